//! One pod's KV cache, by trace block: blocks a running request uses are
//! pinned; a finished request's prompt blocks stay cached, least recently
//! used first to go, until their room is needed. A request's cached prefix
//! is its leading blocks present here *and already computed* (vLLM's prefix
//! caching by chained block hashes, at the trace's 512-token granularity): a
//! block another request is still computing is no hit, the request computes
//! its own copy. Output tokens take room too, as blocks no later request can
//! match.
//!
//! Two tiers: the GPU's blocks (what running requests may pin) and a
//! host-memory tier behind it (vLLM's KV offloading), which takes the GPU's
//! least recently used unpinned blocks when the GPU needs room and drops its
//! own oldest when full. A hit in the host tier is moved back to the GPU:
//! the reservation says how many blocks were, and the engine charges their
//! reload (model.rs, `reload_s`).

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Gpu,
    Host,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    pins: u32,
    /// Last use, for the LRU order of unpinned blocks.
    stamp: u64,
    tier: Tier,
    /// Its KV is computed (or arrived): only then is it a hit.
    computed: bool,
}

/// What a reservation took: the blocks the request pins (its hits and the
/// blocks it computes into the cache), and how many of its hits came back
/// from the host tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub pinned: Vec<u64>,
    pub hits: usize,
    pub reloaded: usize,
    /// Room taken outside the cache: `anonymous` plus blocks the request
    /// computes a copy of (present but not computed yet).
    pub anonymous: usize,
}

/// A pod's KV cache: `pin_limit` blocks on the GPU, `capacity` in all.
#[derive(Debug)]
pub struct BlockCache {
    capacity: usize,
    /// Blocks on the GPU (what running requests may pin at once).
    pin_limit: usize,
    entries: HashMap<u64, Entry>,
    /// Unpinned blocks on the GPU by last use, oldest first.
    gpu_lru: BTreeMap<u64, u64>,
    /// Host-tier blocks by last use, oldest first.
    host_lru: BTreeMap<u64, u64>,
    /// Entries on the GPU, pinned or not.
    on_gpu: usize,
    /// Blocks in use that no request can match (output, anonymous tails).
    anonymous: usize,
    clock: u64,
    evicted: u64,
    /// What changed since last taken, when asked to keep it (KV events).
    changes: Option<Changes>,
}

/// Blocks that became hits here, and blocks that left for good, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    pub stored: Vec<u64>,
    pub removed: Vec<u64>,
}

impl BlockCache {
    /// A cache of `capacity` blocks, of which `pin_limit` (at most
    /// `capacity`) are on the GPU; the rest is the host tier.
    pub fn new(capacity: usize, pin_limit: usize) -> BlockCache {
        BlockCache {
            capacity,
            pin_limit: pin_limit.min(capacity),
            entries: HashMap::new(),
            gpu_lru: BTreeMap::new(),
            host_lru: BTreeMap::new(),
            on_gpu: 0,
            anonymous: 0,
            clock: 0,
            evicted: 0,
            changes: None,
        }
    }

    /// Keeps the changes from now on, for [`BlockCache::take_changes`].
    pub fn track_changes(&mut self) {
        self.changes.get_or_insert_with(Changes::default);
    }

    /// The changes since last taken (none when not tracked).
    pub fn take_changes(&mut self) -> Option<Changes> {
        self.changes.as_mut().map(std::mem::take)
    }

    fn dropped(&mut self, id: u64) {
        self.entries.remove(&id);
        self.evicted += 1;
        if let Some(c) = &mut self.changes {
            c.removed.push(id);
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn pin_limit(&self) -> usize {
        self.pin_limit
    }

    fn host_capacity(&self) -> usize {
        self.capacity - self.pin_limit
    }

    /// How many of `ids` lead with a computed cached block.
    pub fn leading_hits(&self, ids: &[u64]) -> usize {
        ids.iter()
            .take_while(|id| self.entries.get(id).is_some_and(|e| e.computed))
            .count()
    }

    /// Blocks pinned by running requests.
    pub fn in_use(&self) -> usize {
        self.on_gpu - self.gpu_lru.len() + self.anonymous
    }

    /// Blocks cached and not in use (both tiers): room that can be taken back.
    pub fn cached_free(&self) -> usize {
        self.gpu_lru.len() + self.host_lru.len()
    }

    /// Blocks dropped from the cache since it started.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Pins the leading computed blocks of `ids` (reloading those in the host
    /// tier), adds the blocks not present as blocks this request computes,
    /// and takes `anonymous` more blocks (plus one per block present but not
    /// computed: the request computes its own copy), evicting the GPU's least
    /// recently used unpinned blocks to the host tier as needed. `None`, and
    /// nothing changed, when the GPU has not the room.
    pub fn reserve(&mut self, ids: &[u64], anonymous: usize) -> Option<Reserved> {
        let hits = self.leading_hits(ids);
        let mut new: Vec<u64> = Vec::new();
        let mut copies = 0;
        for id in ids.get(hits..).unwrap_or_default() {
            if self.entries.contains_key(id) || new.contains(id) {
                copies += 1;
            } else {
                new.push(*id);
            }
        }
        let hit_ids = ids.get(..hits).unwrap_or_default();
        let tier_of = |id: &u64| self.entries.get(id).map(|e| (e.tier, e.pins));
        let reloaded = hit_ids
            .iter()
            .filter(|id| matches!(tier_of(id), Some((Tier::Host, _))))
            .count();
        let reused_free = hit_ids
            .iter()
            .filter(|id| tier_of(id) == Some((Tier::Gpu, 0)))
            .count();
        let need = reloaded + new.len() + anonymous + copies;
        if self.in_use() + need + reused_free > self.pin_limit {
            return None;
        }
        for id in hit_ids {
            self.pin(*id);
        }
        for id in &new {
            self.entries.insert(
                *id,
                Entry {
                    pins: 1,
                    stamp: 0,
                    tier: Tier::Gpu,
                    computed: false,
                },
            );
        }
        self.on_gpu += new.len();
        self.anonymous += anonymous + copies;
        while self.on_gpu + self.anonymous > self.pin_limit {
            let Some((_, id)) = self.gpu_lru.pop_first() else {
                break;
            };
            self.demote(id);
        }
        let mut pinned = hit_ids.to_vec();
        pinned.extend(new);
        Some(Reserved {
            pinned,
            hits,
            reloaded,
            anonymous: anonymous + copies,
        })
    }

    /// Pins a cached block, back on the GPU if it was in the host tier.
    fn pin(&mut self, id: u64) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if e.pins == 0 {
            match e.tier {
                Tier::Gpu => self.gpu_lru.remove(&e.stamp),
                Tier::Host => self.host_lru.remove(&e.stamp),
            };
        }
        if e.tier == Tier::Host {
            e.tier = Tier::Gpu;
            self.on_gpu += 1;
        }
        e.pins += 1;
    }

    /// An unpinned GPU block leaves the GPU: to the host tier (its oldest
    /// block dropped when full), or dropped when there is none.
    fn demote(&mut self, id: u64) {
        self.on_gpu -= 1;
        if self.host_capacity() == 0 {
            self.dropped(id);
            return;
        }
        if let Some(e) = self.entries.get_mut(&id) {
            e.tier = Tier::Host;
            self.host_lru.insert(e.stamp, id);
        }
        while self.host_lru.len() > self.host_capacity() {
            let Some((_, old)) = self.host_lru.pop_first() else {
                break;
            };
            self.dropped(old);
        }
    }

    /// Marks blocks computed (their KV written): hits from now on.
    pub fn mark_computed(&mut self, ids: &[u64]) {
        for id in ids {
            if let Some(e) = self.entries.get_mut(id) {
                if !e.computed {
                    if let Some(c) = &mut self.changes {
                        c.stored.push(*id);
                    }
                }
                e.computed = true;
            }
        }
    }

    /// Unpins `ids` and frees `anonymous` blocks: computed blocks stay
    /// cached, most recently used; blocks never computed (a request dropped
    /// mid-prefill) go.
    pub fn release(&mut self, ids: &[u64], anonymous: usize) {
        for id in ids {
            let Some(e) = self.entries.get_mut(id) else {
                continue;
            };
            e.pins = e.pins.saturating_sub(1);
            if e.pins > 0 {
                continue;
            }
            if e.computed {
                self.clock += 1;
                e.stamp = self.clock;
                self.gpu_lru.insert(self.clock, *id);
            } else {
                self.entries.remove(id);
                self.on_gpu -= 1;
            }
        }
        self.anonymous = self.anonymous.saturating_sub(anonymous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reserves, computes and releases `ids`: a request that ran to the end.
    fn serve(c: &mut BlockCache, ids: &[u64], anonymous: usize) -> Reserved {
        let r = c.reserve(ids, anonymous).expect("room");
        c.mark_computed(&r.pinned);
        c.release(&r.pinned, r.anonymous);
        r
    }

    #[test]
    fn a_host_tier_keeps_more_than_the_gpu_can_pin() {
        let mut c = BlockCache::new(8, 3);
        assert!(
            c.reserve(&[1, 2, 3, 4], 0).is_none(),
            "more than the GPU holds"
        );
        serve(&mut c, &[1, 2, 3], 0);
        serve(&mut c, &[4, 5], 1);
        assert_eq!(c.cached_free(), 5, "the cache keeps what no request pins");
        assert_eq!(c.leading_hits(&[1, 2, 3]), 3);
        assert_eq!(c.evicted(), 0);
    }

    #[test]
    fn tracked_changes_say_which_blocks_became_hits_and_which_left() {
        // GPU-only, three blocks: the fourth evicts the oldest.
        let mut c = BlockCache::new(3, 3);
        assert_eq!(c.take_changes(), None, "not tracked unless asked");
        c.track_changes();
        let r = c.reserve(&[1, 2], 0).unwrap();
        assert_eq!(
            c.take_changes().unwrap(),
            Changes::default(),
            "not computed yet"
        );
        c.mark_computed(&r.pinned);
        c.mark_computed(&r.pinned);
        c.release(&r.pinned, 0);
        let got = c.take_changes().unwrap();
        assert_eq!((got.stored, got.removed), (vec![1, 2], vec![]));
        // A block dropped before it was computed was never a hit: no change.
        let r = c.reserve(&[9], 0).unwrap();
        c.release(&r.pinned, 0);
        assert_eq!(c.take_changes().unwrap(), Changes::default());
        serve(&mut c, &[3, 4], 0);
        let got = c.take_changes().unwrap();
        assert_eq!((got.stored, got.removed), (vec![3, 4], vec![1]));
    }

    #[test]
    fn a_released_prompt_is_a_hit_for_the_next_with_its_prefix() {
        let mut c = BlockCache::new(10, 10);
        assert_eq!(c.leading_hits(&[1, 2, 3]), 0);
        let r = c.reserve(&[1, 2, 3], 2).expect("room");
        assert_eq!(c.in_use(), 5);
        c.mark_computed(&r.pinned);
        c.release(&r.pinned, 2);
        assert_eq!((c.in_use(), c.cached_free()), (0, 3));
        assert_eq!(c.leading_hits(&[1, 2, 9]), 2);
        assert_eq!(c.leading_hits(&[2, 3]), 2);
        assert_eq!(c.leading_hits(&[9, 1]), 0, "only leading blocks count");
    }

    #[test]
    fn only_computed_blocks_are_hits() {
        let mut c = BlockCache::new(10, 10);
        let a = c.reserve(&[1, 2, 3], 0).expect("room");
        assert_eq!(c.leading_hits(&[1, 2, 3]), 0, "admitted, not computed");
        // A second request meanwhile computes its own copies: no hit, and
        // its copies take room of their own.
        let b = c.reserve(&[1, 2, 4], 0).expect("room");
        assert_eq!((b.hits, b.pinned, b.anonymous), (0, vec![4], 2));
        assert_eq!(c.in_use(), 6);
        c.mark_computed(&a.pinned[..2]);
        assert_eq!(c.leading_hits(&[1, 2, 3]), 2, "computed so far");
        c.mark_computed(&a.pinned);
        assert_eq!(c.reserve(&[1, 2, 3], 0).expect("room").hits, 3);
    }

    #[test]
    fn a_block_never_computed_leaves_with_its_request() {
        let mut c = BlockCache::new(10, 10);
        let r = c.reserve(&[1, 2], 0).expect("room");
        c.mark_computed(&r.pinned[..1]);
        c.release(&r.pinned, 0);
        assert_eq!((c.cached_free(), c.in_use()), (1, 0));
        assert_eq!(c.leading_hits(&[1, 2]), 1);
    }

    #[test]
    fn the_least_recently_used_unpinned_blocks_go_first() {
        let mut c = BlockCache::new(4, 4);
        serve(&mut c, &[1, 2], 0);
        serve(&mut c, &[3, 4], 0);
        // Reusing 1 makes 2 the oldest.
        serve(&mut c, &[1], 0);
        assert!(c.reserve(&[5], 0).is_some());
        assert_eq!(c.leading_hits(&[2]), 0, "evicted");
        assert_eq!(c.leading_hits(&[3]), 1);
        assert_eq!(c.leading_hits(&[1]), 1);
        assert_eq!(c.evicted(), 1);
    }

    #[test]
    fn a_host_tier_hit_is_reloaded_to_the_gpu() {
        // Two GPU blocks, two more in the host tier.
        let mut c = BlockCache::new(4, 2);
        serve(&mut c, &[1, 2], 0);
        serve(&mut c, &[3, 4], 0);
        // 1 and 2 went to the host tier to make room for 3 and 4.
        let r = c.reserve(&[1, 2], 0).expect("room");
        assert_eq!((r.hits, r.reloaded), (2, 2));
        c.release(&r.pinned, 0);
        let r = c.reserve(&[1, 2], 0).expect("room");
        assert_eq!((r.hits, r.reloaded), (2, 0), "back on the GPU");
        c.release(&r.pinned, 0);
        // A fifth block sends 1 to the host tier, which drops its oldest, 3.
        serve(&mut c, &[5], 0);
        assert_eq!(c.evicted(), 1);
        assert_eq!(c.leading_hits(&[3]), 0);
        assert_eq!(c.leading_hits(&[4]), 1);
    }

    #[test]
    fn pinned_blocks_are_never_evicted_and_a_full_cache_refuses() {
        let mut c = BlockCache::new(4, 4);
        let a = c.reserve(&[1, 2], 1).expect("room");
        c.mark_computed(&a.pinned);
        assert!(c.reserve(&[3, 4], 0).is_none(), "one block of room left");
        assert_eq!(c.in_use(), 3, "a refusal changes nothing");
        let b = c.reserve(&[1, 3], 0).expect("a reused block takes no room");
        assert_eq!(c.in_use(), 4);
        c.mark_computed(&b.pinned);
        c.release(&a.pinned, 1);
        assert_eq!(c.leading_hits(&[1, 3]), 2);
        assert!(
            c.reserve(&[7, 8], 0).is_some(),
            "2 and the anonymous block make room"
        );
        assert_eq!(
            c.leading_hits(&[1, 3]),
            2,
            "1 is still pinned by the second request"
        );
    }
}

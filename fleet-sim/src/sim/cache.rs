//! One pod's KV cache, by trace block: blocks a running request uses are
//! pinned; a finished request's prompt blocks stay cached, least recently
//! used first to go, until their room is needed. A request's cached prefix
//! is its leading blocks present here (vLLM's prefix caching by chained
//! block hashes, at the trace's 512-token granularity). Output tokens take
//! room too, as blocks no later request can match.
//!
//! Two sizes: what running requests may pin (the GPU's memory), and what
//! the cache holds in all, which may be larger (a host-memory tier such as
//! vLLM's KV offloading). A hit is a hit wherever the block is: moving it
//! back to the GPU is not modelled.

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Copy)]
struct Entry {
    pins: u32,
    /// Last use, for the LRU order of unpinned blocks.
    stamp: u64,
}

/// A pod's KV cache of `capacity` blocks.
#[derive(Debug)]
pub struct BlockCache {
    capacity: usize,
    /// Blocks running requests may pin at once.
    pin_limit: usize,
    entries: HashMap<u64, Entry>,
    /// Unpinned blocks by last use, oldest first.
    lru: BTreeMap<u64, u64>,
    /// Blocks in use that no request can match (output, anonymous tails).
    anonymous: usize,
    clock: u64,
}

impl BlockCache {
    /// A cache of `capacity` blocks, of which running requests may pin
    /// `pin_limit` (at most `capacity`).
    pub fn new(capacity: usize, pin_limit: usize) -> BlockCache {
        BlockCache {
            capacity,
            pin_limit: pin_limit.min(capacity),
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            anonymous: 0,
            clock: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn pin_limit(&self) -> usize {
        self.pin_limit
    }

    /// How many of `ids` lead with a cached block.
    pub fn leading_hits(&self, ids: &[u64]) -> usize {
        ids.iter()
            .take_while(|id| self.entries.contains_key(id))
            .count()
    }

    /// Blocks pinned by running requests.
    pub fn in_use(&self) -> usize {
        self.entries.len() - self.lru.len() + self.anonymous
    }

    /// Blocks cached and not in use: room that can be taken back.
    pub fn cached_free(&self) -> usize {
        self.lru.len()
    }

    /// Pins `ids` (cached ones are reused, others take room) and takes
    /// `anonymous` more blocks, evicting the least recently used unpinned
    /// blocks as needed. Nothing changes when the room is not there.
    pub fn reserve(&mut self, ids: &[u64], anonymous: usize) -> bool {
        let mut new: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| !self.entries.contains_key(id))
            .collect();
        new.sort_unstable();
        new.dedup();
        let reused_free = ids
            .iter()
            .filter(|id| self.entries.get(id).is_some_and(|e| e.pins == 0))
            .count();
        let evictable = self.lru.len().saturating_sub(reused_free);
        let free = self
            .capacity
            .saturating_sub(self.entries.len() + self.anonymous);
        let need = new.len() + anonymous;
        if need > free + evictable || self.in_use() + need + reused_free > self.pin_limit {
            return false;
        }
        for id in ids {
            if let Some(e) = self.entries.get_mut(id) {
                if e.pins == 0 {
                    self.lru.remove(&e.stamp);
                }
                e.pins += 1;
            }
        }
        let mut to_evict = need.saturating_sub(free);
        while to_evict > 0 {
            let Some((_, id)) = self.lru.pop_first() else {
                break;
            };
            self.entries.remove(&id);
            to_evict -= 1;
        }
        for id in new {
            self.entries.insert(id, Entry { pins: 1, stamp: 0 });
        }
        self.anonymous += anonymous;
        true
    }

    /// Unpins `ids` and frees `anonymous` blocks: the prompt's blocks stay
    /// cached, most recently used.
    pub fn release(&mut self, ids: &[u64], anonymous: usize) {
        for id in ids {
            if let Some(e) = self.entries.get_mut(id) {
                e.pins = e.pins.saturating_sub(1);
                if e.pins == 0 {
                    self.clock += 1;
                    e.stamp = self.clock;
                    self.lru.insert(self.clock, *id);
                }
            }
        }
        self.anonymous = self.anonymous.saturating_sub(anonymous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_tier_keeps_more_than_the_gpu_can_pin() {
        let mut c = BlockCache::new(8, 3);
        assert!(!c.reserve(&[1, 2, 3, 4], 0), "more than the GPU holds");
        assert!(c.reserve(&[1, 2, 3], 0));
        c.release(&[1, 2, 3], 0);
        assert!(c.reserve(&[4, 5], 1));
        c.release(&[4, 5], 1);
        assert_eq!(c.cached_free(), 5, "the cache keeps what no request pins");
        assert_eq!(c.leading_hits(&[1, 2, 3]), 3);
    }

    #[test]
    fn a_released_prompt_is_a_hit_for_the_next_with_its_prefix() {
        let mut c = BlockCache::new(10, 10);
        assert_eq!(c.leading_hits(&[1, 2, 3]), 0);
        assert!(c.reserve(&[1, 2, 3], 2));
        assert_eq!(c.in_use(), 5);
        c.release(&[1, 2, 3], 2);
        assert_eq!((c.in_use(), c.cached_free()), (0, 3));
        assert_eq!(c.leading_hits(&[1, 2, 9]), 2);
        assert_eq!(c.leading_hits(&[2, 3]), 2);
        assert_eq!(c.leading_hits(&[9, 1]), 0, "only leading blocks count");
    }

    #[test]
    fn the_least_recently_used_unpinned_blocks_go_first() {
        let mut c = BlockCache::new(4, 4);
        assert!(c.reserve(&[1, 2], 0));
        c.release(&[1, 2], 0);
        assert!(c.reserve(&[3, 4], 0));
        c.release(&[3, 4], 0);
        // Reusing 1 makes 2 the oldest.
        assert!(c.reserve(&[1], 0));
        c.release(&[1], 0);
        assert!(c.reserve(&[5], 0));
        assert_eq!(c.leading_hits(&[2]), 0, "evicted");
        assert_eq!(c.leading_hits(&[3]), 1);
        assert_eq!(c.leading_hits(&[1]), 1);
    }

    #[test]
    fn pinned_blocks_are_never_evicted_and_a_full_cache_refuses() {
        let mut c = BlockCache::new(4, 4);
        assert!(c.reserve(&[1, 2], 1));
        assert!(!c.reserve(&[3, 4], 0), "one block of room left");
        assert_eq!(c.in_use(), 3, "a refusal changes nothing");
        assert!(c.reserve(&[1, 3], 0), "a reused block takes no room");
        assert_eq!(c.in_use(), 4);
        c.release(&[1, 2], 1);
        assert_eq!(c.leading_hits(&[1, 3]), 2);
        assert!(c.reserve(&[7, 8], 0), "2 and the anonymous block make room");
        assert_eq!(
            c.leading_hits(&[1, 3]),
            2,
            "1 is still pinned by the second request"
        );
    }
}

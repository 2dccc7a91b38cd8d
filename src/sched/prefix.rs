//! The prefix-cache table: which prefill pods last served each block prefix.
//!
//! A prompt is cut into fixed-size byte blocks; block `i`'s hash chains the
//! hashes of blocks `0..i`, so it names the whole prefix up to it. The table
//! lives in Envoy shared data (every worker sees it), one key per slot: a
//! slot holds one block hash and the pods that last served it (up to
//! [`MAX_HOLDERS`], most recent first, each with its time); an insert of
//! another hash into a taken slot overwrites it, so the table is bounded by
//! construction and old entries are evicted by newer ones (and each holder
//! is ignored once older than the TTL).
//!
//! Several holders per block: a prefix many pods hold (a system prompt
//! every conversation begins with) reads as held by each of them, not by
//! the last to serve it, which a policy weighing cache would then pile every
//! new conversation onto (measured: bench/README.md, "Tuning the
//! placement").
//!
//! Every entry is a host call inside Envoy, so not every block is stored:
//! only checkpoint blocks (powers of two, every 16th, and the last), and a
//! lookup bisects over them (a repeated prompt costs one lookup; a partial
//! match a handful). A prompt of 256 blocks stores 20 entries.
//!
//! Each holder also names where the prompt it served ended (its block count
//! and last hash): a conversation's next turn, which holds the last turn's
//! whole prompt, matches to that block exactly, not to the checkpoint below
//! it, without another lookup.

use crate::codec::{RecordReader, RecordWriter};
use crate::fleet::PodId;

/// The most pods one block names: beyond it the oldest are forgotten.
pub const MAX_HOLDERS: usize = 8;

/// One pod that served a prompt through a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub pod: PodId,
    pub at_ms: u64,
    /// The blocks of the prompt it served, and the hash of its last: the
    /// pod holds that whole prompt.
    pub end: u32,
    pub end_hash: u64,
}

impl Holder {
    const SIZE: usize = 28;

    /// How many leading blocks of `hashes` the pod holds, found at
    /// checkpoint block `at`: the whole of the prompt it served when
    /// `hashes` extends that prompt (chained hashes: an equal hash at its
    /// last block means an equal prefix), else up to `at`.
    fn held(&self, hashes: &[u64], at: usize) -> usize {
        let end = self.end as usize;
        let extends =
            end > at + 1 && end.checked_sub(1).and_then(|i| hashes.get(i)) == Some(&self.end_hash);
        if extends {
            end
        } else {
            at + 1
        }
    }
}

/// One slot's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixEntry {
    pub hash: u64,
    /// Most recent first, at most [`MAX_HOLDERS`], each pod once.
    pub holders: Vec<Holder>,
}

impl PrefixEntry {
    /// The entry for block hash `hash` of a prompt whose block hashes are
    /// `hashes`, served by `pod` at `at_ms`, alone.
    pub fn new(hash: u64, hashes: &[u64], pod: PodId, at_ms: u64) -> PrefixEntry {
        PrefixEntry::merged(None, hash, hashes, pod, at_ms, 0)
    }

    /// `pod` served the prompt through block `hash` at `at_ms`: it goes
    /// first, before the holders of `previous` that are still fresh
    /// (`ttl_ms`) when `previous` names the same block; another block's
    /// entry is replaced.
    pub fn merged(
        previous: Option<PrefixEntry>,
        hash: u64,
        hashes: &[u64],
        pod: PodId,
        at_ms: u64,
        ttl_ms: u64,
    ) -> PrefixEntry {
        let first = Holder {
            pod,
            at_ms,
            end: u32::try_from(hashes.len()).unwrap_or(u32::MAX),
            end_hash: hashes.last().copied().unwrap_or(0),
        };
        let earlier = previous
            .filter(|e| e.hash == hash)
            .map(|e| e.holders)
            .unwrap_or_default()
            .into_iter()
            .filter(|h| h.pod != pod && at_ms.saturating_sub(h.at_ms) <= ttl_ms);
        PrefixEntry {
            hash,
            holders: std::iter::once(first)
                .chain(earlier)
                .take(MAX_HOLDERS)
                .collect(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = RecordWriter::with_capacity(8 + self.holders.len() * Holder::SIZE);
        w.u64(self.hash);
        for h in &self.holders {
            w.u64(h.pod.0).u64(h.at_ms).u32(h.end).u64(h.end_hash);
        }
        w.finish()
    }

    /// Reads a slot; anything but a hash and 1 to [`MAX_HOLDERS`] holders
    /// (a value of another release, a torn write) reads as empty.
    pub fn decode(b: &[u8]) -> Option<PrefixEntry> {
        let n = b.len().checked_sub(8)? / Holder::SIZE;
        if n == 0 || n > MAX_HOLDERS || b.len() != 8 + n * Holder::SIZE {
            return None;
        }
        let mut r = RecordReader::new(b);
        let hash = r.u64()?;
        let holders = (0..n)
            .map(|_| {
                Some(Holder {
                    pod: PodId(r.u64()?),
                    at_ms: r.u64()?,
                    end: r.u32()?,
                    end_hash: r.u64()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(PrefixEntry { hash, holders })
    }
}

/// Chained hashes of the prompt's complete blocks (a partial last block is
/// not hashed: it says nothing reusable). `seed` separates models.
pub fn block_hashes(prompt: &[u8], seed: u64, block_bytes: usize, max_blocks: usize) -> Vec<u64> {
    let block_bytes = block_bytes.max(1);
    let mut out = Vec::with_capacity((prompt.len() / block_bytes).min(max_blocks));
    let mut h = seed;
    for block in prompt.chunks_exact(block_bytes).take(max_blocks) {
        // Chained: a block's hash names the whole prefix up to it. XXH64 is a
        // fixed algorithm, so every replica and VM of one release computes
        // the same value (a release that changes it moves prefixes once).
        h = xxhash_rust::xxh64::xxh64(block, h);
        out.push(h);
    }
    out
}

/// The slot a block hash lives in.
pub fn slot_of(hash: u64, slots: u32) -> u32 {
    (hash % slots.max(1) as u64) as u32
}

/// The result of walking a prompt's blocks through the table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefixMatch {
    /// Per pod, the leading blocks it holds as far as the table knows,
    /// deepest first (the most recent first among equals).
    pub by_pod: Vec<(PodId, usize)>,
    /// Leading blocks counted as held by every pod: those through a
    /// checkpoint whose entry names [`MAX_HOLDERS`] fresh pods. A prefix
    /// that common (a system prompt most conversations begin with) is on
    /// more pods than an entry can name, and counting it only on the ones
    /// named would pile new conversations onto them in a fleet of more
    /// than [`MAX_HOLDERS`] pods; with no more pods than that, the named
    /// ones are all of them and this changes nothing.
    pub common: usize,
    pub blocks: usize,
}

impl PrefixMatch {
    /// Blocks matched along the chain (any holder): the deepest holder's.
    /// Placement asks per pod ([`PrefixMatch::depth_of`]); the tests check
    /// the walk with this.
    #[cfg(test)]
    pub fn depth(&self) -> usize {
        self.by_pod
            .iter()
            .map(|(_, d)| *d)
            .fold(self.common, usize::max)
    }

    /// The leading blocks `pod` holds (0: the table knows none).
    pub fn depth_of(&self, pod: PodId) -> usize {
        self.by_pod
            .iter()
            .find(|(p, _)| *p == pod)
            .map_or(0, |(_, d)| *d)
            .max(self.common)
    }

    /// [`PrefixMatch::depth_of`] as a percentage of the prompt's blocks.
    pub fn percent(&self, pod: PodId) -> f64 {
        percent_of(self.depth_of(pod), self.blocks)
    }

    /// The pods the table names, deepest first, with their percentages.
    pub fn holders(&self) -> impl Iterator<Item = (PodId, f64)> + '_ {
        self.by_pod
            .iter()
            .map(|(p, d)| (*p, percent_of(*d, self.blocks)))
    }

    /// `holder` holds the prompt's first `depth` blocks: kept when deeper
    /// than what is known of it (holders arrive most recent first).
    fn note(&mut self, holder: PodId, depth: usize) {
        match self.by_pod.iter_mut().find(|(p, _)| *p == holder) {
            Some((_, d)) => *d = (*d).max(depth),
            None => self.by_pod.push((holder, depth)),
        }
    }
}

fn percent_of(depth: usize, blocks: usize) -> f64 {
    if blocks == 0 {
        0.0
    } else {
        depth as f64 * 100.0 / blocks as f64
    }
}

/// How far apart the prefill table's checkpoints are, in blocks.
pub const PREFILL_CHECKPOINT_EVERY: usize = 16;

/// The block indices stored in the table for a prompt of `n` blocks.
pub fn checkpoints(n: usize) -> Vec<usize> {
    checkpoints_every(n, PREFILL_CHECKPOINT_EVERY)
}

/// The block indices stored for a prompt of `n` blocks when checkpoints are
/// `every` blocks apart (besides the powers of two and the last block): a
/// match is found to within `every` blocks.
pub fn checkpoints_every(n: usize, every: usize) -> Vec<usize> {
    let every = every.max(1);
    (0..n)
        .filter(|i| (i + 1).is_power_of_two() || (i + 1) % every == 0 || i + 1 == n)
        .collect()
}

/// Finds the deepest checkpoint of `hashes` present in the table (bisecting:
/// the entries of one prompt are written together, so presence is monotone
/// along the chain but for evictions, which only make the match a worse
/// hint). The pod holding it holds the prefix up to it; its match is that
/// depth as a percentage of the prompt's blocks.
pub fn walk(
    hashes: &[u64],
    lookup: impl FnMut(u64) -> Option<PrefixEntry>,
    now_ms: u64,
    ttl_ms: u64,
) -> PrefixMatch {
    walk_every(hashes, lookup, now_ms, ttl_ms, PREFILL_CHECKPOINT_EVERY)
}

/// [`walk`] over a table whose checkpoints are `every` blocks apart.
pub fn walk_every(
    hashes: &[u64],
    mut lookup: impl FnMut(u64) -> Option<PrefixEntry>,
    now_ms: u64,
    ttl_ms: u64,
    every: usize,
) -> PrefixMatch {
    let mut m = PrefixMatch {
        blocks: hashes.len(),
        ..Default::default()
    };
    let cps = checkpoints_every(hashes.len(), every);
    // Each found checkpoint's fresh holders hold the prompt at least to it;
    // the bisection's shallower finds name pods that hold less of it (the
    // pod a conversation left, the other holders of a shared prefix).
    let mut probe = |k: usize, m: &mut PrefixMatch| {
        let at = *cps.get(k)?;
        let h = *hashes.get(at)?;
        let e = lookup(h).filter(|e| e.hash == h)?;
        let fresh = |o: &&Holder| now_ms.saturating_sub(o.at_ms) <= ttl_ms;
        let named = e.holders.iter().filter(fresh).count();
        if named == 0 {
            return None;
        }
        if named >= MAX_HOLDERS {
            m.common = m.common.max(at + 1);
        }
        for o in e.holders.iter().filter(fresh) {
            m.note(o.pod, o.held(hashes, at));
        }
        Some(())
    };
    let Some(last) = cps.len().checked_sub(1) else {
        return m;
    };
    // A repeated prompt matches at its last block: one lookup.
    if probe(last, &mut m).is_none() {
        let (mut lo, mut hi) = (0usize, last);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match probe(mid, &mut m) {
                Some(()) => lo = mid + 1,
                None => hi = mid,
            }
        }
    }
    // Deepest first; a stable sort keeps the most recent first among equals.
    m.by_pod.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
    m
}

/// The checkpoint hashes `pod` should record: those past the depth it
/// already holds.
pub fn to_record(hashes: &[u64], held_depth: usize) -> Vec<u64> {
    to_record_every(hashes, held_depth, PREFILL_CHECKPOINT_EVERY)
}

/// [`to_record`] for a table whose checkpoints are `every` blocks apart.
pub fn to_record_every(hashes: &[u64], held_depth: usize, every: usize) -> Vec<u64> {
    checkpoints_every(hashes.len(), every)
        .into_iter()
        .filter(|i| *i >= held_depth)
        .filter_map(|i| hashes.get(i).copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn hashes_chain_over_complete_blocks() {
        let a = block_hashes(b"aaaabbbbcc", 1, 4, 100);
        assert_eq!(a.len(), 2, "the partial block is not hashed");
        let b = block_hashes(b"aaaabbbbdddd", 1, 4, 100);
        assert_eq!(a[..], b[..2], "a shared prefix shares hashes");
        let c = block_hashes(b"xaaabbbb", 1, 4, 100);
        assert_ne!(a[1], c[1], "block 1's hash depends on block 0");
        assert_ne!(
            block_hashes(b"aaaa", 2, 4, 9),
            block_hashes(b"aaaa", 1, 4, 9),
            "seeds separate models"
        );
        assert_eq!(block_hashes(&[0u8; 100], 1, 4, 5).len(), 5);
    }

    fn table(hashes: &[u64], upto: usize, pod: PodId, at: u64) -> HashMap<u64, PrefixEntry> {
        to_record(&hashes[..upto], 0)
            .into_iter()
            .map(|h| (h, PrefixEntry::new(h, &hashes[..upto], pod, at)))
            .collect()
    }

    #[test]
    fn checkpoints_are_sparse_and_end_at_the_last_block() {
        assert_eq!(checkpoints(0), Vec::<usize>::new());
        assert_eq!(checkpoints(1), vec![0]);
        assert_eq!(checkpoints(10), vec![0, 1, 3, 7, 9]);
        assert_eq!(checkpoints(256).len(), 20);
        assert_eq!(checkpoints(40), vec![0, 1, 3, 7, 15, 31, 39]);
    }

    #[test]
    fn walk_finds_the_deepest_recorded_checkpoint_in_few_lookups() {
        let prompt = [7u8; 400]; // 100 blocks of 4
        let hashes = block_hashes(&prompt, 3, 4, 1000);
        // Pod 2 served this whole prompt.
        let t = table(&hashes, 100, PodId(2), 100);
        let mut lookups = 0;
        let m = walk(
            &hashes,
            |h| {
                lookups += 1;
                t.get(&h).cloned()
            },
            200,
            1000,
        );
        assert_eq!((m.depth(), m.percent(PodId(2)), lookups), (100, 100.0, 1));

        // A prompt sharing the first 70 blocks: the deepest shared checkpoint
        // is block 63 (index 63 = every 16th).
        let mut other = prompt.to_vec();
        other[70 * 4] = 9;
        let other_hashes = block_hashes(&other, 3, 4, 1000);
        let mut lookups = 0;
        let m = walk(
            &other_hashes,
            |h| {
                lookups += 1;
                t.get(&h).cloned()
            },
            200,
            1000,
        );
        assert_eq!(m.depth(), 64);
        assert_eq!(m.percent(PodId(2)), 64.0);
        assert_eq!(m.percent(PodId(1)), 0.0);
        assert!(lookups <= 5, "{lookups} lookups");

        // Stale entries and hash collisions are misses.
        assert_eq!(walk(&hashes, |h| t.get(&h).cloned(), 5000, 1000).depth(), 0);
        assert_eq!(
            walk(
                &hashes,
                |h| Some(PrefixEntry::new(h ^ 1, &hashes, PodId(1), 0)),
                0,
                10
            )
            .depth(),
            0
        );
        assert_eq!(walk(&[], |_| None, 0, 10), PrefixMatch::default());
    }

    #[test]
    fn a_prompt_that_extends_a_recorded_one_matches_all_of_it() {
        let turn = [5u8; 4 * 45]; // 45 blocks of 4: its checkpoints are 0, 1, 3, 7, 15, 31, 44
        let hashes = block_hashes(&turn, 3, 4, 1000);
        let t = table(&hashes, 45, PodId(4), 100);
        // The next turn: the whole last turn and 30 blocks more. Its own
        // checkpoints below 45 are ..., 31: without the recorded end it
        // would match 32 blocks.
        let mut next = turn.to_vec();
        next.extend_from_slice(&[6u8; 4 * 30]);
        let next_hashes = block_hashes(&next, 3, 4, 1000);
        let m = walk(&next_hashes, |h| t.get(&h).cloned(), 200, 1000);
        assert_eq!((m.depth(), m.blocks), (45, 75));
        assert_eq!(m.percent(PodId(4)), 60.0);
        // A prompt that leaves the last turn before its end matches only to
        // the checkpoint below where it leaves.
        let mut other = turn.to_vec();
        other[40 * 4] = 1;
        other.extend_from_slice(&[6u8; 4 * 30]);
        let other_hashes = block_hashes(&other, 3, 4, 1000);
        assert_eq!(
            walk(&other_hashes, |h| t.get(&h).cloned(), 200, 1000).depth(),
            32
        );
    }

    #[test]
    fn a_pod_records_only_what_it_does_not_hold() {
        let hashes = block_hashes(&[1u8; 80], 1, 4, 100); // 20 blocks
        assert_eq!(to_record(&hashes, 0).len(), checkpoints(20).len());
        assert_eq!(to_record(&hashes, 16), vec![hashes[19]]);
        assert!(to_record(&hashes, 20).is_empty());
    }

    #[test]
    fn entries_round_trip() {
        let hashes = [3u64, 12];
        let e = PrefixEntry::new(u64::MAX - 3, &hashes, PodId(9), 1_764_000_000_000);
        let e = PrefixEntry::merged(
            Some(e),
            u64::MAX - 3,
            &hashes[..1],
            PodId(4),
            1_764_000_000_500,
            1000,
        );
        assert_eq!(e.holders.len(), 2);
        assert_eq!(PrefixEntry::decode(&e.encode()), Some(e));
        assert_eq!(PrefixEntry::decode(&[1, 2, 3]), None);
        assert_eq!(PrefixEntry::decode(&[0; 8]), None, "no holder");
        assert_eq!(PrefixEntry::decode(&[0; 8 + 28 + 5]), None, "a torn holder");
        assert_eq!(
            PrefixEntry::decode(&[0; 8 + 9 * 28]),
            None,
            "too many holders"
        );
    }

    #[test]
    fn a_block_keeps_its_recent_holders_once_each_and_forgets_stale_ones() {
        let hashes = [7u64];
        let mut e = PrefixEntry::new(7, &hashes, PodId(0), 0);
        for pod in 1..12 {
            e = PrefixEntry::merged(Some(e), 7, &hashes, PodId(pod), pod * 10, 1_000);
        }
        let pods: Vec<u64> = e.holders.iter().map(|h| h.pod.0).collect();
        assert_eq!(
            pods,
            vec![11, 10, 9, 8, 7, 6, 5, 4],
            "most recent first, at most 8"
        );
        // A holder serving again moves to the front, once.
        e = PrefixEntry::merged(Some(e), 7, &hashes, PodId(6), 200, 1_000);
        let pods: Vec<u64> = e.holders.iter().map(|h| h.pod.0).collect();
        assert_eq!(pods, vec![6, 11, 10, 9, 8, 7, 5, 4]);
        // Holders older than the TTL are dropped; another block replaces them all.
        let later = PrefixEntry::merged(Some(e.clone()), 7, &hashes, PodId(1), 1_075, 1_000);
        let pods: Vec<u64> = later.holders.iter().map(|h| h.pod.0).collect();
        assert_eq!(pods, vec![1, 6, 11, 10, 9, 8]);
        let other = PrefixEntry::merged(Some(e), 8, &hashes, PodId(2), 300, 1_000);
        assert_eq!(other.holders.len(), 1);
    }

    /// Records `pod` serving the prompt `hashes` at `at` as the router does:
    /// the checkpoints past what the table says it holds, merged into their
    /// slots (TTL 10,000).
    fn serve(t: &mut HashMap<u64, PrefixEntry>, hashes: &[u64], pod: u64, at: u64) {
        let held = walk(hashes, |h| t.get(&h).cloned(), at, 10_000).depth_of(PodId(pod));
        for h in to_record(hashes, held) {
            let e = PrefixEntry::merged(t.get(&h).cloned(), h, hashes, PodId(pod), at, 10_000);
            t.insert(h, e);
        }
    }

    #[test]
    fn a_prefix_served_by_several_pods_names_each_of_them() {
        // A system prompt of 8 blocks that three pods served, each with a
        // conversation of its own after it.
        let system = [1u8; 4 * 8];
        let mut t: HashMap<u64, PrefixEntry> = HashMap::new();
        let served = |t: &mut HashMap<u64, PrefixEntry>, tail: u8, pod: u64, at: u64| {
            let mut p = system.to_vec();
            p.extend_from_slice(&[tail; 4 * 24]);
            serve(t, &block_hashes(&p, 3, 4, 1000), pod, at);
        };
        served(&mut t, 2, 0, 100);
        served(&mut t, 3, 1, 200);
        served(&mut t, 4, 2, 300);
        // A new conversation: the system prompt, then its own text.
        let mut p = system.to_vec();
        p.extend_from_slice(&[9u8; 4 * 24]);
        let hashes = block_hashes(&p, 3, 4, 1000);
        let m = walk(&hashes, |h| t.get(&h).cloned(), 400, 10_000);
        assert_eq!(m.depth(), 8);
        for pod in 0..3 {
            assert_eq!(m.depth_of(PodId(pod)), 8, "pod {pod}");
        }
        assert_eq!(m.percent(PodId(1)), 25.0);
        // Once the TTL passes for the first two, only the last is named.
        let m = walk(&hashes, |h| t.get(&h).cloned(), 10_250, 10_000);
        assert_eq!(
            (
                m.depth_of(PodId(0)),
                m.depth_of(PodId(1)),
                m.depth_of(PodId(2))
            ),
            (0, 0, 8)
        );
    }

    #[test]
    fn a_prefix_whose_entry_is_full_counts_as_held_by_every_pod() {
        // A system prompt of 8 blocks served by MAX_HOLDERS pods, then by
        // one pod fewer, each with a conversation of its own after it.
        let system = [1u8; 4 * 8];
        let asked = |pods: u64| {
            let mut t: HashMap<u64, PrefixEntry> = HashMap::new();
            for pod in 0..pods {
                let mut p = system.to_vec();
                p.extend_from_slice(&[pod as u8 + 2; 4 * 24]);
                serve(&mut t, &block_hashes(&p, 3, 4, 1000), pod, 100 + pod);
            }
            let mut p = system.to_vec();
            p.extend_from_slice(&[99u8; 4 * 24]);
            walk(
                &block_hashes(&p, 3, 4, 1000),
                |h| t.get(&h).cloned(),
                200,
                10_000,
            )
        };
        let full = asked(MAX_HOLDERS as u64);
        assert_eq!(full.common, 8);
        // A pod the entry has no room to name holds it as far as placement
        // knows, and the named ones no more than before.
        assert_eq!(full.depth_of(PodId(31)), 8);
        assert_eq!((full.depth_of(PodId(0)), full.depth()), (8, 8));
        let short = asked(MAX_HOLDERS as u64 - 1);
        assert_eq!((short.common, short.depth_of(PodId(31))), (0, 0));
        assert_eq!(short.depth_of(PodId(0)), 8);
    }

    #[test]
    fn the_pod_a_conversation_left_is_still_named_for_what_it_holds() {
        // Turn one (40 blocks) on pod 0; turn two (60 blocks, turn one and
        // 20 more) moved to pod 1; turn three (80 blocks) asks.
        let text = [5u8; 4 * 80];
        let hashes = block_hashes(&text, 3, 4, 1000);
        let mut t: HashMap<u64, PrefixEntry> = HashMap::new();
        serve(&mut t, &hashes[..40], 0, 100);
        serve(&mut t, &hashes[..60], 1, 200);
        let m = walk(&hashes, |h| t.get(&h).cloned(), 300, 10_000);
        assert_eq!(m.depth_of(PodId(1)), 60);
        assert_eq!(m.depth_of(PodId(0)), 40, "{:?}", m.by_pod);
        assert_eq!(
            m.by_pod.first().map(|(p, _)| *p),
            Some(PodId(1)),
            "deepest first"
        );
    }
}

//! The prefix-cache table: which prefill pod last served each block prefix.
//!
//! A prompt is cut into fixed-size byte blocks; block `i`'s hash chains the
//! hashes of blocks `0..i`, so it names the whole prefix up to it. The table
//! lives in Envoy shared data (every worker sees it), one key per slot: a
//! slot holds one `(hash, pod, time)`, and an insert into a taken slot
//! overwrites it, so the table is bounded by construction and old entries
//! are evicted by newer ones (and ignored once older than the TTL).
//!
//! Every entry is a host call inside Envoy, so not every block is stored:
//! only checkpoint blocks (powers of two, every 16th, and the last), and a
//! lookup bisects over them (a repeated prompt costs one lookup; a partial
//! match a handful). A prompt of 256 blocks stores 20 entries.
//!
//! Each entry also names where the prompt that wrote it ended (its block
//! count and last hash): a conversation's next turn, which holds the last
//! turn's whole prompt, matches to that block exactly, not to the
//! checkpoint below it, without another lookup.

use crate::codec::{RecordReader, RecordWriter};
use crate::fleet::PodId;

/// One slot's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixEntry {
    pub hash: u64,
    pub pod: PodId,
    pub at_ms: u64,
    /// The blocks of the prompt that wrote the entry, and the hash of its
    /// last: the pod holds that whole prompt.
    pub end: u32,
    pub end_hash: u64,
}

impl PrefixEntry {
    pub const SIZE: usize = 36;

    /// The entry for block hash `hash` of a prompt whose block hashes are
    /// `hashes`, served by `pod` at `at_ms`.
    pub fn new(hash: u64, hashes: &[u64], pod: PodId, at_ms: u64) -> PrefixEntry {
        PrefixEntry {
            hash,
            pod,
            at_ms,
            end: u32::try_from(hashes.len()).unwrap_or(u32::MAX),
            end_hash: hashes.last().copied().unwrap_or(0),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = RecordWriter::with_capacity(Self::SIZE);
        w.u64(self.hash)
            .u64(self.pod.0)
            .u64(self.at_ms)
            .u32(self.end)
            .u64(self.end_hash);
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Option<PrefixEntry> {
        if b.len() != Self::SIZE {
            return None;
        }
        let mut r = RecordReader::new(b);
        Some(PrefixEntry {
            hash: r.u64()?,
            pod: PodId(r.u64()?),
            at_ms: r.u64()?,
            end: r.u32()?,
            end_hash: r.u64()?,
        })
    }

    /// How many leading blocks of `hashes` the entry's pod holds, found at
    /// checkpoint block `at`: the whole of the prompt that wrote it when
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
    /// Per pod, the match percentage of its deepest owned block.
    pub by_pod: Vec<(PodId, f64)>,
    /// Blocks matched along the chain (any owner).
    pub depth: usize,
    pub blocks: usize,
}

impl PrefixMatch {
    pub fn percent(&self, pod: PodId) -> f64 {
        self.by_pod
            .iter()
            .find(|(p, _)| *p == pod)
            .map(|(_, m)| *m)
            .unwrap_or(0.0)
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
    let mut probe = |k: usize| {
        let h = *cps.get(k).and_then(|i| hashes.get(*i))?;
        lookup(h).filter(|e| e.hash == h && now_ms.saturating_sub(e.at_ms) <= ttl_ms)
    };
    let Some(last) = cps.len().checked_sub(1) else {
        return m;
    };
    // A repeated prompt matches at its last block: one lookup.
    let found = match probe(last) {
        Some(e) => Some((last, e)),
        None => {
            let (mut lo, mut hi, mut best) = (0usize, last, None);
            while lo < hi {
                let mid = (lo + hi) / 2;
                match probe(mid) {
                    Some(e) => {
                        best = Some((mid, e));
                        lo = mid + 1;
                    }
                    None => hi = mid,
                }
            }
            best
        }
    };
    if let Some((k, e)) = found {
        m.depth = cps.get(k).map_or(0, |i| e.held(hashes, *i));
        m.by_pod
            .push((e.pod, m.depth as f64 * 100.0 / hashes.len() as f64));
    }
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
                t.get(&h).copied()
            },
            200,
            1000,
        );
        assert_eq!((m.depth, m.percent(PodId(2)), lookups), (100, 100.0, 1));

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
                t.get(&h).copied()
            },
            200,
            1000,
        );
        assert_eq!(m.depth, 64);
        assert_eq!(m.percent(PodId(2)), 64.0);
        assert_eq!(m.percent(PodId(1)), 0.0);
        assert!(lookups <= 5, "{lookups} lookups");

        // Stale entries and hash collisions are misses.
        assert_eq!(walk(&hashes, |h| t.get(&h).copied(), 5000, 1000).depth, 0);
        assert_eq!(
            walk(
                &hashes,
                |h| Some(PrefixEntry::new(h ^ 1, &hashes, PodId(1), 0)),
                0,
                10
            )
            .depth,
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
        let m = walk(&next_hashes, |h| t.get(&h).copied(), 200, 1000);
        assert_eq!((m.depth, m.blocks), (45, 75));
        assert_eq!(m.percent(PodId(4)), 60.0);
        // A prompt that leaves the last turn before its end matches only to
        // the checkpoint below where it leaves.
        let mut other = turn.to_vec();
        other[40 * 4] = 1;
        other.extend_from_slice(&[6u8; 4 * 30]);
        let other_hashes = block_hashes(&other, 3, 4, 1000);
        assert_eq!(
            walk(&other_hashes, |h| t.get(&h).copied(), 200, 1000).depth,
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
        let e = PrefixEntry {
            hash: u64::MAX - 3,
            pod: PodId(9),
            at_ms: 1_764_000_000_000,
            end: 77,
            end_hash: 12,
        };
        assert_eq!(PrefixEntry::decode(&e.encode()), Some(e));
        assert_eq!(PrefixEntry::decode(&[1, 2, 3]), None);
    }
}

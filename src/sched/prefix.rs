//! The prefix-cache table: which prefill pod last served each block prefix.
//!
//! A prompt is cut into fixed-size byte blocks; block `i`'s hash chains the
//! hashes of blocks `0..i`, so it names the whole prefix up to it. The table
//! lives in Envoy shared data (every worker sees it), one key per slot: a
//! slot holds one `(hash, pod, time)`, and an insert into a taken slot
//! overwrites it, so the table is bounded by construction and old entries
//! are evicted by newer ones (and ignored once older than the TTL).

use crate::config::fnv1a;

/// One slot's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixEntry {
    pub hash: u64,
    pub pod: u32,
    pub at_ms: u64,
}

impl PrefixEntry {
    pub const SIZE: usize = 20;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[..8].copy_from_slice(&self.hash.to_le_bytes());
        b[8..12].copy_from_slice(&self.pod.to_le_bytes());
        b[12..].copy_from_slice(&self.at_ms.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<PrefixEntry> {
        let b: &[u8; Self::SIZE] = b.try_into().ok()?;
        Some(PrefixEntry {
            hash: u64::from_le_bytes(b[..8].try_into().ok()?),
            pod: u32::from_le_bytes(b[8..12].try_into().ok()?),
            at_ms: u64::from_le_bytes(b[12..].try_into().ok()?),
        })
    }
}

/// Chained hashes of the prompt's complete blocks (a partial last block is
/// not hashed: it says nothing reusable). `seed` separates models.
pub fn block_hashes(prompt: &[u8], seed: u64, block_bytes: usize, max_blocks: usize) -> Vec<u64> {
    let block_bytes = block_bytes.max(1);
    let mut out = Vec::with_capacity((prompt.len() / block_bytes).min(max_blocks));
    let mut h = seed;
    for block in prompt.chunks_exact(block_bytes).take(max_blocks) {
        let mut buf = Vec::with_capacity(8 + block.len());
        buf.extend_from_slice(&h.to_le_bytes());
        buf.extend_from_slice(block);
        h = fnv1a(&buf);
        out.push(h);
    }
    out
}

/// The slot a block hash lives in.
pub fn slot_of(hash: u64, slots: u32) -> u32 {
    (hash % slots.max(1) as u64) as u32
}

/// The shared-data key of a slot.
pub fn slot_key(fingerprint: &str, slot: u32) -> String {
    format!("pd_router.{fingerprint}.pfx.{slot}")
}

/// The result of walking a prompt's blocks through the table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefixMatch {
    /// Per pod, the match percentage of its deepest owned block.
    pub by_pod: Vec<(usize, f64)>,
    /// Blocks matched along the chain (any owner).
    pub depth: usize,
    pub blocks: usize,
}

impl PrefixMatch {
    pub fn percent(&self, pod: usize) -> f64 {
        self.by_pod
            .iter()
            .find(|(p, _)| *p == pod)
            .map(|(_, m)| *m)
            .unwrap_or(0.0)
    }
}

/// Walks `hashes` from the first block, stopping at the first block nobody
/// holds; each pod's match is the depth of the deepest block it owns, as a
/// percentage of the prompt's blocks.
pub fn walk(
    hashes: &[u64],
    mut lookup: impl FnMut(u64) -> Option<PrefixEntry>,
    now_ms: u64,
    ttl_ms: u64,
) -> PrefixMatch {
    let mut m = PrefixMatch {
        blocks: hashes.len(),
        ..Default::default()
    };
    for (i, h) in hashes.iter().enumerate() {
        let Some(e) =
            lookup(*h).filter(|e| e.hash == *h && now_ms.saturating_sub(e.at_ms) <= ttl_ms)
        else {
            break;
        };
        m.depth = i + 1;
        let pct = (i + 1) as f64 * 100.0 / hashes.len() as f64;
        match m.by_pod.iter_mut().find(|(p, _)| *p == e.pod as usize) {
            Some(slot) => slot.1 = pct,
            None => m.by_pod.push((e.pod as usize, pct)),
        }
    }
    m
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

    #[test]
    fn walk_finds_each_pods_deepest_block() {
        let hashes = block_hashes(&[7u8; 40], 3, 4, 100); // 10 blocks
        let mut table: HashMap<u64, PrefixEntry> = HashMap::new();
        for (i, h) in hashes.iter().enumerate().take(6) {
            let pod = if i < 2 { 1 } else { 2 };
            table.insert(
                *h,
                PrefixEntry {
                    hash: *h,
                    pod,
                    at_ms: 100,
                },
            );
        }
        let m = walk(&hashes, |h| table.get(&h).copied(), 200, 1000);
        assert_eq!(m.depth, 6);
        assert_eq!(m.percent(1), 20.0);
        assert_eq!(m.percent(2), 60.0);
        assert_eq!(m.percent(3), 0.0);
        // Stale entries count as absent.
        let m = walk(&hashes, |h| table.get(&h).copied(), 5000, 1000);
        assert_eq!(m.depth, 0);
        // A slot holding another hash (a collision) is a miss.
        let m = walk(
            &hashes,
            |h| {
                Some(PrefixEntry {
                    hash: h ^ 1,
                    pod: 1,
                    at_ms: 0,
                })
            },
            0,
            10,
        );
        assert_eq!(m.depth, 0);
    }

    #[test]
    fn entries_round_trip() {
        let e = PrefixEntry {
            hash: u64::MAX - 3,
            pod: 9,
            at_ms: 1_764_000_000_000,
        };
        assert_eq!(PrefixEntry::decode(&e.encode()), Some(e));
        assert_eq!(PrefixEntry::decode(&[1, 2, 3]), None);
    }
}

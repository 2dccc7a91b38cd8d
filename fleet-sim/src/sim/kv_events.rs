//! vLLM's KV events, keyed as llm-d's precise prefix scorer keys prompts, so
//! llm-d's endpoint picker can run in front of the simulated pods with its
//! KV-event index working as in production (`--kv-events`).
//!
//! The picker tokenizes a prompt, cuts the ids into chunks of its
//! `blockSize`, and keys chunk i by sha256 over canonical CBOR of
//! `[digest of chunk i-1, the chunk's ids, null]`, chained from
//! sha256(CBOR(hash seed)); a key is the digest's last 8 bytes read big
//! endian (llm-d-kv-cache-manager v0.4.0, `kvblock/token_processor.go`).
//! It indexes a BlockStored event's hashes as those keys as they come
//! (`kvevents/pool.go`), so a pod must hash its blocks the same way: vLLM
//! does with `--prefix-caching-hash-algo sha256_cbor` and the picker's block
//! size, which is what this module does for the sims.
//!
//! The tokenizer is one id per character of the sims' alphabet
//! ([`tokenizer_json`], handed to the picker as a local tokenizer.json), and
//! the picker's block size is one sim block's bytes, so a key is one trace
//! block, and its text, [`block_text`], a pure function of the block's id.
//! A block's digest is learned once from the first prompt it leads in
//! (the trace's ids name a block with its prefix, so its parent is the same
//! in every prompt). Partial last blocks are never keyed, as neither vLLM
//! nor the picker hashes a partial block.
//!
//! What a pod publishes (its cache's changes, [`super::cache::Changes`]): a
//! block it holds computed for the first time (BlockStored), and a block
//! that leaves it for good (BlockRemoved). A move between GPU and host tier
//! is not published: vLLM v0.11's offloading connector reports no tier
//! either, and llm-d v0.4.0 scores every tier alike.

use super::text::{block_text, Prompt, Shape, BLOCK_TOKENS};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

/// Every byte the sims' prompts hold (text.rs: a `#<hex id>;` marker, then
/// lowercase letters and spaces); token id = position + 1, 0 is unknown.
pub const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz #;0123456789";

/// Batches kept for a reader that falls behind; older ones are dropped (a
/// picker that misses them scores less, as it would if vLLM's publisher
/// dropped them).
const KEEP: usize = 100_000;

pub fn token_id(byte: u8) -> u32 {
    ALPHABET
        .iter()
        .position(|c| *c == byte)
        .map_or(0, |i| i as u32 + 1)
}

/// The HuggingFace tokenizer.json of [`token_id`]: every character its own
/// token, no special tokens added. A BPE model with no merges and no
/// pre-tokenizer: HF tokenizers 0.23 encodes 33,000 characters with it in
/// 5.5 ms, against 23 ms for a word-level model behind a split at every
/// character (bench/README.md, "llm-d's precise prefix scorer as a peer").
pub fn tokenizer_json() -> Value {
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), json!(0));
    for c in ALPHABET {
        vocab.insert(char::from(*c).to_string(), json!(token_id(*c)));
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "dropout": null, "unk_token": "[UNK]",
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    })
}

/// A CBOR head, shortest form (RFC 8949 §4.2.1, as canonical encoding asks).
fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xFF => out.extend([m | 24, n as u8]),
        0x100..=0xFFFF => {
            out.push(m | 25);
            out.extend((n as u16).to_be_bytes());
        }
        0x1_0000..=0xFFFF_FFFF => {
            out.push(m | 26);
            out.extend((n as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend(n.to_be_bytes());
        }
    }
}

/// The digest a chain starts from: sha256 of the seed as a CBOR text string.
pub fn seed_digest(seed: &str) -> [u8; 32] {
    let mut b = Vec::with_capacity(seed.len() + 9);
    head(&mut b, 3, seed.len() as u64);
    b.extend_from_slice(seed.as_bytes());
    Sha256::digest(&b).into()
}

/// A chunk's digest: sha256 of CBOR `[parent, tokens, null]`.
pub fn chunk_digest(parent: &[u8; 32], tokens: &[u32]) -> [u8; 32] {
    let mut b = Vec::with_capacity(40 + tokens.len() * 2);
    head(&mut b, 4, 3);
    head(&mut b, 2, 32);
    b.extend_from_slice(parent);
    head(&mut b, 4, tokens.len() as u64);
    for t in tokens {
        head(&mut b, 0, u64::from(*t));
    }
    b.push(0xF6);
    Sha256::digest(&b).into()
}

/// The key the picker indexes: the digest's last 8 bytes, big endian.
pub fn key(digest: &[u8; 32]) -> u64 {
    let mut last = [0u8; 8];
    last.copy_from_slice(&digest[24..]);
    u64::from_be_bytes(last)
}

/// One pod's changes, published as one event batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Batch {
    pub seq: u64,
    /// The pod's IP: the picker's pod identifier (the topic's middle part).
    pub pod: String,
    /// Unix seconds (vLLM's batch timestamp).
    pub ts: f64,
    /// BlockStored's hashes, in prompt order where they came from one.
    pub stored: Vec<u64>,
    /// The key of the first stored block's parent (none at a prompt's start).
    pub parent: Option<u64>,
    pub removed: Vec<u64>,
}

#[derive(Default)]
struct State {
    /// Block id: (its parent's key, its digest).
    digests: HashMap<u64, (Option<u64>, [u8; 32])>,
    log: VecDeque<Batch>,
    next: u64,
}

/// The fleet's KV events: the blocks' keys and the batches not yet read.
pub struct KvEvents {
    shape: Shape,
    root: [u8; 32],
    state: Mutex<State>,
    published: Notify,
}

impl KvEvents {
    /// Events for prompts of `shape`, chained from the empty hash seed
    /// (llm-d's default `hashSeed`; vLLM's with PYTHONHASHSEED set empty).
    pub fn new(shape: Shape) -> KvEvents {
        KvEvents {
            shape,
            root: seed_digest(""),
            state: Mutex::new(State::default()),
            published: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Learns the digests of `prompt`'s whole blocks not seen before.
    pub fn learn(&self, prompt: &Prompt) {
        let mut st = self.state();
        let mut parent = (None, self.root);
        for b in prompt.blocks.iter() {
            let (Some(id), true) = (b.id, b.tokens == BLOCK_TOKENS) else {
                break;
            };
            let d = match st.digests.get(&id) {
                Some((_, d)) => *d,
                None => {
                    let tokens: Vec<u32> = block_text(id, self.shape)
                        .iter()
                        .map(|c| token_id(*c))
                        .collect();
                    let d = chunk_digest(&parent.1, &tokens);
                    st.digests.insert(id, (parent.0, d));
                    d
                }
            };
            parent = (Some(key(&d)), d);
        }
    }

    /// Publishes a pod's changes (block ids): those with no learned digest
    /// (partial blocks) are left out; nothing left, nothing published.
    pub fn publish(&self, pod: &str, stored: &[u64], removed: &[u64]) {
        let mut st = self.state();
        let known = |ids: &[u64]| -> Vec<(Option<u64>, u64)> {
            ids.iter()
                .filter_map(|id| st.digests.get(id).map(|(p, d)| (*p, key(d))))
                .collect()
        };
        let (stored, removed) = (known(stored), known(removed));
        if stored.is_empty() && removed.is_empty() {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        st.next += 1;
        let batch = Batch {
            seq: st.next,
            pod: pod.to_string(),
            ts,
            parent: stored.first().and_then(|(p, _)| *p),
            stored: stored.into_iter().map(|(_, k)| k).collect(),
            removed: removed.into_iter().map(|(_, k)| k).collect(),
        };
        st.log.push_back(batch);
        if st.log.len() > KEEP {
            st.log.pop_front();
        }
        drop(st);
        self.published.notify_waiters();
    }

    /// The batches after `seq` (those up to it are dropped: read), waiting
    /// up to `wait` for one when there is none.
    pub async fn after(&self, seq: u64, wait: Duration) -> Vec<Batch> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let published = self.published.notified();
            tokio::pin!(published);
            // Registered before the log is read: no batch is missed.
            published.as_mut().enable();
            {
                let mut st = self.state();
                while st.log.front().is_some_and(|b| b.seq <= seq) {
                    st.log.pop_front();
                }
                if !st.log.is_empty() {
                    return st.log.iter().cloned().collect();
                }
            }
            if tokio::time::timeout_at(deadline, published).await.is_err() {
                return Vec::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::text::{parse_prompt, prompt_text};

    // The expected keys are llm-d-kv-cache-manager v0.4.0's
    // `ChunkedTokenDatabase.TokensToKVBlockKeys` run on the same tokens.
    fn chain(seed: &str, tokens: &[u32], block: usize) -> Vec<u64> {
        let mut parent = seed_digest(seed);
        tokens
            .chunks_exact(block)
            .map(|c| {
                parent = chunk_digest(&parent, c);
                key(&parent)
            })
            .collect()
    }

    #[test]
    fn keys_are_llm_d_s_for_the_same_tokens() {
        let short = [28, 31, 6, 29, 1, 2, 27, 3, 4];
        assert_eq!(
            chain("", &short, 4),
            [16407960327927638511, 11119950077303757920]
        );
        assert_eq!(
            chain("42", &short, 4),
            [15926600960099129876, 11623122984643595542]
        );
        // Ids past 23 and a chunk past 255 ids take the longer CBOR heads.
        let long: Vec<u32> = (0..4100).map(|i| i % 40).collect();
        assert_eq!(
            chain("", &long, 2048),
            [4539512859533390602, 13928126116753090787]
        );
    }

    #[test]
    fn the_tokenizer_gives_every_prompt_byte_an_id_of_its_own() {
        let shape = Shape::default();
        let text = block_text(0xabc, shape);
        assert!(text.iter().all(|c| token_id(*c) != 0));
        let t = tokenizer_json();
        let vocab = t["model"]["vocab"].as_object().unwrap();
        assert_eq!(vocab.len(), ALPHABET.len() + 1);
        assert_eq!(vocab["#"], json!(token_id(b'#')));
    }

    #[tokio::test]
    async fn a_prompt_s_whole_blocks_are_published_chained_as_the_picker_keys_them() {
        let shape = Shape::default();
        let ids = [5u64, 9, 11];
        // Two whole blocks and a partial third.
        let text = prompt_text(&ids, 2 * BLOCK_TOKENS + 100, shape);
        let prompt = parse_prompt(text.as_bytes(), shape);
        let ev = KvEvents::new(shape);
        ev.learn(&prompt);
        ev.publish("127.0.0.2", &[5, 9, 11], &[]);
        let tokens: Vec<u32> = text.bytes().map(token_id).collect();
        let want = chain("", &tokens, shape.block_bytes());
        assert_eq!(want.len(), 2);
        let got = ev.after(0, Duration::ZERO).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].pod, "127.0.0.2");
        assert_eq!(got[0].stored, want);
        assert_eq!(got[0].parent, None);
        // The second block alone names the first as its parent; a removal
        // names the key it was stored under.
        ev.publish("127.0.0.3", &[9], &[5]);
        let got = ev.after(1, Duration::ZERO).await;
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].seq, got[0].parent, &got[0].stored, &got[0].removed),
            (2, Some(want[0]), &vec![want[1]], &vec![want[0]])
        );
        // Read batches are gone; unknown ids publish nothing.
        ev.publish("127.0.0.3", &[77], &[]);
        assert!(ev.after(2, Duration::from_millis(20)).await.is_empty());
    }

    #[tokio::test]
    async fn a_reader_waiting_wakes_when_a_batch_is_published() {
        let shape = Shape::default();
        let ev = std::sync::Arc::new(KvEvents::new(shape));
        let text = prompt_text(&[3], BLOCK_TOKENS, shape);
        ev.learn(&parse_prompt(text.as_bytes(), shape));
        let reader = {
            let ev = std::sync::Arc::clone(&ev);
            tokio::spawn(async move { ev.after(0, Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        ev.publish("127.0.0.2", &[3], &[]);
        let got = tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), 1);
    }
}

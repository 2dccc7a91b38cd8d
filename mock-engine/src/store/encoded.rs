//! vLLM E/P/D with NIXL: the media items an encoder pod encoded, by hash,
//! which a prefill pulls over the encoder's side channel (`GET /ec/{hash}`).
//! With the shared-storage connector the files in `--ec-storage` play this
//! part instead.

use std::collections::HashMap;
use std::sync::Mutex;

use super::lock;

#[derive(Default)]
pub struct Encoded(Mutex<HashMap<String, u64>>);

impl Encoded {
    /// Records the item `hash`, encoded into `tokens` embeddings.
    pub fn put(&self, hash: &str, tokens: u64) {
        lock(&self.0).insert(hash.to_owned(), tokens);
    }

    /// The embeddings' token count of item `hash`, if this pod encoded it.
    pub fn get(&self, hash: &str) -> Option<u64> {
        lock(&self.0).get(hash).copied()
    }
}

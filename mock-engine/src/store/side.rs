//! What a prefill's side channel holds for its decodes, as data: NIXL/shfs
//! KV blocks by remote request id and TensorRT-LLM contexts by
//! disaggregated request id (see `sidechannel.rs` for the HTTP side).
//! Entries are single-consumer, like NIXL freeing blocks after the read.

use std::collections::HashMap;
use std::sync::Mutex;

use super::lock;

/// A prefill's KV blocks, as a NIXL/shfs decode must name them to pull.
pub struct KvEntry {
    pub engine_id: String,
    pub block_ids: Vec<u64>,
    pub prompt_hash: String,
}

/// The form in which a TRT-LLM context answered the prompt's ids; the
/// generation request must carry them in that form (an orchestrator relays
/// what it got, and drops nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdsForm {
    /// Not answered (older chat endpoints, `--fault no-token-ids`).
    Absent,
    /// `prompt_token_ids`.
    Array,
    /// `prompt_token_ids_b64`.
    Base64,
}

impl IdsForm {
    fn tag(self) -> u8 {
        match self {
            IdsForm::Absent => b'-',
            IdsForm::Array => b'a',
            IdsForm::Base64 => b'b',
        }
    }

    fn from_tag(tag: u8) -> Option<IdsForm> {
        [IdsForm::Absent, IdsForm::Array, IdsForm::Base64]
            .into_iter()
            .find(|f| f.tag() == tag)
    }
}

/// What a TRT-LLM context leaves for its generation request.
#[derive(Debug, PartialEq, Eq)]
pub struct CtxEntry {
    pub token_ids: Vec<u64>,
    /// The `encoded_opaque_state` the context answered.
    pub encoded_opaque_state: String,
    pub answered: IdsForm,
}

impl CtxEntry {
    /// The body of `GET /ctx/{id}`: the form's tag byte, the opaque state
    /// (base64, so no newline), a newline, then the ids as little-endian
    /// u64s. Binary, as
    /// the cache transfer it stands in for: 131 000 ids as JSON made the
    /// mocks, not the router, bind the bench's 512 KB rate.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(self.encoded_opaque_state.len() + 2 + 8 * self.token_ids.len());
        out.push(self.answered.tag());
        out.extend_from_slice(self.encoded_opaque_state.as_bytes());
        out.push(b'\n');
        for id in &self.token_ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    pub fn decode(body: &[u8]) -> Result<CtxEntry, String> {
        let (&tag, body) = body.split_first().ok_or("empty body")?;
        let answered =
            IdsForm::from_tag(tag).ok_or_else(|| format!("unknown ids form {tag:#x}"))?;
        let mut lines = body.splitn(2, |b| *b == b'\n');
        let state = lines.next().unwrap_or_default();
        let ids = lines.next().ok_or("no opaque state line")?;
        let encoded_opaque_state = std::str::from_utf8(state)
            .map_err(|e| format!("opaque state: {e}"))?
            .to_string();
        let words = ids.chunks_exact(8);
        if !words.remainder().is_empty() {
            return Err(format!(
                "{} id bytes is not a whole number of u64s",
                ids.len()
            ));
        }
        let token_ids = words
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        Ok(CtxEntry {
            token_ids,
            encoded_opaque_state,
            answered,
        })
    }
}

/// Why a NIXL pull took nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum KvMiss {
    /// No KV under the id: never offered, or already pulled.
    Unknown,
    /// The KV belongs to this engine id, not the pull's.
    Engine(String),
    /// The KV is in these blocks, not the pull's.
    Blocks(Vec<u64>),
}

/// What a prefill's side channel serves, single-consumer.
#[derive(Default)]
pub struct SideStore {
    kv: Mutex<HashMap<String, KvEntry>>,
    ctx: Mutex<HashMap<u64, CtxEntry>>,
}

impl SideStore {
    pub fn put_kv(&self, remote_request_id: String, entry: KvEntry) {
        lock(&self.kv).insert(remote_request_id, entry);
    }

    /// Takes the KV under `remote_request_id` when the pull names its
    /// engine and blocks: its prompt hash. A miss leaves the entry.
    pub fn take_kv(
        &self,
        remote_request_id: &str,
        engine_id: &str,
        block_ids: &[u64],
    ) -> Result<String, KvMiss> {
        let mut kv = lock(&self.kv);
        let Some(entry) = kv.get(remote_request_id) else {
            return Err(KvMiss::Unknown);
        };
        if entry.engine_id != engine_id {
            return Err(KvMiss::Engine(entry.engine_id.clone()));
        }
        if entry.block_ids != block_ids {
            return Err(KvMiss::Blocks(entry.block_ids.clone()));
        }
        let hash = entry.prompt_hash.clone();
        kv.remove(remote_request_id);
        Ok(hash)
    }

    /// Stores a TRT-LLM context; false if the id is still pending, since
    /// reusing a live disagg_request_id would mix two requests' KV.
    pub fn put_ctx(&self, id: u64, entry: CtxEntry) -> bool {
        let mut ctx = lock(&self.ctx);
        if ctx.contains_key(&id) {
            return false;
        }
        ctx.insert(id, entry);
        true
    }

    /// Takes the TRT-LLM context under `id`, once.
    pub fn take_ctx(&self, id: u64) -> Option<CtxEntry> {
        lock(&self.ctx).remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctx_body_round_trips() {
        for answered in [IdsForm::Absent, IdsForm::Array, IdsForm::Base64] {
            let ctx = CtxEntry {
                token_ids: vec![0, 151_935, u64::MAX],
                encoded_opaque_state: "bW9jaw+/=".into(),
                answered,
            };
            assert_eq!(CtxEntry::decode(&ctx.encode()), Ok(ctx));
        }
    }

    #[test]
    fn ctx_body_must_be_whole() {
        assert!(CtxEntry::decode(b"").is_err());
        assert!(CtxEntry::decode(b"ano newline").is_err());
        assert!(CtxEntry::decode(b"astate\n1234567").is_err());
        assert!(CtxEntry::decode(b"?state\n").is_err(), "unknown form");
        let empty = CtxEntry::decode(b"-\n").expect("no ids is well formed");
        assert!(empty.token_ids.is_empty() && empty.encoded_opaque_state.is_empty());
    }

    #[test]
    fn a_mismatched_pull_leaves_the_kv() {
        let store = SideStore::default();
        let entry = || KvEntry {
            engine_id: "e".into(),
            block_ids: vec![1, 2],
            prompt_hash: "h".into(),
        };
        store.put_kv("r".into(), entry());
        assert_eq!(store.take_kv("x", "e", &[1, 2]), Err(KvMiss::Unknown));
        assert_eq!(
            store.take_kv("r", "f", &[1, 2]),
            Err(KvMiss::Engine("e".into()))
        );
        assert_eq!(
            store.take_kv("r", "e", &[2]),
            Err(KvMiss::Blocks(vec![1, 2]))
        );
        assert_eq!(store.take_kv("r", "e", &[1, 2]), Ok("h".into()));
        assert_eq!(store.take_kv("r", "e", &[1, 2]), Err(KvMiss::Unknown));
    }
}

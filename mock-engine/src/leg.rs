//! What one engine's leg hands to the answer: the prefill's extra members
//! and counts ([`PrefillOut`]), the decode's KV source and counts
//! ([`DecodeOut`], [`Kv`]). Each engine's contract (engines/) fills them;
//! answer.rs renders them.

use serde_json::value::RawValue;
use serde_json::{Map, Number, Value};

/// Where the decode's KV came from; sent as `x-mock-kv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kv {
    Pulled,
    Recomputed,
    None,
}

impl Kv {
    pub fn as_str(self) -> &'static str {
        match self {
            Kv::Pulled => "pulled",
            Kv::Recomputed => "recomputed",
            Kv::None => "none",
        }
    }
}

/// What a prefill engine adds to the common one-token answer.
pub struct PrefillOut {
    /// Overrides the default `cmpl-mock-`/`chatcmpl-mock-` id prefix.
    pub id_prefix: Option<&'static str>,
    pub finish_reason: &'static str,
    pub prompt_tokens: u64,
    /// Extra top-level members (e.g. kv_transfer_params).
    pub top: Map<String, Value>,
    /// Extra top-level members already serialised, written after all the
    /// others: TRT-LLM's `prompt_token_ids` (131 000 ids at 512 KB) cost the
    /// mock several times the router's whole work as a `Value` tree.
    pub top_raw: Vec<(&'static str, Box<RawValue>)>,
    /// Extra members of every choice (e.g. TRT-LLM disaggregated_params).
    pub choice: Map<String, Value>,
    /// The pod's prefix-cache hits for this prompt (set by the dispatcher).
    pub cached_tokens: Number,
}

impl PrefillOut {
    pub fn new(prompt_tokens: u64) -> Self {
        PrefillOut {
            id_prefix: None,
            finish_reason: "length",
            prompt_tokens,
            top: Map::new(),
            top_raw: Vec::new(),
            choice: Map::new(),
            cached_tokens: Number::from(0u64),
        }
    }
}

pub struct DecodeOut {
    pub kv: Kv,
    pub prompt_tokens: u64,
    /// SGLang: the prefill's cached count, learnt in the bootstrap exchange.
    pub prefill_cached: Option<u64>,
    /// What the decode reports as cached (set by the dispatcher).
    pub cached_tokens: Number,
    /// Extra top-level members of the answer (a bidirectional vLLM
    /// decode's `kv_transfer_params`), on its last chunk when streamed.
    pub top: Map<String, Value>,
}

impl DecodeOut {
    pub fn new(kv: Kv, prompt_tokens: u64) -> Self {
        DecodeOut {
            kv,
            prompt_tokens,
            prefill_cached: None,
            cached_tokens: Number::from(0u64),
            top: Map::new(),
        }
    }
}

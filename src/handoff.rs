//! The vocabulary of a hand-off, shared by the engine handlers and the vLLM
//! KV-transfer agents they delegate to: what a handler sees of the request
//! being split ([`PdContext`]), the edits it makes to each leg, and the
//! randomness and learned pod fields it draws on.

use crate::api::ClientFields;
use crate::body::{Edits, Members};
use crate::error::EngineError;
use crate::fleet::{Connector, Endpoint, PodId};
use std::collections::BTreeMap;

/// Randomness and ids that handlers draw on; the filter backs it with the
/// host, tests with fixed values.
pub trait IdSource {
    /// A uniformly random 64-bit value.
    fn random_u64(&mut self) -> Result<u64, String>;
    /// The next TensorRT-LLM disagg request id.
    fn disagg_request_id(&mut self) -> i64;
}

/// What the router learned about pods while running, for hand-offs that
/// need more than the configuration says: a value the split is handed, not
/// a way back into the router.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LearnedPods {
    /// What each asked prefill pod said (a pod is asked one thing, by its
    /// engine): a vLLM Mooncake pod its engine id per data-parallel rank
    /// (its bootstrap server's `GET /query`); a TensorRT-LLM
    /// generation-first context server its `disaggregated_params`, one JSON
    /// object (`GET /server_info`).
    pub said: BTreeMap<PodId, Vec<String>>,
}

/// Nothing learned (golden fixtures, fuzzing, benches).
pub static NOTHING_LEARNED: LearnedPods = LearnedPods {
    said: BTreeMap::new(),
};

impl LearnedPods {
    /// A Mooncake prefill pod's engine ids, once learned.
    pub fn mooncake_engines(&self, pod: PodId) -> Option<&[String]> {
        self.said.get(&pod).map(Vec::as_slice)
    }

    /// A TensorRT-LLM context server's `disaggregated_params` (JSON), once
    /// learned.
    pub fn trt_server_info(&self, pod: PodId) -> Option<&str> {
        self.said.get(&pod)?.first().map(String::as_str)
    }
}

/// The call that aborts a split's prefill on its pod (the engine's own
/// route), sent when the stream ends before the prefill answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortCall {
    pub path: &'static str,
    /// JSON.
    pub body: String,
}

/// What a handler can see of the request being split.
pub struct PdContext<'a> {
    pub fields: &'a ClientFields,
    /// The client's body and its top-level members.
    pub body: &'a [u8],
    pub top: &'a Members,
    pub request_id: &'a str,
    /// The model's `kv_connector`, if it names one.
    pub model_connector: Option<Connector>,
    /// The router's global connector, for pods and models that name none.
    pub default_connector: Connector,
    /// The decode pod of this split (some hand-offs name it to the prefill).
    pub decode_pod: &'a Endpoint,
    pub learned: &'a LearnedPods,
    /// TensorRT-LLM's `internal_request_auth_key`, when configured.
    pub trt_auth_key: Option<&'a [u8]>,
    /// The model's `trt_token_ids_b64`.
    pub trt_token_ids_b64: bool,
    /// The model's `schedule_style` is `generation_first`.
    pub trt_generation_first: bool,
    /// This split's TensorRT-LLM disagg request id (drawn when a
    /// TensorRT-LLM model's legs are built; none otherwise).
    pub disagg_request_id: Option<i64>,
    /// Next-turn KV reuse: the decode's `kv_transfer_params` this prefill
    /// pulls the prefix from (`crate::reuse`).
    pub kv_source: Option<&'a str>,
    /// Randomness (request ids, ranks, rooms).
    pub ids: &'a mut dyn IdSource,
}

impl PdContext<'_> {
    /// The vLLM connector for `pod`: the pod's own, else the model's, else
    /// the router's global one.
    pub fn connector_for(&self, pod: &Endpoint) -> Connector {
        pod.connector(self.model_connector, self.default_connector)
    }

    /// 128 random bits as 32 hex digits (transfer ids, request ids).
    pub fn random_hex(&mut self) -> Result<String, EngineError> {
        let mut out = String::with_capacity(32);
        for _ in 0..2 {
            let r = self
                .ids
                .random_u64()
                .map_err(|e| EngineError::Internal(format!("no randomness: {e}")))?;
            out.push_str(&format!("{r:016x}"));
        }
        Ok(out)
    }
}

/// One leg's edits: its body's top-level members and request headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LegEdits {
    pub body: Edits,
    /// Lower-case names; each replaces the header of that name.
    pub headers: Vec<(String, String)>,
}

impl LegEdits {
    pub fn set_header(&mut self, name: &str, value: impl Into<String>) {
        let value = value.into();
        match self.headers.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = value,
            None => self.headers.push((name.to_owned(), value)),
        }
    }

    /// Nothing to change: the leg is the client's request as sent.
    pub fn is_empty(&self) -> bool {
        self.body.is_empty() && self.headers.is_empty()
    }
}

/// Edits for both legs. The decode leg starts as the client's body: it keeps
/// the client's sampling values; only hand-off fields are added.
#[derive(Debug, Clone, Default)]
pub struct Legs {
    pub prefill: LegEdits,
    pub decode: LegEdits,
}

/// A hand-off that went ahead without something it usually carries: worth
/// a log line and a counter, not a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Degraded {
    /// No hand-off at all: the decode computes the prompt itself.
    HandoffMissing,
    /// TensorRT-LLM: no prompt token ids; the generation server tokenises.
    TokenIdsMissing,
}

//! One inference engine's prefill/decode contract: the trait each engine
//! implements, the prefill answer it reads and what it says to do next.

use crate::body::Members;
use crate::error::{ClientError, EngineError};
use crate::fleet::{Connector, Endpoint, Model};
use crate::handoff::{AbortCall, Degraded, LearnedPods, LegEdits, Legs, PdContext};

/// A prefill answer, parsed once by the flow.
pub struct PrefillAnswer<'a> {
    pub body: &'a [u8],
    pub top: &'a Members,
}

/// What to do once the prefill answer is merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merged {
    /// Send the decode request, with everything the hand-off carries or
    /// without part of it ([`Degraded`]).
    Decode(Option<Degraded>),
    /// The prefill answer already is the client's answer (TensorRT-LLM, when
    /// the context phase finished the generation).
    Answer {
        body: Vec<u8>,
        content_type: &'static str,
    },
}

/// One inference engine's prefill/decode contract.
pub trait EngineHandler {
    /// The name models use in `engine`.
    fn name(&self) -> &'static str;

    /// Whether prefill and decode run concurrently (AIBrix's `IsAsync`): the
    /// decode is sent as soon as the prefill is dispatched, and the prefill
    /// answer is only watched.
    fn concurrent(&self) -> bool;

    /// Whether this split runs concurrently: the engine's rule, unless its
    /// hand-off depends on the pod (vLLM's connectors differ).
    fn concurrent_for(&self, _ctx: &PdContext, _prefill: &Endpoint) -> bool {
        self.concurrent()
    }

    /// Top-level keys this engine's hand-off writes; a client may not send them.
    fn owned_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// What the client sent inside a member the hand-off also writes, kept
    /// for both legs (vLLM's `kv_transfer_params` settings), or why the
    /// request is refused. `None`: nothing to keep.
    fn client_params(
        &self,
        _body: &[u8],
        _top: &Members,
    ) -> Result<Option<Vec<(String, String)>>, ClientError> {
        Ok(None)
    }

    /// Whether `pod` can take a prefill for `model` now; `connector` is the vLLM KV
    /// connector it would hand off with. A pod that is not ready is skipped
    /// when pods are chosen.
    fn prefill_ready(
        &self,
        _model: &Model,
        _pod: &Endpoint,
        _connector: Connector,
        _learned: &LearnedPods,
    ) -> bool {
        true
    }

    /// Whether this request should be split at all with `prefill` as the
    /// prefill pod; if not, it goes to the decode pod whole.
    fn should_split(&self, _ctx: &PdContext, _prefill: &Endpoint) -> bool {
        true
    }

    /// The call that aborts this split's prefill on its pod, when the
    /// stream ends before the prefill answered and the engine has a route
    /// for it. None by default: vLLM's and TensorRT-LLM's servers abort a
    /// request when its connection closes, which a proxy-wasm call cannot
    /// do (docs/engines.md).
    fn prefill_abort(&self, _ctx: &PdContext) -> Option<AbortCall> {
        None
    }

    /// Adds the engine's fields to the legs. The common prefill constraints are
    /// already in `legs.prefill`; a handler may override them.
    fn augment_prefill_request(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError>;

    /// Turns the prefill answer into decode edits (sequential splits only).
    fn merge_prefill_response(
        &self,
        ctx: &mut PdContext,
        answer: &PrefillAnswer,
        pod: &Endpoint,
        decode: &mut LegEdits,
    ) -> Result<Merged, EngineError>;
}

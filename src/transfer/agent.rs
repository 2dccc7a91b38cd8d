//! One KV-transfer protocol's side of the hand-off: the trait each agent
//! implements, and what its merge found in the prefill answer.

use crate::body::Members;
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{LearnedPods, LegEdits, Legs, PdContext};

/// What the prefill answer carried for the decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relay {
    /// Hand-off data was put into the decode body.
    Relayed,
    /// The answer had none: the decode will recompute the prompt by itself.
    Missing,
}

/// One KV-transfer protocol between a prefill and a decode vLLM pod.
pub trait KvTransferAgent {
    fn name(&self) -> &'static str;

    /// Whether the hand-off can serve `n` parallel samples. NIXL blocks are
    /// freed by their first reader, so `n > 1` must not be relayed.
    fn supports_n(&self, n: u64) -> bool {
        n <= 1
    }

    /// Whether the legs run concurrently (the hand-off does not come from
    /// the prefill's answer).
    fn concurrent(&self) -> bool {
        false
    }

    /// Whether `prefill_pod` can hand off now: some protocols need a fact
    /// about the pod that the router learns or is told first.
    fn prefill_ready(&self, _prefill_pod: &Endpoint, _learned: &LearnedPods) -> bool {
        true
    }

    /// Adds this protocol's fields (and headers) to the legs.
    fn augment_prefill(
        &self,
        ctx: &mut PdContext,
        prefill_pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError>;

    /// Reads the prefill answer and adds the hand-off to the decode leg.
    /// By default the answer carries nothing: the hand-off was set up by
    /// [`Self::augment_prefill`] (concurrent connectors, and those whose
    /// pods find each other by request id).
    fn merge(
        &self,
        _answer: &[u8],
        _answer_top: &Members,
        _prefill_pod: &Endpoint,
        _decode: &mut LegEdits,
    ) -> Result<Relay, EngineError> {
        Ok(Relay::Relayed)
    }
}

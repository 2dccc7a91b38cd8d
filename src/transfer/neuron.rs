use super::agent::{KvTransferAgent, Relay};
use crate::body::Members;
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{LegEdits, Legs, PdContext};

/// AIBrix's Neuron variant: the prefill leg carries nothing extra, and the
/// decode receives the whole prefill answer under `disagg_prefill_resp`.
pub struct Neuron;

impl KvTransferAgent for Neuron {
    fn name(&self) -> &'static str {
        "neuron"
    }

    fn augment_prefill(
        &self,
        _ctx: &mut PdContext,
        _prefill_pod: &Endpoint,
        _legs: &mut Legs,
    ) -> Result<(), EngineError> {
        Ok(())
    }

    fn merge(
        &self,
        answer: &[u8],
        _answer_top: &Members,
        _prefill_pod: &Endpoint,
        decode: &mut LegEdits,
    ) -> Result<Relay, EngineError> {
        // The answer was parsed as an object before the agent was called, so
        // it is valid JSON and safe to embed as is.
        decode.body.set_raw_bytes("disagg_prefill_resp", answer);
        Ok(Relay::Relayed)
    }
}

use super::handler::{EngineHandler, Merged, PrefillAnswer};
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{LegEdits, Legs, PdContext};

/// Engines pd-router has no hand-off for: a synchronous prefill with the
/// common constraints (warming the prefill pod's prefix cache, as AIBrix's
/// default does), then the client's body unchanged to the decode.
pub struct DefaultHandler;

impl EngineHandler for DefaultHandler {
    fn name(&self) -> &'static str {
        "default"
    }

    fn concurrent(&self) -> bool {
        false
    }

    fn augment_prefill_request(
        &self,
        _ctx: &mut PdContext,
        _pod: &Endpoint,
        _legs: &mut Legs,
    ) -> Result<(), EngineError> {
        Ok(())
    }

    fn merge_prefill_response(
        &self,
        _ctx: &mut PdContext,
        _answer: &PrefillAnswer,
        _pod: &Endpoint,
        _decode: &mut LegEdits,
    ) -> Result<Merged, EngineError> {
        Ok(Merged::Decode(None))
    }
}

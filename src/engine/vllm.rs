use super::{EngineError, EngineHandler, Legs, Merged, PdContext, PrefillAnswer};
use crate::body::Edits;
use crate::fleet::{Connector, Endpoint};
use crate::transfer::{agent, Handoff};

/// vLLM: delegates the hand-off to the KV-transfer agent of the prefill pod,
/// else of the model, else the router's global default. Sequential: the decode needs
/// the prefill's answer.
pub struct VllmHandler;

impl VllmHandler {
    fn connector(ctx: &PdContext, pod: &Endpoint) -> Connector {
        pod.kv_connector
            .or(ctx.model_connector)
            .unwrap_or(ctx.default_connector)
    }
}

impl EngineHandler for VllmHandler {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn is_async(&self) -> bool {
        false
    }

    fn owned_keys(&self) -> &'static [&'static str] {
        &["kv_transfer_params", "disagg_prefill_resp"]
    }

    fn should_split(&self, ctx: &PdContext, prefill: &Endpoint) -> bool {
        // A NIXL hand-off has one reader; relaying it to n samples would leave
        // the others without blocks (SMG skips the split for n > 1 as well),
        // and a prefill whose blocks are never pulled pins them until vLLM's
        // abort timeout. The decode recomputes instead.
        agent(Self::connector(ctx, prefill)).supports_n(ctx.facts.n)
    }

    fn augment_prefill_request(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        agent(Self::connector(ctx, pod)).augment_prefill(&mut legs.prefill);
        Ok(())
    }

    fn merge_prefill_response(
        &self,
        ctx: &mut PdContext,
        answer: &PrefillAnswer,
        pod: &Endpoint,
        decode: &mut Edits,
    ) -> Result<Merged, EngineError> {
        let agent = agent(Self::connector(ctx, pod));
        Ok(match agent.merge(answer.body, answer.top, pod, decode)? {
            Handoff::Relayed => Merged::Forward,
            Handoff::Missing => Merged::ForwardWithoutHandoff,
        })
    }
}

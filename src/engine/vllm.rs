use super::{EngineError, EngineHandler, Legs, Merged, PdContext, PrefillAnswer};
use crate::body::Edits;
use crate::config::Endpoint;
use crate::transfer::{Connector, Handoff};
use std::cell::Cell;

thread_local! {
    // Envoy gives each VM one thread, so a thread-local is the VM's global.
    static CONNECTOR: Cell<Connector> = const { Cell::new(Connector::Nixl) };
}

/// Sets the KV connector used when neither the prefill pod nor the model
/// names one (the seed's `SetConnectorTypeFunc`; the config's `kv_connector`).
pub fn set_connector_type(connector: Connector) {
    CONNECTOR.with(|c| c.set(connector));
}

/// The global default KV connector.
pub fn connector_type() -> Connector {
    CONNECTOR.with(|c| c.get())
}

/// vLLM: delegates the hand-off to the KV-transfer agent of the prefill pod,
/// else of the model, else the global default. Sequential: the decode needs
/// the prefill's answer.
pub struct VllmHandler;

impl VllmHandler {
    fn connector(ctx: &PdContext, pod: &Endpoint) -> Connector {
        pod.kv_connector
            .or(ctx.model_connector)
            .unwrap_or_else(connector_type)
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
        Self::connector(ctx, prefill)
            .agent()
            .supports_n(ctx.facts.n)
    }

    fn augment_prefill_request(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        Self::connector(ctx, pod)
            .agent()
            .augment_prefill(&mut legs.prefill);
        Ok(())
    }

    fn merge_prefill_response(
        &self,
        ctx: &mut PdContext,
        answer: &PrefillAnswer,
        pod: &Endpoint,
        decode: &mut Edits,
    ) -> Result<Merged, EngineError> {
        let agent = Self::connector(ctx, pod).agent();
        Ok(match agent.merge(answer.body, answer.top, pod, decode)? {
            Handoff::Relayed => Merged::Forward,
            Handoff::Missing => Merged::ForwardWithoutHandoff,
        })
    }
}

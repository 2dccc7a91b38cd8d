use super::handler::{EngineHandler, Merged, PrefillAnswer};
use crate::body::Members;
use crate::error::{ClientError, EngineError};
use crate::fleet::{Connector, Endpoint, Model};
use crate::handoff::{Degraded, LearnedPods, LegEdits, Legs, PdContext};
use crate::transfer::client_params::{self, Refused};
use crate::transfer::{agent, Relay};

/// vLLM: delegates the hand-off to the KV-transfer agent of the prefill pod,
/// else of the model, else the router's global default. Sequential for the
/// pull connectors (the decode needs the prefill's answer), concurrent for
/// Mooncake and NIXL push (the legs pair by an id the router gives both).
pub struct VllmHandler;

impl EngineHandler for VllmHandler {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn concurrent(&self) -> bool {
        false
    }

    fn concurrent_for(&self, ctx: &PdContext, prefill: &Endpoint) -> bool {
        agent(ctx.connector_for(prefill)).concurrent()
    }

    fn prefill_ready(
        &self,
        _model: &Model,
        pod: &Endpoint,
        connector: Connector,
        learned: &LearnedPods,
    ) -> bool {
        agent(connector).prefill_ready(pod, learned)
    }

    fn owned_keys(&self) -> &'static [&'static str] {
        &["disagg_prefill_resp"]
    }

    fn client_params(
        &self,
        body: &[u8],
        top: &Members,
    ) -> Result<Option<Vec<(String, String)>>, ClientError> {
        let Some(raw) = top.raw_non_null(body, "kv_transfer_params") else {
            return Ok(None);
        };
        match client_params::kept(raw) {
            Ok(kept) => Ok(Some(kept)),
            Err(Refused::NotAnObject) => Err(ClientError::BadField {
                field: "kv_transfer_params".into(),
                message: "must be an object".into(),
            }),
            Err(Refused::Renamed { old, new }) => Err(ClientError::BadField {
                field: format!("kv_transfer_params.{old}"),
                message: format!(
                    "is the offloading connector's name from before vLLM renamed it to `{new}`, which vLLM now ignores without a word; `{new}` is hand-off data the router writes, so remove it from the request"
                ),
            }),
            Err(Refused::Owned(key)) => Err(ClientError::RouterOwnedKey {
                key: format!("kv_transfer_params.{key}"),
                engine: self.name().into(),
            }),
        }
    }

    fn should_split(&self, ctx: &PdContext, prefill: &Endpoint) -> bool {
        // A NIXL or Mooncake hand-off has one reader; relaying it to n
        // samples would leave the others without blocks (SMG skips the split
        // for n > 1 as well), and a prefill whose blocks are never pulled
        // pins them until vLLM's abort timeout. The decode recomputes instead.
        agent(ctx.connector_for(prefill)).supports_n(ctx.fields.n)
    }

    fn augment_prefill_request(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        agent(ctx.connector_for(pod)).augment_prefill(ctx, pod, legs)
    }

    fn merge_prefill_response(
        &self,
        ctx: &mut PdContext,
        answer: &PrefillAnswer,
        pod: &Endpoint,
        decode: &mut LegEdits,
    ) -> Result<Merged, EngineError> {
        let agent = agent(ctx.connector_for(pod));
        Ok(match agent.merge(answer.body, answer.top, pod, decode)? {
            Relay::Relayed => Merged::Decode(None),
            Relay::Missing => Merged::Decode(Some(Degraded::HandoffMissing)),
        })
    }
}

use super::agent::{KvTransferAgent, Relay};
use super::answer::kv_transfer_params;
use crate::body::Members;
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{LegEdits, Legs, PdContext};

/// vLLM's `NixlConnector`, pull mode: the decode pulls the prefill's blocks.
///
/// Only `do_remote_decode` is read by the prefill engine; the nulls follow
/// vLLM's own proxy. The answer's `kv_transfer_params` grows with each vLLM
/// release, so it is relayed as raw bytes, never modelled.
pub struct Nixl;

pub(crate) const PREFILL_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// A decode's answered `kv_transfer_params` as the next prefill's (vLLM's
/// bidirectional transfer, `disagg_proxy_multiturn.py`): the decode's dict
/// verbatim, but for the two flags, so the prefill pulls the prefix from
/// the decode and then serves its own blocks to the next decode. `None`
/// when it is not an object (the prefill then computes the prompt).
fn source_params(source: &str) -> Option<String> {
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(source).ok()?;
    v.insert("do_remote_decode".into(), true.into());
    v.insert("do_remote_prefill".into(), false.into());
    serde_json::to_string(&v).ok()
}

impl KvTransferAgent for Nixl {
    fn name(&self) -> &'static str {
        "nixl"
    }

    fn augment_prefill(
        &self,
        ctx: &mut PdContext,
        _prefill_pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        match ctx.kv_source.and_then(source_params) {
            Some(params) => legs.prefill.body.set_raw("kv_transfer_params", params),
            None => legs
                .prefill
                .body
                .set_raw("kv_transfer_params", PREFILL_PARAMS),
        }
        Ok(())
    }

    fn merge(
        &self,
        answer: &[u8],
        answer_top: &Members,
        _prefill_pod: &Endpoint,
        decode: &mut LegEdits,
    ) -> Result<Relay, EngineError> {
        match kv_transfer_params(answer, answer_top)? {
            None => Ok(Relay::Missing),
            Some(raw) => {
                decode.body.set_raw_bytes("kv_transfer_params", raw);
                Ok(Relay::Relayed)
            }
        }
    }
}

use super::agent::{KvTransferAgent, Relay};
use super::answer::kv_transfer_params;
use crate::body::{Edits, Members};
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{LegEdits, Legs, PdContext};

/// AIBrix's `shfs`: NIXL pull mode, but the router overwrites `remote_host`
/// with the prefill pod's IP, for engines that advertise an address the
/// decode cannot reach (a pod-local or wildcard one).
pub struct Shfs;

impl KvTransferAgent for Shfs {
    fn name(&self) -> &'static str {
        "shfs"
    }

    fn augment_prefill(
        &self,
        _ctx: &mut PdContext,
        _prefill_pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        legs.prefill
            .body
            .set_raw("kv_transfer_params", super::nixl::PREFILL_PARAMS);
        Ok(())
    }

    fn merge(
        &self,
        answer: &[u8],
        answer_top: &Members,
        prefill_pod: &Endpoint,
        decode: &mut LegEdits,
    ) -> Result<Relay, EngineError> {
        let Some(raw) = kv_transfer_params(answer, answer_top)? else {
            return Ok(Relay::Missing);
        };
        let params = Members::parse(raw)
            .map_err(|e| EngineError::BadPrefillAnswer(format!("kv_transfer_params: {e}")))?;
        let mut edit = Edits::new();
        edit.set_str("remote_host", &prefill_pod.ip);
        let rewritten = params
            .render(raw, &edit)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        decode.body.set_raw_bytes("kv_transfer_params", &rewritten);
        Ok(Relay::Relayed)
    }
}

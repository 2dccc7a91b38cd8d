use super::agent::KvTransferAgent;
use super::pairing::pair_by_request_id;
use crate::body::json_string;
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{LearnedPods, Legs, PdContext};

/// vLLM's `NixlPushConnector` (checked against vLLM 0.33's
/// `kv_connector/v1/nixl/push_*`): the prefill pushes its blocks into blocks
/// the decode registered, so the legs run concurrently. vLLM pairs the two
/// by request id (the same `X-Request-Id`, or body `request_id` on
/// `/v1/responses`), not by `transfer_id` (sent anyway, as vLLM's demo
/// proxy does: harmless, and what later releases may read). That id is
/// minted here, as the demo proxy mints a uuid4: a client's own id could be
/// sent by two requests in flight at once, and their decodes would then
/// register for, and be pushed, each other's KV. The decode is
/// told the prefill's side channel from configuration (`nixl_push` on the
/// endpoint): vLLM reads `remote_engine_id`, `remote_host`, `remote_port`
/// and `tp_size` by key and fails without one.
pub struct NixlPush;

impl KvTransferAgent for NixlPush {
    fn name(&self) -> &'static str {
        "nixl_push"
    }

    fn concurrent(&self) -> bool {
        true
    }

    /// A discovered pod without its side channel cannot hand off
    /// (configured ones are refused at load).
    fn prefill_ready(&self, pod: &Endpoint, _learned: &LearnedPods) -> bool {
        pod.nixl_push.is_some()
    }

    fn augment_prefill(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        let peer = pod.nixl_push.as_ref().ok_or_else(|| {
            EngineError::NotReady(format!(
                "prefill pod {} has no nixl_push side channel configured (engine_id)",
                pod.name
            ))
        })?;
        // One draw names both: 128 random bits are unique among requests in
        // flight, which is all the pairing needs. The client's id (header
        // or body) is replaced on both legs; the router's log lines carry it.
        let request_id = ctx.random_hex()?;
        pair_by_request_id(ctx, legs, &request_id);
        let transfer_id = json_string(&format!("xfer-{request_id}"));
        legs.prefill.body.set_raw(
            "kv_transfer_params",
            format!(
                r#"{{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null,"transfer_id":{transfer_id}}}"#
            ),
        );
        let host = peer.side_channel_host.as_deref().unwrap_or(&pod.ip);
        legs.decode.body.set_raw(
            "kv_transfer_params",
            format!(
                r#"{{"do_remote_decode":false,"do_remote_prefill":true,"remote_engine_id":{},"remote_host":{},"remote_port":{},"tp_size":{},"pp_size":{},"remote_request_id":{},"transfer_id":{transfer_id}}}"#,
                json_string(&peer.engine_id),
                json_string(host),
                peer.side_channel_port,
                peer.tp_size,
                peer.pp_size,
                json_string(&request_id),
            ),
        );
        Ok(())
    }
}

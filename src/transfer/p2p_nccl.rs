use super::agent::KvTransferAgent;
use super::pairing::pair_by_request_id;
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{Legs, PdContext};

/// vLLM's `P2pNcclConnector`, for the vLLM versions that ship it (it was
/// removed by vLLM PR 44854 in June 2026; checked against its last source):
/// the pods learn each other's ZMQ address from the request id alone, which
/// both legs carry: `___prefill_addr_<ip:port>___decode_addr_<ip:port>_<hex>`.
/// The prefill parses `___decode_addr_(.*):(\d+)` to know where to send, the
/// decode `___prefill_addr_(.*):(\d+)___`. Sequential: the decode gets the
/// client's body unchanged once the prefill answered.
///
/// vLLM ≥ 0.14 appends a random suffix to every request id inside the
/// engine, and P2P NCCL keys its tensors by that internal id, so the two pods
/// never find each other's tensors: run both with
/// `VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1`.
pub struct P2pNccl;

/// The request id that names both pods' ZMQ addresses. `None` for IPv6:
/// vLLM's greedy `(.*):(\d+)` parse takes the address apart wrongly.
pub fn p2p_request_id(prefill: &Endpoint, decode: &Endpoint, nonce: &str) -> Option<String> {
    if prefill.ip.contains(':') || decode.ip.contains(':') {
        return None;
    }
    Some(format!(
        "___prefill_addr_{}:{}___decode_addr_{}:{}_{nonce}",
        prefill.ip, prefill.kv_port, decode.ip, decode.kv_port
    ))
}

impl KvTransferAgent for P2pNccl {
    fn name(&self) -> &'static str {
        "p2p_nccl"
    }

    fn augment_prefill(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        let nonce = ctx.random_hex()?;
        let id = p2p_request_id(pod, ctx.decode_pod, &nonce).ok_or_else(|| {
            EngineError::Unsupported(
                "vLLM P2P NCCL cannot name IPv6 pods in its request ids; use IPv4 pods or another connector".into(),
            )
        })?;
        pair_by_request_id(ctx, legs, &id);
        Ok(())
    }
}

//! vLLM KV-transfer agents: how the prefill's hand-off reaches the decode.
//!
//! The vLLM handler picks an agent per prefill pod (else per model, else the
//! global default) and delegates both halves of the hand-off to it.

pub mod client_params;
mod mooncake;
mod neuron;
mod nixl;
mod nixl_push;
mod p2p_nccl;
mod shfs;

use crate::body::Members;
use crate::error::EngineError;
use crate::fleet::{Connector, Endpoint};
use crate::handoff::{LearnedPods, LegEdits, Legs, PdContext};

pub use mooncake::{parse_query, Mooncake};
pub use neuron::Neuron;
pub use nixl::Nixl;
pub use nixl_push::NixlPush;
pub use p2p_nccl::{p2p_request_id, P2pNccl};
pub use shfs::Shfs;

/// The agent that speaks `connector`.
pub fn agent(connector: Connector) -> &'static dyn KvTransferAgent {
    match connector {
        Connector::Nixl => &Nixl,
        Connector::Shfs => &Shfs,
        Connector::Neuron => &Neuron,
        Connector::Mooncake => &Mooncake,
        Connector::NixlPush => &NixlPush,
        Connector::P2pNccl => &P2pNccl,
    }
}

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

/// Pairs the legs by `id`, an id the router minted: set as both legs'
/// `X-Request-Id`, and for `/v1/responses` and `/inference/v1/generate` as
/// the body's `request_id` too (vLLM reads their id from the body, not the
/// header). Never the client's id: two requests in flight with one id
/// would pair with each other's KV.
fn pair_by_request_id(ctx: &PdContext, legs: &mut Legs, id: &str) {
    let in_body = ctx.fields.api.id_in_body();
    for leg in [&mut legs.prefill, &mut legs.decode] {
        leg.set_header("x-request-id", id.to_owned());
        if in_body {
            leg.body.set_str("request_id", id);
        }
    }
}

/// The `kv_transfer_params` member of a prefill answer, if it is an object.
fn kv_transfer_params<'a>(
    answer: &'a [u8],
    top: &Members,
) -> Result<Option<&'a [u8]>, EngineError> {
    match top.raw_non_null(answer, "kv_transfer_params") {
        None => Ok(None),
        Some(raw) if raw.first() == Some(&b'{') => Ok(Some(raw)),
        Some(_) => Err(EngineError::BadPrefillAnswer(
            "kv_transfer_params in the prefill answer is not an object".into(),
        )),
    }
}

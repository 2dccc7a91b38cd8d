//! vLLM KV-transfer agents: how the prefill's hand-off reaches the decode.
//!
//! The vLLM handler picks an agent per prefill pod (else per model, else the
//! global default) and delegates both halves of the hand-off to it.

mod neuron;
mod nixl;
mod shfs;

use crate::body::{Edits, TopLevel};
use crate::error::EngineError;
use crate::fleet::{Connector, Endpoint};

pub use neuron::Neuron;
pub use nixl::Nixl;
pub use shfs::Shfs;

/// The agent that speaks `connector`.
pub fn agent(connector: Connector) -> &'static dyn KvTransferAgent {
    match connector {
        Connector::Nixl => &Nixl,
        Connector::Shfs => &Shfs,
        Connector::Neuron => &Neuron,
    }
}

/// What the prefill answer carried for the decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
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

    /// Adds this protocol's fields to the prefill leg.
    fn augment_prefill(&self, prefill: &mut Edits);

    /// Reads the prefill answer and adds the hand-off to the decode leg.
    fn merge(
        &self,
        answer: &[u8],
        answer_top: &TopLevel,
        prefill_pod: &Endpoint,
        decode: &mut Edits,
    ) -> Result<Handoff, EngineError>;
}

/// The `kv_transfer_params` member of a prefill answer, if it is an object.
fn kv_transfer_params<'a>(
    answer: &'a [u8],
    top: &TopLevel,
) -> Result<Option<&'a [u8]>, EngineError> {
    match top.raw_non_null(answer, "kv_transfer_params") {
        None => Ok(None),
        Some(raw) if raw.first() == Some(&b'{') => Ok(Some(raw)),
        Some(_) => Err(EngineError::BadPrefillAnswer(
            "kv_transfer_params in the prefill answer is not an object".into(),
        )),
    }
}

//! vLLM KV-transfer agents: how the prefill's hand-off reaches the decode.
//!
//! The vLLM handler picks an agent per prefill pod (else per model, else the
//! global default) and delegates both halves of the hand-off to it.

mod agent;
mod answer;
pub mod client_params;
mod mooncake;
mod neuron;
mod nixl;
mod nixl_push;
mod p2p_nccl;
mod pairing;
mod shfs;

use crate::fleet::Connector;

pub use agent::{KvTransferAgent, Relay};
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

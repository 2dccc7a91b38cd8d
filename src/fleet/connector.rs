/// The vLLM KV connectors pd-router relays hand-offs for. Only the names live
/// here; `transfer` holds what each one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Connector {
    /// vLLM's `NixlConnector` in pull mode: relay `kv_transfer_params` verbatim.
    Nixl,
    /// AIBrix's variant: like `nixl`, with `remote_host` set to the prefill pod IP.
    Shfs,
    /// AIBrix's Neuron variant: the whole prefill answer goes to the decode.
    Neuron,
    /// vLLM's `MooncakeConnector`: legs run concurrently, paired by a
    /// router-minted `transfer_id`; the decode finds the prefill's engine
    /// through its bootstrap server.
    Mooncake,
    /// vLLM's `NixlPushConnector`: legs run concurrently, paired by request
    /// id; the decode is told the prefill's side channel.
    NixlPush,
    /// vLLM's `P2pNcclConnector` (removed from vLLM by PR 44854; for the
    /// versions that still ship it): both pods' ZMQ addresses travel in the
    /// request id.
    P2pNccl,
}

impl Connector {
    /// Every accepted name, in the order the docs list them.
    pub const NAMES: [&'static str; 6] = [
        "nixl",
        "shfs",
        "neuron",
        "mooncake",
        "nixl_push",
        "p2p_nccl",
    ];

    pub fn from_name(name: &str) -> Option<Connector> {
        match name {
            "nixl" => Some(Connector::Nixl),
            "shfs" => Some(Connector::Shfs),
            "neuron" => Some(Connector::Neuron),
            "mooncake" => Some(Connector::Mooncake),
            "nixl_push" => Some(Connector::NixlPush),
            "p2p_nccl" => Some(Connector::P2pNccl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Connector::Nixl => "nixl",
            Connector::Shfs => "shfs",
            Connector::Neuron => "neuron",
            Connector::Mooncake => "mooncake",
            Connector::NixlPush => "nixl_push",
            Connector::P2pNccl => "p2p_nccl",
        }
    }
}

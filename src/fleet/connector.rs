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
}

impl Connector {
    /// Every accepted name, in the order the docs list them.
    pub const NAMES: [&'static str; 3] = ["nixl", "shfs", "neuron"];

    pub fn from_name(name: &str) -> Option<Connector> {
        match name {
            "nixl" => Some(Connector::Nixl),
            "shfs" => Some(Connector::Shfs),
            "neuron" => Some(Connector::Neuron),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Connector::Nixl => "nixl",
            Connector::Shfs => "shfs",
            Connector::Neuron => "neuron",
        }
    }
}

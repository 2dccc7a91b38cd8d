/// vLLM's encoder-cache (EC) connectors, as the router relays their
/// hand-off (E/P/D: encoder pods compute a request's media embeddings
/// before its prefill). Only the names live here; `encoder` holds what each
/// one means for the legs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EcConnector {
    /// vLLM's `ECExampleConnector`: the encoder writes its output to
    /// storage the prefill shares, keyed by the item's hash; its answer is
    /// discarded (llm-d's `ec-example`).
    Example,
    /// Each encoder answer's `ec_transfer_params` (a map keyed by the
    /// item's hash) is merged into one map on the prefill request (vLLM's
    /// `disagg_epd_proxy.py`, llm-d's `ec-nixl`).
    Nixl,
}

impl EcConnector {
    /// Every accepted name, in the order the docs list them.
    pub const NAMES: [&'static str; 2] = ["example", "nixl"];

    pub fn from_name(name: &str) -> Option<EcConnector> {
        match name {
            "example" => Some(EcConnector::Example),
            "nixl" => Some(EcConnector::Nixl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EcConnector::Example => "example",
            EcConnector::Nixl => "nixl",
        }
    }
}

//! What the flow keeps of the client's request headers.

use super::Flow;
use crate::error::PdError;
use crate::fleet::PodId;
use crate::host::{Counter, Host, Level};
use crate::router::picked::{
    read_encoders, read_picked, Picked, DESTINATION_HEADER, ENCODERS_HEADER, KV_SOURCE_HEADER,
    PREFILLER_HEADER,
};

/// Client headers that travel to the prefill leg too: credentials, and trace
/// context so both legs land in one trace.
const FORWARDED_HEADERS: [&str; 14] = [
    "authorization",
    "traceparent",
    "tracestate",
    "baggage",
    "b3",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "x-b3-flags",
    "x-ot-span-context",
    "x-cloud-trace-context",
    "x-datadog-trace-id",
    "x-datadog-parent-id",
];

/// What the flow keeps of the client's request headers.
#[derive(Debug, Default)]
pub(super) struct RequestHead {
    pub id: String,
    pub path: String,
    pub authority: String,
    pub forwarded: Vec<(&'static str, String)>,
    /// The client sent `transfer-encoding` (a new body needs it gone).
    pub chunked: bool,
    /// Executor mode: the pods an endpoint picker chose.
    pub picked: Option<Picked>,
    /// Executor mode: the encoder pods it chose (E/P/D), as addresses.
    pub encoders: Vec<std::net::SocketAddr>,
    /// `Prefer: if-available`: only a decode pod holding the prompt's KV
    /// may serve it, without a prefill (`router::if_available`).
    pub prefer_if_available: bool,
    /// Admission: the objective's priority and the tenant.
    pub priority: i32,
    pub fairness: String,
    /// The headers any model's session affinity reads, as sent.
    pub session_headers: Vec<(String, String)>,
}

/// The first of `names` present in `headers`, as text.
pub(super) fn first_of(headers: &[(String, Vec<u8>)], names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    })
}

/// The headers in `headers` that some model's session affinity names.
pub(super) fn session_headers(
    headers: &[(String, Vec<u8>)],
    fleet: &crate::fleet::Fleet,
) -> Vec<(String, String)> {
    let mut affinities = fleet
        .models()
        .iter()
        .filter_map(|m| m.session.as_ref())
        .peekable();
    // Most fleets have no session affinity: their requests pay one pass
    // over the models, not one per header.
    if affinities.peek().is_none() {
        return Vec::new();
    }
    let affinities: Vec<_> = affinities.collect();
    let named = |k: &str| affinities.iter().any(|s| s.headers.iter().any(|h| h == k));
    headers
        .iter()
        .filter(|(k, _)| named(k))
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

/// The endpoint picker's choice in `headers` (executor mode).
pub(super) fn picked(headers: &[(String, Vec<u8>)]) -> Option<Picked> {
    let value = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    };
    read_picked(value(DESTINATION_HEADER), value(PREFILLER_HEADER))
}

/// The encoder pods the endpoint picker chose, from every value of its
/// header (executor mode).
pub(super) fn encoders(headers: &[(String, Vec<u8>)]) -> Vec<std::net::SocketAddr> {
    read_encoders(
        headers
            .iter()
            .filter(|(k, _)| k == ENCODERS_HEADER)
            .map(|(_, v)| v.as_slice()),
    )
}

/// The client headers that go to the prefill leg too, as sent.
pub(super) fn forwarded(headers: &[(String, Vec<u8>)]) -> Vec<(&'static str, String)> {
    FORWARDED_HEADERS
        .iter()
        .filter_map(|name| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| std::str::from_utf8(v).ok())
                .map(|v| (*name, v.to_owned()))
        })
        .collect()
}

impl Flow {
    /// The picker's headers besides its pods: they are the router's
    /// business, not the engines', so none reaches them. Encoder pods are
    /// read first (`head::encoders`) and serve the encoder leg; a KV source
    /// is one no configured connector can pull from (counted, said once).
    pub(super) fn picker_headers<H: Host>(
        &mut self,
        host: &mut H,
        headers: &[(String, Vec<u8>)],
    ) -> Result<(), PdError> {
        let present = |name: &str| headers.iter().any(|(k, v)| k == name && !v.is_empty());
        for name in [PREFILLER_HEADER, KV_SOURCE_HEADER, ENCODERS_HEADER] {
            if headers.iter().any(|(k, _)| k == name) {
                host.set_request_header(name, None)?;
            }
        }
        if present(KV_SOURCE_HEADER) {
            host.increment(Counter::KvSourceIgnored);
            if self.router.first_time(PodId(0), "kv_source") {
                self.log(
                    host,
                    Level::Info,
                    &format!("{KV_SOURCE_HEADER} from the endpoint picker ignored: no configured connector pulls KV from a peer (vLLM's OffloadingConnector P2P tier); counted by kv_source_ignored (said once)"),
                );
            }
        }
        Ok(())
    }
}

//! Executor mode: an endpoint picker earlier in Envoy's filter chain (the
//! Gateway API Inference Extension's EPP, as llm-d runs it) has chosen the
//! pods, and pd-router performs the hand-off between them instead of
//! choosing its own. The picker names the decode pod in
//! `x-gateway-destination-endpoint` (an ordered fallback list, `ip:port`
//! first) and the prefill pod in `x-prefiller-host-port` (llm-d-router
//! `pkg/common/routing`); only pods discovery knows are used.

use super::Router;
use crate::error::PdError;
use crate::fleet::{Endpoint, Model};
use crate::sched::prefix::PrefixMatch;
use crate::split::{Placement, SplitRequest};
use std::net::SocketAddr;
use std::rc::Rc;

/// The decode endpoint the picker chose (the Inference Extension's header).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The prefill endpoint llm-d's picker chose, when it disaggregates.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// A peer holding more of the prompt's KV than the chosen pods, for
/// vLLM's OffloadingConnector P2P pull (llm-d's `p2p-source-producer`).
/// llm-d's sidecar follows it only on connectors that pull over that tier
/// and ignores it otherwise; pd-router has no such connector, so it is
/// removed and counted (`kv_source_ignored`).
pub const KV_SOURCE_HEADER: &str = "x-kv-cache-source-host-port";
/// The encoder pods llm-d's picker chose for a request with media (E/P/D):
/// `ip:port` entries, comma-separated (llm-d-router
/// `pkg/common/routing/common.go`, `EncoderEndpointsHeader`).
pub const ENCODERS_HEADER: &str = "x-encoder-hosts-ports";

/// What the picker chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Picked {
    pub decode: SocketAddr,
    /// `None`: the picker keeps the request whole on the decode pod.
    pub prefill: Option<SocketAddr>,
}

/// The first `ip:port` of a header value that parses (the destination is a
/// comma-separated fallback list; IPv6 in brackets).
fn first_address(value: &[u8]) -> Option<SocketAddr> {
    std::str::from_utf8(value)
        .ok()?
        .split(',')
        .find_map(|a| a.trim().parse().ok())
}

/// The encoder addresses in the header's `values`: every value, each split
/// on commas (llm-d's sidecar reads them so); entries that are not
/// `ip:port` are dropped.
pub fn read_encoders<'v>(values: impl Iterator<Item = &'v [u8]>) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for v in values {
        let Ok(text) = std::str::from_utf8(v) else {
            continue;
        };
        for a in text.split(',').filter_map(|a| a.trim().parse().ok()) {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

/// The picker's choice from the request's headers, if it made one.
pub fn read_picked(destination: Option<&[u8]>, prefiller: Option<&[u8]>) -> Option<Picked> {
    Some(Picked {
        decode: first_address(destination?)?,
        prefill: prefiller.and_then(first_address),
    })
}

/// `model`'s endpoint at `address` among `pods`.
fn known<'a>(
    pods: impl Iterator<Item = &'a Rc<Endpoint>>,
    address: SocketAddr,
) -> Option<Rc<Endpoint>> {
    let address = address.to_string();
    pods.into_iter().find(|e| e.address == address).cloned()
}

fn unknown(model: &Model, role: &str, address: SocketAddr) -> PdError {
    PdError::Unavailable(format!(
        "the endpoint picker chose {address} as the {role} pod of model `{}`, which discovery does not know as one",
        model.name
    ))
}

impl Router {
    /// The picker's encoders that are encoder pods of `model` (a roleset's
    /// `encode` pod, or a prefill pod that encodes), and the addresses
    /// refused: the header is no way to make the router call an arbitrary
    /// address (llm-d's sidecar keeps an SSRF allowlist for the same
    /// reason).
    pub fn picked_encoders(
        &self,
        model: &Model,
        addresses: &[SocketAddr],
    ) -> (Vec<Rc<Endpoint>>, Vec<SocketAddr>) {
        let encoders = model.rolesets.iter().flat_map(|r| {
            r.encode
                .iter()
                .chain(r.prefill.iter().filter(|p| p.encodes))
        });
        let mut known_ones = Vec::new();
        let mut refused = Vec::new();
        for a in addresses {
            match known(encoders.clone(), *a) {
                Some(e) => known_ones.push(e),
                None => refused.push(*a),
            }
        }
        (known_ones, refused)
    }

    /// The picker's decode pod: a decode or combined pod of `model`. Calls
    /// the router does not split but routes by model go there too.
    pub fn picked_decode(&self, model: &Model, picked: &Picked) -> Result<Rc<Endpoint>, PdError> {
        let decodes = model.rolesets.iter().flat_map(|r| r.decode.iter());
        known(decodes.chain(model.combined.iter()), picked.decode)
            .ok_or_else(|| unknown(model, "decode", picked.decode))
    }

    /// The placement the picker chose: its decode pod (a decode or combined
    /// pod of the model), with its prefill pod (a prefill pod of the model,
    /// or a combined one labelled for both phases) or, without one, whole. A pod discovery does not know is
    /// refused: the picker's headers are not a way to send requests to
    /// arbitrary addresses.
    pub fn place_picked(
        &self,
        request: &SplitRequest,
        picked: &Picked,
    ) -> Result<Placement, PdError> {
        let model = &request.model;
        let decode = self.picked_decode(model, picked)?;
        let Some(prefill_at) = picked.prefill else {
            return Ok(Placement::Combined {
                pod: decode,
                reason: "endpoint picker: whole",
            });
        };
        // llm-d's prefill filter also accepts pods labelled for both phases
        // (`prefill-decode`, `both`, `encode-prefill-decode`): refusing them
        // would answer 503 to a pick llm-d's own sidecar executes.
        let prefills = model
            .rolesets
            .iter()
            .flat_map(|r| r.prefill.iter())
            .chain(model.combined.iter().filter(|e| e.prefill_when_picked));
        let prefill =
            known(prefills, prefill_at).ok_or_else(|| unknown(model, "prefill", prefill_at))?;
        Ok(Placement::Split {
            prefill,
            decode,
            reason: "endpoint picker",
            prefix: PrefixMatch::default(),
            decided: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pickers_headers_name_the_pods() {
        let p = read_picked(Some(b"10.0.0.2:8000,10.0.0.3:8000"), Some(b"10.0.0.1:8000"));
        assert_eq!(
            p,
            Some(Picked {
                decode: "10.0.0.2:8000".parse().expect("addr"),
                prefill: Some("10.0.0.1:8000".parse().expect("addr")),
            })
        );
        let whole = read_picked(Some(b"[fd00::2]:8000"), None).expect("picked");
        assert_eq!(whole.decode, "[fd00::2]:8000".parse().expect("addr"));
        assert_eq!(whole.prefill, None);
        // The first address that parses; no destination, no choice.
        assert_eq!(
            read_picked(Some(b"pod-a, 10.0.0.9:8000"), Some(b"junk")),
            Some(Picked {
                decode: "10.0.0.9:8000".parse().expect("addr"),
                prefill: None
            })
        );
        assert_eq!(read_picked(None, Some(b"10.0.0.1:8000")), None);
        assert_eq!(read_picked(Some(b"nowhere"), None), None);
    }
}

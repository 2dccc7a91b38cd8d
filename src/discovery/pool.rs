//! An InferencePool (the Gateway API Inference Extension's
//! `inference.networking.k8s.io/v1`) as the source of the pods: its
//! `selector.matchLabels` say which pods, its `targetPorts` on which ports.
//! Every target port is an endpoint of its own (`<pod>-rank-<i>`), as the
//! Inference Extension's endpoint picker treats them: a data-parallel rank.

use serde::Deserialize;
use std::collections::BTreeMap;

/// `discovery.kubernetes.inference_pool`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolRef {
    pub name: String,
    /// Unset: the discovery namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The model the pool's pods serve; unset: their model label.
    #[serde(default)]
    pub model: Option<String>,
}

/// What discovery takes from a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    /// The `labelSelector` of its `matchLabels` (`k=v,k=v`, sorted).
    pub selector: String,
    pub ports: Vec<u16>,
}

#[derive(Deserialize)]
struct Pool {
    spec: Spec,
}

#[derive(Deserialize)]
struct Spec {
    selector: Selector,
    #[serde(rename = "targetPorts")]
    target_ports: Vec<Port>,
}

#[derive(Deserialize)]
struct Selector {
    #[serde(rename = "matchLabels")]
    match_labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Port {
    number: u32,
}

/// The pool's path (a GET of one object).
pub fn pool_path(namespace: &str, name: &str) -> String {
    format!(
        "/apis/inference.networking.k8s.io/v1/namespaces/{}/inferencepools/{}",
        encode_segment(namespace),
        encode_segment(name)
    )
}

fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Reads an InferencePool answer.
pub fn read_pool(body: &[u8]) -> Result<PoolView, String> {
    let pool: Pool =
        serde_json::from_slice(body).map_err(|e| format!("not an InferencePool: {e}"))?;
    if pool.spec.selector.match_labels.is_empty() {
        return Err("the pool's selector.matchLabels is empty (it would select every pod)".into());
    }
    let selector = pool
        .spec
        .selector
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut ports = Vec::with_capacity(pool.spec.target_ports.len());
    for p in &pool.spec.target_ports {
        match u16::try_from(p.number) {
            Ok(n) if n != 0 => ports.push(n),
            _ => return Err(format!("target port {} is not a port", p.number)),
        }
    }
    if ports.is_empty() {
        return Err("the pool has no targetPorts".into());
    }
    Ok(PoolView { selector, ports })
}

/// The target ports a pod serves: those its active-ports annotation names
/// (unknown ones ignored), else all.
pub fn active_ports(view: &PoolView, annotation: Option<&str>) -> Vec<u16> {
    let Some(list) = annotation else {
        return view.ports.clone();
    };
    let named: Vec<u16> = list
        .split(',')
        .filter_map(|p| p.trim().parse::<u16>().ok())
        .collect();
    view.ports
        .iter()
        .copied()
        .filter(|p| named.contains(p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_gives_its_selector_and_ports() {
        let body = br#"{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool",
            "metadata":{"name":"p","namespace":"llm"},
            "spec":{"selector":{"matchLabels":{"llm-d.ai/guide":"pd","app":"qwen"}},
                    "targetPorts":[{"number":8000},{"number":8001}],
                    "endpointPickerRef":{"name":"epp","port":{"number":9002}}}}"#;
        let view = read_pool(body).expect("pool");
        assert_eq!(view.selector, "app=qwen,llm-d.ai/guide=pd");
        assert_eq!(view.ports, [8000, 8001]);
        assert_eq!(active_ports(&view, Some("8001, 9999")), [8001]);
        assert_eq!(active_ports(&view, None), [8000, 8001]);
        assert!(read_pool(
            br#"{"spec":{"selector":{"matchLabels":{}},"targetPorts":[{"number":1}]}}"#
        )
        .is_err());
        assert!(read_pool(
            br#"{"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":70000}]}}"#
        )
        .is_err());
        assert!(read_pool(b"<html>").is_err());
        assert_eq!(
            pool_path("llm", "qwen-pool"),
            "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools/qwen-pool"
        );
    }
}

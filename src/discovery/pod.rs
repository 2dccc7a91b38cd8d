//! Reading Pods as the API server serves them (a PodList, or a watch
//! event's object) into the endpoints the router may use: the pod must be
//! Running, Ready, addressed and not terminating; its labels say its model
//! and role in AIBrix's scheme or llm-d's; an InferencePool's target ports
//! give one endpoint each.

use super::kube::{
    labels, nixl_peer, pd_annotations, positive, DiscoveredPod, KubeDiscovery, LabelScheme, Page,
    PodRole, Skipped, DEFAULT_ENGINE, DEFAULT_PORT,
};
use super::pool::{active_ports, PoolView};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    metadata: ListMeta,
    /// `null` when the list is empty, in some servers' answers.
    #[serde(default)]
    items: Option<Vec<Pod>>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "continue")]
    next: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct Pod {
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<PodStatus>,
}

#[derive(Deserialize)]
struct ObjectMeta {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "deletionTimestamp")]
    deletion_timestamp: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Deserialize)]
struct PodStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default, rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<Condition>>,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

/// How to read pods: from the discovery configuration.
#[derive(Debug, Clone, Default)]
pub struct Reader {
    /// Pod names carry their namespace (every namespace is listed).
    pub qualify: bool,
    pub scheme: LabelScheme,
    /// The InferencePool's view: its target ports are the pods' ports.
    pub pool: Option<PoolView>,
    /// The model an InferencePool's pods serve, when configured.
    pub pool_model: Option<String>,
}

impl Reader {
    pub fn of(cfg: &KubeDiscovery) -> Reader {
        Reader {
            qualify: cfg.namespace.is_empty(),
            scheme: cfg.labels,
            pool: cfg.pool.clone(),
            pool_model: cfg.inference_pool.as_ref().and_then(|p| p.model.clone()),
        }
    }
}

/// Reads one PodList answer with AIBrix's labels. `qualify`: pod names
/// carry their namespace (a list over every namespace can hold two pods of
/// one name).
pub fn read_page(body: &[u8], qualify: bool) -> Result<Page, String> {
    read_page_as(
        body,
        &Reader {
            qualify,
            ..Reader::default()
        },
    )
}

/// Reads one PodList answer as `reader` says.
pub fn read_page_as(body: &[u8], reader: &Reader) -> Result<Page, String> {
    let list: PodList = serde_json::from_slice(body).map_err(|e| format!("not a PodList: {e}"))?;
    let mut page = Page {
        next: list.metadata.next.filter(|t| !t.is_empty()),
        resource_version: list.metadata.resource_version.filter(|v| !v.is_empty()),
        ..Page::default()
    };
    for item in list.items.unwrap_or_default() {
        let (name, read) = read_pod(&item, reader);
        match read {
            Ok(pods) => page.pods.extend(pods),
            Err(why) => page.skipped.push((name, why)),
        }
    }
    Ok(page)
}

impl Pod {
    /// `metadata.resourceVersion`, where it is set and not empty.
    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.metadata
            .resource_version
            .as_deref()
            .filter(|v| !v.is_empty())
    }
}

/// A pod's name (with its namespace when qualified) and the endpoints it
/// gives, or why it is not routed to.
pub(crate) fn read_pod(
    item: &Pod,
    reader: &Reader,
) -> (String, Result<Vec<DiscoveredPod>, Skipped>) {
    let name = match (&item.metadata.namespace, reader.qualify) {
        (Some(ns), true) => format!("{ns}/{}", item.metadata.name),
        _ => item.metadata.name.clone(),
    };
    let read = routable(item, &name, reader);
    (name, read)
}

/// The address a routable pod has: Running, Ready, an IP, not terminating
/// (AIBrix's and the endpoint pickers' rules; Running is stricter and
/// harmless, a Ready pod is Running).
fn address(pod: &Pod) -> Result<IpAddr, Skipped> {
    let status = pod.status.as_ref().ok_or(Skipped::NotRunning)?;
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(Skipped::Terminating);
    }
    if status.phase.as_deref() != Some("Running") {
        return Err(Skipped::NotRunning);
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.kind == "Ready" && c.status == "True");
    if !ready {
        return Err(Skipped::NotReady);
    }
    status
        .pod_ip
        .as_deref()
        .and_then(|ip| ip.parse().ok())
        .ok_or(Skipped::NoAddress)
}

/// What a pod's labels say, in either scheme.
struct Labelled {
    model: String,
    role: PodRole,
    engine: String,
    port: u16,
    roleset: String,
    kv_connector: Option<String>,
}

fn routable(pod: &Pod, name: &str, reader: &Reader) -> Result<Vec<DiscoveredPod>, Skipped> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let ip = address(pod)?;
    let l = match reader.scheme {
        LabelScheme::Aibrix => aibrix(labels, annotations, reader)?,
        LabelScheme::LlmD => llm_d(labels, reader)?,
    };
    let bootstrap_port = annotations
        .get(labels::SGLANG_BOOTSTRAP_PORT)
        .and_then(|p| p.trim().parse::<u16>().ok())
        .filter(|p| *p != 0)
        .unwrap_or(crate::fleet::DEFAULT_BOOTSTRAP_PORT);
    let endpoint = |port: u16, name: String, object: String| DiscoveredPod {
        model: l.model.clone(),
        name,
        address: SocketAddr::new(ip, port),
        engine: l.engine.clone(),
        role: l.role,
        roleset: l.roleset.clone(),
        kv_connector: l.kv_connector.clone(),
        bootstrap_port,
        dp_size: positive(annotations, pd_annotations::DP_SIZE).unwrap_or(1),
        kv_port: positive(annotations, pd_annotations::KV_PORT)
            .unwrap_or(crate::fleet::DEFAULT_KV_PORT),
        nixl_push: nixl_peer(annotations),
        object,
    };
    let Some(pool) = &reader.pool else {
        return Ok(vec![endpoint(l.port, name.to_owned(), String::new())]);
    };
    let active = annotations
        .get(labels::LLMD_ACTIVE_PORTS)
        .or_else(|| annotations.get(labels::GIE_ACTIVE_PORTS))
        .map(String::as_str);
    let ports = active_ports(pool, active);
    if ports.is_empty() {
        return Err(Skipped::BadPort(active.unwrap_or("").to_owned()));
    }
    // One endpoint per target port (a data-parallel rank), named as the
    // Inference Extension's picker names them; a single port keeps the
    // pod's name.
    if let [port] = ports[..] {
        return Ok(vec![endpoint(port, name.to_owned(), String::new())]);
    }
    Ok(ports
        .iter()
        .enumerate()
        .map(|(i, p)| endpoint(*p, format!("{name}-rank-{i}"), name.to_owned()))
        .collect())
}

/// AIBrix's labels (label, else annotation, for the model), and its rule
/// that only the HTTP server of a pod group (index 0, no ray worker) serves.
fn aibrix(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    reader: &Reader,
) -> Result<Labelled, Skipped> {
    let model = reader
        .pool_model
        .as_ref()
        .or_else(|| labels.get(labels::MODEL))
        .or_else(|| annotations.get(labels::MODEL))
        .filter(|m| !m.is_empty())
        .ok_or(Skipped::NoModel)?;
    let worker = labels
        .get(labels::RAY_NODE_TYPE)
        .is_some_and(|t| t == "worker")
        || labels
            .get(labels::POD_GROUP_INDEX)
            .is_some_and(|i| i.trim() != "0");
    if worker {
        return Err(Skipped::NotServing);
    }
    let port = match labels.get(labels::PORT) {
        None => DEFAULT_PORT,
        Some(p) => p
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| Skipped::BadPort(p.clone()))?,
    };
    let role = match labels.get(labels::ROLE).map(String::as_str) {
        None | Some("") => PodRole::Both,
        Some("prefill") => PodRole::Prefill,
        Some("decode") => PodRole::Decode,
        Some(other) => return Err(Skipped::OtherRole(other.to_owned())),
    };
    Ok(Labelled {
        model: model.clone(),
        role,
        engine: engine(labels, labels::ENGINE),
        port,
        roleset: labels.get(labels::ROLESET).cloned().unwrap_or_default(),
        kv_connector: labels
            .get(labels::KV_CONNECTOR)
            .map(|c| c.trim().to_ascii_lowercase()),
    })
}

/// llm-d's labels: `llm-d.ai/role` (llm-d-router's by-label filters),
/// `llm-d.ai/model` unless the pool names the model.
fn llm_d(labels: &BTreeMap<String, String>, reader: &Reader) -> Result<Labelled, Skipped> {
    let model = reader
        .pool_model
        .as_ref()
        .or_else(|| labels.get(labels::LLMD_MODEL))
        .filter(|m| !m.is_empty())
        .ok_or(Skipped::NoModel)?;
    let role = match labels.get(labels::LLMD_ROLE).map(String::as_str) {
        Some("prefill") => PodRole::Prefill,
        Some("encode-prefill") => PodRole::EncodePrefill,
        Some("encode") => PodRole::Encode,
        Some("decode") => PodRole::Decode,
        // Both phases: served whole when pd-router places the request, and
        // a prefill pod when llm-d's picker names it as one. An
        // `encode-prefill-decode` pod encodes its own media as well: the
        // router sends it no encoder leg, and never uses it as an encoder.
        Some("prefill-decode") | Some("both") => PodRole::PrefillDecode,
        Some("encode-prefill-decode") => PodRole::EncodePrefillDecode,
        // A pod without the label is one llm-d's decode filter takes and
        // its prefill filter does not: it serves whole requests only.
        None | Some("") => PodRole::Both,
        Some(other) => return Err(Skipped::OtherRole(other.to_owned())),
    };
    Ok(Labelled {
        model: model.clone(),
        role,
        engine: engine(labels, labels::LLMD_ENGINE),
        port: DEFAULT_PORT,
        roleset: String::new(),
        kv_connector: None,
    })
}

fn engine(labels: &BTreeMap<String, String>, key: &str) -> String {
    labels
        .get(key)
        .filter(|e| !e.is_empty())
        .cloned()
        .unwrap_or_else(|| DEFAULT_ENGINE.to_owned())
}

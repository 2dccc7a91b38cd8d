//! The Kubernetes side of discovery: the configuration, the LIST request,
//! and reading a PodList into the pods the router can use (AIBrix's labels
//! and its rules for which pods are routable).

use super::pool::{PoolRef, PoolView};
use crate::fleet::NixlPeer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// `discovery.kubernetes` in the plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeDiscovery {
    /// The Envoy cluster that reaches the API server.
    pub cluster: String,
    #[serde(default = "d_authority")]
    pub authority: String,
    /// Empty: every namespace (`/api/v1/pods`).
    #[serde(default = "d_namespace")]
    pub namespace: String,
    /// The `labelSelector`. Unset: `model.aibrix.ai/name in (<models>)`
    /// over the configured models whose names are label values, else
    /// `model.aibrix.ai/name` (see [`KubeDiscovery::narrow_to`]); empty:
    /// every pod.
    #[serde(default)]
    pub label_selector: Option<String>,
    /// The `fieldSelector`: only Running pods can be routed to, so the API
    /// server need not send the others.
    #[serde(default = "d_field_selector")]
    pub field_selector: String,
    /// List mode: how often the pods are listed. Watch mode: the base of
    /// the backoff after a failure.
    #[serde(default = "d_interval_ms")]
    pub interval_ms: u64,
    #[serde(default = "d_timeout_ms")]
    pub timeout_ms: u64,
    /// The VM environment variable holding the bearer token.
    #[serde(default = "d_token_env")]
    pub token_env: String,
    /// Items per page (`limit`).
    #[serde(default = "d_page_size")]
    pub page_size: u32,
    /// `resourceVersion=0`: the API server answers from its watch cache,
    /// which costs it (and etcd) nothing but ignores `limit` (one answer
    /// holds every pod). `false`: a consistent list, paged by `limit`, from
    /// the cache on Kubernetes 1.34+ and from etcd before.
    #[serde(default = "d_true")]
    pub list_from_cache: bool,
    /// One LIST, then bounded watches from its resourceVersion (`false`: a
    /// LIST every `interval_ms`).
    #[serde(default = "d_true")]
    pub watch: bool,
    /// How long each bounded watch stays open (`timeoutSeconds`): a change
    /// reaches the router at most this much (and a jitter) later.
    #[serde(default = "d_watch_seconds")]
    pub watch_seconds: u64,
    /// A pod set not confirmed by the API server for this long is stale:
    /// logged once, until it is current again.
    #[serde(default = "d_stale_after_ms")]
    pub stale_after_ms: u64,
    /// Whose labels say a pod's model and role: AIBrix's (the default) or
    /// llm-d's (`llm-d.ai/role`).
    #[serde(default)]
    pub labels: LabelScheme,
    /// Read AIBrix's `ModelAdapter` objects every `interval_ms`: which
    /// pods serve which LoRA adapter. Unset: with AIBrix's labels.
    #[serde(default)]
    pub model_adapters: Option<bool>,
    /// The pods are an InferencePool's: its selector and target ports.
    #[serde(default)]
    pub inference_pool: Option<PoolRef>,
    /// The pool as last read (its selector replaces `label_selector`).
    #[serde(skip)]
    pub pool: Option<PoolView>,
}

/// Which labels name a pod's model and role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum LabelScheme {
    /// `model.aibrix.ai/name`, `role-name`, ... (vllm-project/aibrix).
    #[default]
    #[serde(rename = "aibrix")]
    Aibrix,
    /// `llm-d.ai/role` (prefill, decode, prefill-decode), `llm-d.ai/model`.
    #[serde(rename = "llm-d")]
    LlmD,
}

fn d_authority() -> String {
    "kubernetes.default.svc".into()
}
fn d_namespace() -> String {
    "default".into()
}
fn d_field_selector() -> String {
    "status.phase=Running".into()
}
fn d_watch_seconds() -> u64 {
    2
}
fn d_stale_after_ms() -> u64 {
    30_000
}
fn d_interval_ms() -> u64 {
    2000
}
fn d_timeout_ms() -> u64 {
    2000
}
fn d_token_env() -> String {
    "PD_ROUTER_KUBE_TOKEN".into()
}
fn d_page_size() -> u32 {
    500
}
fn d_true() -> bool {
    true
}

/// AIBrix's labels and annotations (vllm-project/aibrix `pkg/constants`).
pub mod labels {
    pub const MODEL: &str = "model.aibrix.ai/name";
    pub const ENGINE: &str = "model.aibrix.ai/engine";
    pub const PORT: &str = "model.aibrix.ai/port";
    pub const ROLE: &str = "role-name";
    pub const ROLESET: &str = "roleset-name";
    pub const KV_CONNECTOR: &str = "model.aibrix.ai/kv-connector-type";
    /// An annotation, not a label.
    pub const SGLANG_BOOTSTRAP_PORT: &str = "model.aibrix.ai/sglang-bootstrap-port";
    /// Multi-pod groups (StormService): only index 0 serves HTTP.
    pub const POD_GROUP_INDEX: &str = "stormservice.orchestration.aibrix.ai/pod-group-index";
    pub const RAY_NODE_TYPE: &str = "ray.io/node-type";
    /// llm-d's (llm-d-router `pkg/epp/framework/plugins/scheduling/filter/bylabel`).
    pub const LLMD_ROLE: &str = "llm-d.ai/role";
    pub const LLMD_MODEL: &str = "llm-d.ai/model";
    pub const LLMD_ENGINE: &str = "llm-d.ai/engine-type";
    /// Which of an InferencePool's target ports a pod serves (llm-d's name,
    /// then the Inference Extension's); absent: all.
    pub const LLMD_ACTIVE_PORTS: &str = "llm-d.ai/active-ports";
    pub const GIE_ACTIVE_PORTS: &str = "inference.networking.k8s.io/active-ports";
}

/// pd-router's own annotations, for hand-off facts AIBrix has no key for.
/// (AIBrix's `data-parallel-size` container env var means vLLM's per-rank
/// HTTP ports, which PD routing does not use; not the same thing.)
pub mod pd_annotations {
    /// Data-parallel ranks behind the pod's one HTTP server (SGLang
    /// `--dp-size` × `--attn-dp-size`; vLLM Mooncake's `_dp<r>` engines).
    pub const DP_SIZE: &str = "pd-router.io/dp-size";
    /// vLLM P2P NCCL: `kv_transfer_config.kv_port`.
    pub const KV_PORT: &str = "pd-router.io/kv-port";
    /// vLLM NIXL push: the prefill's `kv_transfer_config.engine_id`.
    pub const NIXL_ENGINE_ID: &str = "pd-router.io/nixl-engine-id";
    pub const NIXL_SIDE_CHANNEL_HOST: &str = "pd-router.io/nixl-side-channel-host";
    pub const NIXL_SIDE_CHANNEL_PORT: &str = "pd-router.io/nixl-side-channel-port";
    pub const NIXL_TP_SIZE: &str = "pd-router.io/nixl-tp-size";
    pub const NIXL_PP_SIZE: &str = "pd-router.io/nixl-pp-size";
}

pub const DEFAULT_ENGINE: &str = "vllm";
pub const DEFAULT_PORT: u16 = 8000;

/// Which phases a discovered pod serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodRole {
    Prefill,
    Decode,
    /// No role label: both phases, as a combined pod.
    Both,
    /// Labelled for both phases (llm-d's `prefill-decode`, its deprecated
    /// `both`, `encode-prefill-decode`): a combined pod that llm-d's prefill
    /// filter also accepts (llm-d-router v0.9.0
    /// `pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go`,
    /// `NewPrefillRole`), so an endpoint picker may name it as a split's
    /// prefill pod. An unlabelled pod passes only llm-d's decode filter.
    PrefillDecode,
    /// An encoder pod (llm-d's `encode`): computes media embeddings for
    /// its roleset's prefill pods (E/P/D).
    Encode,
    /// A prefill pod that encodes its own media (llm-d's `encode-prefill`):
    /// a request placed on it needs no encoder leg.
    EncodePrefill,
    /// [`PodRole::PrefillDecode`] that encodes its own media too (llm-d's
    /// `encode-prefill-decode`).
    EncodePrefillDecode,
}

/// A pod the router may route to, as read from the API server.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DiscoveredPod {
    pub model: String,
    pub name: String,
    pub address: SocketAddr,
    pub engine: String,
    pub role: PodRole,
    /// Empty when the pod names none.
    pub roleset: String,
    /// The label's value as given (lower-cased); unknown names are kept so
    /// they can be reported, and ignored when the fleet is built.
    pub kv_connector: Option<String>,
    pub bootstrap_port: u16,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub dp_size: u32,
    #[serde(default = "d_kv_port", skip_serializing_if = "is_default_kv_port")]
    pub kv_port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nixl_push: Option<NixlPeer>,
    /// The Kubernetes pod, when it is not `name`: one endpoint per target
    /// port of an InferencePool is named `<pod>-rank-<i>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object: String,
}

impl DiscoveredPod {
    /// The Kubernetes pod this endpoint is (or is a rank of).
    pub fn object(&self) -> &str {
        if self.object.is_empty() {
            &self.name
        } else {
            &self.object
        }
    }
}

fn one() -> u32 {
    1
}
fn is_one(v: &u32) -> bool {
    *v == 1
}
fn d_kv_port() -> u16 {
    crate::fleet::DEFAULT_KV_PORT
}
fn is_default_kv_port(v: &u16) -> bool {
    *v == crate::fleet::DEFAULT_KV_PORT
}

/// A positive number an annotation holds; absent or malformed: `None`.
pub(crate) fn positive<T: std::str::FromStr + PartialEq + Default>(
    annotations: &BTreeMap<String, String>,
    key: &str,
) -> Option<T> {
    annotations
        .get(key)
        .and_then(|v| v.trim().parse::<T>().ok())
        .filter(|v| *v != T::default())
}

/// The NIXL push side channel a prefill pod's annotations describe.
pub(crate) fn nixl_peer(annotations: &BTreeMap<String, String>) -> Option<NixlPeer> {
    let engine_id = annotations
        .get(pd_annotations::NIXL_ENGINE_ID)
        .map(|e| e.trim())
        .filter(|e| !e.is_empty())?;
    Some(NixlPeer {
        engine_id: engine_id.to_owned(),
        side_channel_host: annotations
            .get(pd_annotations::NIXL_SIDE_CHANNEL_HOST)
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty()),
        side_channel_port: positive(annotations, pd_annotations::NIXL_SIDE_CHANNEL_PORT)
            .unwrap_or(crate::fleet::DEFAULT_NIXL_SIDE_CHANNEL_PORT),
        tp_size: positive(annotations, pd_annotations::NIXL_TP_SIZE).unwrap_or(1),
        pp_size: positive(annotations, pd_annotations::NIXL_PP_SIZE).unwrap_or(1),
    })
}

/// Why a listed pod is not routed to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skipped {
    NotRunning,
    NotReady,
    NoAddress,
    Terminating,
    NoModel,
    /// Not the HTTP server of its pod group (AIBrix: pod-group-index > 0, ray workers).
    NotServing,
    BadPort(String),
    OtherRole(String),
}

/// One page of a LIST.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    pub pods: Vec<DiscoveredPod>,
    pub skipped: Vec<(String, Skipped)>,
    /// `metadata.continue`: more pages follow.
    pub next: Option<String>,
    /// `metadata.resourceVersion`: where a watch of this list starts.
    pub resource_version: Option<String>,
}

/// Percent-encodes a query value (RFC 3986 unreserved characters stay).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `value` is a valid label value (apimachinery
/// `IsValidLabelValue`): at most 63 characters, alphanumerics with `-`, `_`
/// and `.` inside.
pub fn is_label_value(value: &str) -> bool {
    let b = value.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            b.len() <= 63
                && f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter().all(inner)
        }
        _ => false,
    }
}

impl KubeDiscovery {
    /// Fills in an unset `label_selector`: the model label with the
    /// configured model names that can be label values (others cannot be
    /// on a pod), so the API server sends only pods the router serves.
    pub fn narrow_to<'a>(&mut self, models: impl IntoIterator<Item = &'a str>) {
        if self.label_selector.is_some() {
            return;
        }
        let label = self.model_label();
        let mut names: Vec<&str> = models.into_iter().filter(|m| is_label_value(m)).collect();
        names.sort_unstable();
        names.dedup();
        self.label_selector = Some(if names.is_empty() {
            label.to_owned()
        } else {
            format!("{label} in ({})", names.join(","))
        });
    }

    /// The label that names a pod's model in this scheme.
    pub fn model_label(&self) -> &'static str {
        match self.labels {
            LabelScheme::Aibrix => labels::MODEL,
            LabelScheme::LlmD => labels::LLMD_MODEL,
        }
    }

    /// Whether `ModelAdapter` objects are read (see `model_adapters`).
    pub fn reads_adapters(&self) -> bool {
        self.model_adapters
            .unwrap_or(self.labels == LabelScheme::Aibrix)
    }

    /// The LIST of `ModelAdapter`s in the discovery namespace (or every
    /// one): a handful of objects, one answer, no paging.
    pub fn adapters_path(&self) -> String {
        let mut path = "/apis/model.aibrix.ai/v1alpha1/".to_owned();
        if !self.namespace.is_empty() {
            path.push_str(&format!("namespaces/{}/", encode(&self.namespace)));
        }
        path.push_str("modeladapters");
        if self.list_from_cache {
            path.push_str("?resourceVersion=0");
        }
        path
    }

    /// The pods asked for: an InferencePool's selector, else
    /// `label_selector`.
    fn selector(&self) -> &str {
        match (&self.pool, &self.label_selector) {
            (Some(pool), _) => &pool.selector,
            (None, Some(s)) => s,
            (None, None) => self.model_label(),
        }
    }

    fn base_path(&self) -> String {
        if self.namespace.is_empty() {
            "/api/v1/pods".to_owned()
        } else {
            format!("/api/v1/namespaces/{}/pods", encode(&self.namespace))
        }
    }

    /// `labelSelector` and `fieldSelector`, those that are set.
    fn selectors(&self) -> Vec<String> {
        let mut q = Vec::with_capacity(2);
        if !self.selector().is_empty() {
            q.push(format!("labelSelector={}", encode(self.selector())));
        }
        if !self.field_selector.is_empty() {
            q.push(format!("fieldSelector={}", encode(&self.field_selector)));
        }
        q
    }

    /// The path of a LIST: the first page, or the one after `next`.
    pub fn list_path(&self, next: Option<&str>) -> String {
        let mut q = self.selectors();
        q.push(format!("limit={}", self.page_size));
        match next {
            // A continue token carries its own resource version.
            Some(token) => q.push(format!("continue={}", encode(token))),
            None if self.list_from_cache => q.push("resourceVersion=0".into()),
            None => {}
        }
        format!("{}?{}", self.base_path(), q.join("&"))
    }

    /// The path of a bounded watch from `resource_version`: the API server
    /// closes it after `watch_seconds`, so the call's answer is complete.
    pub fn watch_path(&self, resource_version: &str) -> String {
        let mut q = self.selectors();
        q.push("watch=1".into());
        q.push("allowWatchBookmarks=true".into());
        q.push(format!("resourceVersion={}", encode(resource_version)));
        q.push(format!("timeoutSeconds={}", self.watch_seconds));
        format!("{}?{}", self.base_path(), q.join("&"))
    }

    /// The bound on one call: a watch stays open `watch_seconds` before it
    /// answers, so its timeout adds that to `timeout_ms`.
    pub fn call_timeout_ms(&self, watching: bool) -> u64 {
        if watching {
            self.timeout_ms
                .saturating_add(self.watch_seconds.saturating_mul(1000))
        } else {
            self.timeout_ms
        }
    }
}

//! The typed configuration: [`Config`] and the groups it gathers the flat
//! JSON keys into, by what each part configures.

use crate::admission::{Admission, Objectives};
use crate::discovery::KubeDiscovery;
use crate::fleet::{Connector, Fleet, Model, Scheduling};
use crate::load::HealthRule;
use crate::trace::Tracing;

/// How the filter tells Envoy where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// ORIGINAL_DST clusters with `use_http_header`: the filter's choice is
    /// the destination, whatever the pod's address.
    #[default]
    OriginalDst,
    /// Clusters a mesh builds (EDS) with Envoy's override_host load
    /// balancing policy: the header names the endpoint; only the cluster's
    /// members are reachable, and a choice that is not one falls back to the
    /// cluster's own policy (the filter counts it, `decode_rerouted`).
    OverrideHost,
}

impl Routing {
    pub const NAMES: [&'static str; 2] = ["original_dst", "override_host"];

    pub(crate) fn from_name(name: &str) -> Option<Routing> {
        match name {
            "original_dst" => Some(Routing::OriginalDst),
            "override_host" => Some(Routing::OverrideHost),
            _ => None,
        }
    }

    /// The header each mode routes by, unless `routing_header` says otherwise.
    pub fn default_header(self) -> &'static str {
        match self {
            Routing::OriginalDst => "x-envoy-original-dst-host",
            Routing::OverrideHost => "x-gateway-destination-endpoint",
        }
    }
}

/// Where requests go and how Envoy is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingSettings {
    pub mode: Routing,
    /// The request header that names the upstream (`routing_header`).
    pub header: String,
    /// The cluster prefill calls go through (`prefill_cluster`).
    pub prefill_cluster: String,
    /// `placement: "epp"`: an endpoint picker earlier in Envoy's filter
    /// chain chooses the pods (`router::picked`).
    pub picker: bool,
}

/// The prefill leg's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillSettings {
    /// `prefill_timeout_ms`.
    pub timeout_ms: u64,
    /// `prefill_max_retries`: other pods tried after a failed prefill.
    pub max_retries: u32,
}

/// Scraping the pods' engine metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeSettings {
    /// `scrape_interval_ms`; 0 turns scraping off.
    pub interval_ms: u64,
    /// `scrape_timeout_ms`.
    pub timeout_ms: u64,
    /// `metrics_ttl_ms`: older readings are not used.
    pub ttl_ms: u64,
    /// `metrics_path`.
    pub path: String,
    /// `metrics_cluster` (default: the prefill cluster).
    pub cluster: String,
}

/// TensorRT-LLM's ids and signatures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrtSettings {
    /// `trt_machine_id`, unless the VM environment names one.
    pub machine_id: u16,
    /// The VM environment variable whose value, when set, is this replica's
    /// TensorRT-LLM machine id (see [`crate::trt_id::machine_id_from`]).
    pub machine_id_env: String,
    /// The VM environment variable holding TensorRT-LLM's shared
    /// `disagg_auth_key`: a secret, so never in the plugin JSON, which Envoy
    /// serves on its admin `/config_dump`.
    pub auth_key_env: String,
}

/// The validated configuration. The JSON is flat; the typed form groups
/// the keys by what they configure.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub routing: RoutingSettings,
    pub prefill: PrefillSettings,
    /// `unhealthy_cooldown_ms` and `eject_after_failures` (prefill failures
    /// in a row, 5xx or timeouts, that eject a pod; an unreachable pod is
    /// ejected at once).
    pub health: HealthRule,
    pub scrape: ScrapeSettings,
    pub trt: TrtSettings,
    pub kv_connector: Connector,
    /// Accepted so that configurations written for earlier versions still
    /// load; it has no effect. vLLM's NIXL lease
    /// (`kv_connector_extra_config.kv_lease_duration`) starts when the
    /// engine finishes the prefill and the decode pod's heartbeats extend
    /// it, and the decode leaves in the callback that receives the
    /// prefill's answer: no router setting bears on it.
    pub kv_lease_ms: u64,
    pub max_body_bytes: usize,
    /// Debugging aid: answers carry `x-pd-prefill-ms` and `x-pd-routing-us`.
    pub timing_headers: bool,
    /// Pods with their own stat series (per VM); later ones count as `other`.
    pub max_pod_stats: usize,
    pub scheduling: Scheduling,
    /// The models as configured, with their static pods.
    pub models: Vec<Model>,
    /// Pods discovered from the Kubernetes API, if configured.
    pub discovery: Option<KubeDiscovery>,
    /// Admission control, when a limit is set.
    pub admission: Option<Admission>,
    /// Objective names to priorities (`x-gateway-inference-objective`).
    pub objectives: Objectives,
    /// Spans per request to an OpenTelemetry collector, when configured.
    pub tracing: Option<Tracing>,
    /// Identifies this configuration's shared-data keys, so a reloaded
    /// configuration never reads another one's state.
    pub fingerprint: String,
}

impl Config {
    /// The configured model named `name`.
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The configured models and their static pods, as a fleet.
    pub fn fleet(&self) -> Fleet {
        Fleet::new(self.models.clone())
    }
}

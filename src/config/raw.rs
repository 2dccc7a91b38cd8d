//! The plugin JSON as serde reads it: every key, its default, nothing
//! checked beyond types (see `validate`). Unknown keys are errors.

use crate::admission::{Admission, Objectives};
use crate::discovery::KubeDiscovery;
use crate::fleet::{Decider, KvReuse, Scheduling, SessionAffinity, TokenRange};
use crate::trace::Tracing;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::fmt;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawConfig {
    pub prefill_cluster: String,
    pub routing: Option<String>,
    /// Default: the routing mode's header.
    pub routing_header: Option<String>,
    pub prefill_timeout_ms: u64,
    pub max_body_bytes: u64,
    pub trt_machine_id: u64,
    pub trt_machine_id_env: String,
    pub trt_auth_key_env: String,
    pub kv_connector: String,
    pub prefill_max_retries: u32,
    pub kv_lease_ms: u64,
    pub unhealthy_cooldown_ms: u64,
    pub eject_after_failures: u32,
    pub scrape_interval_ms: u64,
    pub scrape_timeout_ms: u64,
    pub metrics_ttl_ms: u64,
    pub metrics_path: String,
    pub metrics_cluster: Option<String>,
    pub timing_headers: bool,
    pub max_pod_stats: usize,
    pub scheduling: Scheduling,
    /// `"own"` (default) or `"epp"`: an endpoint picker earlier in the
    /// chain chooses the pods.
    pub placement: Option<String>,
    /// Required unless pods are discovered.
    pub models: Option<Vec<RawModel>>,
    pub discovery: Option<RawDiscovery>,
    pub admission: Option<Admission>,
    pub objectives: Objectives,
    pub tracing: Option<Tracing>,
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            prefill_cluster: "pd_prefill".into(),
            routing: None,
            routing_header: None,
            prefill_timeout_ms: 30_000,
            max_body_bytes: 32 * 1024 * 1024,
            trt_machine_id: 0,
            trt_machine_id_env: "PD_ROUTER_TRT_MACHINE_ID".into(),
            trt_auth_key_env: "PD_ROUTER_TRT_AUTH_KEY".into(),
            kv_connector: "nixl".into(),
            prefill_max_retries: 1,
            kv_lease_ms: 30_000,
            unhealthy_cooldown_ms: 10_000,
            eject_after_failures: 3,
            scrape_interval_ms: 1_000,
            scrape_timeout_ms: 1_000,
            metrics_ttl_ms: 5_000,
            metrics_path: "/metrics".into(),
            metrics_cluster: None,
            timing_headers: false,
            max_pod_stats: 512,
            scheduling: Scheduling::default(),
            placement: None,
            models: None,
            discovery: None,
            admission: None,
            objectives: Objectives::default(),
            tracing: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDiscovery {
    pub kubernetes: KubeDiscovery,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    pub name: String,
    pub engine: String,
    #[serde(default)]
    pub kv_connector: Option<String>,
    #[serde(default)]
    pub prefill_policy: Option<String>,
    #[serde(default)]
    pub decode_policy: Option<String>,
    #[serde(default)]
    pub trt_token_ids_b64: bool,
    #[serde(default)]
    pub schedule_style: Option<String>,
    #[serde(default)]
    pub decider: Option<Decider>,
    #[serde(default)]
    pub session: Option<SessionAffinity>,
    #[serde(default)]
    pub kv_reuse: Option<KvReuse>,
    #[serde(default)]
    pub bytes_per_token: Option<f64>,
    #[serde(default)]
    pub adapters: Vec<String>,
    /// vLLM E/P/D: `"example"` or `"nixl"` (none: no encoder leg).
    #[serde(default)]
    pub ec_connector: Option<String>,
    #[serde(default)]
    pub rolesets: Vec<RawRoleset>,
    #[serde(default)]
    pub combined: Vec<RawEndpoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoleset {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub prefill: Vec<RawEndpoint>,
    #[serde(default)]
    pub decode: Vec<RawEndpoint>,
    /// Encoder pods (E/P/D).
    #[serde(default)]
    pub encode: Vec<RawEndpoint>,
    #[serde(default)]
    pub prompt_tokens: Option<TokenRange>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointSpec {
    pub address: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    #[serde(default)]
    pub kv_connector: Option<String>,
    #[serde(default)]
    pub prompt_tokens: Option<TokenRange>,
    #[serde(default)]
    pub dp_size: Option<u32>,
    #[serde(default)]
    pub kv_port: Option<u16>,
    #[serde(default)]
    pub nixl_push: Option<RawNixlPeer>,
    /// A prefill pod that encodes its own media (no encoder leg).
    #[serde(default)]
    pub encodes: bool,
}

/// vLLM NIXL push: the prefill's side channel, as its engine was started.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNixlPeer {
    pub engine_id: String,
    #[serde(default)]
    pub side_channel_host: Option<String>,
    #[serde(default)]
    pub side_channel_port: Option<u16>,
    #[serde(default)]
    pub tp_size: Option<u32>,
    #[serde(default)]
    pub pp_size: Option<u32>,
}

/// An endpoint is either `"IP:port"` or an object; a custom visitor keeps the
/// error messages specific (serde's untagged enums only say "did not match").
pub(crate) struct RawEndpoint(pub EndpointSpec);

impl<'de> Deserialize<'de> for RawEndpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawEndpoint;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"IP:port\" or an object with \"address\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawEndpoint, E> {
                Ok(RawEndpoint(EndpointSpec {
                    address: v.to_owned(),
                    name: None,
                    bootstrap_port: None,
                    kv_connector: None,
                    prompt_tokens: None,
                    dp_size: None,
                    kv_port: None,
                    nixl_push: None,
                    encodes: false,
                }))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawEndpoint, A::Error> {
                EndpointSpec::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawEndpoint)
            }
        }
        d.deserialize_any(V)
    }
}

//! Plugin configuration: the JSON in Envoy's `configuration`, validated once.
//!
//! Parsing is strict (unknown keys are errors: a misspelt `prefill_timout_ms`
//! silently falling back to a default is worse than a refused config), and
//! every error names the field by its path so one log line says what to fix.

use crate::discovery::KubeDiscovery;
use crate::fleet::{
    fnv1a, Connector, DecodePolicy, Endpoint, EngineKind, Fleet, Model, ModelSettings, NixlPeer,
    PrefillPolicy, RolesetPods, Scheduling, TokenRange, DEFAULT_BOOTSTRAP_PORT,
    DEFAULT_NIXL_SIDE_CHANNEL_PORT,
};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;

/// A configuration error: the JSON path of the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() || self.path == "." {
            write!(f, "pd-router configuration: {}", self.message)
        } else {
            write!(
                f,
                "pd-router configuration: {}: {}",
                self.path, self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "d_prefill_cluster")]
    prefill_cluster: String,
    #[serde(default)]
    routing: Option<String>,
    /// Default: the routing mode's header.
    #[serde(default)]
    routing_header: Option<String>,
    #[serde(default = "d_prefill_timeout_ms")]
    prefill_timeout_ms: u64,
    #[serde(default = "d_max_body_bytes")]
    max_body_bytes: u64,
    #[serde(default)]
    trt_machine_id: u64,
    #[serde(default = "d_trt_machine_id_env")]
    trt_machine_id_env: String,
    #[serde(default = "d_trt_auth_key_env")]
    trt_auth_key_env: String,
    #[serde(default = "d_kv_connector")]
    kv_connector: String,
    #[serde(default = "d_prefill_max_retries")]
    prefill_max_retries: u32,
    #[serde(default = "d_unhealthy_cooldown_ms")]
    unhealthy_cooldown_ms: u64,
    #[serde(default = "d_eject_after_failures")]
    eject_after_failures: u32,
    #[serde(default = "d_scrape_interval_ms")]
    scrape_interval_ms: u64,
    #[serde(default = "d_scrape_timeout_ms")]
    scrape_timeout_ms: u64,
    #[serde(default = "d_metrics_ttl_ms")]
    metrics_ttl_ms: u64,
    #[serde(default = "d_metrics_path")]
    metrics_path: String,
    #[serde(default)]
    metrics_cluster: Option<String>,
    #[serde(default)]
    timing_headers: bool,
    #[serde(default = "d_max_pod_stats")]
    max_pod_stats: usize,
    #[serde(default)]
    scheduling: Scheduling,
    /// Required unless pods are discovered.
    #[serde(default)]
    models: Option<Vec<RawModel>>,
    #[serde(default)]
    discovery: Option<RawDiscovery>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDiscovery {
    kubernetes: KubeDiscovery,
}

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

    fn from_name(name: &str) -> Option<Routing> {
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

fn d_prefill_cluster() -> String {
    "pd_prefill".into()
}
fn d_trt_machine_id_env() -> String {
    "PD_ROUTER_TRT_MACHINE_ID".into()
}
fn d_trt_auth_key_env() -> String {
    "PD_ROUTER_TRT_AUTH_KEY".into()
}
fn d_prefill_timeout_ms() -> u64 {
    30_000
}
fn d_max_body_bytes() -> u64 {
    32 * 1024 * 1024
}
fn d_kv_connector() -> String {
    "nixl".into()
}
fn d_prefill_max_retries() -> u32 {
    1
}
fn d_unhealthy_cooldown_ms() -> u64 {
    10_000
}
fn d_eject_after_failures() -> u32 {
    3
}
fn d_scrape_interval_ms() -> u64 {
    1_000
}
fn d_scrape_timeout_ms() -> u64 {
    1_000
}
fn d_metrics_ttl_ms() -> u64 {
    5_000
}
fn d_max_pod_stats() -> usize {
    512
}
fn d_metrics_path() -> String {
    "/metrics".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    engine: String,
    #[serde(default)]
    kv_connector: Option<String>,
    #[serde(default)]
    prefill_policy: Option<String>,
    #[serde(default)]
    decode_policy: Option<String>,
    #[serde(default)]
    trt_token_ids_b64: bool,
    #[serde(default)]
    rolesets: Vec<RawRoleset>,
    #[serde(default)]
    combined: Vec<RawEndpoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoleset {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    prefill: Vec<RawEndpoint>,
    #[serde(default)]
    decode: Vec<RawEndpoint>,
    #[serde(default)]
    prompt_tokens: Option<TokenRange>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointSpec {
    address: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    kv_connector: Option<String>,
    #[serde(default)]
    prompt_tokens: Option<TokenRange>,
    #[serde(default)]
    dp_size: Option<u32>,
    #[serde(default)]
    kv_port: Option<u16>,
    #[serde(default)]
    nixl_push: Option<RawNixlPeer>,
}

/// vLLM NIXL push: the prefill's side channel, as its engine was started.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNixlPeer {
    engine_id: String,
    #[serde(default)]
    side_channel_host: Option<String>,
    #[serde(default)]
    side_channel_port: Option<u16>,
    #[serde(default)]
    tp_size: Option<u32>,
    #[serde(default)]
    pp_size: Option<u32>,
}

/// An endpoint is either `"IP:port"` or an object; a custom visitor keeps the
/// error messages specific (serde's untagged enums only say "did not match").
struct RawEndpoint(EndpointSpec);

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

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub prefill_cluster: String,
    pub routing: Routing,
    pub routing_header: String,
    pub prefill_timeout_ms: u64,
    pub max_body_bytes: usize,
    pub trt_machine_id: u16,
    /// The VM environment variable whose value, when set, is this replica's
    /// TensorRT-LLM machine id (see [`crate::trt_id::machine_id_from`]).
    pub trt_machine_id_env: String,
    /// The VM environment variable holding TensorRT-LLM's shared
    /// `disagg_auth_key`: a secret, so never in the plugin JSON, which Envoy
    /// serves on its admin `/config_dump`.
    pub trt_auth_key_env: String,
    pub kv_connector: Connector,
    pub prefill_max_retries: u32,
    pub unhealthy_cooldown_ms: u64,
    /// Prefill failures in a row (5xx, timeouts) that eject a pod; an
    /// unreachable pod is ejected at once.
    pub eject_after_failures: u32,
    /// 0 turns scraping off.
    pub scrape_interval_ms: u64,
    pub scrape_timeout_ms: u64,
    pub metrics_ttl_ms: u64,
    pub metrics_path: String,
    pub metrics_cluster: String,
    /// Debugging aid: answers carry `x-pd-prefill-ms` and `x-pd-routing-us`.
    pub timing_headers: bool,
    /// Pods with their own stat series (per VM); later ones count as `other`.
    pub max_pod_stats: usize,
    pub scheduling: Scheduling,
    /// The models as configured, with their static pods.
    pub models: Vec<Model>,
    /// Pods discovered from the Kubernetes API, if configured.
    pub discovery: Option<KubeDiscovery>,
    /// Identifies this configuration's shared-data keys, so a reloaded
    /// configuration never reads another one's state.
    pub fingerprint: String,
}

impl Config {
    /// Parses and validates the plugin configuration.
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
        let de = &mut serde_json::Deserializer::from_slice(json);
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            err(path, e.into_inner().to_string())
        })?;
        let mut config = Self::validate(raw)?;
        config.fingerprint = format!("{:016x}", fnv1a(json));
        Ok(config)
    }

    /// The configured model named `name`.
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The configured models and their static pods, as a fleet.
    pub fn fleet(&self) -> Fleet {
        Fleet::new(self.models.clone())
    }

    fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        check_settings(&raw)?;
        let max_body_bytes = usize::try_from(raw.max_body_bytes)
            .map_err(|_| err("max_body_bytes", "is larger than this platform can address"))?;
        let trt_machine_id = crate::trt_id::validate_trt_machine_id(raw.trt_machine_id)
            .map_err(|e| err("trt_machine_id", e.to_string()))?;
        let kv_connector = parse_connector(&raw.kv_connector, "kv_connector")?;
        let discovery = raw.discovery.map(|d| d.kubernetes);
        if let Some(d) = &discovery {
            check_discovery(d)?;
        }
        let raw_models = raw.models.unwrap_or_default();
        if raw_models.is_empty() && discovery.is_none() {
            return Err(err(
                "models",
                "at least one model is required (or pods discovered: discovery.kubernetes)",
            ));
        }
        let routing = match raw.routing.as_deref() {
            None => Routing::default(),
            Some(r) => Routing::from_name(r).ok_or_else(|| {
                err(
                    "routing",
                    format!(
                        "unknown routing {r:?}; expected one of: {}",
                        Routing::NAMES.join(", ")
                    ),
                )
            })?,
        };
        let routing_header = raw
            .routing_header
            .as_deref()
            .map(str::trim)
            .unwrap_or(routing.default_header())
            .to_owned();
        let mut models: Vec<Model> = Vec::with_capacity(raw_models.len());
        for (mi, m) in raw_models.into_iter().enumerate() {
            if !m.name.is_empty() && models.iter().any(|other| other.name == m.name) {
                return Err(err(
                    format!("models[{mi}].name"),
                    format!("model {:?} is configured twice", m.name),
                ));
            }
            models.push(model(m, &format!("models[{mi}]"))?);
        }
        check_push_peers(&models, kv_connector)?;
        let metrics_cluster = raw
            .metrics_cluster
            .unwrap_or_else(|| raw.prefill_cluster.clone());
        Ok(Config {
            prefill_cluster: raw.prefill_cluster,
            routing,
            routing_header,
            prefill_timeout_ms: raw.prefill_timeout_ms,
            max_body_bytes,
            trt_machine_id,
            trt_machine_id_env: raw.trt_machine_id_env,
            trt_auth_key_env: raw.trt_auth_key_env,
            kv_connector,
            prefill_max_retries: raw.prefill_max_retries,
            unhealthy_cooldown_ms: raw.unhealthy_cooldown_ms,
            eject_after_failures: raw.eject_after_failures.max(1),
            scrape_interval_ms: raw.scrape_interval_ms,
            scrape_timeout_ms: raw.scrape_timeout_ms,
            metrics_ttl_ms: raw.metrics_ttl_ms,
            metrics_path: raw.metrics_path,
            metrics_cluster,
            timing_headers: raw.timing_headers,
            max_pod_stats: raw.max_pod_stats,
            scheduling: raw.scheduling,
            models,
            discovery,
            fingerprint: String::new(),
        })
    }
}

/// The top-level values that have a valid range.
fn check_settings(raw: &RawConfig) -> Result<(), ConfigError> {
    if raw.prefill_cluster.trim().is_empty() {
        return Err(err("prefill_cluster", "must name an Envoy cluster"));
    }
    if let Some(header) = &raw.routing_header {
        let h = header.trim();
        if h.is_empty()
            || !h
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(err(
                "routing_header",
                format!("{header:?} is not a lowercase HTTP header name"),
            ));
        }
    }
    if raw.prefill_timeout_ms == 0 || raw.prefill_timeout_ms > u32::MAX as u64 {
        return Err(err(
            "prefill_timeout_ms",
            format!("must be between 1 and {}", u32::MAX),
        ));
    }
    if raw.max_body_bytes == 0 {
        return Err(err("max_body_bytes", "must be greater than 0"));
    }
    let sch = &raw.scheduling;
    if sch.prefix_block_bytes == 0 {
        return Err(err(
            "scheduling.prefix_block_bytes",
            "must be greater than 0",
        ));
    }
    if sch.prefix_table_slots == 0 {
        return Err(err(
            "scheduling.prefix_table_slots",
            "must be greater than 0",
        ));
    }
    if let Some((name, _)) = sch
        .ratios()
        .into_iter()
        .find(|(_, v)| !v.is_finite() || *v < 0.0)
    {
        return Err(err(
            format!("scheduling.{name}"),
            "must be a finite number >= 0",
        ));
    }
    if raw.scrape_interval_ms > 0 && raw.scrape_timeout_ms == 0 {
        return Err(err("scrape_timeout_ms", "must be greater than 0"));
    }
    if !raw.metrics_path.starts_with('/') {
        return Err(err("metrics_path", "must start with /"));
    }
    Ok(())
}

/// `discovery.kubernetes`: values with a valid range.
fn check_discovery(d: &KubeDiscovery) -> Result<(), ConfigError> {
    let p = "discovery.kubernetes";
    if d.cluster.trim().is_empty() {
        return Err(err(
            format!("{p}.cluster"),
            "must name the Envoy cluster that reaches the API server",
        ));
    }
    if d.authority.trim().is_empty() {
        return Err(err(format!("{p}.authority"), "must not be empty"));
    }
    if d.interval_ms < 100 {
        return Err(err(format!("{p}.interval_ms"), "must be at least 100"));
    }
    if d.timeout_ms == 0 || d.timeout_ms > u32::MAX as u64 {
        return Err(err(
            format!("{p}.timeout_ms"),
            format!("must be between 1 and {}", u32::MAX),
        ));
    }
    if d.page_size == 0 {
        return Err(err(format!("{p}.page_size"), "must be greater than 0"));
    }
    Ok(())
}

/// One `models[]` entry, validated, with its static pods.
fn model(m: RawModel, mp: &str) -> Result<Model, ConfigError> {
    if m.name.is_empty() {
        return Err(err(format!("{mp}.name"), "must not be empty"));
    }
    if m.trt_token_ids_b64 && EngineKind::of(&m.engine) != EngineKind::Trtllm {
        return Err(err(
            format!("{mp}.trt_token_ids_b64"),
            format!(
                "is a TensorRT-LLM hand-off, and this model's engine is {:?}: remove it, or \
                 set \"engine\": \"trtllm\"",
                m.engine
            ),
        ));
    }
    let settings = ModelSettings {
        kv_connector: m
            .kv_connector
            .as_deref()
            .map(|c| parse_connector(c, &format!("{mp}.kv_connector")))
            .transpose()?,
        prefill_policy: policy(
            m.prefill_policy.as_deref(),
            &format!("{mp}.prefill_policy"),
            PrefillPolicy::from_name,
            &PrefillPolicy::NAMES,
        )?,
        decode_policy: policy(
            m.decode_policy.as_deref(),
            &format!("{mp}.decode_policy"),
            DecodePolicy::from_name,
            &DecodePolicy::NAMES,
        )?,
        trt_token_ids_b64: m.trt_token_ids_b64,
        name: m.name,
        engine: m.engine,
    };
    let endpoints = |list: Vec<RawEndpoint>, path: &str| {
        list.into_iter()
            .enumerate()
            .map(|(ei, e)| endpoint(e.0, &format!("{path}[{ei}]")))
            .collect::<Result<Vec<_>, _>>()
    };
    let mut rolesets = Vec::with_capacity(m.rolesets.len());
    for (ri, rs) in m.rolesets.into_iter().enumerate() {
        let rp = format!("{mp}.rolesets[{ri}]");
        if let Some(r) = rs.prompt_tokens {
            check_range(r, &format!("{rp}.prompt_tokens"))?;
        }
        rolesets.push(RolesetPods {
            name: rs.name.unwrap_or_else(|| format!("rs{ri}")),
            prefill: endpoints(rs.prefill, &format!("{rp}.prefill"))?,
            decode: endpoints(rs.decode, &format!("{rp}.decode"))?,
            prompt_tokens: rs.prompt_tokens,
        });
    }
    let combined = endpoints(m.combined, &format!("{mp}.combined"))?;
    Ok(Model::new(settings, rolesets, combined))
}

/// vLLM NIXL push tells the decode where the prefill's side channel is, and
/// only configuration knows: a push prefill pod without it could never serve.
fn check_push_peers(models: &[Model], global: Connector) -> Result<(), ConfigError> {
    for (mi, m) in models.iter().enumerate() {
        if m.kind != EngineKind::Vllm {
            continue;
        }
        for (ri, rs) in m.rolesets.iter().enumerate() {
            for (pi, p) in rs.prefill.iter().enumerate() {
                let connector = p.connector(m.kv_connector, global);
                if connector == Connector::NixlPush && p.nixl_push.is_none() {
                    return Err(err(
                        format!("models[{mi}].rolesets[{ri}].prefill[{pi}]"),
                        "the nixl_push connector needs the pod's side channel: \
                         add \"nixl_push\": {\"engine_id\": ...} (its kv_transfer_config.engine_id)",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A policy name, or the default when absent.
fn policy<P: Default>(
    name: Option<&str>,
    path: &str,
    from_name: fn(&str) -> Option<P>,
    names: &[&str],
) -> Result<P, ConfigError> {
    match name {
        None => Ok(P::default()),
        Some(n) => from_name(n).ok_or_else(|| {
            err(
                path,
                format!(
                    "unknown policy {n:?}; expected one of: {}",
                    names.join(", ")
                ),
            )
        }),
    }
}

fn check_range(r: TokenRange, path: &str) -> Result<(), ConfigError> {
    if r.min > r.max {
        return Err(err(path, format!("min {} is above max {}", r.min, r.max)));
    }
    Ok(())
}

fn parse_connector(name: &str, path: &str) -> Result<Connector, ConfigError> {
    Connector::from_name(name).ok_or_else(|| {
        err(
            path,
            format!(
                "unknown KV connector {name:?}; expected one of: {}",
                Connector::NAMES.join(", ")
            ),
        )
    })
}

fn endpoint(spec: EndpointSpec, path: &str) -> Result<Endpoint, ConfigError> {
    // ORIGINAL_DST routes to the header's address without DNS, so only a
    // literal IP:port can work.
    let addr: SocketAddr = spec.address.parse().map_err(|_| {
        err(
            format!("{path}.address"),
            format!(
                "{:?} is not a literal IP:port (host names are not resolved)",
                spec.address
            ),
        )
    })?;
    if addr.port() == 0 {
        return Err(err(format!("{path}.address"), "port must not be 0"));
    }
    if spec.bootstrap_port == Some(0) {
        return Err(err(format!("{path}.bootstrap_port"), "must not be 0"));
    }
    if let Some(r) = spec.prompt_tokens {
        check_range(r, &format!("{path}.prompt_tokens"))?;
    }
    let mut e = Endpoint::new(addr, spec.name);
    e.bootstrap_port = spec.bootstrap_port.unwrap_or(DEFAULT_BOOTSTRAP_PORT);
    e.kv_connector = spec
        .kv_connector
        .as_deref()
        .map(|c| parse_connector(c, &format!("{path}.kv_connector")))
        .transpose()?;
    e.prompt_tokens = spec.prompt_tokens;
    if let Some(dp) = spec.dp_size {
        if dp == 0 {
            return Err(err(format!("{path}.dp_size"), "must be at least 1"));
        }
        e.dp_size = dp;
    }
    if let Some(port) = spec.kv_port {
        if port == 0 {
            return Err(err(format!("{path}.kv_port"), "must not be 0"));
        }
        e.kv_port = port;
    }
    if let Some(n) = spec.nixl_push {
        e.nixl_push = Some(nixl_peer(n, &format!("{path}.nixl_push"))?);
    }
    Ok(e)
}

fn nixl_peer(n: RawNixlPeer, path: &str) -> Result<NixlPeer, ConfigError> {
    if n.engine_id.trim().is_empty() {
        return Err(err(
            format!("{path}.engine_id"),
            "must be the prefill's kv_transfer_config.engine_id",
        ));
    }
    let size = |v: Option<u32>, field: &str| match v {
        Some(0) => Err(err(format!("{path}.{field}"), "must be at least 1")),
        v => Ok(v.unwrap_or(1)),
    };
    if n.side_channel_port == Some(0) {
        return Err(err(format!("{path}.side_channel_port"), "must not be 0"));
    }
    Ok(NixlPeer {
        engine_id: n.engine_id,
        side_channel_host: n.side_channel_host.filter(|h| !h.trim().is_empty()),
        side_channel_port: n
            .side_channel_port
            .unwrap_or(DEFAULT_NIXL_SIDE_CHANNEL_PORT),
        tp_size: size(n.tp_size, "tp_size")?,
        pp_size: size(n.pp_size, "pp_size")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::DEFAULT_KV_PORT;

    const EXAMPLE: &str = r#"{
      "prefill_cluster": "pd_prefill",
      "routing_header": "x-envoy-original-dst-host",
      "prefill_timeout_ms": 30000,
      "max_body_bytes": 33554432,
      "trt_machine_id": 0,
      "kv_connector": "nixl",
      "models": [
        { "name": "Qwen/Qwen3-8B", "engine": "vllm", "kv_connector": "shfs",
          "rolesets": [
            { "name": "rs0",
              "prefill": ["10.0.0.1:8000", {"address": "10.0.0.3:8000", "name": "prefill-1", "bootstrap_port": 8998, "kv_connector": "nixl"}],
              "decode":  ["10.0.0.2:8000"] } ] } ]
    }"#;

    fn parse_err(json: &str) -> String {
        Config::parse(json.as_bytes())
            .expect_err("should be rejected")
            .to_string()
    }

    #[test]
    fn base64_token_ids_are_a_tensorrt_llm_setting() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"trtllm","trt_token_ids_b64":true,"rolesets":[]}]}"#,
        )
        .expect("valid");
        assert!(c.model("m").expect("model").trt_token_ids_b64);
        let e = parse_err(
            r#"{"models":[{"name":"m","engine":"vllm","trt_token_ids_b64":true,"rolesets":[]}]}"#,
        );
        assert!(
            e.contains("models[0].trt_token_ids_b64") && e.contains("\"vllm\""),
            "{e}"
        );
    }

    #[test]
    fn parses_the_documented_example() {
        let c = Config::parse(EXAMPLE.as_bytes()).expect("valid");
        assert_eq!(c.kv_connector, Connector::Nixl);
        let m = c.model("Qwen/Qwen3-8B").expect("model");
        assert_eq!(m.kv_connector, Some(Connector::Shfs));
        let rs = &m.rolesets[0];
        assert_eq!(rs.prefill[0].name, "10.0.0.1:8000");
        assert_eq!(rs.prefill[0].bootstrap_port, DEFAULT_BOOTSTRAP_PORT);
        assert_eq!(rs.prefill[1].name, "prefill-1");
        assert_eq!(rs.prefill[1].ip, "10.0.0.3");
        assert_eq!(rs.prefill[1].kv_connector, Some(Connector::Nixl));
        assert!(rs.is_eligible());
    }

    #[test]
    fn shipped_plugin_configurations_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/wasm-config");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).expect("wasm-config/") {
            let path = entry.expect("entry").path();
            let raw = std::fs::read(&path).expect("read");
            Config::parse(&raw).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
        assert!(n >= 6);
    }

    #[test]
    fn defaults_apply_to_every_key_but_models() {
        let c = Config::parse(br#"{"models":[{"name":"m","engine":"x","rolesets":[]}]}"#)
            .expect("valid");
        assert_eq!(c.prefill_cluster, "pd_prefill");
        assert_eq!(c.routing_header, "x-envoy-original-dst-host");
        assert_eq!(c.prefill_timeout_ms, 30_000);
        assert_eq!(c.max_body_bytes, 33_554_432);
        assert_eq!(c.trt_machine_id, 0);
        assert_eq!(c.kv_connector, Connector::Nixl);
    }

    #[test]
    fn ipv6_endpoints_keep_brackets_for_routing_and_drop_them_for_hosts() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"sglang","rolesets":[{"prefill":["[::1]:30000"],"decode":["[::1]:30001"]}]}]}"#,
        )
        .expect("valid");
        let p = &c.models[0].rolesets[0].prefill[0];
        assert_eq!(p.address, "[::1]:30000");
        assert_eq!(p.ip, "::1");
    }

    #[test]
    fn errors_name_the_field_and_the_fix() {
        assert_eq!(
            parse_err(r#"{"models":[{"name":"m","engine":"v","rolesets":[{"prefill":["vllm-0:8000"]}]}]}"#),
            "pd-router configuration: models[0].rolesets[0].prefill[0].address: \"vllm-0:8000\" is not a literal IP:port (host names are not resolved)"
        );
        assert!(parse_err(r#"{"prefill_timout_ms":1,"models":[]}"#)
            .contains("unknown field `prefill_timout_ms`"));
        assert!(parse_err(
            r#"{"kv_connector":"lmcache","models":[{"name":"m","engine":"v","rolesets":[]}]}"#
        )
        .contains(
            "kv_connector: unknown KV connector \"lmcache\"; expected one of: nixl, shfs, neuron, mooncake, nixl_push, p2p_nccl"
        ));
        assert!(parse_err(
            r#"{"trt_machine_id":1024,"models":[{"name":"m","engine":"v","rolesets":[]}]}"#
        )
        .starts_with("pd-router configuration: trt_machine_id: "));
        assert!(parse_err(r#"{"models":[]}"#).contains("models: at least one model"));
        assert!(parse_err(r#"{}"#).contains("models: at least one model is required"));
        assert!(parse_err(r#"{"models":[{"name":"m","engine":"v","rolesets":[{"decode":[{"adress":"1.2.3.4:5"}]}]}]}"#)
            .contains("models[0].rolesets[0].decode[0]"));
        assert!(
            parse_err(r#"{"models":[{"name":"m","engine":"v","rolesets":[{"decode":[7]}]}]}"#)
                .contains("\"IP:port\" or an object")
        );
        assert!(parse_err(r#"{"routing_header":"X-Bad Header","models":[{"name":"m","engine":"v","rolesets":[]}]}"#)
            .contains("routing_header"));
        assert!(parse_err(r#"{"models":[{"name":"m","engine":"v","rolesets":[]},{"name":"m","engine":"v","rolesets":[]}]}"#)
            .contains("models[1].name: model \"m\" is configured twice"));
        assert!(parse_err("not json").starts_with("pd-router configuration: "));
        assert!(parse_err(r#"{"kv_connector":"nixl_push","models":[{"name":"m","engine":"vllm","rolesets":[{"prefill":["1.2.3.4:5"],"decode":["1.2.3.4:6"]}]}]}"#)
            .contains("models[0].rolesets[0].prefill[0]: the nixl_push connector needs the pod's side channel"));
        assert!(parse_err(r#"{"models":[{"name":"m","engine":"sglang","rolesets":[{"prefill":[{"address":"1.2.3.4:5","dp_size":0}]}]}]}"#)
            .contains("prefill[0].dp_size: must be at least 1"));
    }

    #[test]
    fn hand_off_settings_reach_the_endpoint() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","kv_connector":"nixl_push","rolesets":[{
                "prefill":[{"address":"10.0.0.1:8000","dp_size":2,"kv_port":21001,
                            "nixl_push":{"engine_id":"prefill-0","tp_size":2}}],
                "decode":["10.0.0.2:8000"]}]}]}"#,
        )
        .expect("valid");
        let p = &c.models[0].rolesets[0].prefill[0];
        assert_eq!((p.dp_size, p.kv_port), (2, 21001));
        let peer = p.nixl_push.as_ref().expect("peer");
        assert_eq!(peer.engine_id, "prefill-0");
        assert_eq!(peer.side_channel_host, None);
        assert_eq!(peer.side_channel_port, DEFAULT_NIXL_SIDE_CHANNEL_PORT);
        assert_eq!((peer.tp_size, peer.pp_size), (2, 1));
        assert_eq!(c.trt_auth_key_env, "PD_ROUTER_TRT_AUTH_KEY");
        let d = &c.models[0].rolesets[0].decode[0];
        assert_eq!((d.dp_size, d.kv_port), (1, DEFAULT_KV_PORT));
    }
}

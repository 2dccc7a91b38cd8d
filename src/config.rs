//! Plugin configuration: the JSON in Envoy's `configuration`, validated once.
//!
//! Parsing is strict (unknown keys are errors: a misspelt `prefill_timout_ms`
//! silently falling back to a default is worse than a refused config), and
//! every error names the field by its path so one log line says what to fix.

use crate::transfer::Connector;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::HashMap;
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

/// Default SGLang bootstrap port, as in SGLang's `--disaggregation-bootstrap-port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "d_prefill_cluster")]
    prefill_cluster: String,
    #[serde(default = "d_routing_header")]
    routing_header: String,
    #[serde(default = "d_prefill_timeout_ms")]
    prefill_timeout_ms: u64,
    #[serde(default = "d_max_body_bytes")]
    max_body_bytes: u64,
    #[serde(default)]
    trt_machine_id: u64,
    #[serde(default = "d_kv_connector")]
    kv_connector: String,
    models: Vec<RawModel>,
}

fn d_prefill_cluster() -> String {
    "pd_prefill".into()
}
fn d_routing_header() -> String {
    "x-envoy-original-dst-host".into()
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    engine: String,
    #[serde(default)]
    kv_connector: Option<String>,
    rolesets: Vec<RawRoleset>,
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

/// One engine pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `IP:port` as the routing header wants it (IPv6 in brackets).
    pub address: String,
    /// The IP alone: SGLang's `bootstrap_host`, AIBrix's `remote_host` rewrite.
    pub ip: String,
    pub name: String,
    pub bootstrap_port: u16,
    pub kv_connector: Option<Connector>,
}

/// Prefill and decode pods that belong together (AIBrix's roleset: pods of one
/// roleset share a KV-transfer fabric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roleset {
    pub name: String,
    pub prefill: Vec<Endpoint>,
    pub decode: Vec<Endpoint>,
}

impl Roleset {
    /// Only a roleset with both roles can serve a split request.
    pub fn is_eligible(&self) -> bool {
        !self.prefill.is_empty() && !self.decode.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub name: String,
    /// Free text: unknown engines get the default handler.
    pub engine: String,
    pub kv_connector: Option<Connector>,
    pub rolesets: Vec<Roleset>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub prefill_cluster: String,
    pub routing_header: String,
    pub prefill_timeout_ms: u64,
    pub max_body_bytes: usize,
    pub trt_machine_id: u16,
    pub kv_connector: Connector,
    pub models: Vec<Model>,
    by_name: HashMap<String, usize>,
}

impl Config {
    /// Parses and validates the plugin configuration.
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
        let de = &mut serde_json::Deserializer::from_slice(json);
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            err(path, e.into_inner().to_string())
        })?;
        Self::validate(raw)
    }

    /// The model named `name`, exactly as the client spelt it.
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.model_entry(name).map(|(_, m)| m)
    }

    /// The model named `name` and its index in `models`.
    pub fn model_entry(&self, name: &str) -> Option<(usize, &Model)> {
        self.by_name.get(name).map(|i| (*i, &self.models[*i]))
    }

    fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        if raw.prefill_cluster.trim().is_empty() {
            return Err(err("prefill_cluster", "must name an Envoy cluster"));
        }
        let header = raw.routing_header.trim();
        if header.is_empty()
            || !header
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(err(
                "routing_header",
                format!(
                    "{:?} is not a lowercase HTTP header name",
                    raw.routing_header
                ),
            ));
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
        let max_body_bytes = usize::try_from(raw.max_body_bytes)
            .map_err(|_| err("max_body_bytes", "is larger than this platform can address"))?;
        let trt_machine_id = crate::trt_id::validate_trt_machine_id(raw.trt_machine_id)
            .map_err(|e| err("trt_machine_id", e.to_string()))?;
        let kv_connector = parse_connector(&raw.kv_connector, "kv_connector")?;
        if raw.models.is_empty() {
            return Err(err("models", "at least one model is required"));
        }

        let mut models = Vec::with_capacity(raw.models.len());
        let mut by_name = HashMap::new();
        for (mi, m) in raw.models.into_iter().enumerate() {
            let mp = format!("models[{mi}]");
            if m.name.is_empty() {
                return Err(err(format!("{mp}.name"), "must not be empty"));
            }
            if by_name.insert(m.name.clone(), mi).is_some() {
                return Err(err(
                    format!("{mp}.name"),
                    format!("model {:?} is configured twice", m.name),
                ));
            }
            let model_connector = m
                .kv_connector
                .as_deref()
                .map(|c| parse_connector(c, &format!("{mp}.kv_connector")))
                .transpose()?;
            let mut rolesets = Vec::with_capacity(m.rolesets.len());
            for (ri, rs) in m.rolesets.into_iter().enumerate() {
                let rp = format!("{mp}.rolesets[{ri}]");
                let endpoints = |list: Vec<RawEndpoint>, role: &str| {
                    list.into_iter()
                        .enumerate()
                        .map(|(ei, e)| endpoint(e.0, &format!("{rp}.{role}[{ei}]")))
                        .collect::<Result<Vec<_>, _>>()
                };
                rolesets.push(Roleset {
                    name: rs.name.unwrap_or_else(|| format!("rs{ri}")),
                    prefill: endpoints(rs.prefill, "prefill")?,
                    decode: endpoints(rs.decode, "decode")?,
                });
            }
            models.push(Model {
                name: m.name,
                engine: m.engine,
                kv_connector: model_connector,
                rolesets,
            });
        }
        Ok(Config {
            prefill_cluster: raw.prefill_cluster,
            routing_header: header.to_owned(),
            prefill_timeout_ms: raw.prefill_timeout_ms,
            max_body_bytes,
            trt_machine_id,
            kv_connector,
            models,
            by_name,
        })
    }
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
    let kv_connector = spec
        .kv_connector
        .as_deref()
        .map(|c| parse_connector(c, &format!("{path}.kv_connector")))
        .transpose()?;
    let address = addr.to_string();
    Ok(Endpoint {
        ip: addr.ip().to_string(),
        name: spec.name.unwrap_or_else(|| address.clone()),
        address,
        bootstrap_port: spec.bootstrap_port.unwrap_or(DEFAULT_BOOTSTRAP_PORT),
        kv_connector,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "kv_connector: unknown KV connector \"lmcache\"; expected one of: nixl, shfs, neuron"
        ));
        assert!(parse_err(
            r#"{"trt_machine_id":1024,"models":[{"name":"m","engine":"v","rolesets":[]}]}"#
        )
        .starts_with("pd-router configuration: trt_machine_id: "));
        assert!(parse_err(r#"{"models":[]}"#).contains("models: at least one model"));
        assert!(parse_err(r#"{}"#).contains("missing field `models`"));
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
    }
}

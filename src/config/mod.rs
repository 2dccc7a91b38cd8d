//! Plugin configuration: the JSON in Envoy's `configuration`, validated once.
//!
//! Parsing is strict (unknown keys are errors: a misspelt `prefill_timout_ms`
//! silently falling back to a default is worse than a refused config), and
//! every error names the field by its path so one log line says what to fix.
//!
//! [`raw`] holds the JSON as serde reads it, with every default; [`validate`]
//! checks it and builds the typed [`Config`], grouped by what each part
//! configures.

mod error;
mod raw;
mod settings;
mod validate;

use crate::fleet::{fnv1a, fnv1a_extend};
use raw::RawConfig;

use error::err;

pub use error::ConfigError;
pub use settings::{
    Config, PrefillSettings, Routing, RoutingSettings, ScrapeSettings, TrtSettings,
};

impl Config {
    /// Parses and validates the plugin configuration.
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
        // A JSON string holding the configuration: what Envoy Gateway
        // passes when an EnvoyExtensionPolicy's `config` is a string (as the
        // kustomize package renders it, from the one plugin.json).
        let unwrapped = serde_json::from_slice::<String>(json).ok();
        let json = unwrapped.as_deref().map_or(json, str::as_bytes);
        let de = &mut serde_json::Deserializer::from_slice(json);
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            err(path, e.into_inner().to_string())
        })?;
        let mut config = validate::config(raw)?;
        // The build's shared-data layout is part of it: VMs of a module
        // whose records differ (an update in place, same `vm_id`) never
        // read each other's bytes.
        let layout = crate::pods::SHARED_LAYOUT.as_bytes();
        config.fingerprint = format!("{:016x}", fnv1a_extend(fnv1a(layout), json));
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{
        Connector, DEFAULT_BOOTSTRAP_PORT, DEFAULT_KV_PORT, DEFAULT_NIXL_SIDE_CHANNEL_PORT,
    };

    #[test]
    fn a_configuration_given_as_a_json_string_is_read_as_its_content() {
        let inner = r#"{"models":[{"name":"m","engine":"vllm","rolesets":[{"name":"r","prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#;
        let wrapped = serde_json::to_vec(inner).expect("json");
        let a = Config::parse(inner.as_bytes()).expect("plain");
        let b = Config::parse(&wrapped).expect("wrapped");
        assert_eq!(a.models.len(), b.models.len());
        assert_eq!(a.fingerprint, b.fingerprint, "the same configuration");
        let bad = serde_json::to_vec(r#"{"models": 1}"#).expect("json");
        assert!(Config::parse(&bad).is_err());
    }

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
    fn admission_is_on_only_with_a_limit() {
        let parse = |adm: &str| {
            Config::parse(
                format!(r#"{{"admission":{adm},"objectives":{{"batch":-1}},"models":[{{"name":"m","engine":"vllm"}}]}}"#)
                    .as_bytes(),
            )
        };
        let c = parse(r#"{"max_in_flight_per_pod":4,"queue_ttl_ms":800}"#).expect("valid");
        let a = c.admission.expect("on");
        assert_eq!(
            (a.max_in_flight_per_pod, a.queue_ttl_ms, a.max_queued),
            (4, 800, 1000)
        );
        assert_eq!(c.objectives.priority(Some("batch")), -1);
        assert!(
            parse("{}").expect("valid").admission.is_none(),
            "no limit: off"
        );
        for (adm, at) in [
            (
                r#"{"max_in_flight_per_pod":1,"queue_ttl_ms":0}"#,
                "admission.queue_ttl_ms",
            ),
            (
                r#"{"max_in_flight_per_pod":1,"max_queued":0}"#,
                "admission.max_queued",
            ),
            (
                r#"{"max_waiting_per_pod":1,"tick_ms":5}"#,
                "admission.tick_ms",
            ),
            (r#"{"max_in_flight":1}"#, "max_in_flight"),
        ] {
            let e = parse(adm).expect_err("refused").to_string();
            assert!(e.contains(at), "{adm}: {e}");
        }
    }

    #[test]
    fn adapter_names_are_distinct_from_models_and_each_other() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","adapters":["sql","chat"],"rolesets":[]}]}"#,
        )
        .expect("valid");
        assert_eq!(c.model("m").expect("model").adapters, ["sql", "chat"]);
        for (json, at) in [
            (
                r#"[{"name":"m","engine":"vllm","adapters":[""]}]"#,
                "models[0].adapters[0]",
            ),
            (
                r#"[{"name":"m","engine":"vllm","adapters":["m"]}]"#,
                "models[0].adapters[0]",
            ),
            (
                r#"[{"name":"m","engine":"vllm","adapters":["a","a"]}]"#,
                "models[0].adapters[1]",
            ),
            (
                r#"[{"name":"m","engine":"vllm","adapters":["n"]},{"name":"n","engine":"vllm"}]"#,
                "models[0].adapters[0]",
            ),
            (
                r#"[{"name":"m","engine":"vllm","adapters":["a"]},{"name":"n","engine":"vllm","adapters":["a"]}]"#,
                "models[1].adapters[0]",
            ),
        ] {
            let e = parse_err(&format!(r#"{{"models":{json}}}"#));
            assert!(e.contains(at), "{json}: {e}");
        }
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
    fn generation_first_is_a_tensorrt_llm_schedule_style() {
        let model = |engine: &str, style: &str| {
            format!(
                r#"{{"models":[{{"name":"m","engine":"{engine}","schedule_style":"{style}","rolesets":[]}}]}}"#
            )
        };
        let c = Config::parse(model("trtllm", "generation_first").as_bytes()).expect("valid");
        assert!(c.model("m").expect("model").trt_generation_first);
        let c = Config::parse(model("trtllm", "context_first").as_bytes()).expect("valid");
        assert!(!c.model("m").expect("model").trt_generation_first);
        for engine in ["vllm", "sglang"] {
            let e = parse_err(&model(engine, "generation_first"));
            assert!(
                e.contains("models[0].schedule_style") && e.contains(&format!("{engine:?}")),
                "{e}"
            );
        }
        let e = parse_err(&model("trtllm", "gen_first"));
        assert!(
            e.contains("models[0].schedule_style") && e.contains("generation_first"),
            "{e}"
        );
    }

    #[test]
    fn tracing_needs_a_collector_cluster_and_names_a_bad_field() {
        let with = |tracing: &str| {
            format!(
                r#"{{"tracing":{tracing},"models":[{{"name":"m","engine":"vllm","rolesets":[]}}]}}"#
            )
        };
        let c = Config::parse(with(r#"{"cluster":"otel"}"#).as_bytes()).expect("valid");
        let t = c.tracing.expect("on");
        assert_eq!((t.path.as_str(), t.authority()), ("/v1/traces", "otel"));
        for (tracing, field) in [
            (r#"{}"#, "tracing.cluster"),
            (r#"{"cluster":"otel","path":"v1/traces"}"#, "tracing.path"),
            (
                r#"{"cluster":"otel","max_buffered_spans":0}"#,
                "tracing.max_buffered_spans",
            ),
            (
                r#"{"cluster":"otel","sample_ratio":1.5}"#,
                "tracing.sample_ratio",
            ),
            (r#"{"cluster":"otel","endpoint":"x"}"#, "endpoint"),
        ] {
            let e = parse_err(&with(tracing));
            assert!(e.contains(field), "{tracing}: {e}");
        }
    }

    #[test]
    fn kv_reuse_is_a_vllm_nixl_setting_keyed_by_sessions() {
        let model = |extra: &str| {
            format!(r#"{{"models":[{{"name":"m","engine":"vllm","rolesets":[]{extra}}}]}}"#)
        };
        let c = Config::parse(model(r#","session":{},"kv_reuse":{}"#).as_bytes()).expect("valid");
        let r = c.model("m").and_then(|m| m.kv_reuse).expect("on");
        assert_eq!((r.ttl_ms, r.max_entries), (450_000, 4096));
        for (extra, needle) in [
            (r#","kv_reuse":{}"#, "needs `session`"),
            (
                r#","session":{},"kv_reuse":{"ttl_ms":0}"#,
                "models[0].kv_reuse.ttl_ms",
            ),
            (
                r#","session":{},"kv_reuse":{"max_entries":0}"#,
                "models[0].kv_reuse.max_entries",
            ),
            (
                r#","session":{},"kv_reuse":{},"kv_connector":"mooncake""#,
                "nixl",
            ),
        ] {
            let e = parse_err(&model(extra));
            assert!(
                e.contains("models[0].kv_reuse") && e.contains(needle),
                "{extra}: {e}"
            );
        }
        let e = parse_err(
            r#"{"models":[{"name":"m","engine":"sglang","session":{},"kv_reuse":{},"rolesets":[]}]}"#,
        );
        assert!(
            e.contains("models[0].kv_reuse") && e.contains("sglang"),
            "{e}"
        );
    }

    #[test]
    fn the_ec_connector_is_a_vllm_setting_its_encoders_need() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","ec_connector":"nixl","rolesets":[
                {"prefill":[{"address":"10.0.0.1:8000","encodes":true}],"decode":["10.0.0.2:8000"],
                 "encode":["10.0.0.3:8000","10.0.0.4:8000"]}]}]}"#,
        )
        .expect("valid");
        let m = c.model("m").expect("model");
        assert_eq!(m.ec_connector, Some(crate::fleet::EcConnector::Nixl));
        assert_eq!(m.rolesets[0].encode.len(), 2);
        assert!(m.rolesets[0].prefill[0].encodes && !m.rolesets[0].encode[0].encodes);
        assert_eq!(m.endpoints().len(), 4, "encoders are the model's pods too");
        for (json, at, says) in [
            (
                r#"{"name":"m","engine":"sglang","ec_connector":"nixl","rolesets":[]}"#,
                "models[0].ec_connector",
                "\"sglang\"",
            ),
            (
                r#"{"name":"m","engine":"vllm","ec_connector":"mooncake","rolesets":[]}"#,
                "models[0].ec_connector",
                "example, nixl",
            ),
            (
                r#"{"name":"m","engine":"vllm","rolesets":[{"encode":["10.0.0.3:8000"]}]}"#,
                "models[0].rolesets[0].encode",
                "models[0].ec_connector",
            ),
            (
                r#"{"name":"m","engine":"vllm","ec_connector":"example","rolesets":[{"encode":["nope"]}]}"#,
                "models[0].rolesets[0].encode[0].address",
                "literal IP:port",
            ),
        ] {
            let e = parse_err(&format!(r#"{{"models":[{json}]}}"#));
            assert!(e.contains(at) && e.contains(says), "{json}: {e}");
        }
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
        assert_eq!(c.routing.prefill_cluster, "pd_prefill");
        assert_eq!(c.routing.header, "x-envoy-original-dst-host");
        assert_eq!(c.prefill.timeout_ms, 30_000);
        assert_eq!(c.max_body_bytes, 33_554_432);
        assert_eq!(c.trt.machine_id, 0);
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
        assert_eq!(c.trt.auth_key_env, "PD_ROUTER_TRT_AUTH_KEY");
        let d = &c.models[0].rolesets[0].decode[0];
        assert_eq!((d.dp_size, d.kv_port), (1, DEFAULT_KV_PORT));
    }

    #[test]
    fn session_affinity_is_off_unless_configured_and_errors_name_the_field() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[]},
                {"name":"s","engine":"sglang","session":{"headers":["X-Conversation"]},"rolesets":[]}]}"#,
        )
        .expect("config");
        assert_eq!(c.model("m").expect("m").session, None);
        let s = c.model("s").expect("s").session.clone().expect("session");
        assert_eq!(
            s.headers,
            ["x-conversation"],
            "lower case, as Envoy hands them"
        );
        assert_eq!(
            s.body_fields,
            crate::fleet::SessionAffinity::default().body_fields
        );
        assert_eq!(s.load_factor, 1.5);
        for (session, field) in [
            (r#"{"load_factor":0.5}"#, "models[0].session.load_factor"),
            (r#"{"headers":["a b"]}"#, "models[0].session.headers[0]"),
            (
                r#"{"body_fields":["metadata..id"]}"#,
                "models[0].session.body_fields[0]",
            ),
            (r#"{"headers":[],"body_fields":[]}"#, "models[0].session"),
            (r#"{"sticky":true}"#, "sticky"),
        ] {
            let e = parse_err(&format!(
                r#"{{"models":[{{"name":"m","engine":"vllm","session":{session},"rolesets":[]}}]}}"#
            ));
            assert!(e.contains(field), "{session}: {e}");
        }
    }

    #[test]
    fn a_decider_is_off_unless_configured_and_refused_where_decodes_cannot_serve_whole() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[]},
                {"name":"d","engine":"vllm","decider":{"min_uncached_tokens":64},"bytes_per_token":3.5,"rolesets":[]}]}"#,
        )
        .expect("valid");
        assert_eq!(c.model("m").expect("m").decider, None);
        let d = c.model("d").expect("d");
        let decider = d.decider.expect("decider");
        assert_eq!(
            (
                decider.min_prompt_tokens,
                decider.min_uncached_tokens,
                decider.prefill_saturated_local
            ),
            (256, 64, false)
        );
        assert_eq!(d.bytes_per_token, 3.5);
        let e =
            parse_err(r#"{"models":[{"name":"s","engine":"sglang","decider":{},"rolesets":[]}]}"#);
        assert!(
            e.contains(
                "models[0].decider: SGLang decode servers refuse requests without bootstrap data"
            ),
            "{e}"
        );
        let e = parse_err(
            r#"{"models":[{"name":"m","engine":"vllm","bytes_per_token":0,"rolesets":[]}]}"#,
        );
        assert!(
            e.contains("models[0].bytes_per_token: must be a finite number above 0"),
            "{e}"
        );
        let e = parse_err(
            r#"{"models":[{"name":"m","engine":"vllm","decider":{"min_tokens":1},"rolesets":[]}]}"#,
        );
        assert!(e.contains("unknown field `min_tokens`"), "{e}");
    }
}

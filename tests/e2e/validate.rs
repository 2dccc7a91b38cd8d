//! `envoy --mode validate`: the shipped configurations load, a bad plugin
//! configuration is refused with a line that says what to fix.

use crate::harness::*;
use serde_json::Value;
use std::process::Command;

fn validate(yaml: &str) -> (bool, String) {
    let scratch = Scratch::new("validate");
    let path = scratch.0.join("envoy.yaml");
    std::fs::write(&path, yaml).expect("write");
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn shipped_envoy_yaml_and_every_wasm_config_validate() {
    let shipped = std::fs::read_to_string(repo().join("envoy.yaml"))
        .expect("envoy.yaml")
        .replace(
            "filename: target/wasm32-wasip1/release/pd_router.wasm",
            &format!("filename: {}", wasm_path().display()),
        );
    let (ok, out) = validate(&shipped);
    assert!(ok, "envoy.yaml does not validate:\n{out}");

    let mut n = 0;
    for entry in std::fs::read_dir(repo().join("wasm-config")).expect("wasm-config/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let config: Value = serde_json::from_slice(&std::fs::read(&path).expect("read"))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (ok, out) = validate(&test_envoy_yaml(&config, &wasm_path()));
        assert!(ok, "{} does not validate:\n{out}", path.display());
        n += 1;
    }
    assert!(
        n >= 6,
        "expected a plugin configuration per engine/connector, found {n}"
    );
}

#[test]
fn a_bad_plugin_configuration_is_refused_with_the_field_named() {
    let bad = serde_json::json!({"models": [{"name": "m", "engine": "vllm",
        "rolesets": [{"prefill": ["vllm-prefill-0:8000"], "decode": ["127.0.0.1:1"]}]}]});
    let (ok, out) = validate(&test_envoy_yaml(&bad, &wasm_path()));
    assert!(!ok, "a bad config must be refused:\n{out}");
    assert!(
        out.contains("pd-router configuration: models[0].rolesets[0].prefill[0].address: \\\"vllm-prefill-0:8000\\\" is not a literal IP:port")
            || out.contains("pd-router configuration: models[0].rolesets[0].prefill[0].address: \"vllm-prefill-0:8000\" is not a literal IP:port"),
        "{out}"
    );
    // E/P/D's encoder leg is vLLM's: SGLang's prefill calls its encoders.
    let epd = serde_json::json!({"models": [{"name": "m", "engine": "sglang",
        "ec_connector": "nixl", "rolesets": []}]});
    let (ok, out) = validate(&test_envoy_yaml(&epd, &wasm_path()));
    assert!(!ok, "ec_connector on SGLang must be refused:\n{out}");
    assert!(out.contains("models[0].ec_connector"), "{out}");
    let typo = serde_json::json!({"prefill_timout_ms": 5, "models": []});
    let (ok, out) = validate(&test_envoy_yaml(&typo, &wasm_path()));
    assert!(!ok);
    assert!(out.contains("unknown field `prefill_timout_ms`"), "{out}");
}

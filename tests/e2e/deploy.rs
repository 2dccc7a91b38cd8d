//! deploy/: every overlay of the kustomize package renders (`kubectl
//! kustomize`), every rendered manifest validates, and every Envoy
//! configuration the manifests produce (plain Envoy, Istio, Envoy Gateway in
//! both xDS name schemes, Envoy Gateway with override_host) loads in Envoy
//! with the built module and its plugin configuration.
//!
//! The checks themselves live beside the manifests: `deploy/validate.py`
//! (YAML, Kubernetes' JSON schemas, the hand-kept Envoy Gateway schemas, the
//! assembled Envoy configurations and what Envoy cannot check: flags, cluster
//! names, routes, token, mounts) and `deploy/validate-istio.mjs` (Istio and
//! Gateway API CRD schemas). This test runs them, then `envoy --mode validate`
//! on each assembled configuration, and reports every failure at once.

use crate::harness::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `just setup` lines that install what this test runs.
const SETUP_PIP: &str =
    r#".venv/bin/pip install "PyYAML==6.0.4" "jsonschema==4.26.0" "kubernetes-validate==1.37.0""#;
const SETUP_NPM: &str =
    "npm ci --prefix .tools/node (deploy/node/package.json and package-lock.json copied there)";

const VARIANTS: [&str; 7] = [
    "envoy",
    "envoy-epp",
    "istio",
    "inference-pool",
    "envoy-gateway",
    "envoy-gateway/override-host",
    "envoy-gateway/xds-name-scheme-v2",
];

/// Istio 1.28's Envoy line: the Istio configuration must load there too
/// (`just setup` installs it, as `just envoy-versions` does).
const ISTIO_ENVOY: &str = ".tools/envoy-1.36.4/bin/envoy";

/// A ConfigMap (deploy/envoy: `pd-router-wasm`) holds at most 1 MiB.
const CONFIGMAP_LIMIT: u64 = 1 << 20;

fn python() -> PathBuf {
    repo().join(".venv/bin/python")
}

fn node_modules() -> PathBuf {
    repo().join(".tools/node/node_modules/@kubernetes-models")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run(cmd: &mut Command, what: &str) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("could not run {what}: {e}"))
}

/// Fails, naming the `just setup` step, if a tool the checks need is missing.
fn require_tools() {
    let py = python();
    assert!(
        py.exists(),
        "{} not found: run `just setup` (it creates .venv)",
        py.display()
    );
    let out = run(
        Command::new(&py).args(["-c", "import yaml, jsonschema, kubernetes_validate"]),
        "python",
    );
    assert!(
        out.status.success(),
        "PyYAML / jsonschema / kubernetes-validate missing from .venv: run `just setup` (the step `{SETUP_PIP}`)\n{}",
        text(&out)
    );
    let out = Command::new("kubectl")
        .args(["kustomize", "--help"])
        .output();
    assert!(
        out.is_ok_and(|o| o.status.success()),
        "kubectl not found on PATH: deploy/ is a kustomize package rendered with `kubectl kustomize` (kubectl 1.27 or later, kustomize v5)"
    );
    let out = Command::new("node").arg("--version").output();
    assert!(
        out.is_ok_and(|o| o.status.success()),
        "node not found on PATH (Node.js, which `just setup`'s npm step also needs)"
    );
    for pkg in ["istio", "gateway-api"] {
        let path = node_modules().join(pkg).join("package.json");
        assert!(
            path.exists(),
            "{} not found: run `just setup` (the step `{SETUP_NPM}`)",
            path.display()
        );
    }
}

fn yaml_files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read deploy/") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().and_then(|e| e.to_str()) == Some("yaml") {
            let rel = path.strip_prefix(repo()).expect("under the repo");
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// The lines of an Envoy log that say why it refused a configuration.
fn why(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[critical]") || l.contains("[error]"))
        .collect();
    let tail = &lines[lines.len().saturating_sub(8)..];
    if tail.is_empty() {
        log.lines().rev().take(8).collect::<Vec<_>>().join("\n")
    } else {
        tail.join("\n")
    }
}

#[test]
fn every_deploy_manifest_validates_and_its_envoy_configuration_loads() {
    require_tools();
    let wasm = wasm_path();
    let envoy = envoy_bin();
    let scratch = Scratch::new("deploy");
    let mut failures: Vec<String> = Vec::new();

    // (a) YAML, (b) Kubernetes schemas, (d) Envoy Gateway schemas, and the
    // assembled Envoy configurations with their cross-checks.
    let out = run(
        Command::new(python())
            .arg(repo().join("deploy/validate.py"))
            .arg("--out")
            .arg(&scratch.0)
            .arg("--wasm")
            .arg(&wasm),
        "deploy/validate.py",
    );
    if !out.status.success() {
        failures.push(format!("deploy/validate.py:\n{}", text(&out)));
    }
    let report: Value = serde_json::from_slice(
        &std::fs::read(scratch.0.join("report.json")).unwrap_or_else(|e| {
            panic!("deploy/validate.py wrote no report ({e}):\n{}", text(&out))
        }),
    )
    .expect("report.json");

    // Nothing under deploy/ escapes the checks.
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    assert!(
        files.len() >= 10,
        "expected the deploy/ manifests, found {files:?}"
    );
    for file in &files {
        match report["files"][file.as_str()].as_array() {
            None => failures.push(format!("{file}: not read by deploy/validate.py")),
            Some(docs) => {
                for doc in docs {
                    if doc["checks"].as_array().is_none_or(|c| c.is_empty()) {
                        failures.push(format!(
                            "{file} document {} ({}/{}): no check applies to it",
                            doc["index"], doc["kind"], doc["name"]
                        ));
                    }
                }
            }
        }
    }

    // (c) Istio and Gateway API objects.
    let out = run(
        Command::new("node")
            .arg(repo().join("deploy/validate-istio.mjs"))
            .arg(scratch.0.join("node-docs.json")),
        "node deploy/validate-istio.mjs",
    );
    if !out.status.success() {
        failures.push(format!("deploy/validate-istio.mjs:\n{}", text(&out)));
    }
    assert!(
        report["node_docs"].as_u64().unwrap_or(0) >= 6,
        "expected the Istio and Gateway API objects, got {}",
        report["node_docs"]
    );

    // (e) Each assembled configuration in Envoy, with the module; in parallel.
    let bootstraps = report["bootstraps"].as_array().cloned().unwrap_or_default();
    let got: BTreeSet<&str> = bootstraps
        .iter()
        .filter_map(|b| b["variant"].as_str())
        .collect();
    for want in VARIANTS {
        if !got.contains(want) {
            failures.push(format!("{want}: no Envoy configuration was assembled"));
        }
    }
    let istio_envoy = repo().join(ISTIO_ENVOY);
    assert!(
        istio_envoy.exists(),
        "{} not found: run `just setup` (it installs Envoy 1.36.4 for the Istio configuration)",
        istio_envoy.display()
    );
    // Each configuration on Envoy 1.40; Istio's also on its 1.36.
    let mut jobs: Vec<(&Value, PathBuf)> = bootstraps.iter().map(|b| (b, envoy.clone())).collect();
    jobs.extend(
        bootstraps
            .iter()
            .filter(|b| b["variant"] == "istio" || b["variant"] == "inference-pool")
            .map(|b| (b, istio_envoy.clone())),
    );
    let runs: Vec<_> = jobs
        .into_iter()
        .map(|(b, envoy)| {
            let path = PathBuf::from(b["path"].as_str().expect("path"));
            let label = format!(
                "{}: the Envoy configuration of {} (on {})",
                b["variant"].as_str().unwrap_or("?"),
                b["made_of"].as_str().unwrap_or("?"),
                envoy.display()
            );
            std::thread::spawn(move || {
                let out = Command::new(&envoy)
                    .args(["--mode", "validate", "--disable-hot-restart", "-c"])
                    .arg(&path)
                    .output()
                    .expect("run envoy");
                (label, path, out)
            })
        })
        .collect();
    for handle in runs {
        let (label, path, out) = handle.join().expect("envoy thread");
        let log = text(&out);
        if !out.status.success() {
            failures.push(format!(
                "{label}: envoy --mode validate refuses it ({}):\n{}",
                path.display(),
                why(&log)
            ));
        }
    }

    // The plain-Envoy deployment ships the module gzipped in a ConfigMap,
    // as deploy/README.md says to make it.
    let gz = Command::new("gzip")
        .args(["-9c"])
        .arg(&wasm)
        .output()
        .expect("run gzip");
    assert!(gz.status.success(), "gzip: {}", text(&gz));
    let size = gz.stdout.len() as u64;
    if size >= CONFIGMAP_LIMIT {
        failures.push(format!(
            "{}: {size} bytes gzipped, too big for the pd-router-wasm ConfigMap of deploy/envoy (1 MiB)",
            wasm.display()
        ));
    }

    assert!(
        failures.is_empty(),
        "{} deploy/ failure(s):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Envoy's admin address, once it has written it (10 s at most).
fn admin_address(path: &Path) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok(a) = std::fs::read_to_string(path) {
            if !a.trim().is_empty() {
                return a.trim().to_owned();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Envoy wrote no admin address"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn check_deploy(dump: &Path) -> Output {
    run(
        Command::new(python())
            .arg(repo().join("scripts/check-deploy.py"))
            .arg(dump),
        "scripts/check-deploy.py",
    )
}

#[test]
fn the_post_apply_check_passes_on_a_running_envoy_of_the_plain_overlay() {
    require_tools();
    let scratch = Scratch::new("check-deploy");
    let out = run(
        Command::new(python())
            .arg(repo().join("deploy/validate.py"))
            .arg("--out")
            .arg(&scratch.0)
            .arg("--wasm")
            .arg(wasm_path()),
        "deploy/validate.py",
    );
    assert!(out.status.success(), "{}", text(&out));
    // The rendered plain-Envoy overlay's envoy.yaml, runnable here.
    let admin = scratch.0.join("admin.txt");
    let mut cmd = Command::new(envoy_bin());
    cmd.arg("-c")
        .arg(scratch.0.join("bootstrap-envoy.yaml"))
        .args(["--disable-hot-restart", "--admin-address-path"])
        .arg(&admin)
        .arg("--log-path")
        .arg(scratch.0.join("envoy.log"));
    let _envoy = Proc::spawn("envoy (plain overlay)", &mut cmd);
    let address = admin_address(&admin);
    let dump = http()
        .get(format!("http://{address}/config_dump?include_eds"))
        .send()
        .and_then(|r| r.text())
        .expect("config_dump");
    let path = scratch.0.join("dump.json");
    std::fs::write(&path, &dump).expect("dump");
    let out = check_deploy(&path);
    assert!(
        out.status.success(),
        "the check fails on the plain overlay:\n{}",
        text(&out)
    );
    assert!(text(&out).contains("check-deploy: 0 check(s) failed"));

    // What a control plane that drops the flag and adds its retries leaves.
    let broken = dump
        .replace(
            "\"allow_on_headers_stop_iteration\": true",
            "\"allow_on_headers_stop_iteration\": false",
        )
        .replace(
            "\"cluster\": \"pd_decode\",",
            "\"cluster\": \"pd_decode\", \"retry_policy\": {\"num_retries\": 2},",
        );
    assert_ne!(broken, dump, "the dump's shape changed: update this test");
    std::fs::write(&path, broken).expect("dump");
    let out = check_deploy(&path);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("FAIL: the filter has allow_on_headers_stop_iteration"),
        "{said}"
    );
    assert!(
        said.contains("does not retry") && said.contains("FAIL: route"),
        "{said}"
    );
}

#[test]
fn the_smoke_script_shows_both_legs_pods() {
    let p = Mock::start(
        "smoke-p0",
        &["--engine", "vllm", "--role", "prefill", "--model", "m"],
    );
    let d = Mock::start(
        "smoke-d0",
        &["--engine", "vllm", "--role", "decode", "--model", "m"],
    );
    let envoy = Envoy::start(&serde_json::json!({
        "models": [{"name": "m", "engine": "vllm",
                    "rolesets": [{"prefill": [p.endpoint()], "decode": [d.endpoint()]}]}]
    }));
    let smoke = |model: &str| {
        run(
            Command::new("bash")
                .arg(repo().join("scripts/smoke.sh"))
                .arg(envoy.url(""))
                .arg(model),
            "scripts/smoke.sh",
        )
    };
    let out = smoke("m");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("split: prefill on smoke-p0, decode on smoke-d0"),
        "{said}"
    );
    // A model the router does not serve: said, and a failure.
    let out = smoke("nope");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("the gateway answered 404"),
        "{}",
        text(&out)
    );
}

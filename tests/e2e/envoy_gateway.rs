//! Envoy Gateway's own translator in the loop: `egctl x translate` (the
//! translator and EnvoyPatchPolicy engine of a real Envoy Gateway release)
//! turns the shipped `deploy/envoy-gateway` and `override-host` overlays into
//! xDS, the xDS becomes a static bootstrap for the Envoy each release
//! ships (v1.9: the 1.39 line; v1.7: 1.37.0), and split requests go through it to mock engines discovered from a mock
//! Kubernetes API through the translated `kube_api` cluster.
//!
//! What cannot run here is replaced, and only that (each replacement below
//! asserts it found its target, so a change in Envoy Gateway's output fails
//! loudly instead of being skipped):
//!
//! - **The wasm filter's generation.** egctl has no wasm cache (Envoy
//!   Gateway's controller pulls the image and serves it on its own HTTP
//!   server), so its translator fails every EnvoyExtensionPolicy with "wasm
//!   cache is not initialized", and the fail-closed policy turns the
//!   HTTPRoute's route into a direct 500 (which the route patch then cannot
//!   select). The EnvoyExtensionPolicy is therefore left out of egctl's input,
//!   and a stand-in EnvoyPatchPolicy, applied before the shipped one by Envoy
//!   Gateway's own patch engine, adds the filter as Envoy Gateway's
//!   `internal/xds/translator/wasm.go` generates it from the shipped
//!   policy (name, VM id, root id, host keys, fail-open, the configuration
//!   as a JSON string, disabled on the listener and enabled on the
//!   HTTPRoute's routes) with one difference: the code is the built module
//!   as a `local` file instead of `remote` from Envoy Gateway's HTTP server.
//! - **The control-plane plumbing of the bootstrap** (Envoy Gateway's own,
//!   with the EnvoyProxy's merge, as egctl prints it): `dynamic_resources`
//!   and the clusters that reach Envoy Gateway itself (`xds_cluster`,
//!   `wasm_cluster`: its xDS and wasm servers by DNS name, over its
//!   certificates) go; `local_cluster` (this proxy's own pods by EDS, for
//!   zone-aware balancing) is left without endpoints; the listeners, routes
//!   and clusters it would serve over ADS are put in `static_resources`, the
//!   route configuration inline in its listener instead of RDS; every
//!   listener and the admin bind 127.0.0.1 on ports the kernel picks; the
//!   node id and cluster come on the command line, as Envoy Gateway's pods
//!   pass them.
//! - **The model Service**: given the ClusterIP the API server would give it
//!   (egctl's `--add-missing-resources`), and its cluster (EDS) becomes
//!   STATIC with the two mock engines on 127.0.0.1: their addresses are what
//!   its endpoints would be (override_host picks among them; original_dst
//!   routes around it, the patched route going to pd_decode).
//! - **`kube_api`:** the mock API server on 127.0.0.1 over plain HTTP instead
//!   of `kubernetes.default.svc:443` over TLS with the cluster's CA; the
//!   token's SDS file and watched directory in a scratch directory instead
//!   of the projected volume. The credential injector itself, with its
//!   `header_value_prefix`, runs as translated.
//!
//! Envoy Gateway does not say when it refuses a patch through egctl: the
//! xDS translator logs the failure to a discarded logger and keeps the
//! EnvoyPatchPolicy's status in a table egctl never prints, and egctl exits
//! 0 with the resource unpatched. So each patch's effect is looked for in the
//! translated xDS, and must be absent from a translation without the policy.

use crate::gateway_split::{assert_splits, Pods};
use crate::harness::*;
use crate::kube_api::{KubeApi, KubePod};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The Envoy Envoy Gateway v1.9 ships (1.39.1; the line's 1.39.3 here,
/// `just envoy-versions`).
const EG_ENVOY: &str = ".tools/envoy-1.39.3/bin/envoy";
/// The Envoy Envoy Gateway v1.7.0 ships (its `DefaultEnvoyProxyImage`).
const EG_MIN_ENVOY: &str = ".tools/envoy-1.37.0/bin/envoy";
/// The overlays for Envoy Gateway's default (legacy) xDS names: egctl has no
/// way to set the runtime flag XDSNameSchemeV2, so `xds-name-scheme-v2` is
/// left to deploy.rs's model.
const OVERLAY: &str = "deploy/envoy-gateway";
const OVERLAY_OVERRIDE_HOST: &str = "deploy/envoy-gateway/override-host";
const GATEWAY_CLASS: &str = "deploy/envoy-gateway/install/gatewayclass.yaml";
/// The model of deploy/values (its `model` and plugin.json's model).
const MODEL: &str = "qwen3-8b";
const NAMESPACE: &str = "llm";
const TOKEN: &str = "eg-t0k3n";
/// Split requests sent through each translation.
const REQUESTS: usize = 6;

const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// An egctl build: `EGCTL_BIN` / `EGCTL_MIN_BIN` (the justfile exports them)
/// or the path `just egctl` installs to.
fn egctl(var: &str, version: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(format!(".tools/egctl-{version}/egctl")));
    assert!(
        path.exists(),
        "{} not found: run `just egctl` (part of `just setup`; it builds egctl {version} with `go install`), or set {var}",
        path.display()
    );
    path
}

fn egctl_latest() -> PathBuf {
    egctl("EGCTL_BIN", "v1.9.1")
}

fn egctl_oldest() -> PathBuf {
    egctl("EGCTL_MIN_BIN", "v1.7.0")
}

fn eg_envoy() -> PathBuf {
    installed_envoy(EG_ENVOY)
}

fn eg_min_envoy() -> PathBuf {
    installed_envoy(EG_MIN_ENVOY)
}

fn installed_envoy(rel: &str) -> PathBuf {
    let path = repo().join(rel);
    assert!(
        path.exists(),
        "{} not found: run `just envoy-versions` (part of `just setup`)",
        path.display()
    );
    path
}

/// One YAML document of the rendered overlay, with its kind.
struct Doc {
    kind: String,
    text: String,
}

/// `kubectl kustomize <overlay>`, as documents, plus the GatewayClass
/// Envoy Gateway's install applies.
fn rendered(overlay: &str) -> Vec<Doc> {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(repo().join(overlay))
        .output()
        .expect("kubectl kustomize (kubectl 1.27 or later on PATH)");
    assert!(
        out.status.success(),
        "kubectl kustomize {overlay}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut text = String::from_utf8(out.stdout).expect("utf-8");
    text.push_str("---\n");
    text.push_str(&std::fs::read_to_string(repo().join(GATEWAY_CLASS)).expect("gatewayclass"));
    // kustomize writes `kind:` at column 0 of each document.
    text.split("\n---\n")
        .map(|d| Doc {
            kind: d
                .lines()
                .find_map(|l| l.strip_prefix("kind: "))
                .unwrap_or_default()
                .trim()
                .to_owned(),
            text: d.trim_start_matches("---\n").to_owned(),
        })
        .filter(|d| !d.kind.is_empty())
        .collect()
}

/// One YAML document as JSON (PyYAML in .venv, which `just setup` installs
/// for deploy.rs).
fn yaml_to_json(doc: &str) -> Value {
    let python = repo().join(".venv/bin/python");
    let mut child = Command::new(&python)
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (run `just setup`)", python.display()));
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), doc.as_bytes())
        .expect("write yaml");
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("python");
    assert!(
        out.status.success(),
        "PyYAML missing from .venv: run `just setup`"
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Runs `egctl x translate` on `docs`; the printed JSON.
fn translate(egctl: &Path, docs: &[&str], to: &str, scratch: &Path) -> Value {
    let input = scratch.join(format!("eg-input-{to}.yaml"));
    std::fs::write(&input, docs.join("\n---\n")).expect("write input");
    // --add-missing-resources: the model Service gets the ClusterIP the API
    // server would give it (Envoy Gateway routes to it; the mocks replace it).
    let out = Command::new(egctl)
        .args(["x", "translate", "--from", "gateway-api", "--to", to])
        .args([
            "--type",
            "all",
            "--add-missing-resources",
            "-o",
            "json",
            "-f",
        ])
        .arg(&input)
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", egctl.display()));
    assert!(
        out.status.success(),
        "{} x translate --to {to} refuses the overlay:\n{}",
        egctl.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "egctl printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Every condition Envoy Gateway set to False on the objects it read, with
/// the object it is on. egctl has no wasm cache, so it refuses the
/// EnvoyExtensionPolicy with "Wasm: wasm cache is not initialized."; the
/// EnvoyPatchPolicy is only Accepted at this stage (its patches are applied
/// in the xDS translation, whose status egctl does not print).
fn refusals(read: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut objects: Vec<&Value> = Vec::new();
    for v in read.as_object().expect("resources").values() {
        match v {
            Value::Array(list) => objects.extend(list),
            Value::Object(_) => objects.push(v),
            _ => {}
        }
    }
    fn conditions<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(c)) = m.get("conditions") {
                    out.extend(c);
                }
                m.values().for_each(|v| conditions(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| conditions(v, out)),
            _ => {}
        }
    }
    for o in objects {
        let mut found = Vec::new();
        conditions(&o["status"], &mut found);
        for c in found.into_iter().filter(|c| c["status"] == "False") {
            out.push(format!(
                "{} {}: {} {}: {}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?"),
                c["type"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("?"),
                c["message"].as_str().unwrap_or("?")
            ));
        }
    }
    out
}

/// The resources of one type in a translation's config dump, by name.
fn resources(xds: &Value, type_url: &str) -> Vec<Value> {
    let configs = xds["xds"]
        .as_object()
        .expect("xds by gateway")
        .values()
        .flat_map(|g| g["configs"].as_array().cloned().unwrap_or_default());
    let mut out = Vec::new();
    for c in configs {
        let at = c["@type"].as_str().unwrap_or_default();
        if type_url == LISTENER_TYPE && at.ends_with("ListenersConfigDump") {
            for l in c["dynamicListeners"].as_array().into_iter().flatten() {
                out.push(l["activeState"]["listener"].clone());
            }
        } else if type_url == ROUTE_TYPE && at.ends_with("RoutesConfigDump") {
            for r in c["dynamicRouteConfigs"].as_array().into_iter().flatten() {
                out.push(r["routeConfig"].clone());
            }
        } else if type_url == CLUSTER_TYPE && at.ends_with("ClustersConfigDump") {
            for r in c["dynamicActiveClusters"].as_array().into_iter().flatten() {
                out.push(r["cluster"].clone());
            }
        }
    }
    // Each is an Any in the dump; not in a bootstrap.
    for r in &mut out {
        if let Some(r) = r.as_object_mut() {
            r.remove("@type");
        }
    }
    out
}

fn bootstrap_of(xds: &Value) -> Value {
    xds["xds"]
        .as_object()
        .expect("xds by gateway")
        .values()
        .flat_map(|g| g["configs"].as_array().cloned().unwrap_or_default())
        .find(|c| {
            c["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with("BootstrapConfigDump"))
        })
        .map(|c| c["bootstrap"].clone())
        .expect("egctl printed no bootstrap")
}

fn named<'a>(list: &'a [Value], name: &str) -> Option<&'a Value> {
    list.iter().find(|r| r["name"] == name)
}

/// protojson prints lowerCamelCase; the patches are written in proto names.
fn camel(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn camel_keys(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let k = if k.starts_with('@') {
                        k.clone()
                    } else {
                        camel(k)
                    };
                    (k, camel_keys(v))
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(camel_keys).collect()),
        other => other.clone(),
    }
}

/// `got` holds everything `want` says (objects may carry more keys).
fn contains(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| g.get(k).is_some_and(|gv| contains(gv, wv))),
        (Value::Array(g), Value::Array(w)) => {
            g.len() == w.len() && g.iter().zip(w).all(|(g, w)| contains(g, w))
        }
        _ => got == want,
    }
}

/// Some object inside `v` at whose JSON pointer `pointer` lies `want`.
fn somewhere(v: &Value, pointer: &str, want: &Value) -> bool {
    if v.pointer(pointer).is_some_and(|g| contains(g, want)) {
        return true;
    }
    match v {
        Value::Object(m) => m.values().any(|c| somewhere(c, pointer, want)),
        Value::Array(a) => a.iter().any(|c| somewhere(c, pointer, want)),
        _ => false,
    }
}

/// Whether the effect of one JSON patch shows in a translation: a whole
/// resource added is there with every field it was given; a value added or
/// replaced at a path is there, below some object of the named resource.
fn patch_shows(xds: &Value, patch: &Value) -> bool {
    let type_url = patch["type"].as_str().unwrap_or_default();
    let name = patch["name"].as_str().unwrap_or_default();
    let op = &patch["operation"];
    let list = resources(xds, type_url);
    let Some(resource) = named(&list, name) else {
        return false;
    };
    let value = camel_keys(&op["value"]);
    let path = op["path"].as_str().unwrap_or_default();
    if path.is_empty() && op["jsonPath"].as_str().unwrap_or_default().is_empty() {
        return contains(resource, &value);
    }
    let pointer: String = path.split('/').map(camel).collect::<Vec<_>>().join("/");
    somewhere(resource, &pointer, &value)
}

/// Each JSON patch of the shipped EnvoyPatchPolicy whose effect is missing
/// from `patched` or already present in `unpatched` (where it would prove
/// nothing), with why.
fn refused_patches(policy: &Value, patched: &Value, unpatched: &Value) -> Vec<String> {
    let patches = policy["spec"]["jsonPatches"]
        .as_array()
        .expect("jsonPatches");
    assert!(patches.len() >= 3, "expected the shipped patches: {policy}");
    let mut refused = Vec::new();
    for (i, p) in patches.iter().enumerate() {
        let what = format!(
            "jsonPatches[{i}] ({} {})",
            p["type"]
                .as_str()
                .unwrap_or("?")
                .rsplit('.')
                .next()
                .unwrap_or("?"),
            p["name"]
        );
        if !patch_shows(patched, p) {
            refused.push(format!(
                "{what}: refused, or selected nothing: its effect is not in the translated xDS"
            ));
        } else if patch_shows(unpatched, p) {
            refused.push(format!(
                "{what}: its effect is there without the policy too, so this check proves nothing"
            ));
        }
    }
    refused
}

/// The shipped EnvoyExtensionPolicy's filter, as Envoy Gateway's wasm.go
/// generates it, with the module as a local file; and a stand-in
/// EnvoyPatchPolicy (applied first) that adds it and enables it on the
/// HTTPRoute's route, as Envoy Gateway would.
fn wasm_stand_in(eep: &Value, wasm: &Path, router_index: usize) -> String {
    let ns = eep["metadata"]["namespace"].as_str().expect("namespace");
    let name = eep["metadata"]["name"].as_str().expect("name");
    let spec = &eep["spec"]["wasm"][0];
    // internal/gatewayapi/envoyextensionpolicy.go irConfigNameForWasm.
    let ir = format!("envoyextensionpolicy/{ns}/{name}/wasm/0");
    let filter_name = format!("envoy.filters.http.wasm/{ir}");
    let mut vm = json!({
        "vm_id": ir,
        "runtime": "envoy.wasm.runtime.v8",
        "code": {"local": {"filename": wasm.display().to_string()}},
    });
    if let Some(keys) = spec["env"]["hostKeys"].as_array() {
        vm["environment_variables"] = json!({"host_env_keys": keys});
    }
    let mut config = json!({
        "name": spec["name"].as_str().unwrap_or(&ir),
        "vm_config": vm,
        // The policy's `config` is JSON (here a string); Envoy Gateway hands
        // its raw bytes over as the StringValue.
        "configuration": {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": spec["config"].to_string(),
        },
        "fail_open": spec["failOpen"].as_bool().unwrap_or(false),
    });
    if let Some(root) = spec["rootID"].as_str() {
        config["root_id"] = root.into();
    }
    let filter = json!({
        "name": filter_name,
        "disabled": true,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": config,
        },
    });
    let enable = json!({
        filter_name: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}
    });
    let policy = json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyPatchPolicy",
        "metadata": {"name": "eg-wasm-stand-in", "namespace": ns},
        "spec": {
            "type": "JSONPatch",
            "priority": -1000,
            "targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "llm-gw"},
            "jsonPatches": [
                {"type": LISTENER_TYPE, "name": "llm/llm-gw/http", "operation": {
                    "op": "add", "jsonPath": "..http_filters",
                    "path": format!("/{router_index}"), "value": filter}},
                {"type": ROUTE_TYPE, "name": "llm/llm-gw/http", "operation": {
                    "op": "add",
                    "jsonPath": "..routes[?(@.route.cluster=='httproute/llm/pd-router/rule/0')]",
                    "path": "/typed_per_filter_config", "value": enable}},
            ],
        },
    });
    // JSON is YAML.
    policy.to_string()
}

/// Where the router sits in the translated listener's HTTP filters.
fn router_index(xds: &Value) -> usize {
    let listeners = resources(xds, LISTENER_TYPE);
    let listener = named(&listeners, "llm/llm-gw/http").expect("listener llm/llm-gw/http");
    let filters = hcm(listener)["typedConfig"]["httpFilters"]
        .as_array()
        .expect("httpFilters")
        .clone();
    filters
        .iter()
        .position(|f| f["name"] == "envoy.filters.http.router")
        .expect("a router filter")
}

/// The listener's HTTP connection manager (its one filter chain).
fn hcm(listener: &Value) -> &Value {
    let chain = if listener["defaultFilterChain"].is_object() {
        &listener["defaultFilterChain"]
    } else {
        &listener["filterChains"][0]
    };
    chain["filters"]
        .as_array()
        .and_then(|f| {
            f.iter()
                .find(|f| f["name"] == "envoy.filters.network.http_connection_manager")
        })
        .expect("an http_connection_manager")
}

fn hcm_mut(listener: &mut Value) -> &mut Value {
    let key = if listener["defaultFilterChain"].is_object() {
        "/defaultFilterChain/filters"
    } else {
        "/filterChains/0/filters"
    };
    listener
        .pointer_mut(key)
        .and_then(Value::as_array_mut)
        .and_then(|f| {
            f.iter_mut()
                .find(|f| f["name"] == "envoy.filters.network.http_connection_manager")
        })
        .expect("an http_connection_manager")
}

/// What the test serves the translated configuration with.
struct Stage<'a> {
    wasm: &'a Path,
    prefill: &'a Mock,
    decode: &'a Mock,
    api: &'a KubeApi,
    scratch: &'a Path,
}

/// The translation as a static bootstrap, with the replacements the module
/// doc lists (each asserts it found its target).
fn static_bootstrap(xds: &Value, stage: &Stage) -> Value {
    let mut boot = bootstrap_of(xds);
    let obj = boot.as_object_mut().expect("bootstrap object");
    assert!(
        obj.remove("dynamicResources").is_some(),
        "Envoy Gateway's bootstrap has no dynamicResources: update this test"
    );
    // An RTDS layer would come over ADS too (v1.9.1 has none).
    if let Some(layers) = boot
        .pointer_mut("/layeredRuntime/layers")
        .and_then(Value::as_array_mut)
    {
        layers.retain(|l| l.get("rtdsLayer").is_none());
    }
    boot["admin"]["address"] = json!({"socketAddress": {"address": "127.0.0.1", "portValue": 0}});
    let statics = boot["staticResources"]
        .as_object_mut()
        .expect("staticResources");
    // Envoy Gateway's own xDS and wasm servers, reached by DNS name over its
    // certificates: not here.
    let clusters = statics
        .get_mut("clusters")
        .and_then(Value::as_array_mut)
        .expect("static clusters");
    let before = clusters.len();
    clusters.retain(|c| {
        let n = c["name"].as_str().unwrap_or_default();
        n != "xds_cluster" && n != "wasm_cluster"
    });
    assert!(
        clusters.len() < before,
        "no xds_cluster in Envoy Gateway's bootstrap: update this test"
    );
    // `local_cluster` (this proxy's own pods, for zone-aware balancing) comes
    // by EDS over ADS: here it has no endpoints.
    for c in clusters.iter_mut() {
        if let Some(c) = c
            .as_object_mut()
            .filter(|c| c.contains_key("edsClusterConfig"))
        {
            let name = c["name"].clone();
            c.remove("edsClusterConfig");
            c.insert("type".into(), "STATIC".into());
            c.insert("loadAssignment".into(), json!({"clusterName": name}));
        }
    }
    for l in statics
        .get_mut("listeners")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        l["address"]["socketAddress"]["address"] = "127.0.0.1".into();
        l["address"]["socketAddress"]["portValue"] = 0.into();
    }

    let routes = resources(xds, ROUTE_TYPE);
    let mut listeners = resources(xds, LISTENER_TYPE);
    let mut inlined = 0;
    for l in &mut listeners {
        l["address"]["socketAddress"]["address"] = "127.0.0.1".into();
        l["address"]["socketAddress"]["portValue"] = 0.into();
        // Envoy Gateway's readiness listener carries its routes inline.
        let hcm = &mut hcm_mut(l)["typedConfig"];
        if let Some(rds) = hcm.as_object_mut().and_then(|h| h.remove("rds")) {
            let name = rds["routeConfigName"].as_str().expect("routeConfigName");
            hcm["routeConfig"] = named(&routes, name)
                .unwrap_or_else(|| panic!("no route configuration {name}"))
                .clone();
            inlined += 1;
        }
    }
    assert!(
        inlined > 0,
        "no listener took its routes by RDS: update this test"
    );
    let mut clusters = resources(xds, CLUSTER_TYPE);
    let mut replaced = Vec::new();
    for c in &mut clusters {
        let name = c["name"].as_str().unwrap_or_default().to_owned();
        if c["type"] == "EDS" {
            let endpoints: Vec<Value> = [stage.prefill, stage.decode]
                .iter()
                .map(|m| {
                    json!({"endpoint": {"address": {"socketAddress": {
                        "address": m.host, "portValue": m.http}}}})
                })
                .collect();
            let c = c.as_object_mut().expect("cluster");
            c.remove("edsClusterConfig");
            c.insert("type".into(), "STATIC".into());
            c.insert(
                "loadAssignment".into(),
                json!({"clusterName": name, "endpoints": [{"lbEndpoints": endpoints}]}),
            );
            replaced.push(name);
        } else if name == "kube_api" {
            c["type"] = "STATIC".into();
            c["loadAssignment"]["endpoints"] = json!([{"lbEndpoints": [{"endpoint": {"address": {
                "socketAddress": {"address": "127.0.0.1", "portValue": stage.api.port}}}}]}]);
            let c_obj = c.as_object_mut().expect("cluster");
            assert!(
                c_obj.remove("transportSocket").is_some(),
                "kube_api speaks TLS as shipped"
            );
            let volume = stage.scratch.join("token-volume");
            std::fs::create_dir_all(&volume).expect("token volume");
            std::fs::write(volume.join("token"), TOKEN).expect("token");
            let sds = stage.scratch.join("token-sds.yaml");
            std::fs::write(
                &sds,
                format!(
                    "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: kube_api_token\n  generic_secret: {{secret: {{filename: {}}}}}\n",
                    volume.join("token").display()
                ),
            )
            .expect("sds file");
            let mut text = c.to_string();
            for (from, to) in [
                (
                    "/etc/pd-router-sds/token-sds.yaml",
                    sds.display().to_string(),
                ),
                ("/var/run/secrets/pd-router", volume.display().to_string()),
            ] {
                assert!(text.contains(from), "kube_api does not name {from}");
                text = text.replace(from, &to);
            }
            *c = serde_json::from_str(&text).expect("kube_api");
            replaced.push(name);
        }
    }
    assert!(
        replaced.iter().any(|n| n.starts_with("httproute/"))
            && replaced.iter().any(|n| n == "kube_api"),
        "expected to replace the model Service's EDS cluster and kube_api, replaced {replaced:?}"
    );
    let statics = boot["staticResources"]
        .as_object_mut()
        .expect("staticResources");
    statics
        .get_mut("clusters")
        .and_then(Value::as_array_mut)
        .expect("clusters")
        .extend(clusters);
    statics
        .entry("listeners")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .expect("listeners")
        .extend(listeners);
    // The filter is loaded from the built module; nothing else names a file
    // that is not here.
    assert!(
        boot.to_string().contains(&stage.wasm.display().to_string()),
        "the module's path is not in the configuration"
    );
    boot
}

/// Envoy started from `bootstrap`; the translated listener's port.
struct Running {
    _proc: Proc,
    port: u16,
    log: PathBuf,
}

fn start_envoy(envoy: &Path, bootstrap: &Value, scratch: &Path) -> Running {
    let config = scratch.join("bootstrap.json");
    std::fs::write(&config, bootstrap.to_string()).expect("bootstrap");
    let admin_path = scratch.join("admin.txt");
    let log = scratch.join("envoy.log");
    let mut cmd = Command::new(envoy);
    // Envoy Gateway starts its Envoy with a node id and cluster on the
    // command line (file-based SDS needs them).
    cmd.arg("-c")
        .arg(&config)
        .args(["--disable-hot-restart", "--concurrency", "2"])
        .args([
            "--service-node",
            "eg-envoy-0",
            "--service-cluster",
            "llm/llm-gw",
        ])
        .args(["-l", "info", "--file-flush-interval-msec", "100"])
        .arg("--admin-address-path")
        .arg(&admin_path)
        .arg("--log-path")
        .arg(&log)
        // The EnvoyProxy sets it to the pod IP (`env.hostKeys` hands it on).
        .env("PD_ROUTER_TRT_MACHINE_ID", "10.0.0.7")
        .env_remove("PD_ROUTER_TRT_AUTH_KEY")
        .env_remove("PD_ROUTER_KUBE_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let proc = Proc::spawn("envoy (Envoy Gateway's translation)", &mut cmd);
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = http();
    loop {
        let admin = std::fs::read_to_string(&admin_path).unwrap_or_default();
        if !admin.trim().is_empty() {
            let listeners = client
                .get(format!("http://{}/listeners", admin.trim()))
                .send()
                .and_then(|r| r.text())
                .unwrap_or_default();
            let port = listeners
                .lines()
                .find(|l| l.starts_with("llm/llm-gw/http::"))
                .and_then(|l| l.rsplit(':').next())
                .and_then(|p| p.trim().parse::<u16>().ok())
                .filter(|p| *p != 0);
            let ready = client
                .get(format!("http://{}/ready", admin.trim()))
                .send()
                .is_ok_and(|r| r.status().is_success());
            if let (Some(port), true) = (port, ready) {
                return Running {
                    _proc: proc,
                    port,
                    log,
                };
            }
        }
        assert!(
            Instant::now() < deadline,
            "Envoy refused or never served Envoy Gateway's translation:\n{}",
            tail(&log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The overlay (its documents edited by `edit`) through `egctl`'s
/// translator: the EnvoyPatchPolicy as Envoy Gateway read it, the xDS with
/// every policy, and the xDS without the shipped EnvoyPatchPolicy.
struct Translated {
    policy: Value,
    patched: Value,
    unpatched: Value,
}

fn translate_overlay(
    egctl: &Path,
    overlay: &str,
    scratch: &Path,
    edit: &dyn Fn(&str) -> String,
) -> Translated {
    let docs: Vec<Doc> = rendered(overlay)
        .into_iter()
        .map(|d| Doc {
            text: edit(&d.text),
            kind: d.kind,
        })
        .collect();
    let kinds: Vec<&str> = docs.iter().map(|d| d.kind.as_str()).collect();
    for want in [
        "GatewayClass",
        "Gateway",
        "HTTPRoute",
        "EnvoyProxy",
        "EnvoyPatchPolicy",
        "EnvoyExtensionPolicy",
        "ClientTrafficPolicy",
        "Service",
    ] {
        assert!(
            kinds.contains(&want),
            "the overlay renders no {want}: {kinds:?}"
        );
    }
    let text = |pred: &dyn Fn(&Doc) -> bool| -> Vec<&str> {
        docs.iter()
            .filter(|d| pred(d))
            .map(|d| d.text.as_str())
            .collect()
    };

    // The objects as Envoy Gateway reads them (after its CRD validation and
    // defaults): the policies to follow, and the statuses it gives them.
    let read = translate(egctl, &text(&|_| true), "gateway-api", scratch);
    let eep = read["envoyExtensionPolicies"][0].clone();
    assert!(
        eep.is_object(),
        "egctl read no EnvoyExtensionPolicy: {read}"
    );
    // v1.7.0 does not print EnvoyPatchPolicies here: the shipped one as
    // rendered.
    let policy = yaml_to_json(
        &docs
            .iter()
            .find(|d| d.kind == "EnvoyPatchPolicy")
            .expect("an EnvoyPatchPolicy")
            .text,
    );
    let refusals = refusals(&read);
    assert!(
        refusals.len() == 1 && refusals[0].contains("wasm cache is not initialized"),
        "{} refuses more of the overlay than the wasm it cannot fetch here:\n{}",
        egctl.display(),
        refusals.join("\n")
    );

    // Without the shipped patches (and without the wasm, which egctl cannot
    // fetch): where the router is, and what is there before patching.
    let unpatched = translate(
        egctl,
        &text(&|d| d.kind != "EnvoyExtensionPolicy" && d.kind != "EnvoyPatchPolicy"),
        "xds",
        scratch,
    );
    let stand_in = wasm_stand_in(&eep, &wasm_path(), router_index(&unpatched));
    let mut input = vec![stand_in.as_str()];
    input.extend(text(&|d| d.kind != "EnvoyExtensionPolicy"));
    let patched = translate(egctl, &input, "xds", scratch);
    Translated {
        policy,
        patched,
        unpatched,
    }
}

/// The overlay through `egctl`'s translator and into `envoy`: every
/// shipped patch taken, and one split request through the result.
fn split_through_envoy_gateway(egctl: &Path, overlay: &str, envoy: &Path) {
    let scratch = Scratch::new("envoy-gateway");
    let t = translate_overlay(egctl, overlay, &scratch.0, &str::to_owned);
    let refused = refused_patches(&t.policy, &t.patched, &t.unpatched);
    assert!(
        refused.is_empty(),
        "{} refuses patches of the shipped EnvoyPatchPolicy:\n{}",
        egctl.display(),
        refused.join("\n")
    );
    let patched = t.patched;

    let prefill = Mock::start(
        "eg-prefill-0",
        &["--engine", "vllm", "--role", "prefill", "--model", MODEL],
    );
    let decode = Mock::start(
        "eg-decode-0",
        &["--engine", "vllm", "--role", "decode", "--model", MODEL],
    );
    let api = KubeApi::start(TOKEN);
    let pod = |m: &Mock, role: &str| {
        KubePod::new(&m.name, &m.host, m.http)
            .namespace(NAMESPACE)
            .label("model.aibrix.ai/name", MODEL)
            .label("model.aibrix.ai/engine", "vllm")
            .label("model.aibrix.ai/port", &m.http.to_string())
            .label("role-name", role)
    };
    api.set_pods(&[pod(&prefill, "prefill"), pod(&decode, "decode")]);
    let wasm = wasm_path();
    let bootstrap = static_bootstrap(
        &patched,
        &Stage {
            wasm: &wasm,
            prefill: &prefill,
            decode: &decode,
            api: &api,
            scratch: &scratch.0,
        },
    );
    let envoy = start_envoy(envoy, &bootstrap, &scratch.0);

    // Under override_host the model Service's cluster holds both pods, so
    // a pick the cluster ignored would land on the wrong one half the time
    // (and a prefill mock refuses a decode).
    let url = format!("http://127.0.0.1:{}/v1/chat/completions", envoy.port);
    let pods = Pods {
        prefill: &prefill,
        prefill_name: "eg-prefill-0",
        decode: &decode,
        decode_name: "eg-decode-0",
    };
    assert_splits(&url, MODEL, &pods, &api, &envoy.log, REQUESTS);
}

#[test]
fn envoy_gateway_v1_9_translates_the_overlay_and_its_envoy_splits() {
    split_through_envoy_gateway(&egctl_latest(), OVERLAY, &eg_envoy());
}

/// Envoy Gateway's own cluster follows the filter's pick: its
/// BackendTrafficPolicy's `endpointOverride`, translated by Envoy Gateway.
#[test]
fn envoy_gateway_v1_9_override_host_overlay_splits() {
    split_through_envoy_gateway(&egctl_latest(), OVERLAY_OVERRIDE_HOST, &eg_envoy());
}

/// The oldest release deploy/README.md names (its go-control-plane knows
/// every field the patches set, `header_value_prefix` the newest), on the
/// Envoy it ships, 1.37.0.
#[test]
fn envoy_gateway_v1_7_takes_every_patch() {
    split_through_envoy_gateway(&egctl_oldest(), OVERLAY, &eg_min_envoy());
}

/// What an Envoy Gateway whose go-control-plane predates a field does with
/// a patch that sets it (releases before v1.7 and the injector's
/// `header_value_prefix`): strict protojson refuses that patch, egctl still
/// exits 0 and prints the rest, and only the missing effect tells. The check
/// above must name it.
#[test]
fn a_patch_envoy_gateway_refuses_fails_the_check() {
    let scratch = Scratch::new("envoy-gateway-refused");
    let t = translate_overlay(&egctl_latest(), OVERLAY, &scratch.0, &|doc| {
        doc.replace("header_value_prefix:", "header_value_prefix_unknown:")
    });
    let refused = refused_patches(&t.policy, &t.patched, &t.unpatched);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("\"kube_api\"") && refused[0].contains("refused"),
        "{refused:?}"
    );
}

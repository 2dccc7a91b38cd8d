//! Istio's own control plane in the loop: pilot (istio.io/istio, pinned in
//! `tools/istio/go.mod`, built by `just istio-pilot`) turns the shipped
//! `deploy/istio` overlay, as `kubectl kustomize` renders it, into the xDS
//! it would send the Gateway API gateway `llm-gw`'s Envoy: listeners,
//! routes, clusters and the ECDS extension config, each after the
//! EnvoyFilter's patches. The test checks what docs/deploy.md promises of
//! that output (the filter just before the router with
//! `allow_on_headers_stop_iteration`, pd-router's own route first with no
//! retries and no total timeout, the clusters and the listener buffer), then
//! runs it in a real Envoy (1.36.4, Istio 1.28's line, and 1.40.0) with the
//! built module and sends split requests through it to mock engines that
//! discovery finds through the translated `kube_api` cluster.
//!
//! The pilot is `pilot/test/xds`'s fake discovery server
//! (`tools/istio/main.go`): the real config store and validation, Gateway
//! API controller, EnvoyFilter engine and xDS generators, fed from a file
//! instead of an API server. It is a snapshot of Istio's master (1.31-dev):
//! the module proxy here serves no 1.28.x release of `istio.io/istio`.
//!
//! What cannot run here is replaced, and only that (each replacement
//! asserts it found its target; everything stripped is printed):
//!
//! - **What istiod and kubelet create**: the GatewayClass `istio`, the
//!   gateway's Service and a running pod of it ([`CLUSTER_OBJECTS`]). The
//!   mesh configuration is pilot's built-in default.
//! - **istio-agent and ADS**: pilot's listeners, routes and clusters become
//!   static resources of a bootstrap of ours (istio-agent generates the real
//!   one), each route configuration inline in its listener instead of RDS;
//!   the pd-router filter stays an ECDS filter, its config source a file
//!   instead of ADS, and its extension config is pilot's with one
//!   difference: the code is the built module as a local file, which is
//!   what istio-agent hands Envoy after pulling the `oci://` image.
//! - **Istio's own Envoy extensions**, absent from upstream Envoy
//!   (`istio.metadata_exchange` on the listener and the clusters,
//!   `istio.alpn`; any `istio.*` or `io.istio.*` type), and the mesh
//!   clusters' mTLS transport-socket match, whose certificates istio-agent
//!   serves by SDS: stripped. Their plaintext match stays.
//! - **Addresses**: listeners bind 127.0.0.1 on ports the kernel picks; the
//!   model Service's cluster (EDS) gets the two mock engines as static
//!   endpoints; `kube_api` is the mock API server over plain HTTP, its
//!   bearer file in a scratch directory.
//!
//! Never touched: the pd-router filter, its place, its ECDS config (but the
//! code's source), `pd_prefill`, `pd_decode`, the routes and their retry
//! policies and timeouts.

use crate::gateway_split::{assert_splits, Pods};
use crate::harness::*;
use crate::kube_api::{KubeApi, KubePod};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Istio 1.28's Envoy line (`just envoy-versions`).
const ISTIO_ENVOY: &str = ".tools/envoy-1.36.4/bin/envoy";
const OVERLAY: &str = "deploy/istio";
/// deploy/values: the model, its namespace, the gateway.
const MODEL: &str = "qwen3-8b";
const NAMESPACE: &str = "llm";
const GATEWAY: &str = "llm-gw";
const TOKEN: &str = "istio-t0k3n";
/// Split requests sent through each Envoy.
const REQUESTS: usize = 6;
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// What the cluster would hold besides the overlay, and pilot reads:
/// the GatewayClass istiod creates when it starts; the gateway's Service
/// and one pod, as istiod's deployment controller renders them from the
/// Gateway (`manifests/charts/istio-control/istio-discovery/files/
/// kube-gateway.yaml`: `<gateway>-<class>`, selected by the gateway-name
/// label; the ports the API server would default `targetPort` for) and as
/// kubelet reports the pod (running, ready, its IP). pilot picks the
/// gateway's servers for a proxy by the Service's instances on it.
const CLUSTER_OBJECTS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: istio
spec:
  controllerName: istio.io/gateway-controller
---
apiVersion: v1
kind: Service
metadata:
  name: llm-gw-istio
  namespace: llm
  labels:
    gateway.networking.k8s.io/gateway-name: llm-gw
    gateway.networking.k8s.io/gateway-class-name: istio
spec:
  clusterIP: 10.96.0.80
  ports:
  - name: status-port
    port: 15021
    targetPort: 15021
    protocol: TCP
    appProtocol: tcp
  - name: http
    port: 80
    targetPort: 80
    protocol: TCP
    appProtocol: http
  selector:
    gateway.networking.k8s.io/gateway-name: llm-gw
---
apiVersion: v1
kind: Pod
metadata:
  name: llm-gw-istio-0
  namespace: llm
  labels:
    gateway.networking.k8s.io/gateway-name: llm-gw
    gateway.networking.k8s.io/gateway-class-name: istio
    gateway.istio.io/managed: istio.io-gateway-controller
    service.istio.io/canonical-name: llm-gw-istio
    service.istio.io/canonical-revision: latest
    sidecar.istio.io/inject: \"false\"
spec:
  serviceAccountName: llm-gw-istio
  containers:
  - name: istio-proxy
    image: istio/proxyv2
status:
  phase: Running
  podIP: 10.0.0.7
  podIPs:
  - ip: 10.0.0.7
  conditions:
  - type: Ready
    status: \"True\"
";

/// The pilot program, or None (the test is skipped) when it is not built
/// and PD_ROUTER_REQUIRE_ISTIO is unset; `just test-istio` sets it.
fn pilot() -> Option<PathBuf> {
    let path = std::env::var_os("ISTIO_PILOT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // `just istio-pilot` installs into .tools/istio-<the pinned version>.
            let go_mod = std::fs::read_to_string(repo().join("tools/istio/go.mod"))
                .expect("tools/istio/go.mod");
            let pin = go_mod
                .lines()
                .find_map(|l| l.trim().strip_prefix("istio.io/istio "))
                .expect("tools/istio/go.mod requires istio.io/istio");
            repo().join(format!(".tools/istio-{}/istio-pilot-xds", pin.trim()))
        });
    if path.exists() {
        return Some(path);
    }
    let msg = format!(
        "{} not found: `just istio-pilot` builds Istio's pilot (pinned in tools/istio), or set ISTIO_PILOT_BIN",
        path.display()
    );
    assert!(
        std::env::var_os("PD_ROUTER_REQUIRE_ISTIO").is_none(),
        "{msg}"
    );
    eprintln!("SKIPPED (PD_ROUTER_REQUIRE_ISTIO unset): {msg}");
    None
}

fn tool(path: &str, how: &str) -> PathBuf {
    let path = repo().join(path);
    assert!(path.exists(), "{} not found: run `{how}`", path.display());
    path
}

/// `kubectl kustomize deploy/istio`, each document through `edit`, plus
/// [`CLUSTER_OBJECTS`].
fn rendered(edit: &dyn Fn(&str) -> String) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join(OVERLAY))
        .output()
        .expect("kubectl kustomize (kubectl 1.27 or later on PATH)");
    assert!(
        out.status.success(),
        "kubectl kustomize {OVERLAY}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    for kind in ["Gateway", "HTTPRoute", "EnvoyFilter", "PeerAuthentication"] {
        assert!(
            text.contains(&format!("\nkind: {kind}\n")),
            "{OVERLAY} renders no {kind}"
        );
    }
    let mut docs: Vec<String> = text.split("\n---\n").map(edit).collect();
    docs.push(CLUSTER_OBJECTS.to_owned());
    docs.join("\n---\n")
}

/// pilot's xDS for the gateway's proxy, from `objects`.
fn pilot_xds(pilot: &Path, objects: &str, scratch: &Path) -> Value {
    let input = scratch.join("istio-input.yaml");
    std::fs::write(&input, objects).expect("write input");
    let out = Command::new(pilot)
        .arg("-f")
        .arg(&input)
        .args(["-namespace", NAMESPACE, "-gateway", GATEWAY])
        .args(["-extension-configs", "pd-router"])
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", pilot.display()));
    assert!(
        out.status.success(),
        "{} refuses the overlay:\n{}",
        pilot.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let xds: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "pilot printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    for w in xds["warnings"].as_array().into_iter().flatten() {
        eprintln!("istiod's validation warns: {w}");
    }
    xds
}

fn list<'a>(xds: &'a Value, key: &str) -> &'a [Value] {
    xds[key].as_array().map_or(&[], Vec::as_slice)
}

fn named<'a>(list: &'a [Value], name: &str) -> Option<&'a Value> {
    list.iter().find(|r| r["name"] == name)
}

/// The gateway's listener on port 80.
fn listener(xds: &Value) -> Option<&Value> {
    list(xds, "listeners")
        .iter()
        .find(|l| l["address"]["socket_address"]["port_value"] == 80)
}

/// Each HTTP connection manager of a listener (one per filter chain).
fn hcms(listener: &Value) -> Vec<&Value> {
    let chains = listener["filter_chains"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(Some(&listener["default_filter_chain"]).filter(|c| c.is_object()));
    chains
        .flat_map(|c| c["filters"].as_array().into_iter().flatten())
        .filter(|f| f["name"] == "envoy.filters.network.http_connection_manager")
        .map(|f| &f["typed_config"])
        .collect()
}

/// Where what docs/deploy.md promises of the gateway's configuration is
/// not in pilot's output: one line each.
fn broken_promises(xds: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let Some(listener) = listener(xds) else {
        return vec![format!(
            "no listener on port 80 for the gateway (pilot saw gateways {})",
            xds["gateways"]
        )];
    };
    // The listener buffer above max_body_bytes.
    if listener["per_connection_buffer_limit_bytes"] != 67108864 {
        out.push(format!(
            "listener {}: per_connection_buffer_limit_bytes is {}, not 64 MiB",
            listener["name"], listener["per_connection_buffer_limit_bytes"]
        ));
    }
    let hcms = hcms(listener);
    if hcms.is_empty() {
        out.push(format!(
            "listener {}: no HTTP connection manager",
            listener["name"]
        ));
    }
    let mut route_names = Vec::new();
    for hcm in &hcms {
        let names: Vec<&str> = hcm["http_filters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| f["name"].as_str().unwrap_or("?"))
            .collect();
        let pd = names.iter().position(|n| *n == "pd-router");
        let router = names.iter().position(|n| *n == "envoy.filters.http.router");
        match (pd, router) {
            (None, _) => out.push(format!("the pd-router filter is missing: {names:?}")),
            (Some(p), Some(r)) if p + 1 == r => {
                let f = &hcm["http_filters"][p];
                let source = &f["config_discovery"];
                if !source["type_urls"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t == WASM_TYPE))
                {
                    out.push(format!(
                        "the pd-router filter is not the ECDS Wasm filter: {f}"
                    ));
                }
            }
            _ => out.push(format!(
                "the pd-router filter is not immediately before the router: {names:?}"
            )),
        }
        // docs/deploy.md: Istio's default path normalization (BASE):
        // normalized, no slash merging, escaped slashes kept.
        if hcm["normalize_path"] != true
            || hcm["merge_slashes"] == true
            || hcm["path_with_escaped_slashes_action"] != "KEEP_UNCHANGED"
        {
            out.push(format!(
                "path normalization is not Istio's BASE as docs/deploy.md says: normalize_path {}, merge_slashes {}, path_with_escaped_slashes_action {}",
                hcm["normalize_path"], hcm["merge_slashes"], hcm["path_with_escaped_slashes_action"]
            ));
        }
        if let Some(n) = hcm["rds"]["route_config_name"].as_str() {
            route_names.push(n.to_owned());
        }
    }

    // The filter's ECDS config.
    match named(list(xds, "extension_configs"), "pd-router") {
        None => out.push("no ECDS extension config pd-router".into()),
        Some(ec) => {
            let config = &ec["typed_config"]["config"];
            if ec["typed_config"]["@type"] != WASM_TYPE {
                out.push(format!("pd-router's extension config is not Wasm: {ec}"));
            }
            if config["allow_on_headers_stop_iteration"] != true {
                out.push(
                    "pd-router's extension config lacks allow_on_headers_stop_iteration: true"
                        .into(),
                );
            }
            if config["failure_policy"] != "FAIL_RELOAD" {
                out.push(format!(
                    "pd-router's failure_policy is {}, not FAIL_RELOAD",
                    config["failure_policy"]
                ));
            }
            if config["vm_config"]["runtime"] != "envoy.wasm.runtime.v8" {
                out.push(format!(
                    "pd-router's runtime is {}",
                    config["vm_config"]["runtime"]
                ));
            }
            let shipped: Value = serde_json::from_str(
                &std::fs::read_to_string(repo().join("deploy/values/plugin.json"))
                    .expect("plugin.json"),
            )
            .expect("plugin.json is JSON");
            let got: Option<Value> = config["configuration"]["value"]
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok());
            if got.as_ref() != Some(&shipped) {
                out.push(format!(
                    "pd-router's configuration is not deploy/values/plugin.json: {}",
                    config["configuration"]
                ));
            }
        }
    }

    // pd-router's own route first in the gateway's virtual host: to
    // pd_decode, no retries, no total timeout, an idle limit.
    if route_names.is_empty() {
        out.push("the gateway's connection manager takes no routes by RDS".into());
    }
    for name in &route_names {
        let Some(rc) = named(list(xds, "routes"), name) else {
            out.push(format!("no route configuration {name}"));
            continue;
        };
        let Some(vh) = rc["virtual_hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| {
                v["domains"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|d| d == "*"))
            })
        else {
            out.push(format!("route configuration {name}: no virtual host for *"));
            continue;
        };
        if vh.get("retry_policy").is_some() {
            out.push(format!(
                "virtual host {}: a retry policy {}",
                vh["name"], vh["retry_policy"]
            ));
        }
        // The HTTPRoute's own route: after pd-router's, with the same match
        // (so never used), and with Istio's default retries (deploy/README.md,
        // envoyfilter.yaml: why pd-router needs a route of its own).
        let second = &vh["routes"][1];
        if second["match"]["prefix"] != "/" || second["route"]["retry_policy"]["num_retries"] != 2 {
            out.push(format!(
                "the HTTPRoute's route is not the one the docs describe (after pd-router's, prefix /, Istio's 2 retries): {second}"
            ));
        }
        let first = &vh["routes"][0];
        if first["name"] != "pd-router" {
            out.push(format!(
                "virtual host {}: pd-router's route is not first: {:?}",
                vh["name"],
                vh["routes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| r["name"].as_str().unwrap_or("?"))
                    .collect::<Vec<_>>()
            ));
            continue;
        }
        let route = &first["route"];
        if route["cluster"] != "pd_decode" {
            out.push(format!("pd-router's route goes to {}", route["cluster"]));
        }
        let retries = &route["retry_policy"];
        if !(retries.is_null()
            || retries.as_object().is_some_and(|r| {
                r.get("num_retries").is_none_or(|n| n == 0)
                    && r.get("retry_on").is_none_or(|v| v == "")
            }))
        {
            out.push(format!("pd-router's route retries: {retries}"));
        }
        if route["timeout"] != "0s" {
            out.push(format!(
                "pd-router's route has a total timeout: {}",
                route["timeout"]
            ));
        }
        if route["idle_timeout"] != "120s" {
            out.push(format!(
                "pd-router's route's idle_timeout is {}, not 120s",
                route["idle_timeout"]
            ));
        }
    }

    // The filter's clusters.
    let clusters = list(xds, "clusters");
    for name in ["pd_prefill", "pd_decode"] {
        match named(clusters, name) {
            None => out.push(format!("no cluster {name}")),
            Some(c) => {
                let lb = &c["original_dst_lb_config"];
                if c["type"] != "ORIGINAL_DST"
                    || lb["use_http_header"] != true
                    || lb["http_header_name"] != "x-envoy-original-dst-host"
                {
                    out.push(format!(
                        "cluster {name} does not follow the routing header: {c}"
                    ));
                }
                if c["circuit_breakers"]["thresholds"][0]["max_requests"] != 4294967295u64 {
                    out.push(format!(
                        "cluster {name} keeps Envoy's default circuit breakers"
                    ));
                }
            }
        }
    }
    if named(clusters, "kube_api").is_none() {
        out.push("no cluster kube_api".into());
    }
    out
}

/// Type URLs of Istio's own Envoy extensions (istio/proxy), which upstream
/// Envoy does not have. A TypedStruct names the type it wraps.
fn istio_only(typed_config: &Value) -> Option<String> {
    let t = typed_config["@type"].as_str()?;
    let t = if t.ends_with("udpa.type.v1.TypedStruct") || t.ends_with("xds.type.v3.TypedStruct") {
        typed_config["type_url"].as_str()?
    } else {
        t
    };
    let name = t.rsplit('/').next()?;
    let istio = [
        "istio.",
        "io.istio.",
        "stats.PluginConfig",
        "envoy.tcp.metadataexchange.",
    ]
    .iter()
    .any(|p| name.starts_with(p));
    istio.then(|| name.to_owned())
}

/// Removes, anywhere in `v`, list entries whose typed_config is an Istio-only
/// extension (never pd-router's); records each in `stripped`.
fn strip_istio_extensions(v: &mut Value, at: &str, stripped: &mut Vec<String>) {
    match v {
        Value::Array(items) => {
            items.retain(|item| {
                let gone =
                    item["name"] != "pd-router" && istio_only(&item["typed_config"]).is_some();
                if gone {
                    stripped.push(format!(
                        "{at}: {} ({})",
                        item["name"].as_str().unwrap_or("?"),
                        istio_only(&item["typed_config"]).unwrap_or_default()
                    ));
                }
                !gone
            });
            for (i, item) in items.iter_mut().enumerate() {
                strip_istio_extensions(item, &format!("{at}[{i}]"), stripped);
            }
        }
        Value::Object(m) => {
            for (k, item) in m.iter_mut() {
                strip_istio_extensions(item, &format!("{at}.{k}"), stripped);
            }
        }
        _ => {}
    }
}

/// What the test serves the translated configuration with.
struct Stage<'a> {
    wasm: &'a Path,
    prefill: &'a Mock,
    decode: &'a Mock,
    api: &'a KubeApi,
    scratch: &'a Path,
}

/// pilot's output as a bootstrap a standalone Envoy runs, with the
/// replacements the module doc lists; and what was stripped.
fn static_bootstrap(xds: &Value, stage: &Stage) -> (Value, Vec<String>) {
    let mut stripped = Vec::new();
    let routes = list(xds, "routes");

    // ECDS from a file: pilot's extension config, the code a local file.
    let mut ec = named(list(xds, "extension_configs"), "pd-router")
        .expect("pilot sent no ECDS config pd-router")
        .clone();
    let code = &mut ec["typed_config"]["config"]["vm_config"]["code"];
    let uri = code["remote"]["http_uri"]["uri"]
        .as_str()
        .unwrap_or_default();
    assert!(
        uri.starts_with("oci://"),
        "pd-router's code is not an oci:// image as shipped: {code}"
    );
    *code = json!({"local": {"filename": stage.wasm.display().to_string()}});
    ec["@type"] = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig".into();
    let ecds_file = stage.scratch.join("ecds.json");
    std::fs::write(&ecds_file, json!({"resources": [ec]}).to_string()).expect("ecds file");

    let mut listeners: Vec<Value> = list(xds, "listeners").to_vec();
    let mut inlined = 0;
    let mut ecds = 0;
    for l in &mut listeners {
        l["address"]["socket_address"]["address"] = "127.0.0.1".into();
        l["address"]["socket_address"]["port_value"] = 0.into();
        for chain in l["filter_chains"].as_array_mut().into_iter().flatten() {
            for f in chain["filters"].as_array_mut().into_iter().flatten() {
                if f["name"] != "envoy.filters.network.http_connection_manager" {
                    continue;
                }
                let hcm = &mut f["typed_config"];
                if let Some(rds) = hcm.as_object_mut().and_then(|h| h.remove("rds")) {
                    let name = rds["route_config_name"]
                        .as_str()
                        .expect("route_config_name");
                    hcm["route_config"] = named(routes, name)
                        .unwrap_or_else(|| panic!("no route configuration {name}"))
                        .clone();
                    inlined += 1;
                }
                for hf in hcm["http_filters"].as_array_mut().into_iter().flatten() {
                    if hf["name"] == "pd-router" {
                        let source = &mut hf["config_discovery"]["config_source"];
                        assert!(
                            source.get("ads").is_some(),
                            "pd-router's ECDS source is not ADS: {source}"
                        );
                        source.as_object_mut().expect("config_source").remove("ads");
                        source["path_config_source"] =
                            json!({"path": ecds_file.display().to_string()});
                        ecds += 1;
                    }
                }
            }
        }
    }
    assert!(
        inlined > 0,
        "no listener took its routes by RDS: update this test"
    );
    assert_eq!(
        ecds, 1,
        "expected the pd-router filter in one connection manager"
    );
    let mut listeners = Value::Array(listeners);
    strip_istio_extensions(&mut listeners, "listeners", &mut stripped);

    let mut clusters: Vec<Value> = list(xds, "clusters").to_vec();
    let mut replaced = Vec::new();
    for c in &mut clusters {
        let name = c["name"].as_str().unwrap_or_default().to_owned();
        // Mesh mTLS through istio-agent's SDS: the model Service's cluster
        // sends mTLS only to endpoints labelled for it, none here.
        if let Some(matches) = c["transport_socket_matches"].as_array_mut() {
            matches.retain(|m| {
                let sds = m["transport_socket"].to_string().contains("\"sds-grpc\"");
                if sds {
                    stripped.push(format!(
                        "cluster {name}: transport socket match {} (mTLS, certificates by SDS from istio-agent)",
                        m["name"]
                    ));
                }
                !sds
            });
        }
        if c["type"] == "EDS" {
            let endpoints: Vec<Value> = [stage.prefill, stage.decode]
                .iter()
                .map(|m| {
                    json!({"endpoint": {"address": {"socket_address": {
                        "address": m.host, "port_value": m.http}}}})
                })
                .collect();
            let c = c.as_object_mut().expect("cluster");
            c.remove("eds_cluster_config");
            c.insert("type".into(), "STATIC".into());
            c.insert(
                "load_assignment".into(),
                json!({"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]}),
            );
            replaced.push(name);
        } else if name == "kube_api" {
            c["type"] = "STATIC".into();
            c["load_assignment"]["endpoints"] = json!([{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": stage.api.port}}}}]}]);
            assert!(
                c.as_object_mut()
                    .expect("cluster")
                    .remove("transport_socket")
                    .is_some(),
                "kube_api speaks TLS as shipped"
            );
            // What the gateway's pd-router-bearer sidecar writes.
            let bearer = stage.scratch.join("bearer");
            std::fs::create_dir_all(&bearer).expect("bearer dir");
            std::fs::write(bearer.join("bearer"), format!("Bearer {TOKEN}")).expect("bearer");
            let sds = stage.scratch.join("bearer-sds.yaml");
            std::fs::write(
                &sds,
                format!(
                    "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: kube_api_token\n  generic_secret: {{secret: {{filename: {}}}}}\n",
                    bearer.join("bearer").display()
                ),
            )
            .expect("sds file");
            let mut text = c.to_string();
            for (from, to) in [
                (
                    "/etc/pd-router-sds/bearer-sds.yaml",
                    sds.display().to_string(),
                ),
                ("/var/run/pd-router-bearer", bearer.display().to_string()),
            ] {
                assert!(text.contains(from), "kube_api does not name {from}");
                text = text.replace(from, &to);
            }
            *c = serde_json::from_str(&text).expect("kube_api");
            replaced.push(name);
        }
    }
    assert!(
        replaced
            .iter()
            .any(|n| n.contains(&format!("{MODEL}.{NAMESPACE}.svc")))
            && replaced.iter().any(|n| n == "kube_api"),
        "expected to replace the model Service's EDS cluster and kube_api, replaced {replaced:?}"
    );
    let mut clusters = Value::Array(clusters);
    strip_istio_extensions(&mut clusters, "clusters", &mut stripped);

    let boot = json!({
        "node": {"id": format!("router~10.0.0.7~{GATEWAY}-istio-0.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"),
                 "cluster": format!("{GATEWAY}-istio.{NAMESPACE}")},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    });
    let text = boot.to_string();
    assert!(
        !text.contains("\"ads\""),
        "something still needs ADS after the replacements: update this test"
    );
    (boot, stripped)
}

/// Envoy started from `bootstrap`; the gateway listener's port.
struct Running {
    _proc: Proc,
    port: u16,
    log: PathBuf,
}

fn start_envoy(envoy: &Path, bootstrap: &Value, listener: &str, scratch: &Path) -> Running {
    let config = scratch.join("bootstrap.json");
    std::fs::write(&config, bootstrap.to_string()).expect("bootstrap");
    let admin_path = scratch.join("admin.txt");
    let log = scratch.join("envoy.log");
    let mut cmd = Command::new(envoy);
    cmd.arg("-c")
        .arg(&config)
        .args(["--disable-hot-restart", "--concurrency", "2"])
        .args(["-l", "info", "--file-flush-interval-msec", "100"])
        .arg("--admin-address-path")
        .arg(&admin_path)
        .arg("--log-path")
        .arg(&log)
        // The gateway's Deployment sets it from the pod IP (host_env_keys).
        .env("PD_ROUTER_TRT_MACHINE_ID", "10.0.0.7")
        .env_remove("PD_ROUTER_TRT_AUTH_KEY")
        .env_remove("PD_ROUTER_KUBE_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let proc = Proc::spawn("envoy (Istio's configuration)", &mut cmd);
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
                .find(|l| l.starts_with(&format!("{listener}::")))
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
            "Envoy refused or never served Istio's configuration:\n{}",
            tail(&log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The shipped overlay through pilot, checked, and into `envoy`: split
/// requests through it to mock engines it discovers.
fn split_through_istio(envoy: &Path) {
    let Some(pilot) = pilot() else { return };
    let scratch = Scratch::new("istio");
    let xds = pilot_xds(&pilot, &rendered(&str::to_owned), &scratch.0);
    let broken = broken_promises(&xds);
    assert!(
        broken.is_empty(),
        "pilot's configuration for the gateway breaks what docs/deploy.md says:\n{}",
        broken.join("\n")
    );

    let prefill = Mock::start(
        "istio-prefill-0",
        &["--engine", "vllm", "--role", "prefill", "--model", MODEL],
    );
    let decode = Mock::start(
        "istio-decode-0",
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
    let (bootstrap, stripped) = static_bootstrap(
        &xds,
        &Stage {
            wasm: &wasm,
            prefill: &prefill,
            decode: &decode,
            api: &api,
            scratch: &scratch.0,
        },
    );
    for s in &stripped {
        eprintln!("stripped (Istio-only, or istio-agent's): {s}");
    }
    let name = listener(&xds).expect("the gateway listener")["name"]
        .as_str()
        .expect("listener name")
        .to_owned();
    let envoy = start_envoy(envoy, &bootstrap, &name, &scratch.0);

    let url = format!("http://127.0.0.1:{}/v1/chat/completions", envoy.port);
    let pods = Pods {
        prefill: &prefill,
        prefill_name: "istio-prefill-0",
        decode: &decode,
        decode_name: "istio-decode-0",
    };
    assert_splits(&url, MODEL, &pods, &api, &envoy.log, REQUESTS);
}

#[test]
fn istio_pilot_translates_the_overlay_and_envoy_1_36_splits() {
    split_through_istio(&tool(ISTIO_ENVOY, "just envoy-versions"));
}

#[test]
fn istio_pilot_translates_the_overlay_and_envoy_1_40_splits() {
    split_through_istio(&envoy_bin());
}

/// The checks above catch what they claim to: the flag dropped, the filter
/// put first instead of before the router, retries on pd-router's route.
#[test]
fn a_broken_envoy_filter_fails_the_checks() {
    let Some(pilot) = pilot() else { return };
    let scratch = Scratch::new("istio-broken");
    // (what, the rendered text, its replacement, the failure expected)
    let cases = [
        (
            "flag",
            "allow_on_headers_stop_iteration: true",
            "allow_on_headers_stop_iteration: false",
            "lacks allow_on_headers_stop_iteration",
        ),
        (
            "place",
            "operation: INSERT_BEFORE",
            "operation: INSERT_FIRST",
            "not immediately before the router",
        ),
        (
            "retries",
            "num_retries: 0",
            "num_retries: 2",
            "pd-router's route retries",
        ),
    ];
    for (what, from, to, want) in cases {
        let objects = rendered(&|d: &str| d.replacen(from, to, 1));
        assert_ne!(
            objects,
            rendered(&str::to_owned),
            "{what}: the edit matched nothing"
        );
        let broken = broken_promises(&pilot_xds(&pilot, &objects, &scratch.0));
        assert!(
            broken.len() == 1 && broken[0].contains(want),
            "{what}: expected one failure naming {want:?}, got {broken:?}"
        );
    }
}

/// What an istiod whose Envoy API predates a field does with it (Istio 1.27
/// and `allow_on_headers_stop_iteration`; docs/deploy.md): its validation
/// only warns, and the field is dropped from what the gateway gets. Shown
/// here with a field no Envoy has.
#[test]
fn a_field_pilot_does_not_know_is_warned_about_and_dropped() {
    let Some(pilot) = pilot() else { return };
    let scratch = Scratch::new("istio-unknown-field");
    let objects = rendered(&|d: &str| {
        d.replacen(
            "allow_on_headers_stop_iteration: true",
            "allow_on_headers_stop_iteration_unknown: true",
            1,
        )
    });
    let xds = pilot_xds(&pilot, &objects, &scratch.0);
    let warnings = xds["warnings"].to_string();
    assert!(
        warnings.contains("unknown field")
            && warnings.contains("allow_on_headers_stop_iteration_unknown"),
        "pilot's validation does not warn of the unknown field: {warnings}"
    );
    let broken = broken_promises(&xds);
    assert!(
        broken.len() == 1 && broken[0].contains("lacks allow_on_headers_stop_iteration"),
        "{broken:?}"
    );
}

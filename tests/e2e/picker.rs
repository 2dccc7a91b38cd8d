//! Executor mode (`"placement": "epp"`): an endpoint picker earlier in the
//! filter chain chooses the pods, as llm-d's EPP does through ext_proc; here
//! Envoy's header_mutation filter sets its headers. In front of it, the
//! filter deploy/ puts first removes the client's copies. pd-router
//! performs the hand-off to the picked pods (encoders included), and
//! refuses pods it does not know.

use crate::harness::*;
use serde_json::json;

/// envoy.yaml with the client-header strip and a picker that names
/// `decode` (and `prefill`, when given) before pd-router.
fn picker_filters(decode: &str, prefill: Option<&str>, extra: &[(&str, &str)]) -> String {
    let mut set = format!(
        "                - append: {{header: {{key: x-gateway-destination-endpoint, value: \"{decode}\"}}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}}\n"
    );
    if let Some(p) = prefill {
        set.push_str(&format!(
            "                - append: {{header: {{key: x-prefiller-host-port, value: \"{p}\"}}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}}\n"
        ));
    }
    for (k, v) in extra {
        set.push_str(&format!(
            "                - append: {{header: {{key: {k}, value: \"{v}\"}}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}}\n"
        ));
    }
    format!(
        r#"          http_filters:
          - name: strip-picker-headers
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations:
                - remove: x-gateway-destination-endpoint
                - remove: x-prefiller-host-port
                - remove: x-kv-cache-source-host-port
                - remove: x-encoder-hosts-ports
          - name: endpoint-picker
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations:
{set}"#
    )
}

fn completion(i: usize) -> String {
    json!({"model": "m", "prompt": format!("picked {i}"), "max_tokens": 2}).to_string()
}

fn start(models: serde_json::Value, decode: &str, prefill: Option<&str>) -> Envoy {
    start_with(models, decode, prefill, &[])
}

/// As [`start`], the picker also setting `extra` headers.
fn start_with(
    models: serde_json::Value,
    decode: &str,
    prefill: Option<&str>,
    extra: &[(&str, &str)],
) -> Envoy {
    let filters = picker_filters(decode, prefill, extra);
    Envoy::start_full(
        &json!({"placement": "epp", "models": models}),
        1,
        &[("          http_filters:\n", filters.as_str())],
        &[],
    )
}

#[test]
fn the_picked_pods_get_both_legs_and_a_clients_picker_header_never_counts() {
    let vllm = |name: &str, role: &str| {
        Mock::start(
            name,
            &[
                "--engine",
                "vllm",
                "--role",
                role,
                "--model",
                "m",
                "--allow-recompute",
            ],
        )
    };
    let (p0, p1) = (vllm("pk-p0", "prefill"), vllm("pk-p1", "prefill"));
    let (d0, d1) = (vllm("pk-d0", "decode"), vllm("pk-d1", "decode"));
    let models = json!([{"name": "m", "engine": "vllm", "rolesets": [
        {"name": "rs", "prefill": [p0.endpoint(), p1.endpoint()], "decode": [d0.endpoint(), d1.endpoint()]}]}]);

    // The picker chooses p1 and d1; the client names p0, in vain.
    let envoy = start(models.clone(), &d1.address(), Some(&p1.address()));
    let url = envoy.url("/v1/completions");
    for i in 0..10 {
        let a = post(
            &url,
            completion(i),
            &[("x-prefiller-host-port", &p0.address())],
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("prefill-target-pod"), Some("pk-p1"));
        assert_eq!(a.header("decode-target-pod"), Some("pk-d1"));
    }
    assert_eq!(p1.requests().len(), 10);
    assert_eq!(d1.requests().len(), 10);
    assert!(p0.requests().is_empty() && d0.requests().is_empty());
    // The picked prefill pod's header does not reach the engines.
    assert!(d1
        .requests()
        .iter()
        .all(|r| r.header("x-prefiller-host-port").is_none()));
    drop(envoy);

    // No prefill picked (the client's copy stripped): whole on d0.
    let envoy = start(models.clone(), &d0.address(), None);
    let a = post(
        &envoy.url("/v1/completions"),
        completion(20),
        &[("x-prefiller-host-port", &p0.address())],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("decode-target-pod"), Some("pk-d0"));
    assert_eq!(a.header("prefill-target-pod"), None);
    assert!(p0.requests().is_empty());
    drop(envoy);

    // A pod the fleet does not know: refused, and it gets nothing.
    let outsider = vllm("pk-outsider", "decode");
    let envoy = start(models, &outsider.address(), Some(&p1.address()));
    let a = post(&envoy.url("/v1/completions"), completion(30), &[]);
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(
        a.error_message().contains("which discovery does not know"),
        "{}",
        a.body
    );
    assert!(outsider.requests().is_empty());
    envoy.assert_counters_zero();
}

/// llm-d's header pd-router cannot follow (llm-d-router
/// `pkg/common/routing/common.go`): a KV source peer for vLLM's
/// OffloadingConnector P2P pull is removed before the engines and counted,
/// the picked pods still serve.
#[test]
fn a_kv_source_pd_router_cannot_follow_is_counted_and_removed() {
    let vllm = |name: &str, role: &str| {
        Mock::start(name, &["--engine", "vllm", "--role", role, "--model", "m"])
    };
    let (p0, d0) = (vllm("pk-src-p0", "prefill"), vllm("pk-src-d0", "decode"));
    let models = json!([{"name": "m", "engine": "vllm", "rolesets": [
        {"name": "rs", "prefill": [p0.endpoint()], "decode": [d0.endpoint()]}]}]);

    let source = "10.9.9.9:8000";
    let envoy = start_with(
        models,
        &d0.address(),
        Some(&p0.address()),
        &[("x-kv-cache-source-host-port", source)],
    );
    for i in 0..3 {
        let a = post(&envoy.url("/v1/completions"), completion(i), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("prefill-target-pod"), Some("pk-src-p0"));
    }
    let legs: Vec<_> = p0.requests().into_iter().chain(d0.requests()).collect();
    assert_eq!(legs.len(), 6);
    assert!(
        legs.iter()
            .all(|r| r.header("x-kv-cache-source-host-port").is_none()),
        "the source header is the router's, not the engines'"
    );
    assert_eq!(envoy.stat("wasmcustom.pd_router.kv_source_ignored"), 3);
    let said = envoy.log_lines_with("x-kv-cache-source-host-port from the endpoint picker ignored");
    assert_eq!(said, 1, "said once (one worker)");
}

/// E/P/D in executor mode: llm-d's picker names the encoders in
/// `x-encoder-hosts-ports` (llm-d-router `pkg/common/routing/common.go`;
/// its sidecar keeps those on its SSRF allowlist). The known encoder gets
/// the media items, an address the fleet does not know is never dialled,
/// and no engine sees the header.
#[test]
fn the_pickers_known_encoders_serve_an_epd_request() {
    let vllm = |name: &str, role: &str| {
        Mock::start(
            name,
            &["--engine", "vllm", "--role", role, "--ec-connector", "nixl"],
        )
    };
    let (e0, e1) = (vllm("pk-enc-0", "encode"), vllm("pk-enc-1", "encode"));
    let p0 = vllm("pk-enc-p0", "prefill");
    let d0 = Mock::start("pk-enc-d0", &["--engine", "vllm", "--role", "decode"]);
    let models = json!([{"name": "m", "engine": "vllm", "ec_connector": "nixl", "rolesets": [
        {"name": "rs", "prefill": [p0.endpoint()], "decode": [d0.endpoint()],
         "encode": [e0.endpoint(), e1.endpoint()]}]}]);
    let refused = RefusingPort::new();
    let chosen = format!("127.0.0.1:{},{}", refused.port, e1.address());
    let envoy = start_with(
        models,
        &d0.address(),
        Some(&p0.address()),
        &[("x-encoder-hosts-ports", chosen.as_str())],
    );
    let image =
        |n: &str| json!({"type": "image_url", "image_url": {"url": format!("https://x/{n}.png")}});
    let body = json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "which?"}, image("cat"), image("dog")]}]});
    let a = post(&envoy.url("/v1/chat/completions"), body.to_string(), &[]);
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    assert_eq!(a.header("x-mock-kv"), Some("pulled"));
    assert_eq!(e1.requests().len(), 2, "both items on the picked encoder");
    assert!(
        e0.requests().is_empty(),
        "the router did not choose its own"
    );
    let legs: Vec<_> = [&e1, &p0, &d0].iter().flat_map(|m| m.requests()).collect();
    assert!(legs
        .iter()
        .all(|r| r.header("x-encoder-hosts-ports").is_none()));
    assert_eq!(
        envoy.log_lines_with("that are no encoder pods of model `m`"),
        1
    );
}

/// llm-d's prefill filter accepts pods labelled `prefill-decode` (and
/// `both`, `encode-prefill-decode`), so its picker may name one as the
/// prefill pod (llm-d-router v0.9.0 `pkg/epp/framework/plugins/scheduling/
/// filter/bylabel/roles.go`). pd-router, reading the same pods from the
/// pool with llm-d's labels, carries that pick out; a pod with no role
/// label, which llm-d's prefill filter refuses, stays refused.
#[test]
fn a_picked_prefill_decode_pod_gets_the_prefill_leg() {
    use crate::discovery::{common_port, discovery_config, kube_cluster, wait_until, TOKEN};
    use crate::kube_api::{KubeApi, KubePod};
    let api = KubeApi::start(TOKEN);
    let hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let port = common_port(&hosts);
    let engine = |name: &str, role: &str, host: &str| {
        let listen = format!("{host}:{port}");
        Mock::start(
            name,
            &[
                "--engine", "vllm", "--role", role, "--model", "m", "--listen", &listen,
            ],
        )
    };
    // Engines that answer a prefill leg, labelled for both phases / none.
    let both = engine("pk-pd0", "prefill", hosts[0]);
    let unlabelled = engine("pk-n0", "prefill", hosts[1]);
    let decode = engine("pk-dd0", "decode", hosts[2]);
    let pod = |m: &Mock, host: &str| KubePod::new(&m.name, host, 1).label("app", "pk");
    api.set_pods(&[
        pod(&both, hosts[0]).label("llm-d.ai/role", "prefill-decode"),
        pod(&unlabelled, hosts[1]),
        pod(&decode, hosts[2]).label("llm-d.ai/role", "decode"),
    ]);
    api.set_pools(&[("pk-pool", &[("app", "pk")], &[port])]);
    let mut config = discovery_config(json!([{"name": "m", "engine": "vllm", "rolesets": []}]));
    config["placement"] = json!("epp");
    config["discovery"]["kubernetes"]["labels"] = json!("llm-d");
    config["discovery"]["kubernetes"]["inference_pool"] = json!({"name": "pk-pool", "model": "m"});
    let start = |prefill: &Mock| {
        let filters = picker_filters(&decode.address(), Some(&prefill.address()), &[]);
        let cluster = kube_cluster(&api);
        Envoy::start_full(
            &config,
            1,
            &[
                ("          http_filters:\n", filters.as_str()),
                ("  clusters:\n", cluster.as_str()),
            ],
            &[("PD_ROUTER_KUBE_TOKEN", TOKEN)],
        )
    };

    let envoy = start(&both);
    let url = envoy.url("/v1/completions");
    wait_until("the pool's pods are known", || {
        post(&url, completion(40), &[]).status == 200
    });
    let a = post(&url, completion(41), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("pk-pd0"));
    assert_eq!(a.header("decode-target-pod"), Some("pk-dd0"));
    assert!(!both.requests().is_empty());
    envoy.assert_counters_zero();
    drop(envoy);

    let envoy = start(&unlabelled);
    let url = envoy.url("/v1/completions");
    // Until discovery has listed, the decode pod is the unknown one.
    wait_until("the decode pod is known", || {
        post(&url, completion(42), &[])
            .error_message()
            .contains("as the prefill pod")
    });
    let a = post(&url, completion(43), &[]);
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(
        a.error_message().contains(&format!(
            "chose {} as the prefill pod",
            unlabelled.address()
        )),
        "{}",
        a.body
    );
    assert!(unlabelled.requests().is_empty());
}

//! The override_host routing mode: clusters a mesh builds from its own
//! endpoint lists (EDS in Istio and Envoy Gateway; STATIC here), with Envoy's
//! `envoy.load_balancing_policies.override_host` policy reading the header
//! the filter writes. Checked on Envoy 1.40 for both the decode request and
//! the prefill's `dispatch_http_call`.

use crate::harness::*;
use serde_json::json;

/// A cluster of `members` that sends each request to the endpoint named in
/// `x-gateway-destination-endpoint`, else round robin.
fn override_host_cluster(name: &str, members: &[&Mock]) -> String {
    let endpoints: String = members
        .iter()
        .map(|m| {
            format!(
                "        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}}}\n",
                m.http
            )
        })
        .collect();
    format!(
        "  - name: {name}
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
{endpoints}    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            \"@type\": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources: [{{header: x-gateway-destination-endpoint}}]
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin}}
"
    )
}

#[test]
fn override_host_clusters_follow_the_filters_choice_and_mismatches_are_counted() {
    let vllm = |name: &str, role: &str| Mock::start(name, &["--engine", "vllm", "--role", role]);
    let (p0, p1) = (vllm("oh-p0", "prefill"), vllm("oh-p1", "prefill"));
    let (d0, d1) = (vllm("oh-d0", "decode"), vllm("oh-d1", "decode"));
    // A decode pod the filter knows but the cluster does not.
    let outsider = vllm("oh-out", "decode");
    let config = json!({
        "routing": "override_host",
        "prefill_timeout_ms": 5000,
        "models": [
            {"name": "m", "engine": "vllm", "prefill_policy": "random", "decode_policy": "random",
             "rolesets": [{"prefill": [p0.endpoint(), p1.endpoint()], "decode": [d0.endpoint(), d1.endpoint()]}]},
            {"name": "stale", "engine": "vllm",
             "rolesets": [{"prefill": [p0.endpoint()], "decode": [outsider.endpoint()]}]}
        ]
    });
    // The test envoy.yaml with both clusters replaced by override_host ones.
    let yaml = test_envoy_yaml(&config, &wasm_path());
    let start = yaml.find("  - name: pd_prefill").expect("clusters");
    let clusters = format!(
        "{}{}",
        override_host_cluster("pd_prefill", &[&p0, &p1]),
        override_host_cluster("pd_decode", &[&d0, &d1])
    );
    let edited_tail = &yaml[start..];
    let envoy = Envoy::start_edited(&config, 2, &[(edited_tail, clusters.as_str())]);

    let url = envoy.url("/v1/completions");
    let mut prefills = std::collections::BTreeSet::new();
    for i in 0..20 {
        let id = format!("oh-{i}");
        let body = json!({"model": "m", "prompt": format!("p {i}"), "max_tokens": 2}).to_string();
        let a = post(&url, body, &[("x-request-id", &id)]);
        assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
        // The decode went where the filter said...
        assert_eq!(
            a.header("x-mock-pod"),
            a.header("decode-target-pod"),
            "{id}"
        );
        // ...and so did the prefill's dispatch_http_call.
        let chosen = a
            .header("prefill-target-pod")
            .unwrap_or_default()
            .to_owned();
        let by_id = |m: &Mock| {
            m.requests()
                .iter()
                .any(|r| r.header("x-request-id") == Some(id.as_str()))
        };
        let went = if by_id(&p0) {
            "oh-p0"
        } else if by_id(&p1) {
            "oh-p1"
        } else {
            "nowhere"
        };
        assert_eq!(
            went, chosen,
            "{id}: the prefill went to the pod the filter chose"
        );
        prefills.insert(chosen);
    }
    assert_eq!(prefills.len(), 2, "both prefill pods chosen at some point");
    assert_eq!(envoy.stat("wasmcustom.pd_router.decode_rerouted"), 0);

    // A choice outside the cluster falls back silently in Envoy: the
    // request is served, by a member, and the filter counts it.
    let body = json!({"model": "stale", "prompt": "p", "max_tokens": 2}).to_string();
    let a = post(&url, body, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("decode-target-pod"), Some("oh-out"));
    assert_ne!(
        a.header("x-mock-pod"),
        Some("oh-out"),
        "Envoy sent it elsewhere"
    );
    assert!(outsider.requests().is_empty());
    assert_eq!(envoy.stat("wasmcustom.pd_router.decode_rerouted"), 1);
    assert_eq!(
        envoy.log_lines_with("is not a member of the decode cluster"),
        1
    );
}

//! The client never chooses the upstream.

use crate::harness::*;

#[test]
fn a_client_routing_header_pointing_at_the_admin_port_is_ignored() {
    let prefill = Mock::start("p", &["--engine", "vllm", "--role", "prefill"]);
    let decode = Mock::start("d", &["--engine", "vllm", "--role", "decode"]);
    let envoy = Envoy::start(&plugin_config(&[(
        "m",
        "vllm",
        None,
        &[&prefill],
        &[&decode],
    )]));
    let admin = format!("127.0.0.1:{}", envoy.admin);
    let spoof = [("x-envoy-original-dst-host", admin.as_str())];

    // Without the filter this would be Envoy's admin answering.
    let direct = get(&format!("http://{admin}/server_info"), &[]);
    assert_eq!(direct.status, 200);
    assert!(direct.body.contains("\"state\""));

    // A path the router does not split: it goes to a pod the router chose.
    let a = get(&envoy.url("/server_info"), &spoof);
    assert!(
        !a.body.contains("\"state\""),
        "reached the admin port: {}",
        a.body
    );
    assert_eq!(
        a.header("x-mock-pod"),
        Some("d"),
        "went to the pod the router chose"
    );
    // The model list is the gateway's own: no upstream at all.
    let a = get(&envoy.url("/v1/models"), &spoof);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["data"][0]["id"], "m", "{}", a.body);
    assert!(a.header("x-mock-pod").is_none());

    // A split request: both legs go where the router says.
    let body = r#"{"model":"m","prompt":"p","max_tokens":2}"#;
    let a = post(&envoy.url("/v1/completions"), body, &spoof);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-mock-pod"), Some("d"));

    // A rejected request: the header is gone from the request Envoy saw, and
    // nothing was routed anywhere.
    let a = post(&envoy.url("/v1/completions"), "{", &spoof);
    assert_eq!(a.status, 400);
    for r in prefill.requests().iter().chain(decode.requests().iter()) {
        assert_ne!(r.header("x-envoy-original-dst-host"), Some(admin.as_str()));
    }
}

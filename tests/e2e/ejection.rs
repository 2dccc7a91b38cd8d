//! What ejects a pod, through Envoy: the gateway's own circuit breaker on
//! the prefill cluster refusing a burst is not the pod's failure.

use crate::harness::*;
use serde_json::json;

/// The shipped `pd_prefill` cluster with its circuit breaker at `max`
/// concurrent requests (as an operator who left Envoy's limits low would).
fn prefill_breaker_at(max: u32) -> (String, String) {
    let yaml = std::fs::read_to_string(repo().join("envoy.yaml")).expect("envoy.yaml");
    let start = yaml
        .find("  - name: pd_prefill\n")
        .expect("pd_prefill cluster");
    let end = yaml
        .find("  - name: pd_decode\n")
        .expect("pd_decode cluster");
    let cluster = yaml[start..end].to_owned();
    let limited = cluster.replace("max_requests: 4294967295", &format!("max_requests: {max}"));
    assert_ne!(cluster, limited, "pd_prefill has no max_requests");
    (cluster, limited)
}

fn chat(i: usize) -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": format!("question {i}")}],
           "max_tokens": 2})
    .to_string()
}

#[test]
fn a_burst_above_the_gateways_own_limit_ejects_no_pod() {
    // One healthy prefill pod, slow enough for the burst to overlap.
    let p0 = Mock::start(
        "ej-p0",
        &[
            "--engine",
            "vllm",
            "--role",
            "prefill",
            "--fault",
            "delay:300",
        ],
    );
    let d0 = Mock::start("ej-d0", &["--engine", "vllm", "--role", "decode"]);
    let config = json!({
        "prefill_timeout_ms": 5000, "unhealthy_cooldown_ms": 60000,
        "models": [{"name": "m", "engine": "vllm",
                    "rolesets": [{"prefill": [p0.endpoint()], "decode": [d0.endpoint()]}]}]
    });
    let (cluster, limited) = prefill_breaker_at(1);
    let envoy = Envoy::start_edited(&config, 2, &[(&cluster, &limited)]);
    let url = envoy.url("/v1/chat/completions");

    let burst: Vec<Answer> = std::thread::scope(|s| {
        let sent: Vec<_> = (0..8)
            .map(|i| {
                let url = &url;
                s.spawn(move || post(url, chat(i), &[]))
            })
            .collect();
        sent.into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    let mut ok = 0;
    for a in &burst {
        if a.status == 200 {
            ok += 1;
            continue;
        }
        assert_eq!(a.status, 503, "{}", a.body);
        assert_eq!(
            a.json()["error"]["code"],
            "gateway_overloaded",
            "{}",
            a.body
        );
        assert!(
            a.error_message().contains("gateway's own limit"),
            "{}",
            a.body
        );
        assert_eq!(a.header("retry-after"), Some("1"));
    }
    assert!(ok >= 1, "the breaker lets one through");
    assert!(
        ok < 8,
        "the breaker refused none: the burst did not overlap"
    );
    assert_eq!(
        envoy.stat("wasmcustom.pd_router.ejections"),
        0,
        "{}",
        envoy.log()
    );

    // One at a time, every request gets through.
    for i in 0..3 {
        let a = post(&url, chat(100 + i), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
    }
    assert_eq!(
        envoy.stat("wasmcustom.pd_router.ejections"),
        0,
        "{}",
        envoy.log()
    );
    envoy.assert_counters_zero();
}

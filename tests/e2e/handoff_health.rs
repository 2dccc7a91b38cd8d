//! Hand-offs that fail after the prefill, through Envoy against enforcing
//! vLLM mocks: a decode pod failing every hand-off is ejected after its
//! streak, one that fails only with one prefill pod loses that pair and
//! keeps the rest, an error event opening a 200 stream counts as a failure;
//! and what a client may say in `kv_transfer_params`.

use crate::harness::*;
use serde_json::json;
use std::time::Duration;

fn vllm(name: &str, role: &str, fault: &[&str]) -> Mock {
    let mut args = vec!["--engine", "vllm", "--role", role];
    for f in fault {
        args.extend(["--fault", f]);
    }
    Mock::start(name, &args)
}

fn chat(i: usize, stream: bool) -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": format!("question {i}")}],
           "max_tokens": 3, "stream": stream})
    .to_string()
}

#[test]
fn a_decode_failing_every_hand_off_is_ejected_after_its_streak() {
    let p0 = vllm("hh-p0", "prefill", &[]);
    let d0 = vllm("hh-d0", "decode", &[]);
    let d1 = vllm("hh-d1", "decode", &["status:500"]);
    let config = json!({
        "prefill_timeout_ms": 5000, "unhealthy_cooldown_ms": 60000, "eject_after_failures": 3,
        "models": [{"name": "m", "engine": "vllm", "decode_policy": "round_robin",
                    "rolesets": [{"prefill": [p0.endpoint()], "decode": [d0.endpoint(), d1.endpoint()]}]}]
    });
    let envoy = Envoy::start_with(&config, 2);
    let url = envoy.url("/v1/chat/completions");
    let mut failed = 0;
    for i in 0..24 {
        let a = post(&url, chat(i, false), &[]);
        if a.status != 200 {
            assert_eq!(a.header("decode-target-pod"), Some("hh-d1"), "{}", a.body);
            failed += 1;
        }
    }
    // The first failure and at most eject_after_failures - 1 more, then none
    // for the cooldown.
    assert_eq!(d1.requests().len(), 3, "{}", envoy.log());
    assert_eq!(failed, 3);
    assert_eq!(envoy.stat("wasmcustom.pd_router.decode_failed"), 3);
    assert_eq!(envoy.stat("wasmcustom.pd_router.ejections"), 1);
    assert_eq!(envoy.pod_stat("decode_failed", "hh-d1"), 3);
    assert_eq!(envoy.pod_stat("decode_failed", "hh-d0"), 0);
    envoy.assert_counters_zero();
}

#[test]
fn an_error_event_opening_a_stream_is_a_failed_hand_off() {
    let p0 = vllm("he-p0", "prefill", &[]);
    let d0 = vllm("he-d0", "decode", &[]);
    let d1 = vllm("he-d1", "decode", &["error-event"]);
    let config = json!({
        "prefill_timeout_ms": 5000, "unhealthy_cooldown_ms": 60000, "eject_after_failures": 2,
        "models": [{"name": "m", "engine": "vllm", "decode_policy": "round_robin",
                    "rolesets": [{"prefill": [p0.endpoint()], "decode": [d0.endpoint(), d1.endpoint()]}]}]
    });
    let envoy = Envoy::start_with(&config, 1);
    let url = envoy.url("/v1/chat/completions");
    for i in 0..12 {
        let a = post(&url, chat(i, true), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
    }
    assert_eq!(d1.requests().len(), 2, "ejected after two error events");
    assert_eq!(envoy.stat("wasmcustom.pd_router.decode_failed"), 2);
    assert_eq!(envoy.stat("wasmcustom.pd_router.ejections"), 1);
}

#[test]
fn a_pair_that_fails_while_both_pods_work_with_others_is_avoided() {
    let p0 = vllm("hp-p0", "prefill", &[]);
    let p1 = vllm("hp-p1", "prefill", &[]);
    let d0 = vllm("hp-d0", "decode", &[]);
    let d1 = vllm("hp-d1", "decode", &["fail-from:hp-p0"]);
    let d2 = vllm("hp-d2", "decode", &[]);
    // Round robin over 2 prefill and 3 decode pods: hp-p0 meets hp-d1 one
    // request in six, and hp-d1 works with hp-p1 between.
    let config = json!({
        "prefill_timeout_ms": 5000, "unhealthy_cooldown_ms": 60000, "eject_after_failures": 3,
        "scrape_interval_ms": 200,
        "models": [{"name": "m", "engine": "vllm",
                    "prefill_policy": "round_robin", "decode_policy": "round_robin",
                    "rolesets": [{"prefill": [p0.endpoint(), p1.endpoint()],
                                  "decode": [d0.endpoint(), d1.endpoint(), d2.endpoint()]}]}]
    });
    let envoy = Envoy::start_with(&config, 1);
    let url = envoy.url("/v1/chat/completions");
    let (mut on_pair, mut d1_after) = (0, 0);
    for i in 0..48 {
        let a = post(&url, chat(i, false), &[]);
        let pair = (
            a.header("prefill-target-pod"),
            a.header("decode-target-pod"),
        );
        if pair == (Some("hp-p0"), Some("hp-d1")) {
            assert_eq!(a.status, 500, "{}", a.body);
            on_pair += 1;
            // The pair table reaches every VM at its next tick.
            std::thread::sleep(Duration::from_millis(400));
        } else {
            assert_eq!(a.status, 200, "{}", a.body);
            if on_pair == 3 && pair.1 == Some("hp-d1") {
                d1_after += 1;
            }
        }
    }
    assert_eq!(on_pair, 3, "the pair gets no hand-off once avoided");
    assert!(d1_after > 0, "hp-d1 still serves hp-p1's hand-offs");
    assert_eq!(
        envoy.stat("wasmcustom.pd_router.ejections"),
        0,
        "neither pod is ejected"
    );
    assert!(
        envoy.log().contains("the pair is avoided"),
        "{}",
        envoy.log()
    );
}

#[test]
fn a_clients_own_kv_transfer_params_reach_both_legs() {
    let p0 = vllm("hk-p0", "prefill", &[]);
    let d0 = vllm("hk-d0", "decode", &[]);
    let config = json!({
        "prefill_timeout_ms": 5000,
        "models": [{"name": "m", "engine": "vllm",
                    "rolesets": [{"prefill": [p0.endpoint()], "decode": [d0.endpoint()]}]}]
    });
    let envoy = Envoy::start_with(&config, 1);
    let url = envoy.url("/v1/completions");
    let body = json!({"model": "m", "prompt": "p", "max_tokens": 2,
                      "kv_transfer_params": {"lmcache.tag.user": "u1"}});
    let a = post(&url, body.to_string(), &[("x-request-id", "hk-1")]);
    assert_eq!(a.status, 200, "{}", a.body);
    let prefill = p0.requests()[0].json();
    assert_eq!(prefill["kv_transfer_params"]["lmcache.tag.user"], "u1");
    assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
    let decode = d0.requests()[0].json();
    assert_eq!(decode["kv_transfer_params"]["lmcache.tag.user"], "u1");
    assert_eq!(decode["kv_transfer_params"]["do_remote_prefill"], true);

    let forged = json!({"model": "m", "prompt": "p",
                        "kv_transfer_params": {"remote_engine_id": "mock-engine-hk-p0"}});
    let a = post(&url, forged.to_string(), &[]);
    assert_eq!(a.status, 400);
    assert!(
        a.error_message()
            .contains("kv_transfer_params.remote_engine_id"),
        "{}",
        a.body
    );
    assert_eq!(p0.requests().len(), 1, "a refused request reaches no pod");
}

//! The next turn reuses the decode's KV (vLLM's bidirectional NIXL
//! transfer; `models[].kv_reuse`), through Envoy against vLLM mocks that
//! enforce it: a `--bidirectional` decode keeps a finished request's
//! blocks and names them in its answer, the next prefill sent them reads
//! them from the decode's side channel (once), and refuses a prompt that
//! does not extend what they hold.

use crate::harness::*;
use serde_json::{json, Value};

const MODEL: &str = "test/vllm";

fn envoy(prefill: &Mock, decode: &Mock) -> Envoy {
    let mut config = plugin_config(&[(MODEL, "vllm", None, &[prefill], &[decode])]);
    config["models"][0]["session"] = json!({});
    config["models"][0]["kv_reuse"] = json!({});
    Envoy::start(&config)
}

fn chat(envoy: &Envoy, messages: Value, stream: bool) -> Answer {
    let body = json!({"model": MODEL, "messages": messages, "max_tokens": 3, "stream": stream});
    post(
        &envoy.url("/v1/chat/completions"),
        body.to_string(),
        &[("x-session-id", "conversation-1")],
    )
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// The reply the mock decode writes for `max_tokens: 3`.
fn reply() -> Value {
    json!({"role": "assistant", "content": "tok0 tok1 tok2"})
}

fn prefill_params(prefill: &Mock, i: usize) -> Value {
    prefill.requests()[i].json()["kv_transfer_params"].clone()
}

#[test]
fn a_sessions_next_prefill_reads_the_last_decodes_kv_once() {
    let prefill = Mock::start("p-reuse", &["--engine", "vllm", "--role", "prefill"]);
    let decode = Mock::start(
        "d-reuse",
        &["--engine", "vllm", "--role", "decode", "--bidirectional"],
    );
    let envoy = envoy(&prefill, &decode);

    // Turn one, streamed: the decode's handle is taken out of the stream.
    let a = chat(&envoy, json!([user("Bonjour")]), true);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(!a.body.contains("kv_transfer_params"), "{}", a.body);
    assert_eq!(prefill_params(&prefill, 0)["remote_block_ids"], Value::Null);

    // Turn two: its prefill reads the prefix from the decode pod.
    let a = chat(
        &envoy,
        json!([user("Bonjour"), reply(), user("Et alors ?")]),
        false,
    );
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    assert!(a.json().get("kv_transfer_params").is_none(), "{}", a.body);
    let sent = prefill_params(&prefill, 1);
    assert_eq!(sent["do_remote_decode"], true);
    assert_eq!(sent["do_remote_prefill"], false);
    assert_eq!(sent["remote_engine_id"], "mock-engine-d-reuse");
    assert_eq!(
        sent["remote_host"], "127.0.0.1",
        "the decode pod, not localhost"
    );
    assert_eq!(envoy.stat("wasmcustom.pd_router.kv_reuse_sent"), 1);
    assert_eq!(envoy.stat("wasmcustom.pd_router.kv_reuse_failed"), 0);
    // The prefill read the blocks: they are gone from the decode pod.
    let blocks: Vec<String> = sent["remote_block_ids"][0]
        .as_array()
        .expect("blocks")
        .iter()
        .map(|b| b.to_string())
        .collect();
    let again = get(
        &format!(
            "http://127.0.0.1:{}/kv/{}?engine_id={}&block_ids={}",
            decode.side.expect("the decode's side channel"),
            sent["remote_request_id"].as_str().expect("id"),
            sent["remote_engine_id"].as_str().expect("engine"),
            blocks.join(",")
        ),
        &[],
    );
    assert_eq!(again.status, 404, "read once: {}", again.body);

    // Turn three with an edited history: the handle turn two left is not
    // sent (the mock prefill would refuse it: vLLM would answer garbage).
    let a = chat(&envoy, json!([user("Hello"), reply(), user("So?")]), false);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(prefill_params(&prefill, 2)["remote_block_ids"], Value::Null);
    assert_eq!(envoy.stat("wasmcustom.pd_router.kv_reuse_stale"), 1);
    envoy.assert_counters_zero();
}

#[test]
fn a_decode_that_restarted_costs_one_resend_not_the_request() {
    let prefill = Mock::start("p-gone", &["--engine", "vllm", "--role", "prefill"]);
    let mut decode = Mock::start(
        "d-gone",
        &["--engine", "vllm", "--role", "decode", "--bidirectional"],
    );
    let envoy = envoy(&prefill, &decode);
    let a = chat(&envoy, json!([user("Bonjour")]), false);
    assert_eq!(a.status, 200, "{}", a.body);

    // The decode restarts on the same ports: its blocks are gone.
    let (http, side) = (decode.http, decode.side.expect("side channel"));
    decode.kill();
    let listen = format!("127.0.0.1:{http}");
    let side_listen = format!("127.0.0.1:{side}");
    let _decode = Mock::start(
        "d-gone",
        &[
            "--engine",
            "vllm",
            "--role",
            "decode",
            "--bidirectional",
            "--listen",
            &listen,
            "--side-listen",
            &side_listen,
        ],
    );
    let a = chat(
        &envoy,
        json!([user("Bonjour"), reply(), user("Et alors ?")]),
        false,
    );
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    assert_eq!(envoy.stat("wasmcustom.pd_router.kv_reuse_sent"), 1);
    assert_eq!(envoy.stat("wasmcustom.pd_router.kv_reuse_failed"), 1);
    assert_eq!(
        prefill_params(&prefill, 2)["remote_block_ids"],
        Value::Null,
        "resent without it"
    );
    assert_eq!(
        envoy.stat("wasmcustom.pd_router.ejections"),
        0,
        "the prefill pod did nothing wrong"
    );
}

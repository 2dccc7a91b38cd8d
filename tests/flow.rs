//! The request flow against a fake host that records every effect. Each test
//! checks that its path ends in exactly one outcome: a resume, a `Continue`
//! from a paused stream, or one local reply.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::api::Api;
use pd_router::config::Config;
use pd_router::flow::Flow;
use pd_router::host::{Action, Counter, Host, NotSplit, PodEvent, Telemetry};
use pd_router::pods::MemoryStore;
use pd_router::router::Router;
use pd_router::testing::FakeHost;
use std::rc::Rc;

const CONFIG: &str = r#"{
  "prefill_timeout_ms": 1234,
  "max_body_bytes": 4096,
  "models": [
    {"name": "vllm-m", "engine": "vllm", "rolesets": [{"prefill": [{"address":"10.0.0.1:8000","name":"p0"}], "decode": [{"address":"10.0.0.2:8000","name":"d0"}]}]},
    {"name": "shfs-m", "engine": "vllm", "kv_connector": "shfs", "rolesets": [{"prefill": ["10.0.0.1:8000"], "decode": ["10.0.0.2:8000"]}]},
    {"name": "sglang-m", "engine": "sglang", "rolesets": [{"prefill": [{"address":"10.0.0.3:30000","bootstrap_port":9000}], "decode": ["10.0.0.4:30000"]}]},
    {"name": "trt-m", "engine": "trtllm", "rolesets": [{"prefill": ["10.0.0.5:8000"], "decode": ["10.0.0.6:8000"]}]},
    {"name": "trt-b64", "engine": "trtllm", "trt_token_ids_b64": true, "rolesets": [{"prefill": ["10.0.0.5:8000"], "decode": ["10.0.0.6:8000"]}]},
    {"name": "other-m", "engine": "mystery", "rolesets": [{"prefill": ["10.0.0.7:8000"], "decode": ["10.0.0.8:8000"]}]},
    {"name": "lonely-m", "engine": "vllm", "rolesets": [{"prefill": ["10.0.0.9:8000"]}]},
    {"name": "decided-m", "engine": "vllm", "decider": {"min_prompt_tokens": 256, "min_uncached_tokens": 256},
     "rolesets": [{"prefill": [{"address":"10.0.1.1:8000","name":"dp0"}],
                   "decode": [{"address":"10.0.1.2:8000","name":"dd0"}, {"address":"10.0.1.3:8000","name":"dd1"}]}]},
    {"name": "trt-decided", "engine": "trtllm", "decider": {},
     "rolesets": [{"prefill": ["10.0.3.1:8000"], "decode": ["10.0.3.2:8000"]}]},
    {"name": "health-m", "engine": "vllm", "prefill_policy": "round_robin", "decode_policy": "round_robin",
     "rolesets": [{"prefill": [{"address":"10.0.4.1:8000","name":"hp0"}, {"address":"10.0.4.2:8000","name":"hp1"}],
                   "decode": [{"address":"10.0.4.3:8000","name":"hd0"}, {"address":"10.0.4.4:8000","name":"hd1"}]}]},
    {"name": "pair-m", "engine": "vllm", "prefill_policy": "random", "decode_policy": "random",
     "rolesets": [{"prefill": [{"address":"10.0.5.1:8000","name":"pp0"}, {"address":"10.0.5.2:8000","name":"pp1"}],
                   "decode": [{"address":"10.0.5.3:8000","name":"pd0"}, {"address":"10.0.5.4:8000","name":"pd1"}]}]},
    {"name": "local-m", "engine": "vllm", "decider": {"min_prompt_tokens": 0, "min_uncached_tokens": 0, "prefill_saturated_local": true},
     "rolesets": [{"prefill": [{"address":"10.0.2.1:8000","name":"lp0"}], "decode": [{"address":"10.0.2.2:8000","name":"ld0"}]}]}
  ]
}"#;

const ROUTING: &str = "x-envoy-original-dst-host";

fn router() -> Rc<Router> {
    Rc::new(Router::new(Config::parse(CONFIG.as_bytes()).expect("config"), 0).expect("router"))
}

fn post(path: &str, body: &str) -> FakeHost {
    FakeHost::new(
        &[
            (":method", "POST"),
            (":path", path),
            (":authority", "gateway"),
            ("x-request-id", "req-1"),
            ("authorization", "Bearer sk-1"),
            ("traceparent", "00-abc-def-01"),
            ("content-type", "application/json"),
            // A client trying to pick the upstream itself (Envoy's admin port).
            (ROUTING, "127.0.0.1:9901"),
        ],
        body,
    )
}

/// Headers, then the body in two chunks. Returns the last action.
fn send_request(flow: &mut Flow, host: &mut FakeHost) -> Action {
    assert_eq!(flow.on_request_headers(host, false), Action::Pause);
    assert!(
        host.header(ROUTING).is_none(),
        "client routing header stripped"
    );
    let half = host.body.len() / 2;
    assert_eq!(flow.on_request_body(host, half, false), Action::Pause);
    flow.on_request_body(host, host.body.len(), true)
}

fn answer(flow: &mut Flow, host: &mut FakeHost, status: Option<u16>, body: &str) {
    host.call_body = body.as_bytes().to_vec();
    let token = 100 + host.dispatched.len() as u32;
    flow.on_prefill_response(host, token, status, body.len());
}

const VLLM_ANSWER: &str = r#"{"id":"p","choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"0.0.0.0","remote_port":5600,"future":{"n":18446744073709551615}}}"#;

#[test]
fn vllm_sync_split_dispatches_prefill_then_resumes_with_the_handoff() {
    let r = router();
    let mut flow = Flow::new(r);
    let client = r#"{"model":"vllm-m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":50,"min_tokens":3}"#;
    let mut host = post("/v1/chat/completions", client);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(host.dispatched.len(), 1);
    let d = &host.dispatched[0];
    assert_eq!(d.cluster, "pd_prefill");
    assert_eq!(d.timeout_ms, 1234);
    let h = |k: &str| {
        d.headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(h(ROUTING), Some("10.0.0.1:8000"));
    assert_eq!(h(":path"), Some("/v1/chat/completions"));
    assert_eq!(h(":method"), Some("POST"));
    assert_eq!(h("x-request-id"), Some("req-1"));
    assert_eq!(h("authorization"), Some("Bearer sk-1"));
    assert_eq!(h("traceparent"), Some("00-abc-def-01"));
    assert_eq!(
        String::from_utf8_lossy(&d.body),
        r#"{"model":"vllm-m","messages":[{"role":"user","content":"hi"}],"stream":false,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}"#
    );
    assert_eq!(host.resumed, 0, "paused until the prefill answers");

    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    assert!(host.replies.is_empty());
    assert_eq!(
        host.body_str(),
        r#"{"model":"vllm-m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":50,"min_tokens":3,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"0.0.0.0","remote_port":5600,"future":{"n":18446744073709551615}}}"#
    );
    assert_eq!(
        host.header("content-length"),
        Some(host.body.len().to_string())
    );
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.0.2:8000"));
    assert_eq!(host.counted(Counter::Split), 1);

    assert_eq!(flow.on_response_headers(&mut host), Action::Continue);
    assert!(host
        .response_headers
        .contains(&("prefill-target-pod".into(), Some("p0".into()))));
    assert!(host
        .response_headers
        .contains(&("prefill-target-pod-ip".into(), Some("10.0.0.1".into()))));

    // A late duplicate callback changes nothing.
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    assert!(host.replies.is_empty());
}

#[test]
fn long_bodies_stay_in_envoys_buffer_with_the_handoff_in_front() {
    let prompt = "a long prompt, ".repeat(1000);
    let client = format!(r#"{{"model":"vllm-m","prompt":"{prompt}","max_tokens":50}}"#);
    let config = CONFIG.replace(r#""max_body_bytes": 4096"#, r#""max_body_bytes": 65536"#);
    let router = Router::new(Config::parse(config.as_bytes()).expect("config"), 0).expect("router");
    let mut flow = Flow::new(Rc::new(router));
    let mut host = post("/v1/completions", &client);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    // Only `{` is replaced: the prompt never leaves Envoy's buffer.
    assert_eq!(host.replaced, [1]);
    assert_eq!(
        host.body_str(),
        format!(
            r#"{{"kv_transfer_params":{{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"0.0.0.0","remote_port":5600,"future":{{"n":18446744073709551615}}}},{}"#,
            &client[1..]
        )
    );
    assert_eq!(
        host.header("content-length"),
        Some(host.body.len().to_string())
    );
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.0.2:8000"));
}

#[test]
fn shfs_rewrites_remote_host_to_the_prefill_pod_ip() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"shfs-m","prompt":"p"}"#);
    send_request(&mut flow, &mut host);
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    assert!(host
        .body_str()
        .contains(r#""remote_host":"10.0.0.1","remote_port":5600"#));
}

#[test]
fn missing_handoff_forwards_and_counts() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
    send_request(&mut flow, &mut host);
    answer(
        &mut flow,
        &mut host,
        Some(200),
        r#"{"id":"p","choices":[]}"#,
    );
    assert_eq!(host.resumed, 1);
    assert_eq!(host.body_str(), r#"{"model":"vllm-m","prompt":"p"}"#);
    assert_eq!(host.counted(Counter::HandoffMissing), 1);
}

#[test]
fn vllm_n_above_one_is_not_split() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/completions",
        r#"{"model":"vllm-m","prompt":"p","n":2}"#,
    );
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    assert!(host.dispatched.is_empty());
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.0.2:8000"));
    assert_eq!(host.body_str(), r#"{"model":"vllm-m","prompt":"p","n":2}"#);
    assert!(host.replies.is_empty());
    flow.on_response_headers(&mut host);
    assert!(host
        .response_headers
        .contains(&("prefill-target-pod".into(), None)));
}

#[test]
fn sglang_sends_decode_at_once_with_the_same_bootstrap_room() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/chat/completions",
        r#"{"model":"sglang-m","messages":[],"stream":true}"#,
    );
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    let prefill = String::from_utf8_lossy(&host.dispatched[0].body).into_owned();
    let room = i64::MAX; // the first random value, masked to 63 bits
    assert_eq!(
        prefill,
        format!(
            r#"{{"model":"sglang-m","messages":[],"stream":false,"max_tokens":1,"bootstrap_host":"10.0.0.3","bootstrap_port":9000,"bootstrap_room":{room},"rid":"req-1"}}"#
        )
    );
    assert_eq!(
        host.body_str(),
        format!(
            r#"{{"model":"sglang-m","messages":[],"stream":true,"bootstrap_host":"10.0.0.3","bootstrap_port":9000,"bootstrap_room":{room}}}"#
        )
    );
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.0.4:30000"));
    assert_eq!(
        host.resumed, 0,
        "Continue from the body callback is the resume"
    );

    // Prefill succeeds: nothing more happens.
    answer(&mut flow, &mut host, Some(200), r#"{"id":"x"}"#);
    assert!(host.replies.is_empty());
}

#[test]
fn sglang_prefill_failure_before_decode_output_fails_fast() {
    for (status, expect) in [
        (Some(500), "status 500"),
        (Some(504), "504"),
        (None, "reset"),
    ] {
        let mut flow = Flow::new(router());
        let mut host = post("/v1/completions", r#"{"model":"sglang-m","prompt":"p"}"#);
        send_request(&mut flow, &mut host);
        flow.on_response_headers(&mut host);
        answer(
            &mut flow,
            &mut host,
            status,
            r#"{"error":{"message":"boom"}}"#,
        );
        let (code, v) = host.reply();
        assert_eq!(code, 502);
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(expect), "{msg}");
    }
}

#[test]
fn sglang_prefill_failure_after_decode_output_is_only_logged() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"sglang-m","prompt":"p"}"#);
    send_request(&mut flow, &mut host);
    flow.on_response_headers(&mut host);
    flow.on_response_body(&mut host, 10, false);
    answer(&mut flow, &mut host, Some(500), "oops");
    assert!(host.replies.is_empty());
    assert_eq!(host.counted(Counter::PrefillFailed), 1);
}

#[test]
fn sglang_batches_get_arrays_with_a_room_each() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/completions",
        r#"{"model":"sglang-m","prompt":["a","b"]}"#,
    );
    send_request(&mut flow, &mut host);
    let v: serde_json::Value = serde_json::from_slice(&host.body).unwrap();
    assert_eq!(
        v["bootstrap_host"],
        serde_json::json!(["10.0.0.3", "10.0.0.3"])
    );
    assert_eq!(v["bootstrap_port"], serde_json::json!([9000, 9000]));
    assert_eq!(v["bootstrap_room"], serde_json::json!([i64::MAX, 42]));
}

#[test]
fn trtllm_relays_params_and_tokens_and_keeps_big_ids_exact() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/completions",
        r#"{"model":"trt-m","prompt":"hello","max_completion_tokens":9}"#,
    );
    send_request(&mut flow, &mut host);
    let prefill = String::from_utf8_lossy(&host.dispatched[0].body).into_owned();
    assert!(prefill.contains(r#""request_type":"context_only","disagg_request_id":"#));
    assert!(!prefill.contains("max_completion_tokens"));
    answer(
        &mut flow,
        &mut host,
        Some(200),
        r#"{"choices":[{"index":0,"text":"x","finish_reason":"length","disaggregated_params":{"request_type":"context_only","ctx_request_id":9223372036854775806,"opaque_state":"b3BhcXVl"}}],"prompt_token_ids":[1,2,3]}"#,
    );
    assert_eq!(host.resumed, 1);
    assert_eq!(
        host.body_str(),
        r#"{"model":"trt-m","prompt":[1,2,3],"max_completion_tokens":9,"disaggregated_params":{"request_type":"generation_only","ctx_request_id":9223372036854775806,"opaque_state":"b3BhcXVl"}}"#
    );
}

const TRT_PARAMS: &str =
    r#"{"request_type":"context_only","ctx_request_id":7,"disagg_request_id":7}"#;
const TRT_GEN_PARAMS: &str =
    r#"{"request_type":"generation_only","ctx_request_id":7,"disagg_request_id":7}"#;

/// A TensorRT-LLM split of `client` on `path`, answered with the top-level
/// members `ids` beside a pending context; the request the decode gets.
fn trt_split(path: &str, client: &str, ids: &str) -> (String, FakeHost) {
    let mut flow = Flow::new(router());
    let mut host = post(path, client);
    send_request(&mut flow, &mut host);
    let prefill = String::from_utf8_lossy(&host.dispatched[0].body).into_owned();
    let choice = if path.contains("chat") {
        r#""message":{"role":"assistant","content":"x"}"#
    } else {
        r#""text":"x""#
    };
    answer(
        &mut flow,
        &mut host,
        Some(200),
        &format!(
            r#"{{"choices":[{{"index":0,{choice},"finish_reason":"length","disaggregated_params":{TRT_PARAMS}}}],{ids}}}"#
        ),
    );
    (prefill, host)
}

#[test]
fn trtllm_b64_chat_asks_for_and_relays_the_base64_ids_verbatim() {
    let client = r#"{"model":"trt-b64","messages":[{"role":"user","content":"hi"}]}"#;
    let (prefill, host) = trt_split(
        "/v1/chat/completions",
        client,
        r#""usage":{"prompt_tokens":2},"prompt_token_ids":null,"prompt_token_ids_b64":"AQAAAAIAAAA=""#,
    );
    assert!(
        prefill.contains(r#""return_prompt_token_ids_b64":true}"#),
        "{prefill}"
    );
    assert_eq!(host.resumed, 1);
    assert_eq!(
        host.body_str(),
        format!(
            r#"{{"model":"trt-b64","messages":[{{"role":"user","content":"hi"}}],"disaggregated_params":{TRT_GEN_PARAMS},"prompt_token_ids_b64":"AQAAAAIAAAA="}}"#
        )
    );
}

#[test]
fn trtllm_b64_falls_back_to_the_id_array_a_worker_answers() {
    // A context worker that ignores the request still answers the array.
    let client = r#"{"model":"trt-b64","messages":[]}"#;
    let (_, host) = trt_split(
        "/v1/chat/completions",
        client,
        r#""prompt_token_ids":[1,2]"#,
    );
    assert_eq!(
        host.body_str(),
        format!(
            r#"{{"model":"trt-b64","messages":[],"disaggregated_params":{TRT_GEN_PARAMS},"prompt_token_ids":[1,2]}}"#
        )
    );
    // Completions: TensorRT-LLM answers base64 ids on chat only, so the
    // router does not ask, and relays the array as the prompt.
    let client = r#"{"model":"trt-b64","prompt":"hi"}"#;
    let (prefill, host) = trt_split("/v1/completions", client, r#""prompt_token_ids":[1,2]"#);
    assert!(
        !prefill.contains("return_prompt_token_ids_b64"),
        "{prefill}"
    );
    assert_eq!(
        host.body_str(),
        format!(r#"{{"model":"trt-b64","prompt":[1,2],"disaggregated_params":{TRT_GEN_PARAMS}}}"#)
    );
    // Without the setting the context is not asked.
    let (prefill, _) = trt_split(
        "/v1/chat/completions",
        r#"{"model":"trt-m","messages":[]}"#,
        r#""prompt_token_ids":[1]"#,
    );
    assert!(
        !prefill.contains("return_prompt_token_ids_b64"),
        "{prefill}"
    );
}

#[test]
fn trtllm_b64_that_is_not_a_string_is_a_bad_context_answer() {
    let client = r#"{"model":"trt-b64","messages":[]}"#;
    for ids in [
        r#""prompt_token_ids_b64":[1]"#,
        r#""prompt_token_ids_b64":"""#,
    ] {
        let (_, host) = trt_split("/v1/chat/completions", client, ids);
        let (code, v) = host.reply();
        assert_eq!(code, 502, "{ids}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("prompt_token_ids_b64")),
            "{v}"
        );
        assert_eq!(host.resumed, 0);
    }
}

#[test]
fn trtllm_finished_context_answers_without_the_ids() {
    // The ids are a hand-off field; the client did not ask for them, in
    // either form (TensorRT-LLM's answers carry the other one as null).
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/chat/completions",
        r#"{"model":"trt-b64","messages":[]}"#,
    );
    send_request(&mut flow, &mut host);
    answer(
        &mut flow,
        &mut host,
        Some(200),
        r#"{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"."},"finish_reason":"stop"}],"usage":{"total_tokens":2},"prompt_token_ids":null,"prompt_token_ids_b64":"AQAAAA=="}"#,
    );
    assert_eq!(host.resumed, 0);
    let (status, _, body) = &host.replies[0];
    assert_eq!(*status, 200);
    assert_eq!(
        String::from_utf8_lossy(body),
        r#"{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"."},"finish_reason":"stop"}],"usage":{"total_tokens":2}}"#
    );
}

#[test]
fn trtllm_finished_context_answers_the_client_directly() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/chat/completions",
        r#"{"model":"trt-m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
    );
    send_request(&mut flow, &mut host);
    answer(
        &mut flow,
        &mut host,
        Some(200),
        r#"{"id":"c1","created":5,"model":"trt-m","choices":[{"index":0,"message":{"role":"assistant","content":"."},"finish_reason":"stop"}],"prompt_token_ids":[1],"usage":{"total_tokens":2}}"#,
    );
    assert_eq!(host.resumed, 0);
    assert_eq!(host.replies.len(), 1);
    let (status, headers, body) = &host.replies[0];
    assert_eq!(*status, 200);
    assert!(headers.contains(&("content-type".into(), "text/event-stream".into())));
    let text = String::from_utf8_lossy(body);
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 3, "{text}");
    let chunk: serde_json::Value =
        serde_json::from_str(events[0].trim_start_matches("data: ")).unwrap();
    assert_eq!(chunk["object"], "chat.completion.chunk");
    assert_eq!(chunk["choices"][0]["delta"]["content"], ".");
    assert_eq!(chunk["choices"][0]["finish_reason"], "stop");
    assert!(events[1].contains("\"usage\""));
    assert_eq!(events[2], "data: [DONE]");
    assert_eq!(host.counted(Counter::ContextAnswered), 1);
}

#[test]
fn default_engine_prefills_and_forwards_the_client_body_unchanged() {
    let mut flow = Flow::new(router());
    let client = r#"{"model":"other-m","prompt":"p","stream":true}"#;
    let mut host = post("/v1/completions", client);
    send_request(&mut flow, &mut host);
    assert_eq!(
        String::from_utf8_lossy(&host.dispatched[0].body),
        r#"{"model":"other-m","prompt":"p","stream":false,"max_tokens":1}"#
    );
    answer(&mut flow, &mut host, Some(200), r#"{"id":"x"}"#);
    assert_eq!(host.resumed, 1);
    assert_eq!(host.body_str(), client);
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.0.8:8000"));
}

fn expect_error(host: &FakeHost, status: u16, needle: &str) {
    let (code, v) = host.reply();
    assert_eq!(code, status, "{v}");
    let msg = v["error"]["message"].as_str().expect("message");
    assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
    assert!(v["error"]["type"].is_string() && v["error"]["code"].is_string());
    assert_eq!(host.resumed, 0);
    assert!(host.header(ROUTING).is_none(), "no upstream was chosen");
}

#[test]
fn client_errors_reply_once_and_reach_no_upstream() {
    let cases: &[(&str, &str, u16, &str)] = &[
        ("/v1/completions", "{not json", 400, "not valid JSON"),
        ("/v1/completions", "[1,2]", 400, "must be a JSON object"),
        (
            "/v1/completions",
            r#"{"prompt":"p"}"#,
            400,
            "`model` is required",
        ),
        (
            "/v1/completions",
            r#"{"model":"nope","prompt":"p"}"#,
            404,
            "nope",
        ),
        (
            "/v1/completions",
            r#"{"model":"lonely-m","prompt":"p"}"#,
            503,
            "lonely-m",
        ),
        (
            "/v1/completions",
            r#"{"model":"vllm-m","prompt":"p","kv_transfer_params":{"remote_host":"6.6.6.6"}}"#,
            400,
            "kv_transfer_params",
        ),
        (
            "/v1/completions",
            r#"{"model":"vllm-m","prompt":"p","kv_transfer_params":{"decode":{"kv_request_id":"x"}}}"#,
            400,
            "renamed it to `remote_decoder`",
        ),
        (
            "/v1/completions",
            r#"{"model":"sglang-m","prompt":"p","bootstrap_room":1}"#,
            400,
            "bootstrap_room",
        ),
        (
            "/v1/completions",
            r#"{"model":"trt-m","prompt":"p","disaggregated_params":{}}"#,
            400,
            "disaggregated_params",
        ),
        (
            "/v1/completions",
            r#"{"model":"vllm-m","prompt":"p","stream":false,"stream":true}"#,
            400,
            "`stream` appears more than once",
        ),
        (
            "/v1/completions",
            r#"{"model":"trt-m","prompt":["a","b"]}"#,
            400,
            "single prompt",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"trt-m","messages":[],"prompt_token_ids_b64":"AQAAAA=="}"#,
            400,
            "prompt_token_ids_b64",
        ),
    ];
    for (path, body, status, needle) in cases {
        let mut flow = Flow::new(router());
        let mut host = post(path, body);
        assert_eq!(send_request(&mut flow, &mut host), Action::Pause, "{body}");
        assert!(host.dispatched.is_empty(), "{body}");
        expect_error(&host, *status, needle);
    }
}

#[test]
fn oversized_bodies_are_refused_early() {
    // By content-length, at the headers.
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", "{}");
    host.set_request_header("content-length", Some("5000"))
        .unwrap();
    assert_eq!(flow.on_request_headers(&mut host, false), Action::Pause);
    expect_error(&host, 413, "4096");
    // By buffered size, before the end of the stream.
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", &"x".repeat(5000));
    assert_eq!(flow.on_request_headers(&mut host, false), Action::Pause);
    assert_eq!(flow.on_request_body(&mut host, 5000, false), Action::Pause);
    expect_error(&host, 413, "4096");
}

#[test]
fn wrong_method_and_empty_body_are_refused_at_the_headers() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", "");
    host.set_request_header(":method", Some("GET")).unwrap();
    assert_eq!(flow.on_request_headers(&mut host, true), Action::Pause);
    expect_error(&host, 405, "GET");
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", "");
    assert_eq!(flow.on_request_headers(&mut host, true), Action::Pause);
    expect_error(&host, 400, "empty");
}

#[test]
fn unsplit_paths_still_get_a_router_chosen_upstream() {
    let mut flow = Flow::new(router());
    let mut host = post("/health", "");
    host.set_request_header(":method", Some("GET")).unwrap();
    assert_eq!(flow.on_request_headers(&mut host, true), Action::Continue);
    let chosen = host.header(ROUTING).expect("routing header");
    assert_ne!(chosen, "127.0.0.1:9901");
    assert!(chosen.starts_with("10.0.0."));
    assert!(host.replies.is_empty());
    assert_eq!(flow.on_request_body(&mut host, 0, true), Action::Continue);
}

#[test]
fn prefill_failures_map_to_statuses() {
    let cases: &[(Option<u16>, &str, u16, &str)] = &[
        (
            Some(500),
            r#"{"error":{"message":"CUDA error"}}"#,
            502,
            "CUDA error",
        ),
        (
            Some(503),
            "upstream connect error or disconnect/reset before headers",
            502,
            "unreachable",
        ),
        (Some(504), "upstream request timeout", 504, "timed out"),
        (None, "", 502, "reset"),
        (
            Some(400),
            r#"{"error":{"message":"prompt is too long"}}"#,
            400,
            "prompt is too long",
        ),
        (Some(429), r#"{"detail":"busy"}"#, 429, "busy"),
        (Some(200), "not json", 502, "not valid JSON"),
        (Some(302), "", 502, "302"),
    ];
    for (status, body, expect, needle) in cases {
        let mut flow = Flow::new(router());
        let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
        send_request(&mut flow, &mut host);
        answer(&mut flow, &mut host, *status, body);
        let (code, v) = host.reply();
        assert_eq!(code, *expect, "{status:?} {body}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{v}"
        );
        assert_eq!(host.resumed, 0);
    }
}

#[test]
fn dispatch_failure_is_a_bad_gateway() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
    host.dispatch_error = Some("BadArgument".into());
    send_request(&mut flow, &mut host);
    let (code, v) = host.reply();
    assert_eq!(code, 502);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("pd_prefill"));
}

#[test]
fn missing_entropy_is_an_internal_error_not_a_panic() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"sglang-m","prompt":"p"}"#);
    host.randoms.clear();
    send_request(&mut flow, &mut host);
    assert_eq!(host.reply().0, 500);
    assert!(host.dispatched.is_empty());
}

#[test]
fn upstream_cannot_forge_prefill_headers_on_unsplit_requests() {
    let mut flow = Flow::new(router());
    let mut host = post("/health", "");
    host.set_request_header(":method", Some("GET")).unwrap();
    flow.on_request_headers(&mut host, true);
    flow.on_response_headers(&mut host);
    assert!(host
        .response_headers
        .contains(&("prefill-target-pod".into(), None)));
    assert!(host
        .response_headers
        .contains(&("prefill-target-pod-ip".into(), None)));
}

// ---- scheduling state: load accounting, health and retries ----

const POOL: &str = r#"{
  "prefill_timeout_ms": 1000,
  "unhealthy_cooldown_ms": 60000,
  "models": [
    {"name": "m", "engine": "vllm", "prefill_policy": "least_request", "decode_policy": "least_request",
     "rolesets": [{"prefill": [{"address":"10.1.0.1:8000","name":"p0"}, {"address":"10.1.0.2:8000","name":"p1"}],
                   "decode": [{"address":"10.1.0.3:8000","name":"d0"}]}]},
    {"name": "s", "engine": "sglang",
     "rolesets": [{"prefill": ["10.1.1.1:8000"], "decode": ["10.1.1.2:8000"]}]},
    {"name": "c", "engine": "vllm",
     "rolesets": [{"prompt_tokens": {"max": 4}, "prefill": ["10.1.2.1:8000"], "decode": ["10.1.2.2:8000"]}],
     "combined": [{"address": "10.1.2.9:8000", "name": "combo"}]}
  ]
}"#;

fn pool() -> Rc<Router> {
    Rc::new(Router::new(Config::parse(POOL.as_bytes()).expect("config"), 0).expect("router"))
}

fn load(r: &Router, host: &FakeHost) -> Vec<(u32, u32)> {
    r.counters(host)
        .iter()
        .map(|c| (c.outstanding_prefills, c.pending_decodes))
        .collect()
}

/// The position of the pod at `address` in the router's counters.
fn pod_index(r: &Router, address: &str) -> usize {
    r.fleet()
        .pods()
        .iter()
        .position(|p| p.address == address)
        .expect("a pod of the fleet")
}

/// The id of the pod at `address`.
fn pod_id(r: &Router, address: &str) -> pd_router::fleet::PodId {
    r.fleet()
        .pods()
        .iter()
        .find(|p| p.address == address)
        .expect("a pod of the fleet")
        .id
}

/// Answers still streaming whose prefill each pod ran.
fn streams(r: &Router, host: &FakeHost) -> Vec<u32> {
    r.counters(host).iter().map(|c| c.live_streams).collect()
}

fn all_zero(r: &Router, host: &FakeHost) -> bool {
    load(r, host).iter().all(|(p, d)| *p == 0 && *d == 0)
        && streams(r, host).iter().all(|s| *s == 0)
}

/// A fresh request on `host`'s shared data (the same "Envoy"), with fresh
/// host randomness (Envoy's never runs dry or repeats).
fn next_request(host: &mut FakeHost, body: &str) {
    next_request_to(host, "/v1/completions", body);
}

/// [`next_request`] on `path`.
fn next_request_to(host: &mut FakeHost, path: &str, body: &str) {
    // Per test thread: each test draws the same numbers however the tests
    // beside it interleave, so a placement-dependent test is repeatable.
    thread_local! {
        static DRAWS: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
    }
    let shared = std::mem::take(&mut host.shared);
    *host = post(path, body);
    host.shared = shared;
    host.randoms = (0..16)
        .map(|_| {
            let n = DRAWS.with(|d| d.replace(d.get() + 1));
            pd_router::sched::SplitMix64(n).next_u64()
        })
        .collect();
}

fn dispatched_to(host: &FakeHost, i: usize) -> String {
    host.dispatched[i]
        .headers
        .iter()
        .find(|(k, _)| k == ROUTING)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

#[test]
fn load_is_held_while_in_flight_and_returned_on_every_ending() {
    let r = pool();
    let body = r#"{"model":"m","prompt":"p"}"#;
    let mut host = post("/v1/completions", body);

    // Success: prefill counted until it answers, decode until the stream
    // ends, and the stream on its prefill pod until then too.
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    assert_eq!(load(&r, &host).iter().map(|l| l.0).sum::<u32>(), 1);
    let prefill_pod = pod_index(&r, &dispatched_to(&host, 0));
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(load(&r, &host).iter().map(|l| l.0).sum::<u32>(), 0);
    assert_eq!(load(&r, &host).iter().map(|l| l.1).sum::<u32>(), 1);
    let mut one = vec![0; streams(&r, &host).len()];
    one[prefill_pod] = 1;
    assert_eq!(streams(&r, &host), one);
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host), "released once only");

    // The client goes away while the prefill is in flight.
    next_request(&mut host, body);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));

    // The prefill fails (4xx, not retried): local reply, nothing held.
    next_request(&mut host, body);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    answer(&mut flow, &mut host, Some(400), "{}");
    assert_eq!(host.reply().0, 400);
    assert!(all_zero(&r, &host));

    // Async (SGLang): both held, prefill returned on its answer.
    next_request(&mut host, r#"{"model":"s","prompt":"p"}"#);
    let mut flow = Flow::new(Rc::clone(&r));
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    answer(&mut flow, &mut host, Some(200), "{}");
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));
}

#[test]
fn a_prefill_holds_its_work_weighed_by_attention_when_attention_tokens_is_set() {
    // The tokens a prefill holds on its pod until it answers, with and
    // without `attention_tokens`: the same prompt, weighed by its attention.
    let held = |attention: Option<f64>| {
        let config = match attention {
            Some(a) => POOL.replacen(
                '{',
                &format!(r#"{{"scheduling":{{"attention_tokens":{a}}},"#),
                1,
            ),
            None => POOL.to_string(),
        };
        let r = Rc::new(
            Router::new(Config::parse(config.as_bytes()).expect("config"), 0).expect("router"),
        );
        let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(40_000));
        let mut host = post("/v1/completions", &body);
        let mut flow = Flow::new(Rc::clone(&r));
        send_request(&mut flow, &mut host);
        let tokens: u64 = r
            .counters(&host)
            .iter()
            .map(|c| c.outstanding_prefill_tokens)
            .sum();
        answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
        flow.on_stream_end(&mut host);
        assert!(all_zero(&r, &host));
        tokens
    };
    let tokens = held(None);
    assert!(
        tokens > 9_000,
        "about 10,000 tokens at 4 bytes each: {tokens}"
    );
    let work = pd_router::sched::prefill_work(tokens as f64, 0.0, 5_000.0);
    assert_eq!(held(Some(5_000.0)), work.round() as u64);
    assert!(work > 1.9 * tokens as f64);
}

/// Envoy 1.40's own 503 bodies for a call it could not complete.
const ENVOY_OVERFLOW: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: overflow";
const ENVOY_TERMINATION: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: connection termination";

#[test]
fn the_gateways_own_circuit_breaker_ejects_no_pod() {
    let r = pool();
    let body = r#"{"model":"m","prompt":"p"}"#;
    let mut host = post("/v1/completions", body);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    answer(&mut flow, &mut host, Some(503), ENVOY_OVERFLOW);
    assert_eq!(
        host.dispatched.len(),
        1,
        "not retried: the breaker is the cluster's"
    );
    let (status, v) = host.reply();
    assert_eq!(status, 503);
    assert_eq!(v["error"]["code"], "gateway_overloaded", "{v}");
    let headers = &host.replies[0].1;
    assert!(
        headers.iter().any(|(k, v)| k == "retry-after" && v == "1"),
        "{headers:?}"
    );
    assert_eq!(host.counted(Counter::Ejection), 0);
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));
    // Both prefill pods still take requests.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        next_request(&mut host, body);
        let mut flow = Flow::new(Rc::clone(&r));
        send_request(&mut flow, &mut host);
        seen.insert(dispatched_to(&host, 0));
        flow.on_stream_end(&mut host);
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn a_call_envoy_ends_before_it_leaves_is_the_gateways_limit_too() {
    // The breaker's refusal can be inline: dispatch_http_call then fails.
    let mut flow = Flow::new(pool());
    let mut host = post("/v1/completions", r#"{"model":"m","prompt":"p"}"#);
    host.dispatch_error = Some("InternalFailure".into());
    send_request(&mut flow, &mut host);
    let (status, v) = host.reply();
    assert_eq!(status, 503);
    assert_eq!(v["error"]["code"], "gateway_overloaded", "{v}");
    assert_eq!(host.counted(Counter::Ejection), 0);
}

#[test]
fn a_connection_closed_before_any_answer_is_resent_once_without_a_strike() {
    let r = pool();
    let body = r#"{"model":"m","prompt":"p"}"#;
    let mut host = post("/v1/completions", body);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    answer(&mut flow, &mut host, Some(503), ENVOY_TERMINATION);
    assert_eq!(host.dispatched.len(), 2, "resent");
    assert!(host.replies.is_empty());
    assert_eq!(host.counted(Counter::Ejection), 0, "no strike");
    // A second one is a pod that cannot be reached: ejected, and the retry
    // budget (prefill_max_retries = 1) takes the request elsewhere.
    let second = dispatched_to(&host, 1);
    answer(&mut flow, &mut host, Some(503), ENVOY_TERMINATION);
    assert_eq!(host.counted(Counter::Ejection), 1);
    assert_eq!(host.dispatched.len(), 3, "retried");
    assert_ne!(dispatched_to(&host, 2), second);
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));
}

#[test]
fn a_failed_prefill_pod_is_ejected_and_the_request_retried_elsewhere() {
    let r = pool();
    let body = r#"{"model":"m","prompt":"p"}"#;
    let mut host = post("/v1/completions", body);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    let first = dispatched_to(&host, 0);
    answer(
        &mut flow,
        &mut host,
        Some(503),
        "upstream connect error or disconnect/reset before headers",
    );
    assert_eq!(host.dispatched.len(), 2, "retried");
    let second = dispatched_to(&host, 1);
    assert_ne!(first, second, "on another prefill pod");
    assert!(host.replies.is_empty());
    assert_eq!(host.counted(Counter::PrefillRetry), 1);
    assert_eq!(host.counted(Counter::Ejection), 1);
    // The stream's count moved with its prefill.
    let live = streams(&r, &host);
    assert_eq!(live[pod_index(&r, &first)], 0, "{live:?}");
    assert_eq!(live[pod_index(&r, &second)], 1, "{live:?}");
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));

    // Later requests skip the ejected pod.
    for _ in 0..4 {
        next_request(&mut host, body);
        let mut flow = Flow::new(Rc::clone(&r));
        send_request(&mut flow, &mut host);
        assert_eq!(dispatched_to(&host, 0), second);
        flow.on_stream_end(&mut host);
    }

    // Retries are bounded (prefill_max_retries = 1): the last error is answered.
    next_request(&mut host, body);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    answer(&mut flow, &mut host, None, "");
    let (status, v) = host.reply();
    assert_eq!(status, 502);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("reset"),
        "{v}"
    );
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));

    // Every prefill pod unhealthy: 503 naming the model, nothing dispatched.
    next_request(&mut host, body);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    let (status, v) = host.reply();
    assert_eq!(status, 503);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unhealthy"));
    assert!(host.dispatched.is_empty());
}

#[test]
fn prompts_outside_every_bucket_go_to_the_combined_pod() {
    let r = pool();
    let mut host = post(
        "/v1/completions",
        r#"{"model":"c","prompt":"a prompt longer than four tokens"}"#,
    );
    let mut flow = Flow::new(Rc::clone(&r));
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    assert!(host.dispatched.is_empty(), "no prefill for a combined pod");
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.1.2.9:8000"));
    assert_eq!(host.counted(Counter::Unsplit(NotSplit::Combined)), 1);
    flow.on_response_headers(&mut host);
    assert!(host
        .response_headers
        .contains(&("decode-target-pod".into(), Some("combo".into()))));
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));

    let mut host = post("/v1/completions", r#"{"model":"c","prompt":"hi"}"#);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    assert_eq!(
        dispatched_to(&host, 0),
        "10.1.2.1:8000",
        "a short prompt fits the bucket"
    );
}

#[test]
fn selections_are_counted_per_pod_and_named_in_the_response() {
    let r = pool();
    let mut host = post("/v1/completions", r#"{"model":"m","prompt":"p"}"#);
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    flow.on_response_headers(&mut host);
    assert!(host
        .response_headers
        .contains(&("decode-target-pod".into(), Some("d0".into()))));
    let events = host.pod_events.borrow();
    assert!(events.contains(&("d0".to_string(), PodEvent::DecodeSelected)));
    assert_eq!(
        events
            .iter()
            .filter(|(_, e)| *e == PodEvent::PrefillSelected)
            .count(),
        1
    );
}

#[test]
fn engine_errors_eject_a_pod_only_after_several_in_a_row() {
    let r = pool();
    let body = r#"{"model":"m","prompt":"p"}"#;
    let mut host = post("/v1/completions", body);
    // Equal idle pods split requests at random, so each step sends requests
    // until one reaches p0; those that reach p1 succeed (p1's streak is its
    // own). Returns the ejections counted on the way.
    let on_p0 = |host: &mut FakeHost, status: u16| {
        let mut ejections = 0;
        for _ in 0..64 {
            next_request(host, body);
            let mut flow = Flow::new(Rc::clone(&r));
            send_request(&mut flow, host);
            let reached_p0 = dispatched_to(host, 0) == "10.1.0.1:8000";
            if reached_p0 && status != 200 {
                let error = r#"{"error":{"message":"engine error"}}"#;
                answer(&mut flow, host, Some(status), error);
            }
            // The answer (or the retry, on the other pod) succeeds.
            answer(&mut flow, host, Some(200), VLLM_ANSWER);
            flow.on_stream_end(host);
            ejections += host.counted(Counter::Ejection);
            if reached_p0 {
                return ejections;
            }
        }
        panic!("64 requests and none reached p0");
    };
    // Two 500s from p0, a success resets the streak, then three in a row
    // eject it.
    assert_eq!(on_p0(&mut host, 500), 0);
    assert_eq!(on_p0(&mut host, 500), 0);
    assert_eq!(on_p0(&mut host, 200), 0);
    let total: usize = (0..3).map(|_| on_p0(&mut host, 503)).sum();
    assert_eq!(total, 1, "ejected on the third failure in a row");
    assert!(r.counters(&host)[0].unhealthy_until_ms > 0);
    assert!(all_zero(&r, &host));
}

const SWAP: &str = r#"{
  "prefill_max_retries": 0,
  "models": [
    {"name": "m", "engine": "vllm", "prefill_policy": "least_request", "decode_policy": "least_request",
     "rolesets": [{"prefill": [{"address":"10.2.0.1:8000","name":"p0"}, {"address":"10.2.0.2:8000","name":"p1"}],
                   "decode": [{"address":"10.2.0.3:8000","name":"d0"}, {"address":"10.2.0.4:8000","name":"d1"}]}]}
  ]
}"#;

#[test]
fn swapping_the_pod_set_keeps_other_pods_exact_and_drains_the_departed() {
    let r =
        Rc::new(Router::new(Config::parse(SWAP.as_bytes()).expect("config"), 0).expect("router"));
    let model = r.fleet().model("m").expect("model").id;
    let old = r.fleet();
    let pod = |address: &str| {
        old.pods()
            .into_iter()
            .find(|p| p.address == address)
            .expect("pod")
    };
    let body = r#"{"model":"m","prompt":"p"}"#;
    let mut host = post("/v1/completions", body);

    // A: prefill in flight on one pod (pa), its decode held on another (da).
    next_request(&mut host, body);
    let mut a = Flow::new(Rc::clone(&r));
    send_request(&mut a, &mut host);
    let pa = pod(&dispatched_to(&host, 0));
    // B: prefill on the other prefill pod (pb), answered; its decode runs on db.
    next_request(&mut host, body);
    let mut b = Flow::new(Rc::clone(&r));
    send_request(&mut b, &mut host);
    let pb = pod(&dispatched_to(&host, 0));
    assert_ne!(pa.id, pb.id, "least_request avoids the busy prefill pod");
    answer(&mut b, &mut host, Some(200), VLLM_ANSWER);
    let db = pod(&host.header(ROUTING).expect("decode"));
    let da = old
        .pods()
        .into_iter()
        .find(|p| p.name.starts_with('d') && p.id != db.id)
        .expect("the other decode pod");
    // F: fails on pb (pa is busy), leaving pb a failure streak.
    next_request(&mut host, body);
    let mut f = Flow::new(Rc::clone(&r));
    send_request(&mut f, &mut host);
    assert_eq!(dispatched_to(&host, 0), pb.address);
    answer(&mut f, &mut host, Some(500), "{}");
    assert_eq!(host.reply().0, 502);
    f.on_stream_end(&mut host);
    let table = r.load(&host, model);
    assert_eq!(table.get(pa.id).outstanding_prefills, 1);
    assert_eq!(table.get(pb.id).failures, 1);
    assert_eq!(table.get(da.id).pending_decodes, 1);
    let db_before = table.get(db.id);
    assert_eq!(db_before.pending_decodes, 1);

    // A rollout: pa re-created at a new address, pb and da gone, a new p2,
    // db unchanged.
    let swapped = format!(
        r#"{{"prefill_max_retries": 0, "models": [{{"name": "m", "engine": "vllm",
            "prefill_policy": "least_request", "decode_policy": "least_request",
            "rolesets": [{{"prefill": [{{"address":"10.2.0.9:8000","name":"{}"}}, {{"address":"10.2.0.5:8000","name":"p2"}}],
                          "decode": [{{"address":"{}","name":"{}"}}]}}]}}]}}"#,
        pa.name, db.address, db.name
    );
    r.set_fleet(Config::parse(swapped.as_bytes()).expect("config").fleet());
    assert_eq!(r.load(&host, model).get(db.id), db_before, "db untouched");

    // C is placed on the new pod set only, and finishes.
    next_request(&mut host, body);
    let mut c = Flow::new(Rc::clone(&r));
    send_request(&mut c, &mut host);
    let to = dispatched_to(&host, 0);
    assert!(
        ["10.2.0.9:8000", "10.2.0.5:8000"].contains(&to.as_str()),
        "{to}"
    );
    answer(&mut c, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.header(ROUTING), Some(db.address.clone()));
    c.on_stream_end(&mut host);
    let table = r.load(&host, model);
    assert_eq!(
        table.get(db.id),
        db_before,
        "C's load came and went; B's stays"
    );
    // The departed pb keeps its row only while B's answer, prefilled
    // there, streams.
    let pb_row = table.get(pb.id);
    assert_eq!(
        (pb_row.outstanding_prefills, pb_row.live_streams),
        (0, 1),
        "{pb_row:?}"
    );

    // The requests placed before the swap give their load back to the pods
    // they were placed on, and those rows go once drained.
    a.on_stream_end(&mut host);
    b.on_stream_end(&mut host);
    assert!(
        r.load(&host, model).rows().is_empty(),
        "{:?}",
        r.load(&host, model)
    );
    assert!(all_zero(&r, &host));
}

#[test]
fn a_routing_header_that_cannot_be_written_fails_closed() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
    host.refuse_header_writes = true;
    assert_eq!(flow.on_request_headers(&mut host, false), Action::Pause);
    // The client's header could not be stripped, so the request ends here
    // rather than going where it points.
    let (status, v) = host.reply();
    assert_eq!(status, 500);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("setting a request header"));
    assert!(host.dispatched.is_empty());
    assert_eq!(host.resumed, 0);

    // After the prefill: the decode is not sent where the client pointed.
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
    send_request(&mut flow, &mut host);
    host.refuse_header_writes = true;
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    let (status, v) = host.reply();
    assert_eq!(status, 500);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("internal router error"));
    assert_eq!(host.resumed, 0, "never resumed towards an unknown upstream");
}

#[test]
fn a_body_the_host_cannot_hand_over_is_the_routers_error() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
    host.refuse_body = true;
    send_request(&mut flow, &mut host);
    expect_error(&host, 500, "reading the request body");
}

#[test]
fn a_combined_request_counts_as_combined_only() {
    let r = pool();
    let mut host = post(
        "/v1/completions",
        r#"{"model":"c","prompt":"a prompt longer than four tokens"}"#,
    );
    let mut flow = Flow::new(Rc::clone(&r));
    send_request(&mut flow, &mut host);
    assert_eq!(host.counted(Counter::Unsplit(NotSplit::Combined)), 1);
    let others = [
        NotSplit::Path,
        NotSplit::ByModel,
        NotSplit::Engine,
        NotSplit::Response,
        NotSplit::Decider,
    ];
    assert_eq!(others.map(|w| host.counted(Counter::Unsplit(w))), [0; 5]);
}

#[test]
fn the_global_connector_is_the_routers_and_can_be_changed() {
    let config = r#"{"kv_connector":"shfs","models":[{"name":"m","engine":"vllm",
        "rolesets":[{"prefill":["10.3.0.1:8000"],"decode":["10.3.0.2:8000"]}]}]}"#;
    let r = Rc::new(Router::new(Config::parse(config.as_bytes()).unwrap(), 0).unwrap());
    let decode_body = |r: &Rc<Router>| {
        let mut flow = Flow::new(Rc::clone(r));
        let mut host = post("/v1/completions", r#"{"model":"m","prompt":"p"}"#);
        send_request(&mut flow, &mut host);
        answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
        host.body_str()
    };
    // shfs: remote_host becomes the prefill pod's IP.
    assert!(decode_body(&r).contains(r#""remote_host":"10.3.0.1""#));
    r.set_connector_type(pd_router::fleet::Connector::Nixl);
    assert!(
        decode_body(&r).contains(r#""remote_host":"0.0.0.0""#),
        "relayed verbatim"
    );
}

#[test]
fn override_host_routing_counts_answers_from_another_pod() {
    let config = r#"{"routing":"override_host","models":[{"name":"m","engine":"vllm",
        "rolesets":[{"prefill":["10.4.0.1:8000"],"decode":["10.4.0.2:8000"]}]}]}"#;
    let r = Rc::new(Router::new(Config::parse(config.as_bytes()).unwrap(), 0).unwrap());
    assert_eq!(r.config.routing.header, "x-gateway-destination-endpoint");
    let run = |upstream: &str| {
        let mut flow = Flow::new(Rc::clone(&r));
        let mut host = post("/v1/completions", r#"{"model":"m","prompt":"p"}"#);
        send_request(&mut flow, &mut host);
        assert_eq!(
            host.dispatched[0]
                .headers
                .iter()
                .find(|(k, _)| k == "x-gateway-destination-endpoint")
                .map(|(_, v)| v.as_str()),
            Some("10.4.0.1:8000"),
            "the prefill names its endpoint in the mode's header"
        );
        answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
        host.upstream = Some(upstream.to_owned());
        flow.on_response_headers(&mut host);
        let logs = host.logs.borrow().len();
        (host.counted(Counter::DecodeRerouted), logs)
    };
    assert_eq!(run("10.4.0.2:8000").0, 0, "the chosen pod answered");
    let (rerouted, logs) = run("10.4.0.9:8000");
    assert_eq!(rerouted, 1);
    let (rerouted, later_logs) = run("10.4.0.9:8000");
    assert_eq!(rerouted, 1, "counted every time");
    assert!(later_logs < logs, "logged once per pod");
}

fn upstream(host: &mut FakeHost, content_type: &str) {
    host.upstream_headers = vec![
        (":status".into(), "200".into()),
        ("content-type".into(), content_type.into()),
        ("content-length".into(), "999".into()),
    ];
}

const P_USAGE: &str = r#"{"id":"p","choices":[{"text":"x"}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}},"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":1}}"#;
const D_USAGE: &str = r#"{"id":"d","choices":[{"text":"x y"}],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":9}}}"#;

#[test]
fn a_whole_answer_is_buffered_and_gets_the_prefill_cached_tokens() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/completions",
        r#"{"model":"vllm-m","prompt":"p","max_tokens":3}"#,
    );
    send_request(&mut flow, &mut host);
    answer(&mut flow, &mut host, Some(200), P_USAGE);
    upstream(&mut host, "application/json");
    flow.on_response_headers(&mut host);
    assert!(
        host.response_headers
            .contains(&("content-length".into(), None)),
        "the length may change"
    );
    host.response = D_USAGE.as_bytes()[..20].to_vec();
    assert_eq!(flow.on_response_body(&mut host, 20, false), Action::Pause);
    host.response = D_USAGE.as_bytes().to_vec();
    assert_eq!(
        flow.on_response_body(&mut host, D_USAGE.len(), true),
        Action::Continue
    );
    assert_eq!(
        String::from_utf8(host.response.clone()).unwrap(),
        D_USAGE.replace(r#""cached_tokens":9"#, r#""cached_tokens":4"#)
    );
    assert_eq!(host.counted(Counter::AnswerRewritten), 1);
}

#[test]
fn an_answer_with_nothing_to_add_keeps_the_pass_through_path() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
    send_request(&mut flow, &mut host);
    // No cached count in the prefill's answer: the decode's stays.
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    upstream(&mut host, "application/json");
    flow.on_response_headers(&mut host);
    assert!(!host
        .response_headers
        .iter()
        .any(|(k, _)| k == "content-length"));
    host.response = D_USAGE.as_bytes().to_vec();
    assert_eq!(flow.on_response_body(&mut host, 5, false), Action::Continue);
    assert_eq!(host.response, D_USAGE.as_bytes(), "not read, not touched");
}

const SGLANG_USAGE_EVENT: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":13}}}\n\ndata: [DONE]\n\n";

fn sglang_stream(flow: &mut Flow) -> FakeHost {
    let mut host = post(
        "/v1/chat/completions",
        r#"{"model":"sglang-m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
    );
    assert_eq!(send_request(flow, &mut host), Action::Continue);
    upstream(&mut host, "text/event-stream; charset=utf-8");
    flow.on_response_headers(&mut host);
    let first = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"A\"}}]}\n\n";
    host.response = first.as_bytes().to_vec();
    assert_eq!(
        flow.on_response_body(&mut host, first.len(), false),
        Action::Continue,
        "no usage in it: it goes on at once"
    );
    host.response = SGLANG_USAGE_EVENT.as_bytes().to_vec();
    assert_eq!(
        flow.on_response_body(&mut host, SGLANG_USAGE_EVENT.len(), true),
        Action::Pause,
        "held until the prefill tells its cached tokens"
    );
    host
}

#[test]
fn a_concurrent_stream_waits_at_its_usage_for_the_prefill_answer() {
    let mut flow = Flow::new(router());
    let mut host = sglang_stream(&mut flow);
    answer(
        &mut flow,
        &mut host,
        Some(200),
        r#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":5}}}"#,
    );
    assert_eq!(host.response_resumed, 1);
    assert_eq!(
        String::from_utf8(host.response.clone()).unwrap(),
        SGLANG_USAGE_EVENT.replace("\"cached_tokens\":13", "\"cached_tokens\":5")
    );
    assert!(host.replies.is_empty());
}

#[test]
fn a_held_stream_whose_prefill_fails_late_goes_on_as_written() {
    let mut flow = Flow::new(router());
    let mut host = sglang_stream(&mut flow);
    answer(&mut flow, &mut host, Some(500), "oops");
    assert_eq!(host.response_resumed, 1, "released");
    assert_eq!(host.response, SGLANG_USAGE_EVENT.as_bytes(), "unchanged");
    assert!(host.replies.is_empty(), "output already reached the client");
    assert_eq!(host.counted(Counter::PrefillFailed), 1);
}

#[test]
fn prompt_logprobs_are_asked_of_the_prefill_only_and_merged_into_the_answer() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/chat/completions",
        r#"{"model":"vllm-m","messages":[],"prompt_logprobs":1,"max_tokens":4}"#,
    );
    send_request(&mut flow, &mut host);
    let p = String::from_utf8_lossy(&host.dispatched[0].body).into_owned();
    assert!(p.contains(r#""prompt_logprobs":1"#), "{p}");
    let p_answer = r#"{"choices":[{"index":0,"message":{"content":"A"}}],"prompt_logprobs":[null,{"7":{"logprob":-1.5}}],"kv_transfer_params":{"do_remote_prefill":true}}"#;
    answer(&mut flow, &mut host, Some(200), p_answer);
    assert!(
        !host.body_str().contains("prompt_logprobs"),
        "{}",
        host.body_str()
    );
    upstream(&mut host, "application/json");
    flow.on_response_headers(&mut host);
    let d = r#"{"choices":[{"index":0,"message":{"content":"A b"}}],"prompt_logprobs":null}"#;
    host.response = d.as_bytes().to_vec();
    assert_eq!(
        flow.on_response_body(&mut host, d.len(), true),
        Action::Continue
    );
    assert_eq!(
        String::from_utf8(host.response.clone()).unwrap(),
        r#"{"choices":[{"index":0,"message":{"content":"A b"}}],"prompt_logprobs":[null,{"7":{"logprob":-1.5}}]}"#
    );
}

#[test]
fn a_responses_stream_waits_at_its_terminal_event() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/responses",
        r#"{"model":"sglang-m","input":"hi","stream":true,"max_output_tokens":4}"#,
    );
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    upstream(&mut host, "text/event-stream");
    flow.on_response_headers(&mut host);
    let created = "event: response.created\ndata: {\"response\":{\"usage\":null},\"type\":\"response.created\"}\n\n";
    host.response = created.as_bytes().to_vec();
    assert_eq!(
        flow.on_response_body(&mut host, created.len(), false),
        Action::Continue
    );
    let done = "event: response.incomplete\ndata: {\"response\":{\"usage\":{\"input_tokens\":8,\"input_tokens_details\":{\"cached_tokens\":8}}},\"type\":\"response.incomplete\"}\n\n";
    host.response = done.as_bytes().to_vec();
    assert_eq!(
        flow.on_response_body(&mut host, done.len(), true),
        Action::Pause
    );
    answer(
        &mut flow,
        &mut host,
        Some(200),
        r#"{"object":"response","usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":3}}}"#,
    );
    assert_eq!(host.response_resumed, 1);
    assert_eq!(
        String::from_utf8(host.response.clone()).unwrap(),
        done.replace("\"cached_tokens\":8", "\"cached_tokens\":3")
    );
}

/// A completion of `prompt` for a decider's model, on `host`'s shared data.
fn decided(host: &mut FakeHost, model: &str, prompt: &str) {
    next_request(
        host,
        &format!(r#"{{"model":"{model}","prompt":"{prompt}"}}"#),
    );
}

#[test]
fn a_decider_keeps_a_short_prompt_whole_on_a_decode_pod() {
    let r = router();
    let mut flow = Flow::new(Rc::clone(&r));
    let mut host = post("/v1/completions", "");
    decided(&mut host, "decided-m", "hi there");
    let client = host.body.clone();
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    assert!(host.dispatched.is_empty(), "no prefill for a short prompt");
    let to = host.header(ROUTING).expect("routed");
    assert!(to == "10.0.1.2:8000" || to == "10.0.1.3:8000", "{to}");
    assert_eq!(host.body, client, "the client's body, byte for byte");
    assert_eq!(
        host.decisions.borrow().as_slice(),
        &[("decided-m".to_owned(), "short")]
    );
    assert_eq!(host.counted(Counter::Unsplit(NotSplit::Decider)), 1);
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host), "its decode load is given back");
}

#[test]
fn a_decider_splits_a_long_fresh_prompt_then_keeps_its_next_turn_on_the_same_decode() {
    let r = router();
    let turn = "x".repeat(3000);
    let mut flow = Flow::new(Rc::clone(&r));
    let mut host = post("/v1/completions", "");
    decided(&mut host, "decided-m", &turn);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(host.dispatched.len(), 1, "a long fresh prompt is split");
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    let served = host.header(ROUTING).expect("decode routed");
    assert_eq!(
        host.decisions.borrow()[0],
        ("decided-m".to_owned(), "split")
    );
    flow.on_stream_end(&mut host);

    // The same prefix with a new last turn: the decode pod holds all but it.
    for _ in 0..4 {
        let mut flow = Flow::new(Rc::clone(&r));
        decided(
            &mut host,
            "decided-m",
            &format!("{turn} and then one more question"),
        );
        assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
        assert!(
            host.dispatched.is_empty(),
            "no prefill for what the decode holds"
        );
        assert_eq!(host.header(ROUTING).as_deref(), Some(served.as_str()));
        assert_eq!(
            host.decisions.borrow()[0],
            ("decided-m".to_owned(), "cached")
        );
        flow.on_stream_end(&mut host);
    }
    assert!(all_zero(&r, &host));
}

#[test]
fn a_decider_keeps_work_local_when_every_prefill_pod_queues() {
    use pd_router::pods::{update_scraped, PodMetrics, StoredMetrics};
    let r = router();
    let fleet = r.fleet();
    let model = fleet.model("local-m").expect("model");
    let (p, d) = (&model.rolesets[0].prefill[0], &model.rolesets[0].decode[0]);
    let mut host = post("/v1/completions", "");
    let now = host.clock_us.get() / 1000;
    let metrics = |waiting: f64| StoredMetrics {
        at_ms: now,
        metrics: PodMetrics {
            waiting,
            ..PodMetrics::default()
        },
    };
    let key = r.keys().scraped();
    update_scraped(&mut host, &key, |t| {
        t.insert(p.id, metrics(3.0));
        t.insert(d.id, metrics(0.0));
    })
    .expect("scraped");
    r.refresh_metrics(&host);
    let mut flow = Flow::new(Rc::clone(&r));
    decided(&mut host, "local-m", &"y".repeat(3000));
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    assert!(host.dispatched.is_empty());
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.2.2:8000"));
    assert_eq!(
        host.decisions.borrow().as_slice(),
        &[("local-m".to_owned(), "prefill_saturated")]
    );

    // A busy decode too: split after all.
    update_scraped(&mut host, &key, |t| {
        t.insert(d.id, metrics(2.0));
    })
    .expect("scraped");
    r.refresh_metrics(&host);
    let mut flow = Flow::new(Rc::clone(&r));
    decided(&mut host, "local-m", &"y".repeat(3000));
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(host.dispatched.len(), 1);
    assert_eq!(host.decisions.borrow()[0], ("local-m".to_owned(), "split"));
}

#[test]
fn a_tensorrt_llm_decider_sends_a_short_prompt_to_the_generation_server_as_sent() {
    // TensorRT-LLM's own orchestrator prefills locally the same way: the
    // original request, no disaggregated_params, to a generation server.
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", "");
    decided(&mut host, "trt-decided", "short");
    let client = host.body.clone();
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    assert!(host.dispatched.is_empty());
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.3.2:8000"));
    assert_eq!(host.body, client);
    assert_eq!(host.decisions.borrow()[0].1, "short");
}

#[test]
fn a_clients_own_kv_transfer_params_reach_both_legs_and_hand_off_keys_do_not() {
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/completions",
        r#"{"model":"vllm-m","prompt":"p","kv_transfer_params":{"lmcache.tag.user":"u1"}}"#,
    );
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    let prefill: serde_json::Value =
        serde_json::from_slice(&host.dispatched[0].body).expect("prefill JSON");
    assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
    assert_eq!(prefill["kv_transfer_params"]["lmcache.tag.user"], "u1");
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    let decode: serde_json::Value = serde_json::from_str(&host.body_str()).expect("decode JSON");
    assert_eq!(decode["kv_transfer_params"]["remote_engine_id"], "e");
    assert_eq!(decode["kv_transfer_params"]["lmcache.tag.user"], "u1");
    assert!(
        host.body_str()
            .contains(r#""future":{"n":18446744073709551615},"lmcache.tag.user":"u1"}"#),
        "the prefill's params relayed verbatim, the client's after them: {}",
        host.body_str()
    );

    for key in [
        "remote_engine_id",
        "remote_prefill_cached_tokens",
        "do_remote_prefill",
    ] {
        let mut flow = Flow::new(router());
        let body =
            format!(r#"{{"model":"vllm-m","prompt":"p","kv_transfer_params":{{"{key}":1}}}}"#);
        let mut host = post("/v1/completions", &body);
        send_request(&mut flow, &mut host);
        let (status, v) = host.reply();
        assert_eq!(status, 400, "{key}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("kv_transfer_params.{key}")), "{msg}");
        assert!(host.dispatched.is_empty());
    }
}

/// One vLLM split of `health-m` on `host`'s shared data, its decode answered
/// with `status` (and, for a 200, `first_event` as its stream's first bytes).
/// Returns (prefill, decode) addresses.
fn split_answered(
    r: &Rc<Router>,
    host: &mut FakeHost,
    status: u16,
    first_event: &str,
) -> (String, String) {
    let mut flow = Flow::new(Rc::clone(r));
    next_request(host, r#"{"model":"health-m","prompt":"p","stream":true}"#);
    assert_eq!(send_request(&mut flow, host), Action::Pause);
    let prefill = host.dispatched[0]
        .headers
        .iter()
        .find(|(k, _)| k == ROUTING)
        .unwrap()
        .1
        .clone();
    answer(&mut flow, host, Some(200), VLLM_ANSWER);
    let decode = host.header(ROUTING).unwrap();
    host.upstream_headers = vec![
        (":status".into(), status.to_string()),
        ("content-type".into(), "text/event-stream".into()),
    ];
    flow.on_response_headers(host);
    host.response = first_event.as_bytes().to_vec();
    let n = host.response.len();
    flow.on_response_body(host, n, true);
    flow.on_stream_end(host);
    r.refresh_metrics(&*host);
    (prefill, decode)
}

const TOKEN_EVENT: &str = "data: {\"id\":\"d\",\"choices\":[{\"text\":\"x\"}]}\n\n";
const ERROR_EVENT: &str = "data: {\"error\":{\"message\":\"KV transfer failed\",\"code\":500}}\n\n";

#[test]
fn a_decode_failing_every_hand_off_is_ejected_after_its_streak() {
    let r = router();
    let mut host = post("/v1/completions", "");
    let failures = r.config.health.eject_after_failures as usize;
    let mut sent_to_bad = 0;
    let mut bad_failures = 0;
    let (mut counted_failed, mut ejections, mut pod_failed) = (0, 0, 0);
    for _ in 0..20 {
        let (_, decode) = split_answered(&r, &mut host, 200, TOKEN_EVENT);
        if decode == "10.0.4.4:8000" {
            sent_to_bad += 1;
        }
        let _ = decode;
        // Every decode on hd1 fails: 500s and error events alternate.
        let mut flow = Flow::new(Rc::clone(&r));
        next_request(
            &mut host,
            r#"{"model":"health-m","prompt":"p","stream":true}"#,
        );
        send_request(&mut flow, &mut host);
        answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
        let decode = host.header(ROUTING).unwrap();
        let failing = decode == "10.0.4.4:8000";
        let status = if failing && bad_failures % 2 == 0 {
            500
        } else {
            200
        };
        host.upstream_headers = vec![
            (":status".into(), status.to_string()),
            ("content-type".into(), "text/event-stream".into()),
        ];
        flow.on_response_headers(&mut host);
        host.response = if failing { ERROR_EVENT } else { TOKEN_EVENT }
            .as_bytes()
            .to_vec();
        let n = host.response.len();
        flow.on_response_body(&mut host, n, true);
        flow.on_stream_end(&mut host);
        counted_failed += host.counted(Counter::DecodeFailed);
        ejections += host.counted(Counter::Ejection);
        pod_failed += host
            .pod_events
            .borrow()
            .iter()
            .filter(|(p, e)| p == "hd1" && *e == PodEvent::DecodeFailed)
            .count();
        if failing {
            sent_to_bad += 1;
            bad_failures += 1;
        }
    }
    assert_eq!(
        bad_failures, failures,
        "hd1 gets no request after its ejection"
    );
    assert_eq!(counted_failed, failures);
    assert_eq!(ejections, 1);
    assert_eq!(pod_failed, failures, "counted per pod");
    assert!(sent_to_bad >= failures);
    assert!(all_zero(&r, &host));
}

#[test]
fn a_decode_the_gateways_breaker_refused_counts_against_no_pod() {
    let r = pool();
    let mut host = post("/v1/completions", "");
    for _ in 0..5 {
        let mut flow = Flow::new(Rc::clone(&r));
        next_request(&mut host, r#"{"model":"m","prompt":"p"}"#);
        send_request(&mut flow, &mut host);
        answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
        host.upstream_headers = vec![
            (":status".into(), "503".into()),
            ("x-envoy-overloaded".into(), "true".into()),
        ];
        flow.on_response_headers(&mut host);
        flow.on_stream_end(&mut host);
        assert_eq!(host.counted(Counter::DecodeFailed), 0);
        assert_eq!(host.counted(Counter::Ejection), 0);
    }
    assert!(all_zero(&r, &host));
}

#[test]
fn a_pair_that_fails_while_both_pods_work_with_others_is_avoided() {
    let r = router();
    let mut host = post("/v1/completions", "");
    let failures = r.config.health.eject_after_failures as usize;
    let (mut pair_failures, mut after, mut ejections) = (0, 0, 0);
    for _ in 0..80 {
        let mut flow = Flow::new(Rc::clone(&r));
        next_request(
            &mut host,
            r#"{"model":"pair-m","prompt":"p","stream":true}"#,
        );
        send_request(&mut flow, &mut host);
        let prefill = host.dispatched[0]
            .headers
            .iter()
            .find(|(k, _)| k == ROUTING)
            .unwrap()
            .1
            .clone();
        answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
        let decode = host.header(ROUTING).unwrap();
        // Only hp0 -> hd1 fails; each pod works with the other.
        let bad = prefill == "10.0.5.1:8000" && decode == "10.0.5.4:8000";
        if pair_failures >= failures && bad {
            after += 1;
        }
        host.upstream_headers = vec![
            (":status".into(), if bad { "500" } else { "200" }.into()),
            ("content-type".into(), "text/event-stream".into()),
        ];
        flow.on_response_headers(&mut host);
        host.response = TOKEN_EVENT.as_bytes().to_vec();
        let n = host.response.len();
        flow.on_response_body(&mut host, n, true);
        flow.on_stream_end(&mut host);
        ejections += host.counted(Counter::Ejection);
        r.refresh_metrics(&host);
        if bad {
            pair_failures += 1;
        }
    }
    assert_eq!(
        pair_failures, failures,
        "no hand-off on the pair once it is avoided"
    );
    assert_eq!(after, 0);
    assert_eq!(ejections, 0, "neither pod is ejected");
    assert!(all_zero(&r, &host));
}

#[test]
fn a_client_that_leaves_during_its_prefill_is_forgotten_at_once() {
    let r = router();
    let mut flow = Flow::new(Rc::clone(&r));
    let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    flow.on_stream_end(&mut host);
    assert_eq!(host.counted(Counter::ClientGone), 1);
    assert!(all_zero(&r, &host), "its load is given back at once");
    // The prefill's answer, when it comes, leads nowhere.
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 0);
    assert!(host.replies.is_empty());
}

#[test]
fn a_decode_leaves_with_its_prefills_answer_however_slow_the_clock() {
    // A clock that moves 31 s at each reading, past vLLM NIXL's 30 s KV
    // lease: the decode still leaves in the answer's callback (the lease
    // starts when the engine finishes, and no router time counts against
    // it), with the hand-off, and the prefill is not sent again.
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", r#"{"model":"vllm-m","prompt":"p"}"#);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    host.clock_step_us = 31_000_000;
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.dispatched.len(), 1, "prefilled once");
    assert_eq!(host.resumed, 1);
    assert!(host.replies.is_empty());
    assert!(host.body_str().contains("kv_transfer_params"));
}

const GATEWAY: &str = r#"{
  "max_body_bytes": 4096,
  "models": [
    {"name": "a", "engine": "vllm", "adapters": ["a-sql", "a-chat"],
     "rolesets": [{"prefill": ["10.1.0.1:8000"], "decode": ["10.1.0.2:8000", "10.1.0.3:8000"]}]},
    {"name": "b", "engine": "vllm", "rolesets": [{"prefill": ["10.2.0.1:8000"], "decode": ["10.2.0.2:8000"]}]},
    {"name": "c", "engine": "sglang", "combined": ["10.3.0.1:30000"]},
    {"name": "t", "engine": "trtllm", "rolesets": [{"prefill": ["10.4.0.1:8000"], "decode": ["10.4.0.2:8000"]}]}
  ]
}"#;

fn gateway() -> Rc<Router> {
    Rc::new(Router::new(Config::parse(GATEWAY.as_bytes()).expect("config"), 0).expect("router"))
}

fn get(path: &str) -> FakeHost {
    let mut host = post(path, "");
    host.set_request_header(":method", Some("GET")).unwrap();
    host
}

#[test]
fn the_gateway_answers_its_model_list() {
    let mut flow = Flow::new(gateway());
    let mut host = get("/v1/models");
    assert_eq!(flow.on_request_headers(&mut host, true), Action::Pause);
    let (status, list) = host.reply();
    assert_eq!(status, 200);
    assert_eq!(list["object"], "list");
    let ids: Vec<(&str, &str)> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap(),
                c["parent"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        ids,
        [
            ("a", "-"),
            ("a-sql", "a"),
            ("a-chat", "a"),
            ("b", "-"),
            ("c", "-"),
            ("t", "-")
        ]
    );
    assert!(host.dispatched.is_empty() && host.header(ROUTING).is_none());
    assert_eq!(host.counted(Counter::ModelsListed), 1);

    let mut flow = Flow::new(gateway());
    let mut host = get("/v1/models/a-chat");
    assert_eq!(flow.on_request_headers(&mut host, true), Action::Pause);
    let (status, card) = host.reply();
    assert_eq!(
        (status, card["id"].as_str(), card["parent"].as_str()),
        (200, Some("a-chat"), Some("a"))
    );

    let mut flow = Flow::new(gateway());
    let mut host = get("/v1/models/nope");
    assert_eq!(flow.on_request_headers(&mut host, true), Action::Pause);
    expect_error(&host, 404, "nope");
}

/// Sends `body` to `path` on `r` and returns the pod it went to, after
/// checking the load it held came back.
fn by_model(r: &Rc<Router>, host: &mut FakeHost, path: &str, body: &str) -> Option<String> {
    next_request_to(host, path, body);
    let mut flow = Flow::new(Rc::clone(r));
    let action = send_request(&mut flow, host);
    if !host.replies.is_empty() {
        return None;
    }
    assert_eq!(action, Action::Continue);
    assert!(host.dispatched.is_empty(), "nothing is split");
    let held: u32 = load(r, host).iter().map(|l| l.1).sum();
    assert_eq!(held, 1, "counted in the pod's load");
    flow.on_stream_end(host);
    assert!(all_zero(r, host));
    host.header(ROUTING)
}

#[test]
fn calls_that_name_a_model_reach_only_its_pods() {
    let r = gateway();
    let mut host = post("/", "");
    let pods = |m: &str| -> &[&str] {
        match m {
            "a" | "a-sql" | "a-chat" => &["10.1.0.2:8000", "10.1.0.3:8000"],
            "b" => &["10.2.0.2:8000"],
            "c" => &["10.3.0.1:30000"],
            _ => &["10.4.0.2:8000"],
        }
    };
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..40 {
        let model = ["a", "b", "c", "t", "a-sql"][i % 5];
        let path = ["/v1/embeddings", "/tokenize", "/v1/score", "/pooling"][i % 4];
        let body = format!(r#"{{"input":"x","model":"{model}"}}"#);
        let pod = by_model(&r, &mut host, path, &body).expect("routed");
        assert!(
            pods(model).contains(&pod.as_str()),
            "{model} {path} went to {pod}"
        );
        seen.insert(pod);
    }
    assert_eq!(seen.len(), 5, "both of a's decode pods serve: {seen:?}");

    assert_eq!(
        by_model(
            &r,
            &mut host,
            "/v1/embeddings",
            r#"{"model":"zzz","input":"x"}"#
        ),
        None
    );
    expect_error(&host, 404, "zzz");
    assert_eq!(
        by_model(
            &r,
            &mut host,
            "/v1/embeddings",
            r#"{"model":"a","model":"b"}"#
        ),
        None
    );
    expect_error(&host, 400, "model");

    // No model named: any decode pod, in turn, holding no load.
    let mut flow = Flow::new(Rc::clone(&r));
    next_request_to(&mut host, "/v1/load_lora_adapter", r#"{"lora_name":"x"}"#);
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    assert!(host.header(ROUTING).is_some());
    assert!(all_zero(&r, &host));
}

#[test]
fn a_multipart_form_routes_by_its_model_field() {
    let r = gateway();
    let form = "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n--XX\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nb\r\n--XX--\r\n";
    let mut host = post("/v1/audio/transcriptions", form);
    host.set_request_header("content-type", Some("multipart/form-data; boundary=XX"))
        .unwrap();
    let mut flow = Flow::new(Rc::clone(&r));
    assert_eq!(send_request(&mut flow, &mut host), Action::Continue);
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.2.0.2:8000"));
    assert_eq!(host.body_str(), form, "the body is not touched");
}

#[test]
fn an_adapter_splits_on_its_base_models_pods() {
    let r = gateway();
    let client = r#"{"model":"a-sql","prompt":"select","max_tokens":9}"#;
    let mut host = post("/v1/completions", client);
    let mut flow = Flow::new(Rc::clone(&r));
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(dispatched_to(&host, 0), "10.1.0.1:8000");
    assert!(String::from_utf8_lossy(&host.dispatched[0].body).contains(r#""model":"a-sql""#));
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert!(["10.1.0.2:8000", "10.1.0.3:8000"].contains(&host.header(ROUTING).unwrap().as_str()));
    assert!(host.body_str().starts_with(r#"{"model":"a-sql""#));
}

#[test]
fn messages_split_with_max_tokens_capped_on_the_prefill() {
    let mut flow = Flow::new(gateway());
    let client = r#"{"model":"a","system":"be brief","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"min_tokens":2,"stream":true}"#;
    let mut host = post("/v1/messages", client);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(
        String::from_utf8_lossy(&host.dispatched[0].body),
        r#"{"model":"a","system":"be brief","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}"#
    );
    let answer_body = r#"{"id":"msg_1","type":"message","content":[],"usage":{"input_tokens":5,"output_tokens":1},"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":1}}"#;
    answer(&mut flow, &mut host, Some(200), answer_body);
    assert_eq!(
        host.body_str(),
        r#"{"model":"a","system":"be brief","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"min_tokens":2,"stream":true,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":1}}"#
    );

    // Anthropic's API requires max_tokens: without it the decode would be
    // refused after the prefill ran.
    let mut flow = Flow::new(gateway());
    let mut host = post("/v1/messages", r#"{"model":"a","messages":[]}"#);
    send_request(&mut flow, &mut host);
    expect_error(&host, 400, "max_tokens");
}

#[test]
fn generate_caps_the_tokens_inside_sampling_params() {
    let mut flow = Flow::new(gateway());
    let client = r#"{"model":"b","token_ids":[1,2,3],"sampling_params":{"temperature":0,"max_tokens":50,"min_tokens":3},"stream":true}"#;
    let mut host = post("/inference/v1/generate", client);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(
        String::from_utf8_lossy(&host.dispatched[0].body),
        r#"{"model":"b","token_ids":[1,2,3],"sampling_params":{"temperature":0,"max_tokens":1},"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}"#
    );
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert!(host.body_str().starts_with(&client[..client.len() - 1]));

    // Without sampling_params, one is made; without a model, a gateway of
    // several models cannot tell which.
    let mut flow = Flow::new(gateway());
    let mut host = post("/inference/v1/generate", r#"{"model":"b","token_ids":[7]}"#);
    send_request(&mut flow, &mut host);
    assert!(String::from_utf8_lossy(&host.dispatched[0].body)
        .contains(r#""sampling_params":{"max_tokens":1}"#));
    let mut flow = Flow::new(gateway());
    let mut host = post("/inference/v1/generate", r#"{"token_ids":[7]}"#);
    send_request(&mut flow, &mut host);
    expect_error(&host, 400, "4 models");
    let mut flow = Flow::new(gateway());
    let mut host = post(
        "/inference/v1/generate",
        r#"{"model":"b","token_ids":[7],"sampling_params":{"max_tokens":"9"}}"#,
    );
    send_request(&mut flow, &mut host);
    expect_error(&host, 400, "sampling_params.max_tokens");
}

#[test]
fn engines_without_a_handoff_on_a_path_serve_it_unsplit() {
    for (path, body, pod) in [
        (
            "/v1/messages",
            r#"{"model":"t","messages":[],"max_tokens":5}"#,
            "10.4.0.2:8000",
        ),
        (
            "/inference/v1/generate",
            r#"{"model":"c","token_ids":[1]}"#,
            "10.3.0.1:30000",
        ),
    ] {
        let mut flow = Flow::new(gateway());
        let mut host = post(path, body);
        assert_eq!(
            send_request(&mut flow, &mut host),
            Action::Continue,
            "{path}"
        );
        assert!(host.dispatched.is_empty());
        assert_eq!(host.header(ROUTING).as_deref(), Some(pod));
        assert_eq!(host.body_str(), body);
    }
}

const ADMISSION: &str = r#"{
  "admission": {"max_in_flight_per_pod": 1, "queue_ttl_ms": 800, "max_queued": 2},
  "objectives": {"premium": 10, "standard": 0, "batch": -1},
  "models": [{"name": "m", "engine": "vllm",
              "rolesets": [{"prefill": ["10.9.0.1:8000"], "decode": ["10.9.0.2:8000"]}]}]
}"#;

/// A stream of the admission router, with its objective.
struct Waiter {
    flow: Flow,
    host: FakeHost,
}

impl Waiter {
    fn new(r: &Rc<Router>, context: u32, objective: &str) -> Waiter {
        let mut host = post(
            "/v1/completions",
            r#"{"model":"m","prompt":"p","max_tokens":5}"#,
        );
        host.set_request_header("x-gateway-inference-objective", Some(objective))
            .unwrap();
        host.set_request_header("x-gateway-inference-fairness-id", Some("t"))
            .unwrap();
        Waiter {
            flow: Flow::for_stream(Rc::clone(r), context),
            host,
        }
    }

    /// Runs `f` with the Envoy-wide shared data in this stream's host.
    fn on<T>(
        &mut self,
        store: &mut MemoryStore,
        f: impl FnOnce(&mut Flow, &mut FakeHost) -> T,
    ) -> T {
        std::mem::swap(self.host.shared.get_mut(), store);
        let out = f(&mut self.flow, &mut self.host);
        std::mem::swap(self.host.shared.get_mut(), store);
        out
    }

    fn dropped(&self) -> (u16, String, String) {
        let (status, headers, _) = &self.host.replies[0];
        let h = |k: &str| {
            headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        (*status, h("x-pd-dropped-reason"), h("retry-after"))
    }
}

#[test]
fn a_saturated_model_sheds_queues_by_priority_and_expires_waits() {
    let r = Rc::new(Router::new(Config::parse(ADMISSION.as_bytes()).unwrap(), 0).unwrap());
    let mut store = MemoryStore::default();
    let send = |w: &mut Waiter, store: &mut MemoryStore| w.on(store, send_request);

    let mut first = Waiter::new(&r, 1, "standard");
    assert_eq!(send(&mut first, &mut store), Action::Pause);
    assert_eq!(first.host.dispatched.len(), 1, "room: split at once");

    // The prefill pod is full: batch is shed, the others wait.
    let mut batch = Waiter::new(&r, 2, "batch");
    send(&mut batch, &mut store);
    assert_eq!(batch.dropped(), (429, "saturated".into(), "1".into()));
    let mut standard = Waiter::new(&r, 3, "standard");
    let mut premium = Waiter::new(&r, 4, "premium");
    for w in [&mut standard, &mut premium] {
        assert_eq!(send(w, &mut store), Action::Pause);
        assert!(w.host.dispatched.is_empty() && w.host.replies.is_empty());
    }
    assert_eq!(r.waiting_total(), 2);
    let mut overflow = Waiter::new(&r, 5, "premium");
    send(&mut overflow, &mut store);
    assert_eq!(overflow.dropped(), (503, "queue_full".into(), "1".into()));

    let now = first.host.now_ms();
    let next = |w: &mut Waiter, store: &mut MemoryStore| {
        w.on(store, |_, h| {
            r.next_admitted(&*h, now, 0).map(|w| w.context)
        })
    };
    assert_eq!(next(&mut first, &mut store), None, "still full");
    // The first request ends: room for one, and premium goes first.
    first.on(&mut store, |f, h| {
        answer(f, h, Some(200), VLLM_ANSWER);
        f.on_stream_end(h);
    });
    assert_eq!(next(&mut first, &mut store), Some(4));
    assert!(premium.on(&mut store, |f, h| f.admit(h)));
    assert_eq!(
        premium.host.dispatched.len(),
        1,
        "admitted: its prefill left"
    );
    assert_eq!(next(&mut first, &mut store), None);

    // Standard waits its TTL out: 429 with retry-after.
    let expired: Vec<u32> = r
        .take_expired(now + 800)
        .iter()
        .map(|w| w.context)
        .collect();
    assert_eq!(expired, vec![3]);
    standard.on(&mut store, |f, h| f.expire(h));
    assert_eq!(standard.dropped(), (429, "queue_ttl".into(), "1".into()));
    let body: serde_json::Value = serde_json::from_slice(&standard.host.replies[0].2).unwrap();
    assert_eq!(body["error"]["code"], "queue_timeout");

    // A client that leaves while waiting frees its place.
    let mut gone = Waiter::new(&r, 6, "standard");
    assert_eq!(send(&mut gone, &mut store), Action::Pause);
    assert_eq!(r.waiting_total(), 1);
    gone.on(&mut store, |f, h| f.on_stream_end(h));
    assert_eq!(r.waiting_total(), 0);
    assert_eq!(gone.host.counted(Counter::AdmissionCancelled), 1);
    assert!(gone.host.dispatched.is_empty() && gone.host.replies.is_empty());
}

/// A standard request that took the pods' one place and has ended since,
/// and a premium one that waited behind it (context 2), on `r`.
fn premium_waiting_behind_an_ended_request(
    r: &Rc<Router>,
    store: &mut MemoryStore,
) -> (Waiter, Waiter) {
    let send = |w: &mut Waiter, store: &mut MemoryStore| w.on(store, send_request);
    let mut first = Waiter::new(r, 1, "standard");
    assert_eq!(send(&mut first, store), Action::Pause);
    let mut premium = Waiter::new(r, 2, "premium");
    assert_eq!(send(&mut premium, store), Action::Pause);
    assert!(premium.host.dispatched.is_empty(), "full: premium waits");
    first.on(store, |f, h| {
        answer(f, h, Some(200), VLLM_ANSWER);
        f.on_stream_end(h);
    });
    (first, premium)
}

#[test]
fn a_negative_priority_waits_when_room_is_free_but_others_wait_ahead() {
    let r = Rc::new(Router::new(Config::parse(ADMISSION.as_bytes()).unwrap(), 0).unwrap());
    let mut store = MemoryStore::default();
    let send = |w: &mut Waiter, store: &mut MemoryStore| w.on(store, send_request);
    // The first request ended: the model has room, but premium still waits
    // for the next look at the queue. A batch request arriving now is not
    // shed (the model is not saturated): it waits behind premium.
    let (mut first, _premium) = premium_waiting_behind_an_ended_request(&r, &mut store);
    let mut batch = Waiter::new(&r, 3, "batch");
    assert_eq!(send(&mut batch, &mut store), Action::Pause);
    assert!(
        batch.host.replies.is_empty() && batch.host.dispatched.is_empty(),
        "{:?}",
        batch.host.replies
    );
    assert_eq!(batch.host.counted(Counter::AdmissionShed), 0);
    assert_eq!(r.waiting_total(), 2);
    let now = first.host.now_ms();
    let next = first.on(&mut store, |_, h| {
        r.next_admitted(&*h, now, 0).map(|w| w.context)
    });
    assert_eq!(next, Some(2), "premium first");
}

/// Two worker VMs of one Envoy on one store (inside the first's host), each
/// with the slot it leased, as the shell leases them at start.
fn two_workers() -> (Rc<Router>, Rc<Router>, MemoryStore) {
    use pd_router::pods::slots::{ensure_table, lease_slot};
    use pd_router::pods::WORKER_SLOTS_KEY;
    let mut store = MemoryStore::default();
    ensure_table(&mut store, WORKER_SLOTS_KEY);
    let mut worker = |holder: u64| {
        let slot = lease_slot(&mut store, WORKER_SLOTS_KEY, holder, None, 0).unwrap();
        let config = Config::parse(ADMISSION.as_bytes()).unwrap();
        Rc::new(Router::leased(config, slot, holder, 0).unwrap())
    };
    let (first, second) = (worker(11), worker(22));
    (first, second, store)
}

/// The decode pod of [`ADMISSION`]'s model, as load another worker holds.
fn decode_held(r: &Router) -> pd_router::load::HeldLoad {
    let fleet = r.fleet();
    let m = fleet.model("m").unwrap();
    pd_router::load::HeldLoad {
        model: m.id,
        prefill: None,
        prefill_tokens: 0,
        decode: Some(pod_id(r, "10.9.0.2:8000")),
        streaming: None,
    }
}

/// Worker 1 looks at the room (its reads kept for the callback, as the
/// shell keeps them), then worker 2 takes the decode pod's one place.
fn look_then_lose_the_place(w: &mut Waiter, first: &Router, second: &Router) {
    use pd_router::admission::Room;
    use pd_router::pods::CallbackReads;
    w.host.reads = Some(CallbackReads::default());
    let fleet = first.fleet();
    let m = fleet.model("m").unwrap();
    let now = w.host.now_ms();
    let room = first.room(&w.host, m, None, None, now);
    assert!(matches!(room, Room::Free { .. }), "{room:?}");
    let mut store = w.host.shared.borrow_mut();
    second.hold(&mut *store, decode_held(second), now).unwrap();
}

/// Worker 2's request on the decode pod ends; worker 1's stream then runs
/// in a new callback.
fn second_worker_ends(w: &mut Waiter, second: &Router) {
    let now = w.host.now_ms();
    let held = decode_held(second);
    let mut store = w.host.shared.borrow_mut();
    second.release(&mut *store, held, None, now).unwrap();
    drop(store);
    w.host.callback();
}

#[test]
fn a_request_let_in_whose_place_another_worker_took_waits_and_sends_nothing() {
    let (first, second, store) = two_workers();
    let mut w = Waiter::new(&first, 1, "standard");
    *w.host.shared.get_mut() = store;
    look_then_lose_the_place(&mut w, &first, &second);
    // Its placement reads what the look read, finds room, and takes the
    // place; the check after reads afresh and finds two on a pod of one.
    assert_eq!(send_request(&mut w.flow, &mut w.host), Action::Pause);
    assert!(w.host.dispatched.is_empty() && w.host.replies.is_empty());
    assert_eq!(w.host.counted(Counter::AdmissionRaceLost), 1);
    assert_eq!(w.host.counted(Counter::AdmissionQueued), 1);
    assert_eq!(first.waiting_total(), 1, "it waits");
    let fleet = first.fleet();
    let m = fleet.model("m").unwrap();
    let decode = decode_held(&first).decode.unwrap();
    let seen = first.load(&*w.host.shared.borrow(), m.id);
    assert_eq!(seen.get(decode).pending_decodes, 1, "worker 2's alone");
    // Worker 2's request ends: the next tick lets it in, and it is sent.
    second_worker_ends(&mut w, &second);
    let now = w.host.now_ms();
    assert_eq!(
        first.next_admitted(&w.host, now, 0).map(|x| x.context),
        Some(1)
    );
    assert!(w.flow.admit(&mut w.host));
    assert_eq!(w.host.dispatched.len(), 1, "its prefill left");
}

#[test]
fn a_request_the_tick_let_in_whose_place_another_worker_took_keeps_waiting() {
    let (first, second, store) = two_workers();
    let mut w = Waiter::new(&first, 1, "premium");
    *w.host.shared.get_mut() = store;
    // The pod is full when the request arrives: it waits.
    let now = w.host.now_ms();
    second
        .hold(&mut *w.host.shared.borrow_mut(), decode_held(&second), now)
        .unwrap();
    assert_eq!(send_request(&mut w.flow, &mut w.host), Action::Pause);
    assert_eq!(first.waiting_total(), 1);
    second_worker_ends(&mut w, &second);
    // The tick finds room and takes the request out; worker 2 fills the pod
    // again before the request takes its place.
    let next = first.next_admitted(&w.host, now, 0);
    assert_eq!(next.as_ref().map(|x| x.context), Some(1));
    look_then_lose_the_place(&mut w, &first, &second);
    assert!(!w.flow.admit(&mut w.host), "not let in after all");
    assert!(w.host.dispatched.is_empty() && w.host.replies.is_empty());
    assert_eq!(w.host.counted(Counter::AdmissionRaceLost), 1);
    // The tick puts it back in its place (the waitlist's own tests: still
    // open, so other workers' lower priorities wait behind it). Room again:
    // the same stream's request goes.
    second_worker_ends(&mut w, &second);
    assert!(w.flow.admit(&mut w.host));
    assert_eq!(w.host.dispatched.len(), 1, "its prefill left");
}

#[test]
fn a_request_the_tick_lets_in_leaves_the_published_queue_after_taking_its_pods() {
    // Another worker that reads this one's report without the request must
    // also read the load it took, or a lower priority there could take the
    // same place.
    let r = Rc::new(Router::new(Config::parse(ADMISSION.as_bytes()).unwrap(), 0).unwrap());
    let mut store = MemoryStore::default();
    let (mut first, mut premium) = premium_waiting_behind_an_ended_request(&r, &mut store);
    let now = first.host.now_ms();
    let next = first.on(&mut store, |_, h| {
        r.next_admitted(&*h, now, 0).map(|w| w.context)
    });
    assert_eq!(next, Some(2));
    premium.host.written.clear();
    assert!(premium.on(&mut store, |f, h| f.admit(h)));
    let written = &premium.host.written;
    let model = r.fleet().model("m").unwrap().id;
    let load = written.iter().position(|k| *k == *r.keys().load(model, 0));
    let report = written.iter().position(|k| *k == *r.keys().admission(0));
    assert!(
        load.is_some() && report.is_some() && load < report,
        "{written:?}"
    );
}

/// The admission router's configuration with `rolesets` (JSON) as its pods.
fn admission_with(rolesets: &str) -> Config {
    let json = format!(
        r#"{{"admission": {{"max_in_flight_per_pod": 1}},
            "models": [{{"name": "m", "engine": "vllm", "rolesets": {rolesets}}}]}}"#
    );
    Config::parse(json.as_bytes()).unwrap()
}

#[test]
fn a_waiting_request_goes_to_pods_that_joined_while_it_waited() {
    let first_pair = r#"[{"prefill": ["10.9.2.1:8000"], "decode": ["10.9.2.2:8000"]}]"#;
    let r = Rc::new(Router::new(admission_with(first_pair), 0).unwrap());
    let mut store = MemoryStore::default();
    let send = |w: &mut Waiter, store: &mut MemoryStore| w.on(store, send_request);
    let mut held = Waiter::new(&r, 1, "standard");
    assert_eq!(send(&mut held, &mut store), Action::Pause);
    let mut waiting = Waiter::new(&r, 2, "standard");
    assert_eq!(send(&mut waiting, &mut store), Action::Pause);
    assert!(waiting.host.dispatched.is_empty(), "the one pair is full");
    // A second pair joins (discovery) while the first stays held.
    let two_pairs = r#"[{"prefill": ["10.9.2.1:8000"], "decode": ["10.9.2.2:8000"]},
                        {"prefill": ["10.9.2.3:8000"], "decode": ["10.9.2.4:8000"]}]"#;
    r.set_fleet(admission_with(two_pairs).fleet());
    let now = held.host.now_ms();
    let next = held.on(&mut store, |_, h| {
        r.next_admitted(&*h, now, 0).map(|w| w.context)
    });
    assert_eq!(next, Some(2));
    assert!(waiting.on(&mut store, |f, h| f.admit(h)), "let in");
    assert_eq!(
        dispatched_to(&waiting.host, 0),
        "10.9.2.3:8000",
        "on the new pair"
    );
}

#[test]
fn a_waiting_request_never_goes_to_pods_that_left_while_it_waited() {
    let two_pairs = r#"[{"prefill": ["10.9.3.1:8000"], "decode": ["10.9.3.2:8000"]},
                        {"prefill": ["10.9.3.3:8000"], "decode": ["10.9.3.4:8000"]}]"#;
    let r = Rc::new(Router::new(admission_with(two_pairs), 0).unwrap());
    let mut store = MemoryStore::default();
    let send = |w: &mut Waiter, store: &mut MemoryStore| w.on(store, send_request);
    let mut a = Waiter::new(&r, 1, "standard");
    let mut b = Waiter::new(&r, 2, "standard");
    assert_eq!(send(&mut a, &mut store), Action::Pause);
    assert_eq!(send(&mut b, &mut store), Action::Pause);
    let mut waiting = Waiter::new(&r, 3, "standard");
    assert_eq!(send(&mut waiting, &mut store), Action::Pause);
    assert!(waiting.host.dispatched.is_empty(), "both pairs full");
    // The request on the second pair ends, and that pair leaves the fleet:
    // its pods have no load any more, and must not read as free.
    let second = if dispatched_to(&a.host, 0) == "10.9.3.3:8000" {
        &mut a
    } else {
        &mut b
    };
    second.on(&mut store, |f, h| {
        answer(f, h, Some(200), VLLM_ANSWER);
        f.on_stream_end(h);
    });
    let one_pair = r#"[{"prefill": ["10.9.3.1:8000"], "decode": ["10.9.3.2:8000"]}]"#;
    r.set_fleet(admission_with(one_pair).fleet());
    let now = waiting.host.now_ms();
    assert!(
        !waiting.on(&mut store, |f, h| f.admit(h)),
        "still full: it keeps waiting"
    );
    assert!(
        waiting.host.dispatched.is_empty(),
        "{:?}",
        waiting.host.dispatched
    );
    let next = waiting.on(&mut store, |_, h| {
        r.next_admitted(&*h, now, 0).map(|w| w.context)
    });
    assert_eq!(next, None, "nothing has room");
}

#[test]
fn a_prompt_whose_bucket_is_full_waits_rather_than_failing() {
    let buckets = r#"[{"prefill": ["10.9.4.1:8000"], "decode": ["10.9.4.2:8000"], "prompt_tokens": {"max": 100}},
                      {"prefill": ["10.9.4.3:8000"], "decode": ["10.9.4.4:8000"], "prompt_tokens": {"min": 101}}]"#;
    let r = Rc::new(Router::new(admission_with(buckets), 0).unwrap());
    let mut store = MemoryStore::default();
    let send = |w: &mut Waiter, store: &mut MemoryStore| w.on(store, send_request);
    // Short prompts: the first fills the short bucket's pods; the second
    // waits for them though the long bucket's pods are idle.
    let mut first = Waiter::new(&r, 1, "standard");
    assert_eq!(send(&mut first, &mut store), Action::Pause);
    assert_eq!(dispatched_to(&first.host, 0), "10.9.4.1:8000");
    let mut second = Waiter::new(&r, 2, "standard");
    assert_eq!(send(&mut second, &mut store), Action::Pause);
    assert!(second.host.replies.is_empty(), "{:?}", second.host.replies);
    assert!(second.host.dispatched.is_empty());
    assert_eq!(r.waiting_total(), 1);
    first.on(&mut store, |f, h| {
        answer(f, h, Some(200), VLLM_ANSWER);
        f.on_stream_end(h);
    });
    let now = first.host.now_ms();
    let next = first.on(&mut store, |_, h| {
        r.next_admitted(&*h, now, 0).map(|w| w.context)
    });
    assert_eq!(next, Some(2));
    assert!(second.on(&mut store, |f, h| f.admit(h)));
    assert_eq!(dispatched_to(&second.host, 0), "10.9.4.1:8000");
}

#[test]
fn a_prefill_retry_may_use_a_pod_that_was_full_when_the_request_was_let_in() {
    let json = r#"{
      "admission": {"max_in_flight_per_pod": 1},
      "prefill_max_retries": 1,
      "models": [{"name": "m", "engine": "vllm", "prefill_policy": "round_robin",
                  "rolesets": [{"prefill": ["10.9.1.1:8000", "10.9.1.2:8000"],
                                "decode": ["10.9.1.3:8000"]}]}]
    }"#;
    let r = Rc::new(Router::new(Config::parse(json.as_bytes()).unwrap(), 0).unwrap());
    let fleet = r.fleet();
    let m = fleet.model("m").unwrap();
    let a = pod_id(&r, "10.9.1.1:8000");
    let full_a = pd_router::load::HeldLoad {
        model: m.id,
        prefill: Some(a),
        prefill_tokens: 1,
        decode: None,
        streaming: None,
    };
    let mut host = post(
        "/v1/completions",
        r#"{"model":"m","prompt":"p","max_tokens":5}"#,
    );
    // Another request's prefill fills pod A when this one arrives.
    let now = host.now_ms();
    r.hold(host.shared.get_mut(), full_a, now).unwrap();
    let mut flow = Flow::new(Rc::clone(&r));
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(dispatched_to(&host, 0), "10.9.1.2:8000", "A was full");
    // A frees; then B's prefill fails: the retry goes to A.
    r.release(host.shared.get_mut(), full_a, None, now).unwrap();
    answer(
        &mut flow,
        &mut host,
        Some(503),
        "upstream connect error or disconnect/reset before headers",
    );
    assert!(host.replies.is_empty(), "{:?}", host.replies);
    assert_eq!(host.dispatched.len(), 2, "retried");
    assert_eq!(dispatched_to(&host, 1), "10.9.1.1:8000");
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    flow.on_stream_end(&mut host);
    assert!(all_zero(&r, &host));
}

/// Headers, the body in two chunks neither of which ends the stream, then
/// trailers (an HTTP/2 client's trailing HEADERS frame). Returns the
/// trailers' action.
fn send_with_trailers(flow: &mut Flow, host: &mut FakeHost) -> Action {
    assert_eq!(flow.on_request_headers(host, false), Action::Pause);
    let half = host.body.len() / 2;
    assert_eq!(flow.on_request_body(host, half, false), Action::Pause);
    // Envoy may report the size before it buffered the last chunk.
    assert_eq!(flow.on_request_body(host, half, false), Action::Pause);
    flow.on_request_trailers(host)
}

/// One body per API path, for `vllm-m`, and a call routed by its model.
const EVERY_PATH: [(&str, &str); 6] = [
    (
        "/v1/completions",
        r#"{"model":"vllm-m","prompt":"p","max_tokens":5}"#,
    ),
    (
        "/v1/chat/completions",
        r#"{"model":"vllm-m","messages":[{"role":"user","content":"hi"}]}"#,
    ),
    ("/v1/responses", r#"{"model":"vllm-m","input":"hi"}"#),
    (
        "/v1/messages",
        r#"{"model":"vllm-m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#,
    ),
    (
        "/inference/v1/generate",
        r#"{"model":"vllm-m","token_ids":[1,2,3]}"#,
    ),
    ("/v1/embeddings", r#"{"model":"vllm-m","input":"hi"}"#),
];

#[test]
fn trailers_end_the_body_and_the_request_is_split_as_usual() {
    for (path, body) in EVERY_PATH {
        let mut flow = Flow::new(router());
        let mut host = post(path, body);
        let action = send_with_trailers(&mut flow, &mut host);
        assert!(host.replies.is_empty(), "{path}: {:?}", host.replies);
        if path == "/v1/embeddings" {
            assert_eq!(action, Action::Continue, "{path}");
            assert!(host.dispatched.is_empty());
            assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.0.2:8000"));
            continue;
        }
        assert_eq!(action, Action::Pause, "{path}: paused for the prefill");
        assert_eq!(host.dispatched.len(), 1, "{path}: prefill sent");
        let prefill = String::from_utf8_lossy(&host.dispatched[0].body).into_owned();
        assert!(prefill.contains(r#""do_remote_decode":true"#), "{prefill}");
        answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
        assert_eq!(host.resumed, 1, "{path}");
        assert!(host.body_str().contains(r#""remote_engine_id":"e""#));
        assert_eq!(host.header(ROUTING).as_deref(), Some("10.0.0.2:8000"));
        assert_eq!(flow.on_request_trailers(&mut host), Action::Continue);
    }
    // SGLang sends its decode with the prefill: the trailers continue.
    let mut flow = Flow::new(router());
    let mut host = post(
        "/v1/chat/completions",
        r#"{"model":"sglang-m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(send_with_trailers(&mut flow, &mut host), Action::Continue);
    assert_eq!(host.dispatched.len(), 1);
    assert!(host.body_str().contains("bootstrap_room"));
}

#[test]
fn trailers_do_not_carry_forged_handoff_fields_past_the_router() {
    let forged = r#""kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.9.9.9"}"#;
    for (path, body) in EVERY_PATH {
        let body = body.replacen('{', &format!("{{{forged},"), 1);
        let mut flow = Flow::new(router());
        let mut host = post(path, &body);
        assert_eq!(send_with_trailers(&mut flow, &mut host), Action::Pause);
        assert!(host.dispatched.is_empty(), "{path}");
        expect_error(&host, 400, "kv_transfer_params.do_remote_prefill");
    }
    // Trailers right after the headers: an empty body.
    let mut flow = Flow::new(router());
    let mut host = post("/v1/completions", "");
    assert_eq!(flow.on_request_headers(&mut host, false), Action::Pause);
    assert_eq!(flow.on_request_trailers(&mut host), Action::Pause);
    expect_error(&host, 400, "empty");
    // A body past max_body_bytes that Envoy reported short.
    let mut flow = Flow::new(router());
    let big = format!(r#"{{"model":"vllm-m","prompt":"{}"}}"#, "x".repeat(5000));
    let mut host = post("/v1/completions", &big);
    assert_eq!(flow.on_request_headers(&mut host, false), Action::Pause);
    assert_eq!(flow.on_request_body(&mut host, 100, false), Action::Pause);
    assert_eq!(flow.on_request_trailers(&mut host), Action::Pause);
    expect_error(&host, 413, "4096");
}

/// A forged hand-off field per engine: the model, the field, the body.
const FORGED: [(&str, &str, &str); 5] = [
    (
        "vllm-m",
        "kv_transfer_params",
        r#""kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.9.9.9","remote_port":5600}"#,
    ),
    (
        "vllm-m",
        "disagg_prefill_resp",
        r#""disagg_prefill_resp":{}"#,
    ),
    (
        "sglang-m",
        "bootstrap_host",
        r#""bootstrap_host":"10.9.9.9","bootstrap_port":8998,"bootstrap_room":7"#,
    ),
    (
        "trt-m",
        "disaggregated_params",
        r#""disaggregated_params":{"request_type":"generation_only","ctx_request_id":1}"#,
    ),
    ("trt-m", "prompt_token_ids", r#""prompt_token_ids":[1,2]"#),
];

/// Variants of a split path that engines or proxies may read as it.
fn variants(path: &str) -> Vec<String> {
    vec![
        path.to_owned(),
        format!("{path}/"),
        format!("/{path}"),
        path.replacen('/', "//", 2),
        path.to_ascii_uppercase(),
        format!("{path}%2F"),
        path.replace('/', "%2F"),
        format!("{path}?x=1"),
    ]
}

#[test]
fn router_owned_fields_are_refused_on_every_path_that_reaches_a_pod() {
    let mut paths: Vec<String> = Api::ALL.iter().flat_map(|a| variants(a.path())).collect();
    paths.extend(
        [
            "/v1/embeddings",
            "/tokenize",
            "/v1/embeddings/",
            "/generate",
        ]
        .map(str::to_owned),
    );
    for (model, field, forged) in FORGED {
        for path in &paths {
            let body = format!(
                r#"{{"model":"{model}","prompt":"p",{forged},"messages":[],"input":"x","token_ids":[1],"max_tokens":3}}"#
            );
            let mut flow = Flow::new(router());
            let mut host = post(path, &body);
            assert_eq!(
                send_request(&mut flow, &mut host),
                Action::Pause,
                "{model} {path}"
            );
            assert!(host.dispatched.is_empty(), "{model} {path}");
            let (status, v) = host.reply();
            assert_eq!(status, 400, "{model} {path}: {v}");
            assert_eq!(
                v["error"]["code"], "router_owned_field",
                "{model} {path}: {v}"
            );
            assert!(
                v["error"]["message"].as_str().unwrap().contains(field),
                "{model} {path}: {v}"
            );
            assert!(host.header(ROUTING).is_none(), "{model} {path}");
        }
    }
}

#[test]
fn a_body_naming_no_model_is_checked_for_every_engine_of_the_fleet() {
    // SGLang's native /generate names no model: a pass-through, which may
    // land on any engine's pod. Another method with a body too.
    for (method, path, body, field) in [
        (
            "POST",
            "/generate",
            r#"{"text":"hi","bootstrap_host":"10.9.9.9","bootstrap_room":1}"#,
            "bootstrap_host",
        ),
        (
            "POST",
            "/x",
            r#"{"kv_transfer_params":{"do_remote_prefill":true}}"#,
            "kv_transfer_params",
        ),
        (
            "PUT",
            "/x",
            r#"{"disaggregated_params":{}}"#,
            "disaggregated_params",
        ),
        (
            "POST",
            "/x",
            r#"{"kv_transfer_params":{},"kv_transfer_params":{"remote_host":"h"}}"#,
            "kv_transfer_params",
        ),
    ] {
        let mut flow = Flow::new(router());
        let mut host = post(path, body);
        host.set_request_header(":method", Some(method)).unwrap();
        assert_eq!(send_request(&mut flow, &mut host), Action::Pause, "{body}");
        expect_error(&host, 400, field);
    }
    // JSON the router cannot read is refused: Python's parser reads more.
    for body in [
        r#"{"x":NaN,"kv_transfer_params":{"do_remote_prefill":true}}"#,
        "\u{feff}{\"bootstrap_room\":1}",
    ] {
        let mut flow = Flow::new(router());
        let mut host = post("/generate", body);
        assert_eq!(send_request(&mut flow, &mut host), Action::Pause, "{body}");
        let (status, _) = host.reply();
        assert_eq!(status, 400, "{body}");
    }
    // What is not JSON to the engines, and clean bodies, pass.
    for (ctype, body) in [
        ("text/plain", r#"kv_transfer_params"#),
        ("application/json", r#"{"text":"hi","sampling_params":{}}"#),
        ("application/json", "[1,2]"),
        ("application/json", "  "),
        (
            "application/json",
            r#"{"model":"vllm-m","input":"x","kv_transfer_params":{"lmcache.tag.user":"u"}}"#,
        ),
    ] {
        let mut flow = Flow::new(router());
        let mut host = post("/generate", body);
        host.set_request_header("content-type", Some(ctype))
            .unwrap();
        assert_eq!(
            send_request(&mut flow, &mut host),
            Action::Continue,
            "{body}"
        );
        assert!(host.replies.is_empty(), "{body}: {:?}", host.replies);
        assert!(host.header(ROUTING).is_some());
    }
    // A form field named for a hand-off.
    let form = "--XX\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nsglang-m\r\n--XX\r\nContent-Disposition: form-data; name=\"bootstrap_room\"\r\n\r\n1\r\n--XX--\r\n";
    let mut flow = Flow::new(router());
    let mut host = post("/v1/audio/transcriptions", form);
    host.set_request_header("content-type", Some("multipart/form-data; boundary=XX"))
        .unwrap();
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    expect_error(&host, 400, "bootstrap_room");
}

#[test]
fn a_bodyless_get_passes_straight_through_unread() {
    let mut flow = Flow::new(router());
    let mut host = post("/v1/anything", "");
    host.set_request_header(":method", Some("GET")).unwrap();
    assert_eq!(flow.on_request_headers(&mut host, true), Action::Continue);
    assert!(host.header(ROUTING).is_some());
    assert_eq!(host.counts.borrow().get("get request body"), None);
}

#[test]
fn a_variant_of_a_split_path_is_split_as_that_path() {
    for path in [
        "/V1/Chat/Completions/?x=1",
        "//v1/chat//completions",
        "/v1/chat/completions%2F?x=1",
    ] {
        let mut flow = Flow::new(router());
        let mut host = post(
            path,
            r#"{"model":"vllm-m","messages":[{"role":"user","content":"hi"}]}"#,
        );
        assert_eq!(send_request(&mut flow, &mut host), Action::Pause, "{path}");
        let canonical = if path.contains('?') {
            "/v1/chat/completions?x=1"
        } else {
            "/v1/chat/completions"
        };
        assert_eq!(host.header(":path").as_deref(), Some(canonical), "{path}");
        let d = &host.dispatched[0];
        assert!(
            d.headers.contains(&(":path".into(), canonical.into())),
            "{path}"
        );
    }
}

#[test]
fn each_reason_a_request_is_not_split_has_its_own_label_and_log_word() {
    let r = router();
    let reasons = |host: &FakeHost| -> Vec<NotSplit> {
        host.counters
            .borrow()
            .iter()
            .filter_map(|c| match c {
                Counter::Unsplit(w) => Some(*w),
                _ => None,
            })
            .collect()
    };
    let cases = [
        (
            "/v1/completions",
            r#"{"model":"vllm-m","prompt":"p","n":2}"#,
            NotSplit::Engine,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"vllm-m","messages":[{"role":"user","content":"hi"}],"echo":true}"#,
            NotSplit::Response,
        ),
        (
            "/v1/embeddings",
            r#"{"model":"vllm-m","input":"x"}"#,
            NotSplit::ByModel,
        ),
    ];
    for (path, body, why) in cases {
        let mut host = post(path, body);
        host.verbose = true;
        assert_eq!(
            send_request(&mut Flow::new(Rc::clone(&r)), &mut host),
            Action::Continue
        );
        assert!(host.dispatched.is_empty(), "{path}");
        assert_eq!(reasons(&host), vec![why], "{path}");
        let word = format!("not split ({}", why.label());
        assert!(
            host.logs.borrow().iter().any(|l| l.contains(&word)),
            "{path}: {:?}",
            host.logs.borrow()
        );
    }
    let mut host = get("/health");
    host.verbose = true;
    let mut flow = Flow::new(Rc::clone(&r));
    assert_eq!(flow.on_request_headers(&mut host, true), Action::Continue);
    assert_eq!(reasons(&host), vec![NotSplit::Path]);
    assert!(host
        .logs
        .borrow()
        .iter()
        .any(|l| l.contains("not split (path)")));
}

/// Executor mode: a request the endpoint picker named no pods for (it did
/// not run: an ext_proc failing open, or absent from the route) is placed by
/// the router, counted every time and logged once a minute with the likely
/// cause; a request the picker did pick is neither.
#[test]
fn a_missing_pick_is_counted_and_logged_once_a_minute() {
    let config = r#"{"placement":"epp","models":[{"name":"m","engine":"vllm",
        "rolesets":[{"prefill":[{"address":"10.6.0.1:8000","name":"p0"}],"decode":[{"address":"10.6.0.2:8000","name":"d0"}]}]}]}"#;
    let r = Rc::new(Router::new(Config::parse(config.as_bytes()).unwrap(), 0).unwrap());
    let body = r#"{"model":"m","prompt":"p"}"#;
    let missing = |at_s: u64| {
        let mut flow = Flow::new(Rc::clone(&r));
        let mut host = post("/v1/completions", body);
        host.clock_us.set(at_s * 1_000_000);
        send_request(&mut flow, &mut host);
        assert_eq!(host.dispatched.len(), 1, "placed by the router");
        let warned = host
            .logs
            .borrow()
            .iter()
            .filter(|l| {
                l.contains("no x-gateway-destination-endpoint") && l.contains("failure_mode_allow")
            })
            .count();
        (host.counted(Counter::EppPickMissing), warned)
    };
    assert_eq!(missing(1_000), (1, 1), "counted and logged");
    assert_eq!(
        missing(1_030),
        (1, 0),
        "counted, not logged again within the minute"
    );
    assert_eq!(missing(1_061), (1, 1), "logged again a minute later");

    // Picked: neither counted nor logged.
    let mut flow = Flow::new(Rc::clone(&r));
    let mut host = post("/v1/completions", body);
    host.request_headers.push((
        "x-gateway-destination-endpoint".into(),
        b"10.6.0.2:8000".to_vec(),
    ));
    host.request_headers
        .push(("x-prefiller-host-port".into(), b"10.6.0.1:8000".to_vec()));
    send_request(&mut flow, &mut host);
    assert_eq!(host.dispatched.len(), 1);
    assert_eq!(host.counted(Counter::EppPickMissing), 0);

    // By model (a whole call), the same.
    let mut flow = Flow::new(Rc::clone(&r));
    let mut host = post("/v1/embeddings", r#"{"model":"m","input":"x"}"#);
    host.clock_us.set(2_000 * 1_000_000);
    send_request(&mut flow, &mut host);
    assert_eq!(host.counted(Counter::EppPickMissing), 1);
}

fn traced_router() -> Rc<Router> {
    let mut cfg: serde_json::Value = serde_json::from_str(CONFIG).expect("json");
    cfg["tracing"] = serde_json::json!({"cluster": "otel"});
    let config = Config::parse(cfg.to_string().as_bytes()).expect("config");
    Rc::new(Router::new(config, 0).expect("router"))
}

const CLIENT_TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn a_traced_split_puts_each_leg_under_its_own_span_in_the_clients_trace() {
    let r = traced_router();
    let mut flow = Flow::new(Rc::clone(&r));
    let client = r#"{"model":"vllm-m","prompt":"hi","max_tokens":5}"#;
    let mut host = post("/v1/completions", client);
    for (k, v) in host.request_headers.iter_mut() {
        if k == "traceparent" {
            *v = CLIENT_TRACE.as_bytes().to_vec();
        }
    }
    host.randoms = (1..=16).map(|n| n * 0x1111).collect();
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    let leg_header = |headers: &[(String, String)]| {
        headers
            .iter()
            .find(|(k, _)| k == "traceparent")
            .map(|(_, v)| v.clone())
            .expect("traceparent")
    };
    let prefill_tp = leg_header(&host.dispatched[0].headers);
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    let decode_tp = host.header("traceparent").expect("decode traceparent");
    host.upstream_headers = vec![(":status".into(), "200".into())];
    flow.on_response_headers(&mut host);
    flow.on_stream_end(&mut host);

    let spans = r.spans.take(10);
    let names: Vec<&str> = spans.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "pd_router.decide",
            "pd_router.prefill",
            "pd_router.decode",
            "pd_router.request"
        ]
    );
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let request = &spans[3];
    assert_eq!(hex(&request.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        request.parent.map(|p| hex(&p)).as_deref(),
        Some("00f067aa0ba902b7")
    );
    for child in &spans[..3] {
        assert_eq!(child.trace_id, request.trace_id);
        assert_eq!(child.parent, Some(request.span_id), "{}", child.name);
    }
    // Each leg names its own span, in the client's trace.
    let tp = |s: &pd_router::trace::Span| {
        format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", hex(&s.span_id))
    };
    assert_eq!(prefill_tp, tp(&spans[1]));
    assert_eq!(decode_tp, tp(&spans[2]));
    let attr = |s: &pd_router::trace::Span, k: &str| {
        s.attributes
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| format!("{v:?}"))
    };
    assert_eq!(
        attr(&spans[0], "pd.prefill_pod").as_deref(),
        Some(r#"Str("p0")"#)
    );
    assert_eq!(
        attr(&spans[0], "pd.decode_pod").as_deref(),
        Some(r#"Str("d0")"#)
    );
    assert!(attr(&spans[0], "pd.cached_tokens").is_some());
    assert_eq!(
        attr(&spans[1], "http.response.status_code").as_deref(),
        Some("Int(200)")
    );
    assert!(spans.iter().all(|s| s.error.is_none()));
}

#[test]
fn an_unsampled_client_trace_records_nothing_and_a_failed_prefill_marks_its_span() {
    let r = traced_router();
    let mut flow = Flow::new(Rc::clone(&r));
    let client = r#"{"model":"vllm-m","prompt":"hi","max_tokens":5}"#;
    let mut host = post("/v1/completions", client);
    for (k, v) in host.request_headers.iter_mut() {
        if k == "traceparent" {
            *v = CLIENT_TRACE.replace("-01", "-00").into_bytes();
        }
    }
    host.randoms = (1..=16).collect();
    send_request(&mut flow, &mut host);
    flow.on_stream_end(&mut host);
    assert_eq!(r.spans.waiting(), 0, "the client did not sample it");

    // No client trace: a new one, and a prefill that failed says so.
    let mut flow = Flow::new(Rc::clone(&r));
    let mut host = post("/v1/completions", client);
    host.request_headers.retain(|(k, _)| k != "traceparent");
    host.randoms = (1..=16).collect();
    send_request(&mut flow, &mut host);
    answer(&mut flow, &mut host, Some(400), r#"{"error":"no"}"#);
    flow.on_stream_end(&mut host);
    let spans = r.spans.take(10);
    assert_eq!(spans.len(), 3, "decide, prefill, request: no decode left");
    let request = spans.last().expect("request span");
    assert_eq!(request.parent, None, "a trace the router started");
    // The engine's message, its status beside it.
    assert_eq!(spans[1].error.as_deref(), Some("no"), "{:?}", spans[1]);
    assert!(spans[1].attributes.iter().any(|(k, v)| {
        *k == "http.response.status_code" && *v == pd_router::trace::AttrValue::Int(400)
    }));
    assert!(request.error.is_some());
}

fn reuse_router() -> Rc<Router> {
    let mut cfg: serde_json::Value = serde_json::from_str(CONFIG).expect("json");
    let models = cfg["models"].as_array_mut().expect("models");
    models.push(serde_json::json!({
        "name": "reuse-m", "engine": "vllm", "session": {}, "kv_reuse": {},
        "rolesets": [{"prefill": [{"address": "10.0.6.1:8000", "name": "rp0"}],
                      "decode": [{"address": "10.0.6.2:8000", "name": "rd0"}]}]}));
    let config = Config::parse(cfg.to_string().as_bytes()).expect("config");
    Rc::new(Router::new(config, 0).expect("router"))
}

fn turn(messages: &str) -> FakeHost {
    let mut host = post(
        "/v1/chat/completions",
        &format!(r#"{{"model":"reuse-m","messages":{messages},"max_tokens":8}}"#),
    );
    host.request_headers
        .push(("x-session-id".into(), b"conv-7".to_vec()));
    host.randoms = (1..=8).collect();
    host
}

const D_KV: &str = r#"{"id":"d","choices":[{"index":0,"message":{"role":"assistant","content":"yo"},"finish_reason":"stop"}],"kv_transfer_params":{"do_remote_prefill":false,"do_remote_decode":true,"remote_block_ids":[[7,8]],"remote_engine_id":"d-engine","remote_request_id":"d-req","remote_host":"localhost","remote_port":5601,"remote_num_tokens":12}}"#;

/// Turn one of a session: split, the decode answers with its blocks.
fn first_turn(r: &Rc<Router>) -> FakeHost {
    let mut flow = Flow::new(Rc::clone(r));
    let mut host = turn(r#"[{"role":"user","content":"hi"}]"#);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    upstream(&mut host, "application/json");
    flow.on_response_headers(&mut host);
    host.response = D_KV.as_bytes().to_vec();
    assert_eq!(
        flow.on_response_body(&mut host, D_KV.len(), true),
        Action::Continue
    );
    let client_sees = String::from_utf8(host.response.clone()).expect("utf-8");
    assert!(
        !client_sees.contains("kv_transfer_params") && client_sees.contains(r#""content":"yo""#),
        "{client_sees}"
    );
    flow.on_stream_end(&mut host);
    host
}

fn prefill_params(host: &FakeHost, i: usize) -> serde_json::Value {
    let body: serde_json::Value =
        serde_json::from_slice(&host.dispatched[i].body).expect("prefill body");
    body["kv_transfer_params"].clone()
}

/// Turn two of a session after [`first_turn`], sent up to its prefill.
fn second_turn(r: &Rc<Router>) -> (Flow, FakeHost) {
    let first = first_turn(r);
    let mut flow = Flow::new(Rc::clone(r));
    let mut host = turn(
        r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"and?"}]"#,
    );
    host.shared = first.shared;
    send_request(&mut flow, &mut host);
    (flow, host)
}

#[test]
fn the_next_turn_pulls_its_prefix_from_the_last_decode() {
    let r = reuse_router();
    let (_flow, host) = second_turn(&r);
    let sent = prefill_params(&host, 0);
    assert_eq!(sent["do_remote_decode"], true);
    assert_eq!(sent["do_remote_prefill"], false);
    assert_eq!(sent["remote_block_ids"], serde_json::json!([[7, 8]]));
    assert_eq!(sent["remote_engine_id"], "d-engine");
    assert_eq!(sent["remote_host"], "10.0.6.2", "the decode pod's address");
    assert_eq!(sent["remote_port"], 5601);
    assert_eq!(host.counted(Counter::KvReuseSent), 1);

    // A third request of the session finds nothing: the blocks serve one
    // read.
    let mut flow = Flow::new(Rc::clone(&r));
    let mut again = turn(
        r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"and?"}]"#,
    );
    again.shared = host.shared;
    send_request(&mut flow, &mut again);
    assert_eq!(
        prefill_params(&again, 0)["remote_block_ids"],
        serde_json::Value::Null
    );
}

#[test]
fn an_edited_history_gets_no_handle_and_a_failed_read_is_resent_without_it() {
    let r = reuse_router();
    let first = first_turn(&r);
    // The history was edited: the handle is not sent (vLLM would read
    // blocks that do not match the prompt).
    let mut flow = Flow::new(Rc::clone(&r));
    let mut host = turn(r#"[{"role":"user","content":"HI"},{"role":"user","content":"and?"}]"#);
    host.shared = first.shared;
    send_request(&mut flow, &mut host);
    assert_eq!(
        prefill_params(&host, 0)["remote_block_ids"],
        serde_json::Value::Null
    );
    assert_eq!(host.counted(Counter::KvReuseStale), 1);

    // A read that fails (the blocks are gone): once more, without it, and
    // the prefill pod takes no strike.
    let (mut flow, mut host) = second_turn(&r);
    assert_eq!(prefill_params(&host, 0)["remote_engine_id"], "d-engine");
    answer(
        &mut flow,
        &mut host,
        Some(500),
        r#"{"error":{"message":"Internal server error"}}"#,
    );
    assert_eq!(host.dispatched.len(), 2, "resent");
    assert_eq!(
        prefill_params(&host, 1)["remote_block_ids"],
        serde_json::Value::Null
    );
    assert_eq!(host.counted(Counter::KvReuseFailed), 1);
    assert_eq!(
        host.counted(Counter::PrefillRetry),
        0,
        "free of the retry budget"
    );
    answer(&mut flow, &mut host, Some(200), VLLM_ANSWER);
    assert_eq!(host.resumed, 1, "the decode goes");
    assert!(host.replies.is_empty());
}

#[test]
fn an_sglang_prefill_left_behind_is_aborted_and_a_refused_abort_is_counted() {
    for refused in [false, true] {
        let mut flow = Flow::new(router());
        let mut host = post(
            "/v1/chat/completions",
            r#"{"model":"sglang-m","messages":[],"stream":true}"#,
        );
        send_request(&mut flow, &mut host);
        if refused {
            host.dispatch_error = Some("InternalFailure".into());
        }
        // The client leaves before the prefill answered.
        flow.on_stream_end(&mut host);
        let abort = host.dispatched.iter().find(|d| {
            d.headers
                .iter()
                .any(|(k, v)| k == ":path" && v == "/abort_request")
        });
        assert_eq!(abort.is_some(), !refused);
        if let Some(a) = abort {
            assert_eq!(String::from_utf8_lossy(&a.body), r#"{"rid":"req-1"}"#);
        }
        assert_eq!(host.counted(Counter::PrefillAborted), usize::from(!refused));
        assert_eq!(
            host.counted(Counter::PrefillAbortFailed),
            usize::from(refused)
        );
    }
}

// E/P/D: a vLLM model whose media go to encoder pods before the prefill.
const EPD_CONFIG: &str = r#"{
  "prefill_timeout_ms": 1234,
  "models": [
    {"name": "epd", "engine": "vllm", "ec_connector": "nixl",
     "rolesets": [{"prefill": [{"address":"10.9.0.1:8000","name":"p0"}], "decode": [{"address":"10.9.0.2:8000","name":"d0"}],
                   "encode": [{"address":"10.9.0.3:8000","name":"e0"}, {"address":"10.9.0.4:8000","name":"e1"}]}]},
    {"name": "self", "engine": "vllm", "ec_connector": "example",
     "rolesets": [{"prefill": [{"address":"10.9.1.1:8000","name":"ep0","encodes":true}], "decode": ["10.9.1.2:8000"]}]},
    {"name": "bare", "engine": "vllm", "ec_connector": "example",
     "rolesets": [{"prefill": ["10.9.2.1:8000"], "decode": ["10.9.2.2:8000"]}]}
  ]
}"#;

fn epd_flow() -> Flow {
    Flow::new(Rc::new(
        Router::new(Config::parse(EPD_CONFIG.as_bytes()).expect("config"), 0).expect("router"),
    ))
}

const CAT: &str = r#"{"type":"image_url","image_url":{"url":"https://x/cat.png"}}"#;
const DOG: &str = r#"{"type":"image_url","image_url":{"url":"https://x/dog.png"}}"#;

fn media_chat(model: &str) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":[{{"type":"text","text":"compare"}},{CAT},{DOG},{CAT}]}}],"stream":true,"max_tokens":20}}"#
    )
}

/// The token of the `i`th call dispatched (FakeHost counts from 101).
fn token_of(i: usize) -> u32 {
    101 + i as u32
}

fn answer_call(flow: &mut Flow, host: &mut FakeHost, i: usize, status: u16, body: &str) {
    host.call_body = body.as_bytes().to_vec();
    flow.on_prefill_response(host, token_of(i), Some(status), body.len());
}

#[test]
fn epd_media_go_to_encoders_first_and_their_params_to_the_prefill() {
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", &media_chat("epd"));
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    // Two distinct images: two encoder calls, spread over both encoders,
    // and no prefill yet.
    assert_eq!(host.dispatched.len(), 2);
    let mut pods = Vec::new();
    for (i, d) in host.dispatched.iter().enumerate() {
        let h = |k: &str| {
            d.headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        pods.push(h(ROUTING).expect("routed"));
        assert_eq!(h("x-request-id"), Some(format!("req-1-enc-{i}")));
        assert_eq!(d.timeout_ms, 1234);
        let v: serde_json::Value = serde_json::from_slice(&d.body).expect("json");
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(v["stream"], false);
        let content = v["messages"][0]["content"].as_array().expect("content");
        assert_eq!(content.len(), 1, "one item alone: {v}");
        let want = if i == 0 { "cat.png" } else { "dog.png" };
        assert_eq!(content[0]["image_url"]["url"], format!("https://x/{want}"));
    }
    pods.sort();
    assert_eq!(pods, vec!["10.9.0.3:8000", "10.9.0.4:8000"]);
    assert_eq!(host.counted(Counter::EncoderSent), 2);

    // Answers in any order; the prefill leaves after the last.
    answer_call(
        &mut flow,
        &mut host,
        1,
        200,
        r#"{"ec_transfer_params":{"hdog":{"num_encoder_tokens":9}}}"#,
    );
    assert_eq!(host.dispatched.len(), 2, "waits for every encoder");
    answer_call(
        &mut flow,
        &mut host,
        0,
        200,
        r#"{"ec_transfer_params":{"hcat":{"num_encoder_tokens":7}}}"#,
    );
    assert_eq!(host.dispatched.len(), 3);
    let prefill = &host.dispatched[2];
    let h = |k: &str| {
        prefill
            .headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(h(ROUTING), Some("10.9.0.1:8000"));
    assert_eq!(h("x-request-id"), Some("req-1"));
    let v: serde_json::Value = serde_json::from_slice(&prefill.body).expect("json");
    assert_eq!(v["ec_transfer_params"]["hcat"]["num_encoder_tokens"], 7);
    assert_eq!(v["ec_transfer_params"]["hdog"]["num_encoder_tokens"], 9);
    assert_eq!(
        v["messages"][0]["content"].as_array().map(Vec::len),
        Some(4),
        "media intact"
    );
    assert_eq!(host.resumed, 0);

    answer_call(&mut flow, &mut host, 2, 200, VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    assert!(host.replies.is_empty());
    assert_eq!(host.header(ROUTING).as_deref(), Some("10.9.0.2:8000"));
    assert!(host.body_str().contains("kv_transfer_params"));
}

#[test]
fn epd_text_only_and_self_encoding_prefills_skip_the_encoders() {
    let text = r#"{"model":"epd","messages":[{"role":"user","content":"hi"}]}"#;
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", text);
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(host.dispatched.len(), 1);
    assert!(host.dispatched[0]
        .headers
        .contains(&(ROUTING.into(), "10.9.0.1:8000".into())));
    assert_eq!(host.counted(Counter::EncoderSent), 0);

    // llm-d's `encode-prefill`: the prefill encodes its own media.
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", &media_chat("self"));
    assert_eq!(send_request(&mut flow, &mut host), Action::Pause);
    assert_eq!(host.dispatched.len(), 1);
    assert!(host.dispatched[0]
        .headers
        .contains(&(ROUTING.into(), "10.9.1.1:8000".into())));
    let v: serde_json::Value = serde_json::from_slice(&host.dispatched[0].body).expect("json");
    assert!(v.get("ec_transfer_params").is_none());
}

#[test]
fn epd_an_encoder_failure_is_a_502_naming_it_and_no_prefill_leaves() {
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", &media_chat("epd"));
    send_request(&mut flow, &mut host);
    let failed = host.dispatched[0]
        .headers
        .iter()
        .find(|(k, _)| k == ROUTING)
        .map(|(_, v)| v.clone())
        .expect("routed");
    let name = if failed == "10.9.0.3:8000" {
        "e0"
    } else {
        "e1"
    };
    answer_call(
        &mut flow,
        &mut host,
        0,
        500,
        r#"{"error":{"message":"encoder OOM"}}"#,
    );
    expect_error(&host, 502, &format!("encoder pod {name} failed"));
    assert_eq!(host.counted(Counter::EncoderFailed), 1);
    // The other encoder's late answer changes nothing.
    answer_call(&mut flow, &mut host, 1, 200, r#"{"ec_transfer_params":{}}"#);
    assert_eq!(host.dispatched.len(), 2, "no prefill");
    assert_eq!(host.replies.len(), 1);
}

#[test]
fn epd_bad_media_and_models_without_encoders_are_refused_before_any_call() {
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", &media_chat("bare"));
    send_request(&mut flow, &mut host);
    expect_error(&host, 503, "model `bare`");
    assert!(host.dispatched.is_empty());

    let bad = r#"{"model":"epd","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"uri":"x"}}]}]}"#;
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", bad);
    send_request(&mut flow, &mut host);
    expect_error(&host, 400, "messages[0].content[0]");
    assert!(host.dispatched.is_empty());

    let owned = r#"{"model":"epd","messages":[],"ec_transfer_params":{"h":{"remote_host":"169.254.169.254"}}}"#;
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", owned);
    send_request(&mut flow, &mut host);
    expect_error(&host, 400, "ec_transfer_params");
}

#[test]
fn epd_a_client_gone_mid_encode_gives_its_load_back_and_late_answers_do_nothing() {
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", &media_chat("epd"));
    send_request(&mut flow, &mut host);
    assert_eq!(host.dispatched.len(), 2);
    flow.on_stream_end(&mut host);
    assert_eq!(host.counted(Counter::ClientGone), 1);
    answer_call(&mut flow, &mut host, 0, 200, "{}");
    answer_call(&mut flow, &mut host, 1, 200, "{}");
    assert_eq!(host.dispatched.len(), 2, "no prefill for a gone client");
    assert_eq!(host.resumed, 0);
    assert!(host.replies.is_empty());
}

#[test]
fn epd_an_encoder_that_failed_its_health_is_skipped() {
    let config = EPD_CONFIG.replace(
        r#""prefill_timeout_ms": 1234,"#,
        r#""prefill_timeout_ms": 1234, "eject_after_failures": 1,"#,
    );
    let router =
        Rc::new(Router::new(Config::parse(config.as_bytes()).expect("config"), 0).expect("router"));
    let one_image = media_chat("epd").replace(&format!(",{DOG}"), "");
    let mut host = post("/v1/chat/completions", &one_image);
    let mut flow = Flow::new(Rc::clone(&router));
    send_request(&mut flow, &mut host);
    assert_eq!(host.dispatched.len(), 1, "one item, one encoder call");
    let failed = dispatched_to(&host, 0);
    answer_call(&mut flow, &mut host, 0, 500, "{}");
    expect_error(&host, 502, "encoder pod");
    flow.on_stream_end(&mut host);
    // Every later request goes to the other encoder.
    for _ in 0..4 {
        next_request_to(&mut host, "/v1/chat/completions", &one_image);
        let mut flow = Flow::new(Rc::clone(&router));
        send_request(&mut flow, &mut host);
        assert_ne!(dispatched_to(&host, 0), failed);
        flow.on_stream_end(&mut host);
    }
}

/// Executor mode: llm-d's picker names the encoders
/// (`x-encoder-hosts-ports`); those the fleet knows as the model's
/// encoders serve the items, in turn from the first, the others are never
/// dialled; the header never reaches an engine.
#[test]
fn epd_the_pickers_known_encoders_are_used_and_unknown_ones_refused() {
    let config = EPD_CONFIG.replace(
        r#""prefill_timeout_ms": 1234,"#,
        r#""prefill_timeout_ms": 1234, "placement": "epp","#,
    );
    let r = Rc::new(Router::new(Config::parse(config.as_bytes()).unwrap(), 0).unwrap());
    const DEST: &str = "x-gateway-destination-endpoint";
    let picked = |encoders: &str, body: &str| {
        let mut flow = Flow::new(Rc::clone(&r));
        let mut host = post("/v1/chat/completions", body);
        for (k, v) in [
            (DEST, "10.9.0.2:8000"),
            ("x-prefiller-host-port", "10.9.0.1:8000"),
            ("x-encoder-hosts-ports", encoders),
        ] {
            host.request_headers.push((k.into(), v.as_bytes().to_vec()));
        }
        send_request(&mut flow, &mut host);
        assert!(
            host.replies.is_empty(),
            "{:?} {:?}",
            host.replies,
            host.logs.borrow()
        );
        assert!(host.header("x-encoder-hosts-ports").is_none(), "removed");
        let to: Vec<String> = host
            .dispatched
            .iter()
            .filter_map(|d| {
                d.headers
                    .iter()
                    .find(|(k, _)| *k == r.config.routing.header)
                    .map(|(_, v)| v.clone())
            })
            .collect();
        let warned = host
            .logs
            .borrow()
            .iter()
            .filter(|l| l.contains("not called"))
            .count();
        (to, warned)
    };
    let media = media_chat("epd");
    let (to, warned) = picked("169.254.169.254:80, 10.9.0.4:8000", &media);
    assert_eq!(
        to,
        vec!["10.9.0.4:8000", "10.9.0.4:8000"],
        "both items on the known encoder"
    );
    assert_eq!(warned, 1, "the unknown address is said once");
    // None known: the router chooses among the roleset's encoders.
    let (to, _) = picked("10.9.9.9:8000", &media);
    let mut to = to;
    to.sort();
    assert_eq!(to, vec!["10.9.0.3:8000", "10.9.0.4:8000"]);
    // Text alone: no encoder, whatever the picker said.
    let text = r#"{"model":"epd","messages":[{"role":"user","content":"hi"}]}"#;
    let (to, _) = picked("10.9.0.3:8000", text);
    assert_eq!(to, vec!["10.9.0.1:8000"], "the prefill only");
}

/// The encoders' own queues, as scraped, decide where the items go: a busy
/// one gets none while an idle one is there.
#[test]
fn epd_items_go_to_the_encoder_with_the_shorter_scraped_queue() {
    use pd_router::pods::{update_scraped, PodMetrics, StoredMetrics};
    let r = Rc::new(Router::new(Config::parse(EPD_CONFIG.as_bytes()).unwrap(), 0).unwrap());
    let fleet = r.fleet();
    let encoders = &fleet.model("epd").expect("model").rolesets[0].encode;
    let mut host = post("/v1/chat/completions", &media_chat("epd"));
    let now = host.clock_us.get() / 1000;
    let busy = StoredMetrics {
        at_ms: now,
        metrics: PodMetrics {
            running: 4.0,
            waiting: 6.0,
            ..PodMetrics::default()
        },
    };
    let key = r.keys().scraped();
    update_scraped(&mut host, &key, |t| {
        t.insert(encoders[0].id, busy);
    })
    .expect("scraped");
    r.refresh_metrics(&host);
    for _ in 0..3 {
        next_request_to(&mut host, "/v1/chat/completions", &media_chat("epd"));
        let mut flow = Flow::new(Rc::clone(&r));
        send_request(&mut flow, &mut host);
        assert_eq!(host.dispatched.len(), 2);
        for i in 0..2 {
            assert_eq!(
                dispatched_to(&host, i),
                "10.9.0.4:8000",
                "both on the idle e1"
            );
        }
        flow.on_stream_end(&mut host);
    }
}

#[test]
fn epd_an_encoder_answer_that_is_not_json_is_that_encoders_502() {
    let mut flow = epd_flow();
    let mut host = post("/v1/chat/completions", &media_chat("epd"));
    send_request(&mut flow, &mut host);
    answer_call(
        &mut flow,
        &mut host,
        0,
        200,
        r#"{"ec_transfer_params":{"h":{}}}"#,
    );
    let second = dispatched_to(&host, 1);
    let name = if second == "10.9.0.3:8000" {
        "e0"
    } else {
        "e1"
    };
    answer_call(&mut flow, &mut host, 1, 200, "<html>oops</html>");
    expect_error(&host, 502, &format!("encoder pod {name} failed"));
    assert_eq!(host.dispatched.len(), 2, "no prefill");
}

/// The router's own time ends when the encoder calls leave: the wait for
/// them is the encoders', not routing.
#[test]
fn epd_routing_time_stops_when_the_encoders_leave() {
    let config = EPD_CONFIG.replace(
        r#""prefill_timeout_ms": 1234,"#,
        r#""prefill_timeout_ms": 1234, "timing_headers": true,"#,
    );
    let r = Rc::new(Router::new(Config::parse(config.as_bytes()).unwrap(), 0).unwrap());
    let mut flow = Flow::new(r);
    let mut host = post("/v1/chat/completions", &media_chat("epd"));
    send_request(&mut flow, &mut host);
    let later = host.clock_us.get() + 5_000_000;
    host.clock_us.set(later);
    answer_call(&mut flow, &mut host, 0, 200, "{}");
    answer_call(&mut flow, &mut host, 1, 200, "{}");
    answer_call(&mut flow, &mut host, 2, 200, VLLM_ANSWER);
    assert_eq!(host.resumed, 1);
    flow.on_response_headers(&mut host);
    let routing: u64 = host
        .response_headers
        .iter()
        .find(|(k, _)| k == "x-pd-routing-us")
        .and_then(|(_, v)| v.as_deref())
        .and_then(|v| v.parse().ok())
        .expect("x-pd-routing-us");
    assert!(
        routing < 5_000_000,
        "{routing} µs counts the encoders' wait"
    );
}

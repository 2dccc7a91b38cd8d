//! Every engine and connector, for both APIs, streaming and not, through a
//! real Envoy running the filter, against mocks that enforce the contracts.

use crate::harness::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Chat messages and tools with unusual spacing, escapes, non-ASCII text and
/// key order: any re-serialisation by the router changes these bytes.
const MESSAGES: &str = r#"[ {"role":"system" ,"content":"Réponds  en français.\n\u00e9"}, {"role": "user", "content": [{"type":"text","text":"Quel temps fait-il ?"}]} ]"#;
const TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"unit":{"enum":["c","f"]},"city":{"type":"string"}},"required":["city"]}}}]"#;
const PROMPT: &str = r#""Il était une fois,  \u00e0 Paris""#;

pub fn client_body(model: &str, path: &str, stream: bool) -> String {
    if path == "/v1/chat/completions" {
        format!(
            r#"{{"model": "{model}", "messages": {MESSAGES}, "tools": {TOOLS}, "max_tokens": 6, "stream": {stream}, "temperature": 0.5, "seed": 18446744073709551615}}"#
        )
    } else {
        format!(
            r#"{{"model":"{model}","prompt":{PROMPT},"max_tokens":6,"stream":{stream},"min_tokens":2,"stream_options":{},"seed":18446744073709551615}}"#,
            if stream {
                r#"{"include_usage":true}"#
            } else {
                "null"
            }
        )
    }
}

fn request_id() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "e2e-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub struct Setup {
    pub prefill: Mock,
    pub decode: Mock,
    pub envoy: Envoy,
    pub model: String,
}

impl Setup {
    pub fn start(
        engine: &str,
        connector: Option<&str>,
        prefill_args: &[&str],
        decode_args: &[&str],
    ) -> Setup {
        let mock_engine = match engine {
            "vllm" | "sglang" | "trtllm" => engine,
            _ => "default",
        };
        let mut pa = vec!["--engine", mock_engine, "--role", "prefill"];
        let mut da = vec!["--engine", mock_engine, "--role", "decode"];
        if let Some(c) = connector {
            pa.extend(["--connector", c]);
            da.extend(["--connector", c]);
        }
        pa.extend(prefill_args);
        da.extend(decode_args);
        let prefill = Mock::start(&format!("{engine}-prefill"), &pa);
        let decode = Mock::start(&format!("{engine}-decode"), &da);
        let model = format!("test/{engine}");
        let envoy = Envoy::start(&plugin_config(&[(
            &model,
            engine,
            connector,
            &[&prefill],
            &[&decode],
        )]));
        Setup {
            prefill,
            decode,
            envoy,
            model,
        }
    }
}

/// Sends the four request shapes and checks what the client got and what
/// each leg received. `handoff` is the decode mock's `x-mock-kv` verdict.
fn check_engine(setup: &Setup, handoff: &str) {
    let mut sent = Vec::new();
    for path in ["/v1/completions", "/v1/chat/completions"] {
        for stream in [false, true] {
            let body = client_body(&setup.model, path, stream);
            let id = request_id();
            let a = post(
                &setup.envoy.url(path),
                body.clone(),
                &[("x-request-id", &id), ("authorization", "Bearer sk-e2e")],
            );
            let what = format!("{} {path} stream={stream}", setup.model);
            assert_eq!(a.status, 200, "{what}: {}\n{}", a.body, setup.envoy.log());
            assert_eq!(a.header("x-mock-kv"), Some(handoff), "{what}");
            assert_eq!(
                a.header("x-mock-pod"),
                Some(setup.decode.name.as_str()),
                "{what}"
            );
            assert_eq!(
                a.header("prefill-target-pod"),
                Some(setup.prefill.name.as_str()),
                "{what}"
            );
            assert_eq!(
                a.header("prefill-target-pod-ip"),
                Some("127.0.0.1"),
                "{what}"
            );
            if stream {
                assert!(
                    a.header("content-type")
                        .is_some_and(|c| c.starts_with("text/event-stream")),
                    "{what}"
                );
                let events = a.events();
                assert!(
                    events.len() >= 6,
                    "{what}: chunk per token expected, got {events:?}"
                );
                assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{what}");
                for e in &events[..events.len() - 1] {
                    serde_json::from_str::<Value>(e)
                        .unwrap_or_else(|_| panic!("{what}: bad chunk {e}"));
                }
            } else {
                let v = a.json();
                assert!(v["choices"][0].is_object(), "{what}: {v}");
            }
            sent.push((id, path, stream, body));
        }
    }

    let prefills = setup.prefill.requests();
    let decodes = setup.decode.requests();
    assert_eq!(prefills.len(), sent.len(), "one prefill per request");
    assert_eq!(decodes.len(), sent.len(), "one decode per request");
    for (id, path, stream, body) in &sent {
        let by_id = |logs: &[Logged]| {
            logs.iter()
                .find(|l| l.header("x-request-id") == Some(id))
                .cloned()
                .unwrap_or_else(|| panic!("{id}: not seen by a mock"))
        };
        let p = by_id(&prefills);
        let d = by_id(&decodes);
        assert_eq!(&p.path, path);
        assert_eq!(&d.path, path);
        // Credentials travel on both legs.
        assert_eq!(p.header("authorization"), Some("Bearer sk-e2e"));
        assert_eq!(d.header("authorization"), Some("Bearer sk-e2e"));
        let client = body.as_bytes();
        // The router never rewrites what it does not own.
        for key in ["messages", "tools", "seed", "temperature"] {
            let c = raw_member(client, key);
            assert_eq!(p.raw(key), c, "{id}: prefill {key} bytes differ");
            assert_eq!(d.raw(key), c, "{id}: decode {key} bytes differ");
        }
        if *path == "/v1/completions" && setup.model != "test/trtllm" {
            assert_eq!(d.raw("prompt"), raw_member(client, "prompt"));
        }
        // Prefill constraints, and the decode keeps the client's values.
        assert_eq!(p.raw("max_tokens").as_deref(), Some("1"));
        assert_eq!(p.raw("stream").as_deref(), Some("false"));
        assert_eq!(p.raw("stream_options"), None);
        assert_eq!(p.raw("min_tokens"), None);
        assert_eq!(d.raw("max_tokens").as_deref(), Some("6"));
        assert_eq!(
            d.raw("stream").as_deref(),
            Some(if *stream { "true" } else { "false" })
        );
        assert_eq!(
            d.raw("stream_options"),
            raw_member(client, "stream_options")
        );
        // Envoy reframes the decode leg with the content-length the filter set.
        assert_eq!(
            d.header("content-length")
                .and_then(|v| v.parse::<usize>().ok()),
            Some(d.body.len()),
            "{id}: decode content-length"
        );
    }
}

#[test]
fn vllm_nixl() {
    let s = Setup::start("vllm", Some("nixl"), &[], &[]);
    check_engine(&s, "pulled");
    // The hand-off object is relayed verbatim, unknown fields and u64::MAX included.
    let p = s.prefill.requests();
    let d = s.decode.requests();
    assert!(p[0]
        .raw("kv_transfer_params")
        .unwrap()
        .contains(r#""do_remote_decode":true"#));
    let relayed = d[0].raw("kv_transfer_params").expect("decode got hand-off");
    assert!(relayed.contains("18446744073709551615"), "{relayed}");
    assert!(relayed.contains("x_mock_future_field"), "{relayed}");
}

#[test]
fn vllm_shfs_rewrites_remote_host() {
    // The prefill advertises an address the decode cannot use; only the
    // router's rewrite to the pod IP makes the pull work.
    let s = Setup::start(
        "vllm",
        Some("shfs"),
        &["--advertise-host", "192.0.2.1"],
        &[],
    );
    check_engine(&s, "pulled");
    let d = s.decode.requests();
    let params: Value = serde_json::from_str(&d[0].raw("kv_transfer_params").unwrap()).unwrap();
    assert_eq!(params["remote_host"], "127.0.0.1");
}

#[test]
fn vllm_nixl_does_not_rewrite_remote_host() {
    // Same mocks as above with plain nixl: the decode must fail to pull,
    // which proves the shfs test is not passing by accident.
    let s = Setup::start(
        "vllm",
        Some("nixl"),
        &["--advertise-host", "192.0.2.1"],
        &[],
    );
    let a = post(
        &s.envoy.url("/v1/completions"),
        client_body(&s.model, "/v1/completions", false),
        &[],
    );
    assert_eq!(a.status, 422, "{}", a.body);
    assert!(a.body.contains("192.0.2.1"), "{}", a.body);
}

#[test]
fn vllm_neuron() {
    let s = Setup::start("vllm", Some("neuron"), &[], &[]);
    check_engine(&s, "pulled");
    assert!(s.decode.requests()[0].raw("disagg_prefill_resp").is_some());
}

#[test]
fn vllm_missing_handoff_recomputes_and_n_above_one_is_not_split() {
    let s = Setup::start(
        "vllm",
        Some("nixl"),
        &["--fault", "no-kv-params"],
        &["--allow-recompute"],
    );
    let a = post(
        &s.envoy.url("/v1/completions"),
        client_body(&s.model, "/v1/completions", false),
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-mock-kv"), Some("recomputed"));
    assert_eq!(s.envoy.stat("wasmcustom.pd_router.handoff_missing"), 1);

    let body = r#"{"model":"test/vllm","prompt":"p","n":2,"max_tokens":3}"#;
    let a = post(&s.envoy.url("/v1/completions"), body, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["choices"].as_array().map(Vec::len), Some(2));
    assert_eq!(a.header("prefill-target-pod"), None, "n > 1 is not split");
    assert_eq!(s.prefill.requests().len(), 1, "no prefill for n > 1");
}

#[test]
fn sglang_runs_both_legs_concurrently() {
    // The prefill mock blocks until the decode registers its room: a router
    // that awaited the prefill first would time out here.
    let s = Setup::start("sglang", None, &["--bootstrap-timeout-ms", "3000"], &[]);
    check_engine(&s, "pulled");
    let p = s.prefill.requests();
    let d = s.decode.requests();
    let room = p[0].json()["bootstrap_room"].as_u64().expect("room");
    assert!(room < (1 << 63));
    assert_eq!(
        d.iter()
            .filter(|r| r.json()["bootstrap_room"].as_u64() == Some(room))
            .count(),
        1
    );
    assert_eq!(p[0].json()["bootstrap_host"], "127.0.0.1");
    assert_eq!(p[0].json()["bootstrap_port"], s.prefill.bootstrap.unwrap());
}

#[test]
fn sglang_batches_use_one_room_per_sequence() {
    let s = Setup::start("sglang", None, &["--bootstrap-timeout-ms", "3000"], &[]);
    let body = r#"{"model":"test/sglang","prompt":["one","two","three"],"max_tokens":2}"#;
    let a = post(&s.envoy.url("/v1/completions"), body, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    let body = r#"{"model":"test/sglang","messages":[{"role":"user","content":"hi"}],"n":2,"max_tokens":2}"#;
    let a = post(&s.envoy.url("/v1/chat/completions"), body, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    let d = s.decode.requests();
    let rooms = d[0].json()["bootstrap_room"]
        .as_array()
        .cloned()
        .expect("array");
    assert_eq!(rooms.len(), 3);
    assert_eq!(
        d[1].json()["bootstrap_room"].as_array().map(Vec::len),
        Some(2)
    );
}

#[test]
fn sglang_prefill_failure_is_answered_at_once() {
    // The decode would wait 30 s for its KV; the router must not.
    let s = Setup::start(
        "sglang",
        None,
        &["--fault", "status:500"],
        &["--bootstrap-timeout-ms", "30000"],
    );
    for (path, stream) in [("/v1/completions", false), ("/v1/chat/completions", true)] {
        let a = post(&s.envoy.url(path), client_body(&s.model, path, stream), &[]);
        assert_eq!(a.status, 502, "{}", a.body);
        let msg = a.error_message();
        assert!(msg.contains("500"), "{msg}");
        assert!(
            a.elapsed.as_millis() < 1000,
            "answered after {:?}, not within a second",
            a.elapsed
        );
    }
}

#[test]
fn trtllm() {
    let s = Setup::start("trtllm", None, &[], &[]);
    check_engine(&s, "pulled");
    // Snowflake ids exceed 2^53 and must survive the round trip exactly.
    for (p, d) in s.prefill.requests().iter().zip(s.decode.requests()) {
        let sent: Value = serde_json::from_str(&p.raw("disaggregated_params").unwrap()).unwrap();
        let id = sent["disagg_request_id"].as_u64().expect("u64 id");
        assert!(id > (1u64 << 53), "id {id}");
        let relayed = d.raw("disaggregated_params").unwrap();
        assert!(
            relayed.contains(&format!("\"ctx_request_id\":{id}")),
            "{relayed}"
        );
        assert!(relayed.contains("\"generation_only\""), "{relayed}");
    }
}

#[test]
fn trtllm_chat_token_ids_can_travel_as_base64() {
    // TensorRT-LLM's gen_tokids_ctxbytes: a chat context asked for it answers
    // the ids as one base64 string; the generation worker decodes it, and the
    // mock checks the ids are still the context's.
    let prefill = Mock::start(
        "trtllm-prefill",
        &["--engine", "trtllm", "--role", "prefill"],
    );
    let decode = Mock::start("trtllm-decode", &["--engine", "trtllm", "--role", "decode"]);
    let model = "test/trtllm".to_string();
    let mut config = plugin_config(&[(&model, "trtllm", None, &[&prefill], &[&decode])]);
    config["models"][0]["trt_token_ids_b64"] = json!(true);
    let s = Setup {
        envoy: Envoy::start(&config),
        prefill,
        decode,
        model,
    };
    check_engine(&s, "pulled");
    let (prefills, decodes) = (s.prefill.requests(), s.decode.requests());
    assert_eq!(decodes.len(), 4);
    for (p, d) in prefills.iter().zip(&decodes) {
        let asked = p
            .raw("disaggregated_params")
            .is_some_and(|v| v.contains(r#""return_prompt_token_ids_b64":true"#));
        let b64 = d.raw("prompt_token_ids_b64");
        if d.path == "/v1/chat/completions" {
            assert!(asked, "{}", p.body);
            assert!(b64.is_some_and(|v| v.starts_with('"')), "{}", d.body);
            assert_eq!(d.raw("prompt_token_ids"), None, "{}", d.body);
        } else {
            // Completions keep the array (TensorRT-LLM encodes chat only).
            assert!(!asked, "{}", p.body);
            assert_eq!(b64, None, "{}", d.body);
            assert!(
                d.raw("prompt").is_some_and(|v| v.starts_with('[')),
                "{}",
                d.body
            );
        }
    }
}

#[test]
fn trtllm_context_answers_without_token_ids_still_hand_off() {
    // Older TensorRT-LLM chat endpoints do not echo prompt_token_ids; the
    // generation server then tokenises the prompt itself, and the mock checks
    // its tokens are still the context's.
    let s = Setup::start("trtllm", None, &["--fault", "no-token-ids"], &[]);
    check_engine(&s, "pulled");
    for d in s.decode.requests() {
        assert!(d.raw("disaggregated_params").is_some(), "{}", d.body);
        assert_eq!(d.raw("prompt_token_ids"), None, "{}", d.body);
        if d.path == "/v1/completions" {
            assert_eq!(
                d.raw("prompt").as_deref(),
                Some(PROMPT),
                "the client's prompt"
            );
        }
    }
    assert_eq!(
        s.envoy
            .stat("wasmcustom.pd_router.prompt_token_ids_missing"),
        4
    );
    assert_eq!(s.envoy.stat("wasmcustom.pd_router.handoff_missing"), 0);
    assert_eq!(
        s.envoy.log_lines_with("answers without prompt_token_ids"),
        1,
        "logged once per pod"
    );
}

#[test]
fn trtllm_context_answers_without_handoff_are_served_whole() {
    // TensorRT-LLM's generation server runs a request without
    // disaggregated_params as an ordinary one, as vLLM's decode recomputes
    // without kv_transfer_params: the rule for a missing hand-off is the same.
    let s = Setup::start("trtllm", None, &["--fault", "no-disagg-params"], &[]);
    check_engine(&s, "recomputed");
    for d in s.decode.requests() {
        assert_eq!(d.raw("disaggregated_params"), None, "{}", d.body);
        assert_eq!(d.raw("prompt_token_ids"), None, "{}", d.body);
    }
    assert_eq!(s.envoy.stat("wasmcustom.pd_router.handoff_missing"), 4);
}

#[test]
fn trtllm_finished_context_is_the_answer() {
    let s = Setup::start("trtllm", None, &[], &[]);
    let body = |stream: bool| {
        format!(
            r#"{{"model":"test/trtllm","prompt":"stop here [[finish]]","max_tokens":5,"stream":{stream}}}"#
        )
    };
    let a = post(&s.envoy.url("/v1/completions"), body(false), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["choices"][0]["finish_reason"], "stop");
    assert!(a.json().get("prompt_token_ids").is_none());
    let a = post(&s.envoy.url("/v1/completions"), body(true), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a
        .header("content-type")
        .unwrap_or_default()
        .starts_with("text/event-stream"));
    let events = a.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert!(
        s.decode.requests().is_empty(),
        "no decode for a finished context"
    );
}

#[test]
fn default_engine() {
    let s = Setup::start("someengine", None, &[], &[]);
    check_engine(&s, "none");
    // The decode receives the client's body byte for byte.
    let d = s.decode.requests();
    assert_eq!(d[0].body, client_body(&s.model, "/v1/completions", false));
}

#[test]
fn a_four_mib_prompt_goes_through() {
    let s = Setup::start("vllm", Some("nixl"), &[], &[]);
    let prompt = "lorem ipsum ".repeat(4 * 1024 * 1024 / 12 + 1);
    let body = json!({"model": s.model, "prompt": prompt, "max_tokens": 3}).to_string();
    assert!(body.len() > 4 * 1024 * 1024);
    let a = post(&s.envoy.url("/v1/completions"), body.clone(), &[]);
    assert_eq!(a.status, 200, "{}", &a.body[..a.body.len().min(500)]);
    assert_eq!(a.header("x-mock-kv"), Some("pulled"));
    let d = s.decode.requests();
    assert_eq!(d[0].raw("prompt"), raw_member(body.as_bytes(), "prompt"));
}

/// The top-level keys of a logged body, in order.
fn keys(body: &str) -> Vec<String> {
    let top = pd_router::body::Members::parse(body.as_bytes()).expect("logged body is an object");
    top.keys().map(str::to_owned).collect()
}

#[test]
fn long_prompts_keep_their_bytes_with_the_handoff_in_front() {
    // Past a few KiB of untouched body the decode's hand-off goes in front,
    // and Envoy keeps the client's bytes in its buffer (only `{` is
    // replaced); each decode mock still checks its hand-off, and the prompt
    // must arrive byte for byte.
    let content = r#"lorem ipsum, dolor \"sit\" amet. "#.repeat(3300);
    for (engine, connector, path, handoff) in [
        ("sglang", None, "/v1/chat/completions", "bootstrap_host"),
        (
            "vllm",
            Some("nixl"),
            "/v1/chat/completions",
            "kv_transfer_params",
        ),
        (
            "trtllm",
            None,
            "/v1/chat/completions",
            "disaggregated_params",
        ),
        // The ids take the prompt's place: an edit at the body's end, so the
        // body is rendered whole, its new members last.
        ("trtllm", None, "/v1/completions", "disaggregated_params"),
    ] {
        let s = Setup::start(engine, connector, &[], &[]);
        let body = if path == "/v1/completions" {
            format!(
                r#"{{"model":"{}","prompt":"{content}","max_tokens":3}}"#,
                s.model
            )
        } else {
            format!(
                r#"{{"model":"{}","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":3}}"#,
                s.model
            )
        };
        assert!(body.len() > 100_000);
        let what = format!("{engine} {path}");
        let a = post(&s.envoy.url(path), body.clone(), &[]);
        assert_eq!(
            a.status,
            200,
            "{what}: {}",
            &a.body[..a.body.len().min(500)]
        );
        assert_eq!(a.header("x-mock-kv"), Some("pulled"), "{what}");
        let d = s.decode.requests();
        let got = keys(&d[0].body);
        if path == "/v1/completions" {
            assert_eq!(got[..2], ["model", "prompt"], "{what}: {got:?}");
            assert_eq!(got.last().map(String::as_str), Some(handoff), "{what}");
        } else {
            assert_eq!(got[0], handoff, "{what}: {got:?}");
            assert_eq!(
                got[got.len() - 3..],
                ["model", "messages", "max_tokens"],
                "{what}"
            );
            assert_eq!(
                d[0].raw("messages"),
                raw_member(body.as_bytes(), "messages"),
                "{what}"
            );
        }
    }
}

#[test]
fn decode_output_streams_through_chunk_by_chunk() {
    // 8 tokens 150 ms apart: buffered, the first byte would arrive with the
    // last; streamed, it arrives about a second earlier.
    let s = Setup::start("vllm", Some("nixl"), &[], &["--stream-delay-ms", "150"]);
    let body = format!(
        r#"{{"model":"{}","prompt":"p","max_tokens":8,"stream":true}}"#,
        s.model
    );
    let start = std::time::Instant::now();
    let mut resp = http()
        .post(s.envoy.url("/v1/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    let mut first = None;
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = std::io::Read::read(&mut resp, &mut buf).expect("read");
        if n == 0 {
            break;
        }
        first.get_or_insert_with(|| start.elapsed());
        all.extend_from_slice(&buf[..n]);
    }
    let total = start.elapsed();
    let first = first.expect("some output");
    assert!(String::from_utf8_lossy(&all).ends_with("data: [DONE]\n\n"));
    assert!(
        total - first >= std::time::Duration::from_millis(700),
        "first chunk at {first:?}, end at {total:?}: the stream was buffered"
    );
}

#[test]
fn several_worker_threads_share_the_configuration() {
    // Two Envoy workers, each with its own VM: every request still splits, and
    // TensorRT-LLM ids stay distinct across workers.
    let prefill = Mock::start("trt-p", &["--engine", "trtllm", "--role", "prefill"]);
    let decode = Mock::start("trt-d", &["--engine", "trtllm", "--role", "decode"]);
    let envoy = Envoy::start_with(
        &plugin_config(&[("t", "trtllm", None, &[&prefill], &[&decode])]),
        2,
    );
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let url = envoy.url("/v1/completions");
            std::thread::spawn(move || {
                (0..10)
                    .map(|i| {
                        post(
                            &url,
                            format!(r#"{{"model":"t","prompt":"p{i}","max_tokens":2}}"#),
                            &[],
                        )
                        .status
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        assert!(h.join().expect("thread").iter().all(|s| *s == 200));
    }
    let ids: std::collections::HashSet<u64> = prefill
        .requests()
        .iter()
        .map(|r| {
            r.json()["disaggregated_params"]["disagg_request_id"]
                .as_u64()
                .expect("id")
        })
        .collect();
    assert_eq!(ids.len(), 40, "disagg ids must be unique");
}

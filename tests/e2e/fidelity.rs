//! The client's answer is the one a single engine would give: the prefill's
//! real cached-token count in `usage`, and prompt logprobs only the prefill
//! computed, through a real Envoy against mocks whose decode reports the
//! transferred KV as cached (as vLLM's does) and computes no prompt
//! logprobs once it uses a hand-off.

use crate::engines::Setup;
use crate::harness::*;
use serde_json::{json, Value};

/// The cached-token count of an answer, plain or streamed.
fn cached(a: &Answer, path: &str) -> Option<u64> {
    let usage = if a
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"))
    {
        a.body
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find_map(|v| {
                let u = if v["type"].is_string() {
                    &v["response"]["usage"]
                } else {
                    &v["usage"]
                };
                u.is_object().then(|| u.clone())
            })?
    } else {
        a.json()["usage"].clone()
    };
    let details = if path == "/v1/responses" {
        "input_tokens_details"
    } else {
        "prompt_tokens_details"
    };
    usage[details]["cached_tokens"].as_u64()
}

fn request(model: &str, path: &str, stream: bool) -> String {
    let mut b = match path {
        "/v1/chat/completions" => {
            json!({"model": model, "messages": [{"role": "user", "content": "Bonjour, ça va très bien ?"}]})
        }
        "/v1/responses" => json!({"model": model, "input": "Bonjour, ça va très bien ?"}),
        _ => json!({"model": model, "prompt": "Bonjour, ça va très bien ?"}),
    };
    b[if path == "/v1/responses" {
        "max_output_tokens"
    } else {
        "max_tokens"
    }] = 4.into();
    if stream {
        b["stream"] = true.into();
        if path != "/v1/responses" {
            b["stream_options"] = json!({"include_usage": true});
        }
    }
    b.to_string()
}

/// Every path, streamed and not: the client sees `want` cached tokens.
fn check_cached(s: &Setup, paths: &[&str], want: u64) {
    for path in paths {
        for stream in [false, true] {
            let a = post(&s.envoy.url(path), request(&s.model, path, stream), &[]);
            let what = format!("{} {path} stream={stream}", s.model);
            assert_eq!(a.status, 200, "{what}: {}", a.body);
            assert_eq!(a.header("x-mock-kv"), Some("pulled"), "{what}");
            assert_eq!(cached(&a, path), Some(want), "{what}: {}", a.body);
        }
    }
    assert!(s.envoy.stat("wasmcustom.pd_router.answers_rewritten") > 0);
    s.envoy.assert_counters_zero();
}

#[test]
fn vllm_mooncake_answers_carry_the_prefill_cached_tokens() {
    // Concurrent legs: the decode counts the pulled KV as cached (all of
    // it); only the prefill knows its 3.
    let s = Setup::start("vllm", Some("mooncake"), &["--cached-tokens", "3"], &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while post(
        &s.envoy.url("/v1/completions"),
        request(&s.model, "/v1/completions", false),
        &[],
    )
    .status
        == 503
    {
        assert!(
            std::time::Instant::now() < deadline,
            "engine id never learned"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    check_cached(
        &s,
        &["/v1/completions", "/v1/chat/completions", "/v1/responses"],
        3,
    );
}

#[test]
fn vllm_nixl_from_before_remote_cached_tokens_gets_them_from_the_prefill_usage() {
    // vLLM < 0.31: the decode reports the pulled KV as cached.
    let s = Setup::start(
        "vllm",
        Some("nixl"),
        &["--cached-tokens", "2", "--no-remote-cached-field"],
        &["--no-remote-cached-field"],
    );
    check_cached(&s, &["/v1/completions", "/v1/chat/completions"], 2);
}

#[test]
fn sglang_double_counting_decodes_are_corrected() {
    let s = Setup::start(
        "sglang",
        None,
        &["--cached-tokens", "2", "--enable-cache-report"],
        &["--double-count-cached", "--enable-cache-report"],
    );
    check_cached(&s, &["/v1/completions", "/v1/chat/completions"], 2);
}

#[test]
fn an_answer_with_nothing_to_add_is_passed_through_untouched() {
    // The prefill reports no details: nothing to put in the decode's
    // answer, which keeps its length header and its bytes.
    let s = Setup::start(
        "vllm",
        Some("nixl"),
        &["--no-prompt-tokens-details", "--no-remote-cached-field"],
        &["--no-prompt-tokens-details"],
    );
    for stream in [false, true] {
        let a = post(
            &s.envoy.url("/v1/completions"),
            request(&s.model, "/v1/completions", stream),
            &[],
        );
        assert_eq!(a.status, 200, "{}", a.body);
        if !stream {
            assert!(
                a.header("content-length").is_some(),
                "not rewritten: its length stays"
            );
        }
    }
    let a = post(
        &s.envoy.url("/v1/chat/completions"),
        json!({"model": s.model, "messages": [{"role": "user", "content": "hi"}], "stream": true})
            .to_string(),
        &[],
    );
    assert_eq!(a.status, 200);
    assert_eq!(s.envoy.stat("wasmcustom.pd_router.answers_rewritten"), 0);
}

/// What one vLLM engine answers to `body` alone (a decode mock that
/// computes the prompt itself).
fn single_engine(path: &str, body: &str) -> Value {
    let single = Mock::start(
        "single",
        &["--engine", "vllm", "--role", "decode", "--allow-recompute"],
    );
    let a = post(
        &format!("http://{}{path}", single.address()),
        body.to_owned(),
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    a.json()
}

#[test]
fn vllm_prompt_logprobs_come_from_the_prefill_and_the_hand_off_is_used() {
    let s = Setup::start("vllm", Some("nixl"), &[], &[]);
    let chat = json!({"model": s.model, "messages": [{"role": "user", "content": "Été à Paris"}], "prompt_logprobs": 2, "max_tokens": 3}).to_string();
    let a = post(&s.envoy.url("/v1/chat/completions"), chat.clone(), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.header("x-mock-kv"),
        Some("pulled"),
        "the decode used the hand-off"
    );
    let want = single_engine("/v1/chat/completions", &chat);
    assert!(want["prompt_logprobs"].is_array());
    assert_eq!(a.json()["prompt_logprobs"], want["prompt_logprobs"]);
    assert_eq!(
        a.json()["choices"][0]["message"],
        want["choices"][0]["message"]
    );
    let d = s.decode.requests();
    assert_eq!(
        d[0].raw("prompt_logprobs"),
        None,
        "asked of the prefill only"
    );

    let cmpl =
        json!({"model": s.model, "prompt": "Été à Paris", "prompt_logprobs": 1, "max_tokens": 3})
            .to_string();
    let a = post(&s.envoy.url("/v1/completions"), cmpl.clone(), &[]);
    assert_eq!(a.header("x-mock-kv"), Some("pulled"));
    let want = single_engine("/v1/completions", &cmpl);
    assert_eq!(
        a.json()["choices"][0]["prompt_logprobs"],
        want["choices"][0]["prompt_logprobs"]
    );

    // Streamed, vLLM refuses prompt_logprobs: the request goes whole and
    // the client hears the engine's own 400.
    let streamed =
        json!({"model": s.model, "prompt": "x", "prompt_logprobs": 1, "stream": true}).to_string();
    let a = post(&s.envoy.url("/v1/completions"), streamed, &[]);
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(
        a.error_message()
            .contains("not available when `stream=True`"),
        "{}",
        a.body
    );
}

#[test]
fn vllm_echo_with_logprobs_is_what_a_single_engine_answers() {
    let s = Setup::start("vllm", Some("nixl"), &[], &[]);
    let body = json!({"model": s.model, "prompt": "Été à Paris", "echo": true, "logprobs": 1, "max_tokens": 3}).to_string();
    let want = single_engine("/v1/completions", &body);
    let a = post(&s.envoy.url("/v1/completions"), body.clone(), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-mock-kv"), Some("pulled"));
    let (got, want) = (&a.json()["choices"][0], &want["choices"][0]);
    for k in ["text", "logprobs", "prompt_logprobs"] {
        assert_eq!(got[k], want[k], "{k}");
    }
    // Streamed: the first chunk leads with the prompt; the text and the
    // arrays, joined over the chunks, are the single engine's.
    let mut streamed: Value = serde_json::from_str(&body).unwrap();
    streamed["stream"] = true.into();
    let a = post(&s.envoy.url("/v1/completions"), streamed.to_string(), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    let (mut text, mut tokens, mut offsets) = (String::new(), Vec::new(), Vec::new());
    for e in a.events() {
        let Ok(v) = serde_json::from_str::<Value>(&e) else {
            continue;
        };
        let Some(c) = v["choices"].get(0) else {
            continue;
        };
        text.push_str(c["text"].as_str().unwrap_or_default());
        tokens.extend(
            c["logprobs"]["tokens"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        offsets.extend(
            c["logprobs"]["text_offset"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
    }
    assert_eq!(text, want["text"]);
    assert_eq!(Value::from(tokens), want["logprobs"]["tokens"]);
    assert_eq!(Value::from(offsets), want["logprobs"]["text_offset"]);
}

#[test]
fn sglang_echo_with_logprobs_gets_the_prompt_part_from_the_prefill() {
    let s = Setup::start("sglang", None, &[], &[]);
    for stream in [false, true] {
        let body = json!({"model": s.model, "prompt": "Hi there", "echo": true, "logprobs": 0, "max_tokens": 3, "stream": stream}).to_string();
        let a = post(&s.envoy.url("/v1/completions"), body, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        let chunks: Vec<Value> = if stream {
            a.events()
                .iter()
                .filter_map(|e| serde_json::from_str(e).ok())
                .collect()
        } else {
            vec![a.json()]
        };
        let first = &chunks[0]["choices"][0];
        assert!(
            first["text"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Hi there"),
            "{first}"
        );
        let tokens: usize = chunks
            .iter()
            .filter_map(|c| {
                c["choices"][0]["logprobs"]["tokens"]
                    .as_array()
                    .map(Vec::len)
            })
            .sum();
        assert!(tokens > 3, "prompt and generated tokens: {}", a.body);
    }
}

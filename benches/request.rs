//! The filter's own per-request work: reading the client body (parse,
//! fields, checks, prompt digest), planning both legs, and merging a vLLM
//! answer into the decode body, for bodies of 1 KB, 64 KB and 512 KB, and
//! TensorRT-LLM's id merge. Every step is the shipped [`split`] function.
//!
//! `just bench` runs it inside wasm (wasmtime), the code Envoy runs (in
//! V8); `cargo bench --bench request` natively.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::api::Api;
use pd_router::config::Config;
use pd_router::engine::{FixedIds, Registry};
use pd_router::reconcile::{PrefillReport, Rewrite, RewritePlan};
use pd_router::split::{self, Placement, Plan, SplitContext};
use std::hint::black_box;
use std::time::Instant;

/// Where the figures come from: the body scans read a block at a time with
/// SIMD128 inside wasm and eight bytes in a `u64` natively, so only the
/// wasm figures are what Envoy runs.
const WHERE: &str = if cfg!(target_family = "wasm") {
    "inside wasm, wasmtime"
} else {
    "native"
};

fn body(bytes: usize) -> Vec<u8> {
    let filler = "The quick brown fox jumps over the lazy dog. ".repeat(bytes / 45 + 1);
    let content = &filler[..bytes.saturating_sub(200).max(1)];
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"be brief"}},{{"role":"user","content":"{content}"}}],"max_tokens":64,"stream":true,"temperature":0.7}}"#
    )
    .into_bytes()
}

const ANSWER: &[u8] = br#"{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"A"},"finish_reason":"length"}],"usage":{"prompt_tokens":5},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3,4,5,6,7,8],"remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}"#;

/// One model of `engine`, with one prefill and one decode pod.
fn one_model(engine: &str) -> Config {
    model_with(engine, "")
}

/// Like [`one_model`], with `extra` model members (`,"key":value`).
fn model_with(engine: &str, extra: &str) -> Config {
    let json = format!(
        r#"{{"models":[{{"name":"m","engine":"{engine}"{extra},"rolesets":[{{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}}]}}]}}"#
    );
    Config::parse(json.as_bytes()).expect("config")
}

fn per_call(iters: u32, mut f: impl FnMut()) -> f64 {
    let mut rounds = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..iters {
            f();
        }
        rounds.push(start.elapsed().as_nanos() as f64 / iters as f64 / 1000.0);
    }
    rounds.sort_by(|a, b| a.total_cmp(b));
    rounds[2]
}

/// The filter runs on dlmalloc in wasm linear memory, which never hands
/// pages back; glibc trims and re-maps large blocks between iterations, and
/// the page faults that follow (hundreds of µs at 512 KB) are no cost an
/// Envoy request pays. Keep glibc's heap where it is. (Inside wasm, as
/// `just bench` also runs it, the allocator is the filter's own.)
#[cfg(not(target_family = "wasm"))]
#[allow(unsafe_code)]
fn steady_allocator() {
    // SAFETY: mallopt only sets allocator parameters; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, i32::MAX);
    }
}

#[cfg(target_family = "wasm")]
#[allow(unsafe_code)]
fn steady_allocator() {}

fn main() {
    steady_allocator();
    let config = one_model("vllm");
    let fleet = config.fleet();
    let registry = Registry::builtin();
    let view = SplitContext::of_config(&config, &fleet, &registry);
    let mut ids = FixedIds::new(vec![1], 1 << 50);
    let mut merge_ids = ids.clone();
    let mut plan_of = |b: &[u8]| {
        let placement = Placement::first_pair(&fleet).expect("pods");
        split::read(&view, Api::ChatCompletions, "r", b.to_vec())
            .and_then(|r| split::build(&view, r, placement, &mut ids))
    };
    println!("filter work per request, vLLM chat ({WHERE}, release; µs, median of 5)");
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>10}",
        "body", "read", "plan", "merge", "total"
    );
    for size in [1024usize, 64 * 1024, 512 * 1024] {
        let b = body(size);
        let iters = (20_000_000 / size).clamp(50, 20_000) as u32;
        let Ok(Plan::Split(plan)) = plan_of(&b) else {
            panic!("not split");
        };
        // `plan` includes `read`; the clone of the body is the flow's read
        // out of Envoy's buffer.
        let read = per_call(iters, || {
            black_box(split::read(&view, Api::ChatCompletions, "r", b.clone()).ok());
        });
        let plan_t = per_call(iters, || {
            black_box(plan_of(&b).ok());
        });
        let merge = per_call(iters, || {
            black_box(split::merge(&view, &mut merge_ids, &plan, ANSWER).ok());
        });
        println!(
            "{:>7}K {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            size / 1024,
            read,
            (plan_t - read).max(0.0),
            merge,
            plan_t + merge
        );
    }
    // The default digest: blocks of 128 estimated tokens (512 B), the whole
    // prompt up to 1,024 blocks.
    for size in [64 * 1024, 512 * 1024] {
        let digest_input = body(size);
        let digest = per_call(200, || {
            black_box(pd_router::sched::prefix::block_hashes(
                &digest_input,
                7,
                512,
                1024,
            ));
        });
        println!(
            "of read at {}K, the prompt digest (blocks of 512 B, the whole prompt): {digest:.2} µs",
            size / 1024
        );
    }
    println!("read: body copy, parse, fields, checks, prompt digest; plan: placement and both legs built;");
    println!("merge: the prefill answer parsed and the decode body rendered.");
    trtllm_merge();
    answer_rewrite();
}

/// A TensorRT-LLM context answer for a prompt of `bytes` bytes: one token
/// id per 4 bytes, as the mock (and about a real tokenizer) makes them; as
/// an array, or (`b64`) as the base64 string of little-endian int32s.
fn trt_answer(bytes: usize, b64: bool) -> Vec<u8> {
    use base64::Engine as _;
    let ids = (0..bytes / 4).map(|i| 1000 + (i % 150_000) as u32);
    let ids = if b64 {
        let raw: Vec<u8> = ids.flat_map(u32::to_le_bytes).collect();
        let text = base64::engine::general_purpose::STANDARD.encode(raw);
        format!(r#""prompt_token_ids":null,"prompt_token_ids_b64":"{text}""#)
    } else {
        let list: Vec<String> = ids.map(|i| i.to_string()).collect();
        format!(r#""prompt_token_ids":[{}]"#, list.join(","))
    };
    format!(
        r#"{{"id":"c","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"A"}},"finish_reason":"length","disaggregated_params":{{"request_type":"context_only","first_gen_tokens":[319],"ctx_request_id":4398046511104123,"disagg_request_id":4398046511104123,"encoded_opaque_state":"b3BhcXVl","draft_tokens":null}}}}],{ids}}}"#
    )
    .into_bytes()
}

/// TensorRT-LLM: the context answer's token ids into the generation request.
fn trtllm_merge() {
    println!();
    println!("TensorRT-LLM merge: context answer (token ids) into the generation request (µs)");
    println!(
        "{:>8} {:>7} {:>12} {:>10} {:>13} {:>11} {:>11}",
        "body", "ids", "answer", "merge", "of it: parse", "UTF-8 check", "answer copy"
    );
    for b64 in [false, true] {
        let extra = if b64 {
            r#","trt_token_ids_b64":true"#
        } else {
            ""
        };
        trtllm_merge_rows(&model_with("trtllm", extra), b64);
    }
}

fn trtllm_merge_rows(config: &Config, b64: bool) {
    let fleet = config.fleet();
    let registry = Registry::builtin();
    let view = SplitContext::of_config(config, &fleet, &registry);
    let mut ids = FixedIds::new(vec![1], 1 << 50);
    let mut merge_ids = ids.clone();
    let mut plan_of = |b: &[u8]| {
        let placement = Placement::first_pair(&fleet).expect("pods");
        split::read(&view, Api::ChatCompletions, "r", b.to_vec())
            .and_then(|r| split::build(&view, r, placement, &mut ids))
    };
    for size in [1024usize, 64 * 1024, 512 * 1024] {
        let b = body(size);
        let answer = trt_answer(size, b64);
        let Ok(Plan::Split(plan)) = plan_of(&b) else {
            panic!("not split");
        };
        let iters = (10_000_000 / answer.len()).clamp(20, 20_000) as u32;
        let merge = per_call(iters, || {
            black_box(split::merge(&view, &mut merge_ids, &plan, &answer).ok());
        });
        let parse = per_call(iters, || {
            black_box(pd_router::body::Members::parse(&answer).ok());
        });
        // Yardsticks for the parse: validating the bytes as UTF-8, and one
        // copy of them (what moving the token ids costs at the least).
        let utf8 = per_call(iters, || {
            black_box(std::str::from_utf8(black_box(&answer)).is_ok());
        });
        let copy = per_call(iters, || {
            black_box(black_box(&answer).to_vec());
        });
        println!(
            "{:>7}K {:>7} {:>11}B {merge:>10.2} {parse:>13.2} {utf8:>11.2} {copy:>11.2}",
            size / 1024,
            if b64 { "base64" } else { "array" },
            answer.len()
        );
    }
}

/// A decode answer of `tokens` generated tokens: whole, and as the SSE
/// stream vLLM sends (one event per token, then the usage chunk).
fn decode_answer(tokens: usize) -> (Vec<u8>, Vec<u8>) {
    let text = "tok ".repeat(tokens);
    let usage = format!(
        r#"{{"prompt_tokens":900,"total_tokens":{},"completion_tokens":{tokens},"prompt_tokens_details":{{"cached_tokens":900}}}}"#,
        900 + tokens
    );
    let whole = format!(
        r#"{{"id":"cmpl-d","object":"chat.completion","created":1764000000,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"logprobs":null,"finish_reason":"length"}}],"usage":{usage},"prompt_logprobs":null,"kv_transfer_params":null}}"#
    );
    let mut sse = String::new();
    for _ in 0..tokens {
        sse.push_str(r#"data: {"id":"cmpl-d","object":"chat.completion.chunk","created":1764000000,"model":"m","choices":[{"index":0,"delta":{"content":"tok "},"logprobs":null,"finish_reason":null}]}"#);
        sse.push_str("\n\n");
    }
    sse.push_str(&format!(
        r#"data: {{"id":"cmpl-d","object":"chat.completion.chunk","created":1764000000,"model":"m","choices":[],"usage":{usage}}}"#
    ));
    sse.push_str("\n\ndata: [DONE]\n\n");
    (whole.into_bytes(), sse.into_bytes())
}

/// The cost of making an answer faithful (cached tokens from the prefill),
/// against the pass-through path, which does no work in the filter.
fn answer_rewrite() {
    let plan = RewritePlan {
        usage: true,
        logprobs: None,
        stream: false,
        capture_kv: false,
    };
    let fields = PrefillReport {
        cached_tokens: Some(120),
        prompt: None,
    };
    println!();
    println!("answer rewrite, vLLM chat usage ({WHERE}, release; µs per answer, median of 5)");
    println!(
        "{:>8} {:>12} {:>14} {:>14}",
        "tokens", "whole", "sse (1 chunk)", "sse per event"
    );
    for tokens in [16usize, 256, 2048] {
        let (whole, sse) = decode_answer(tokens);
        let iters = (2_000_000 / sse.len()).clamp(20, 20_000) as u32;
        let w = per_call(iters, || {
            let mut r = Rewrite::new(plan.clone(), Some(fields.clone()));
            black_box(r.whole(&whole).ok());
        });
        let stream_plan = RewritePlan {
            stream: true,
            ..plan.clone()
        };
        let s = per_call(iters, || {
            let mut r = Rewrite::new(stream_plan.clone(), Some(fields.clone()));
            black_box(r.chunk(&sse, true).ok());
        });
        // As Envoy delivers a stream: one event per callback.
        let text = String::from_utf8(sse.clone()).unwrap();
        let events: Vec<&[u8]> = text.split_inclusive("\n\n").map(str::as_bytes).collect();
        let e = per_call(iters, || {
            let mut r = Rewrite::new(stream_plan.clone(), Some(fields.clone()));
            for ev in &events {
                black_box(r.chunk(ev, false).ok());
            }
        });
        println!(
            "{tokens:>8} {w:>12.2} {s:>14.2} {:>14.3}",
            e / (tokens + 2) as f64
        );
    }
    println!("pass-through (nothing to rewrite): no response body callback work, 0 µs.");
}

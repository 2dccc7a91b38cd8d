//! The filter's own per-request work, natively: parse the client body, read
//! the fields, build both legs, render them, merge a vLLM answer. Bodies of
//! 1 KB, 64 KB and 512 KB. Inside Envoy the same code runs in V8, slower by
//! a roughly constant factor; the split between steps is what this shows.
//!
//! Run with `just bench`.

use pd_router::api::{read_facts, Api};
use pd_router::body::TopLevel;
use pd_router::config::Config;
use pd_router::engine::{build_legs, FixedEntropy, PdContext, PrefillAnswer, Registry};
use std::hint::black_box;
use std::time::Instant;

fn body(bytes: usize) -> Vec<u8> {
    let filler = "The quick brown fox jumps over the lazy dog. ".repeat(bytes / 45 + 1);
    let content = &filler[..bytes.saturating_sub(200).max(1)];
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"be brief"}},{{"role":"user","content":"{content}"}}],"max_tokens":64,"stream":true,"temperature":0.7}}"#
    )
    .into_bytes()
}

const ANSWER: &[u8] = br#"{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"A"},"finish_reason":"length"}],"usage":{"prompt_tokens":5},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3,4,5,6,7,8],"remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}"#;

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

fn main() {
    let config = Config::parse(
        br#"{"models":[{"name":"m","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#,
    )
    .expect("config");
    let pod = &config.models[0].rolesets[0].prefill[0];
    let registry = Registry::builtin();
    let handler = registry.resolve("vllm");
    println!("filter work per request, vLLM chat (native, release; µs, median of 5)");
    println!(
        "{:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "body", "parse", "facts", "legs", "prefill", "merge", "decode", "total"
    );
    for size in [1024usize, 64 * 1024, 512 * 1024] {
        let b = body(size);
        let iters = (20_000_000 / size).clamp(50, 20_000) as u32;
        let top = TopLevel::parse(&b).expect("parse");
        let facts = read_facts(Api::ChatCompletions, &b, &top).expect("facts");
        let answer_top = TopLevel::parse(ANSWER).expect("answer");
        let mut entropy = FixedEntropy::new(vec![1], 1 << 50);
        let mut ctx = PdContext {
            facts: &facts,
            body: &b,
            top: &top,
            request_id: "r",
            model_connector: None,
            entropy: &mut entropy,
        };
        let legs = build_legs(handler, &mut ctx, pod).expect("legs");
        let mut decode = legs.decode.clone();
        handler
            .merge_prefill_response(
                &mut ctx,
                &PrefillAnswer {
                    body: ANSWER,
                    top: &answer_top,
                },
                pod,
                &mut decode,
            )
            .expect("merge");

        let parse = per_call(iters, || {
            black_box(TopLevel::parse(black_box(&b)).ok());
        });
        let facts_t = per_call(iters, || {
            black_box(read_facts(Api::ChatCompletions, &b, &top).ok());
        });
        let legs_t = per_call(iters, || {
            black_box(build_legs(handler, &mut ctx, pod).ok());
        });
        let prefill_t = per_call(iters, || {
            black_box(top.render(&b, &legs.prefill));
        });
        let merge_t = per_call(iters, || {
            let mut d = legs.decode.clone();
            let t = TopLevel::parse(ANSWER).expect("answer");
            black_box(
                handler
                    .merge_prefill_response(
                        &mut ctx,
                        &PrefillAnswer {
                            body: ANSWER,
                            top: &t,
                        },
                        pod,
                        &mut d,
                    )
                    .ok(),
            );
        });
        let decode_t = per_call(iters, || {
            black_box(top.render(&b, &decode));
        });
        let total = parse + facts_t + legs_t + prefill_t + merge_t + decode_t;
        println!(
            "{:>7}K {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>10.2}",
            size / 1024,
            parse,
            facts_t,
            legs_t,
            prefill_t,
            merge_t,
            decode_t,
            total
        );
    }
}

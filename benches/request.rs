//! The filter's own per-request work, natively: reading the client body
//! (parse, fields, checks, prompt digest), planning both legs, and merging a
//! vLLM answer into the decode body, for bodies of 1 KB, 64 KB and 512 KB.
//! Every step is the shipped [`split`] function; inside Envoy the same code
//! runs in V8, slower by a roughly constant factor.
//!
//! Run with `just bench`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::api::Api;
use pd_router::config::Config;
use pd_router::engine::{FixedEntropy, Registry};
use pd_router::split::{self, FixedPlanner, Plan, RouterView};
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

/// The filter runs on dlmalloc in wasm linear memory, which never hands
/// pages back; glibc trims and re-maps large blocks between iterations, and
/// the page faults that follow (hundreds of µs at 512 KB) are no cost an
/// Envoy request pays. Keep glibc's heap where it is.
fn steady_allocator() {
    // SAFETY: mallopt only sets allocator parameters; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, i32::MAX);
    }
}

fn main() {
    steady_allocator();
    let config = Config::parse(
        br#"{"models":[{"name":"m","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#,
    )
    .expect("config");
    let fleet = config.fleet();
    let registry = Registry::builtin();
    let view = RouterView::of_config(&config, &fleet, &registry);
    let entropy = FixedEntropy::new(vec![1], 1 << 50);
    let mut planner = FixedPlanner::first_pods(&fleet, entropy).expect("pods");
    println!("filter work per request, vLLM chat (native, release; µs, median of 5)");
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>10}",
        "body", "read", "plan", "merge", "total"
    );
    for size in [1024usize, 64 * 1024, 512 * 1024] {
        let b = body(size);
        let iters = (20_000_000 / size).clamp(50, 20_000) as u32;
        let Ok(Plan::Split(plan)) =
            split::plan(&view, &mut planner, Api::ChatCompletions, "r", b.clone())
        else {
            panic!("not split");
        };
        // `plan` includes `read`; the clone of the body is the flow's read
        // out of Envoy's buffer.
        let read = per_call(iters, || {
            black_box(split::read(&view, Api::ChatCompletions, "r", b.clone()).ok());
        });
        let plan_t = per_call(iters, || {
            black_box(split::plan(&view, &mut planner, Api::ChatCompletions, "r", b.clone()).ok());
        });
        let merge = per_call(iters, || {
            black_box(split::merge(&view, &mut planner.entropy, &plan, ANSWER).ok());
        });
        println!(
            "{:>7}K {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            size / 1024,
            read,
            plan_t - read,
            merge,
            plan_t + merge
        );
    }
    println!("read: body copy, parse, fields, checks, prompt digest; plan: placement and both legs built;");
    println!("merge: the prefill answer parsed and the decode body rendered.");
}

//! The per-request cost of choosing pods, with 4 and with 64 pods: the pure
//! scheduling decision, and the whole selection as the filter does it (read
//! the shared counters, walk the prefix table, decide, take the load,
//! record the prefix, give the load back). Shared data is an in-memory
//! stand-in here; the shared-data operations per request are counted so
//! their price inside Envoy (a host call each) can be added.
//!
//! Run with `just bench` (or `cargo bench --bench select`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::api::Api;
use pd_router::config::Config;
use pd_router::load::HeldLoad;
use pd_router::pods::{MemoryStore, SetError, SharedStore};
use pd_router::router::Router;
use pd_router::sched::{schedule, LoadBound, PlacementRequest, PodState};
use pd_router::split::{self, Placement};
use std::cell::Cell;
use std::hint::black_box;
use std::time::Instant;

struct Counting {
    inner: MemoryStore,
    gets: Cell<u64>,
    sets: u64,
}

impl SharedStore for Counting {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.gets.set(self.gets.get() + 1);
        self.inner.shared_get(key)
    }
    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        self.sets += 1;
        self.inner.shared_set(key, value, cas)
    }
}

fn config(pods: usize, prefill_policy: &str, decode_policy: &str) -> Config {
    // pods/4 rolesets of 2 prefill + 2 decode.
    let rolesets: Vec<String> = (0..pods / 4)
        .map(|r| {
            let (a, b) = (r / 256, r % 256);
            format!(
                r#"{{"prefill":["10.{a}.{b}.1:8000","10.{a}.{b}.2:8000"],"decode":["10.{a}.{b}.3:8000","10.{a}.{b}.4:8000"]}}"#
            )
        })
        .collect();
    let json = format!(
        r#"{{"models":[{{"name":"m","engine":"vllm","prefill_policy":"{prefill_policy}","decode_policy":"{decode_policy}","rolesets":[{}]}}]}}"#,
        rolesets.join(",")
    );
    Config::parse(json.as_bytes()).expect("config")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Nanoseconds per call of `f`, median of 7 rounds.
fn time(iters: u32, mut f: impl FnMut(u32)) -> f64 {
    let mut rounds = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        for i in 0..iters {
            f(i);
        }
        rounds.push(start.elapsed().as_nanos() as f64 / iters as f64);
    }
    median(rounds)
}

/// The filter runs on dlmalloc in wasm linear memory, which never hands
/// pages back; glibc trims and re-maps large blocks between iterations, and
/// the page faults that follow (hundreds of µs at 512 KB) are no cost an
/// Envoy request pays. Keep glibc's heap where it is.
#[allow(unsafe_code)]
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
    let prompt = "You are a helpful assistant. Answer briefly. ".repeat(100); // ~4.5 KB: 35 blocks of 128 bytes
    let body = format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":16}}"#).into_bytes();
    println!("pod selection cost per request (native, release; median of 7 rounds)");
    println!(
        "{:<34} {:>5} {:>12} {:>12} {:>8} {:>14}",
        "policies", "pods", "decide µs", "full µs", "ratio", "shared ops/req"
    );
    for (pp, dp) in [
        ("least_ttft", "least_request"),
        ("prefix_cache", "load_balancing"),
        ("least_request", "least_request"),
        ("round_robin", "round_robin"),
        ("power_of_two", "power_of_two"),
        ("consistent_hash", "least_request"),
    ] {
        let mut base = None;
        for pods in [4usize, 64, 1000] {
            let router = Router::new(config(pods, pp, dp), 0).expect("router");
            let fleet = router.fleet();
            let model = &fleet.models()[0];
            let s = &router.config.scheduling;
            let states: Vec<PodState> = (0..model.pods.len())
                .map(|i| PodState {
                    outstanding_prefills: (i % 3) as u32,
                    pending_decodes: (i % 5) as u32,
                    ..Default::default()
                })
                .collect();
            let mut rng = 0x9E37_79B9_7F4A_7C15u64;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            // A 1 000-pod decision takes tens of µs: fewer calls still make
            // 70 ms rounds, and keep `just bench` within its budget.
            let decide_iters = if pods > 100 { 2_000 } else { 20_000 };
            let decide = time(decide_iters, |i| {
                let no_prefix = |_: usize| 0.0;
                let mut query = PlacementRequest {
                    prompt_tokens: 1000,
                    prefix_match: &no_prefix,
                    prefix_key: None,
                    load_bound: LoadBound { factor: 1.25 },
                    prefill_turn: i as u64,
                    decode_turn: &mut |_| 0,
                    random: &mut next,
                    exclude: &[],
                    session: None,
                };
                black_box(schedule(model, &states, &mut query, s));
            });

            // The whole selection as the filter does it, through the
            // router's own functions.
            let mut store = Counting {
                inner: MemoryStore::default(),
                gets: Cell::new(0),
                sets: 0,
            };
            let request = split::read(
                &router.view(&fleet, &router.learned()),
                Api::Completions,
                "bench",
                body.clone(),
            )
            .expect("request");
            let iters = if pods > 100 { 500 } else { 5_000 };
            let full = time(iters, |_| {
                let mut random = |_: &mut Counting| next();
                let placed = router
                    .place(&mut store, &request, &[], &mut random, 1_000)
                    .expect("placed");
                let Placement::Split {
                    prefill,
                    decode,
                    prefix,
                    ..
                } = placed
                else {
                    panic!("no split");
                };
                let held = HeldLoad {
                    model: model.id,
                    prefill: Some(prefill.id),
                    prefill_tokens: router.uncached_tokens(&request, &prefix, prefill.id),
                    decode: Some(decode.id),
                    streaming: Some(prefill.id),
                };
                router.hold(&mut store, held, 1_000).expect("hold");
                router.remember_prefix(&mut store, &request, &prefix, prefill.id, 1_000);
                router
                    .release(&mut store, held, None, 1_000)
                    .expect("release");
            });
            let calls = 7 * iters as u64;
            let ops = (store.gets.get() + store.sets) as f64 / calls as f64;
            let full_us = full / 1000.0;
            let ratio = base.map(|b: f64| full_us / b).unwrap_or(1.0);
            base.get_or_insert(full_us);
            println!(
                "{:<34} {:>5} {:>12.2} {:>12.2} {:>7.1}× {:>14.1}",
                format!("{pp} + {dp}"),
                pods,
                decide / 1000.0,
                full_us,
                ratio,
                ops
            );
        }
    }
    println!("ratio: full cost against the same policies with 4 pods.");
    println!("shared ops: gets + sets per request (the model's load table read, two CAS updates, prefix walk and inserts);");
    println!("inside Envoy each is a host call that copies the value: a read about 0.6 µs, a write 0.2 (bench/README.md, min-pd+100get and +100set).");
}

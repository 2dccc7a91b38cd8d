//! The per-request cost of choosing pods, with 4 and with 64 pods: the pure
//! scheduling decision, and the whole selection as the filter does it (read
//! the shared counters, walk the prefix table, decide, take the load,
//! record the prefix, give the load back). Shared data is an in-memory
//! stand-in here; the shared-data operations per request are counted so
//! their price inside Envoy (a host call each) can be added.
//!
//! Run with `just bench` (or `cargo bench --bench select`).

use pd_router::config::{fnv1a, Config};
use pd_router::sched::prefix::{self, PrefixEntry};
use pd_router::sched::state::{self, MemoryStore, SetError, SharedStore};
use pd_router::sched::{estimate_tokens, schedule, Ask, Decision, PodState};
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
            format!(
                r#"{{"prefill":["10.0.{r}.1:8000","10.0.{r}.2:8000"],"decode":["10.0.{r}.3:8000","10.0.{r}.4:8000"]}}"#
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

fn main() {
    let prompt: Vec<u8> = "You are a helpful assistant. Answer briefly. "
        .repeat(100)
        .into_bytes(); // ~4.5 KB: 35 blocks of 128 bytes
    println!("pod selection cost per request (native, release; median of 7 rounds)");
    println!(
        "{:<34} {:>5} {:>12} {:>12} {:>8} {:>14}",
        "policies", "pods", "decide µs", "full µs", "ratio", "shared ops/req"
    );
    for (pp, dp) in [
        ("prefix_cache", "load_balancing"),
        ("least_request", "least_request"),
        ("round_robin", "round_robin"),
        ("power_of_two", "power_of_two"),
    ] {
        let mut base = None;
        for pods in [4usize, 64] {
            let c = config(pods, pp, dp);
            let model = &c.models[0];
            let s = &c.scheduling;
            let states: Vec<PodState> = (0..c.pods.len())
                .map(|i| PodState {
                    outstanding_prefills: (i % 3) as u32,
                    pending_decodes: (i % 5) as u32,
                    ..Default::default()
                })
                .collect();
            let mut rng = 0x9E37_79B9_7F4A_7C15u64;
            let decide = time(20_000, |i| {
                let mut random = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let no_prefix = |_: usize| 0.0;
                let mut ask = Ask {
                    prompt_tokens: 1000,
                    prefix_match: &no_prefix,
                    turn: i as u64,
                    random: &mut random,
                    exclude: &[],
                };
                black_box(schedule(model, &states, &mut ask, s));
            });

            let mut store = Counting {
                inner: MemoryStore::default(),
                gets: Cell::new(0),
                sets: 0,
            };
            let load_key = state::load_key(&c.fingerprint);
            let n = c.pods.len();
            let iters = 5_000;
            let full = time(iters, |i| {
                let counters = state::decode_load(store.shared_get(&load_key).0.as_deref(), n);
                let pod_states: Vec<PodState> = counters
                    .iter()
                    .map(|k| PodState {
                        outstanding_prefills: k.outstanding_prefills,
                        pending_decodes: k.pending_decodes,
                        unhealthy: false,
                        metrics: None,
                    })
                    .collect();
                let hashes = if pp == "prefix_cache" {
                    prefix::block_hashes(
                        &prompt,
                        fnv1a(b"m"),
                        s.prefix_block_bytes,
                        s.prefix_max_blocks,
                    )
                } else {
                    Vec::new()
                };
                let m = prefix::walk(
                    &hashes,
                    |h| {
                        let key = prefix::slot_key(
                            &c.fingerprint,
                            prefix::slot_of(h, s.prefix_table_slots),
                        );
                        store
                            .shared_get(&key)
                            .0
                            .as_deref()
                            .and_then(PrefixEntry::decode)
                    },
                    1_000,
                    s.prefix_ttl_ms,
                );
                let match_of = |pod: usize| m.percent(pod);
                let mut random = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut ask = Ask {
                    prompt_tokens: estimate_tokens(prompt.len()),
                    prefix_match: &match_of,
                    turn: i as u64,
                    random: &mut random,
                    exclude: &[],
                };
                let d = schedule(model, &pod_states, &mut ask, s);
                let Decision::Split {
                    prefill, decode, ..
                } = d
                else {
                    panic!("no split: {d:?}");
                };
                let (p, dd) = (prefill.pod, decode.pod);
                state::update_load(&mut store, &load_key, n, |c| {
                    c[p].outstanding_prefills += 1;
                    c[dd].pending_decodes += 1;
                })
                .expect("hold");
                let held = if m.percent(p) > 0.0 { m.depth } else { 0 };
                for h in &prefix::to_record(&hashes, held) {
                    let e = PrefixEntry {
                        hash: *h,
                        pod: p as u32,
                        at_ms: 1_000,
                    };
                    let key =
                        prefix::slot_key(&c.fingerprint, prefix::slot_of(*h, s.prefix_table_slots));
                    let _ = store.shared_set(&key, &e.encode(), None);
                }
                state::update_load(&mut store, &load_key, n, |c| {
                    c[p].outstanding_prefills -= 1;
                    c[dd].pending_decodes -= 1;
                })
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
    println!("shared ops: gets + sets per request (counter reads, two CAS updates, prefix walk and inserts);");
    println!("inside Envoy each is a host call that copies the value, so add about 1 µs per op.");
}

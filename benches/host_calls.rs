//! What one request costs in host calls: the shipped [`Flow`] runs against a
//! host that counts every call it makes, by kind, and the bytes copied into
//! and out of the VM, for each engine. Inside Envoy each of these is a
//! crossing between V8 and Envoy, the wasm layer's fixed cost per request
//! (the e2e bench measures what they cost together). A 1 KB request is
//! counted call by call; a 512 KB one by its bytes, where a body's copies
//! show.
//!
//! Run with `just bench`.
#![allow(
    unsafe_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::config::Config;
use pd_router::flow::Flow;
use pd_router::host::Action;
use pd_router::pods::CallbackReads;
use pd_router::router::Router;
use pd_router::testing::FakeHost;
use std::alloc::{GlobalAlloc, Layout, System};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Counts the VM's allocations (and reallocations) while `COUNTING` is set:
/// the flow's, and the buffers the SDK would allocate for what a host call
/// returns (here the counting host's copies), but not the host's own state.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

fn counted(bytes: usize) {
    if COUNTING.load(Relaxed) {
        ALLOCS.fetch_add(1, Relaxed);
        ALLOC_BYTES.fetch_add(bytes as u64, Relaxed);
    }
}

// SAFETY: every call goes straight to the system allocator; counting
// touches only atomics.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Runs host-side work (Envoy's shared-data store) uncounted.
fn host_side<T>(f: impl FnOnce() -> T) -> T {
    let was = COUNTING.swap(false, Relaxed);
    let v = f();
    COUNTING.store(was, Relaxed);
    v
}

/// One request's host calls and the VM's allocations.
struct Counts {
    calls: Vec<(&'static str, u64)>,
    bytes_in: u64,
    bytes_out: u64,
    allocs: u64,
    alloc_bytes: u64,
}

impl Counts {
    fn get(&self, what: &str) -> Option<u64> {
        self.calls.iter().find(|(k, _)| *k == what).map(|(_, n)| *n)
    }
}

/// Runs the fake host's own work uncounted (see [`FakeHost::host_work`]).
fn uncounted(f: &mut dyn FnMut()) {
    host_side(f)
}

const CONFIG: &str = r#"{"models":[
  {"name":"vllm","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]},
  {"name":"sglang","engine":"sglang","rolesets":[{"prefill":["10.0.0.3:8000"],"decode":["10.0.0.4:8000"]}]},
  {"name":"trtllm","engine":"trtllm","rolesets":[{"prefill":["10.0.0.5:8000"],"decode":["10.0.0.6:8000"]}]},
  {"name":"default","engine":"default","rolesets":[{"prefill":["10.0.0.7:8000"],"decode":["10.0.0.8:8000"]}]}
]}"#;

fn prefill_answer(engine: &str) -> &'static str {
    match engine {
        "vllm" => {
            r#"{"id":"p","choices":[{"index":0,"message":{"content":"A"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"prompt_tokens_details":null},"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"10.0.0.1","remote_port":5600}}"#
        }
        "trtllm" => {
            r#"{"id":"p","choices":[{"index":0,"message":{"content":"A"},"finish_reason":"length","disaggregated_params":{"request_type":"context_only","ctx_request_id":1,"disagg_request_id":4398046511104123}}],"prompt_token_ids":[1,2,3,4,5,6,7,8,9]}"#
        }
        _ => {
            r#"{"id":"p","choices":[{"index":0,"message":{"content":"A"},"finish_reason":"length"}]}"#
        }
    }
}

/// One non-streamed chat request of 1 KB through the flow, as Envoy would
/// call it: headers, the body in one callback, the prefill's answer,
/// response headers, the body in one callback, the stream's end.
fn one_request(router: &Rc<Router>, engine: &str) -> Counts {
    request_with(router, engine, 900, &mut |_| {})
}

/// [`one_request`] with `content` bytes of message, calling `before` ahead
/// of each callback with its name.
fn request_with(
    router: &Rc<Router>,
    engine: &str,
    content: usize,
    before: &mut dyn FnMut(&'static str),
) -> Counts {
    let content = "x".repeat(content);
    let body = format!(
        r#"{{"model":"{engine}","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":4}}"#
    );
    let mut host = FakeHost {
        request_headers: [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":authority", "gateway"),
            ("content-type", "application/json"),
            ("x-request-id", "r-1"),
            ("content-length", &body.len().to_string()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect(),
        body: body.into_bytes(),
        call_body: prefill_answer(engine).as_bytes().to_vec(),
        upstream_headers: vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/json".into()),
        ],
        response: br#"{"id":"d","choices":[{"index":0,"message":{"content":"A b c d"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"total_tokens":13,"completion_tokens":4,"prompt_tokens_details":null}}"#.to_vec(),
        // As the shell reads: once per callback, a clock that moves.
        reads: Some(CallbackReads::default()),
        clock_step_us: 150,
        verbose: false,
        randoms: vec![7; 8],
        host_work: uncounted,
        record: false,
        ..FakeHost::default()
    };
    ALLOCS.store(0, Relaxed);
    ALLOC_BYTES.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    let mut flow = Flow::new(Rc::clone(router));
    let mut callbacks = 0;
    callbacks += 1;
    before("request headers");
    assert_eq!(
        flow.on_request_headers(host.callback(), false),
        Action::Pause
    );
    callbacks += 1;
    let len = host.body.len();
    before("request body");
    let sent = flow.on_request_body(host.callback(), len, true);
    if sent == Action::Pause {
        callbacks += 1;
        let n = host.call_body.len();
        before("prefill answer");
        let token = host.last_token();
        flow.on_prefill_response(host.callback(), token, Some(200), n);
    }
    callbacks += 2;
    before("response headers");
    flow.on_response_headers(host.callback());
    let n = host.response.len();
    before("response body");
    flow.on_response_body(host.callback(), n, true);
    if sent == Action::Continue {
        // Concurrent engines: the prefill answers while the decode streams.
        callbacks += 1;
        let n = host.call_body.len();
        before("prefill answer");
        let token = host.last_token();
        flow.on_prefill_response(host.callback(), token, Some(200), n);
    }
    callbacks += 1;
    before("stream end");
    flow.on_stream_end(host.callback());
    before("end");
    drop(flow);
    COUNTING.store(false, Relaxed);
    // Envoy also creates the context and calls on_done/on_delete: 3 more.
    callbacks += 3;
    let host_counts = host.counts.into_inner();
    let mut calls = host_counts.calls;
    calls.push((" wasm callbacks (into the VM)", callbacks));
    Counts {
        calls,
        bytes_in: host_counts.bytes_in,
        bytes_out: host_counts.bytes_out,
        allocs: ALLOCS.load(Relaxed),
        alloc_bytes: ALLOC_BYTES.load(Relaxed),
    }
}

fn main() {
    let router =
        Rc::new(Router::new(Config::parse(CONFIG.as_bytes()).expect("config"), 0).expect("router"));
    let engines = ["vllm", "sglang", "trtllm", "default"];
    let counts: Vec<Counts> = engines.iter().map(|e| one_request(&router, e)).collect();
    let mut kinds: Vec<&str> = counts
        .iter()
        .flat_map(|c| c.calls.iter().map(|(k, _)| *k))
        .collect();
    kinds.sort();
    kinds.dedup();
    println!(
        "host calls per request, 1 KB chat, not streamed (the shipped flow, counted natively)"
    );
    print!("{:<34}", "");
    for e in engines {
        print!("{e:>9}");
    }
    println!();
    for k in &kinds {
        print!("{:<34}", k.trim_start());
        for c in &counts {
            print!("{:>9}", c.get(k).unwrap_or(0));
        }
        println!();
    }
    let total = |c: &Counts| {
        c.calls
            .iter()
            .filter(|(k, _)| !k.starts_with(' '))
            .map(|(_, v)| v)
            .sum::<u64>()
    };
    let row = |label: &str, value: &dyn Fn(&Counts) -> u64| {
        print!("{label:<34}");
        for c in &counts {
            print!("{:>9}", value(c));
        }
        println!();
    };
    row("host calls (total)", &total);
    row("bytes into the VM", &|c| c.bytes_in);
    row("bytes out of the VM", &|c| c.bytes_out);
    row("VM allocations", &|c| c.allocs);
    row("bytes allocated in the VM", &|c| c.alloc_bytes);
    println!("Not counted: the SDK's own calls around each callback (e.g. reading a callback's arguments).");
    // At 512 KB the bytes are the body's: what crosses into and out of the
    // VM, and what the VM allocates (its linear memory never shrinks).
    let big: Vec<Counts> = engines
        .iter()
        .map(|e| request_with(&router, e, 512 * 1024, &mut |_| {}))
        .collect();
    println!("the same request with a 512 KB message, in KB:");
    for (label, value) in [
        (
            "  bytes into the VM",
            &(|c: &Counts| c.bytes_in) as &dyn Fn(&Counts) -> u64,
        ),
        ("  bytes out of the VM", &|c: &Counts| c.bytes_out),
        ("  bytes allocated in the VM", &|c: &Counts| c.alloc_bytes),
    ] {
        print!("{label:<34}");
        for c in &big {
            print!("{:>9}", value(c) / 1024);
        }
        println!();
    }
    // The same request end to end through the flow, timed: the VM's share
    // of a request when this runs inside wasm (`just bench` runs it there
    // too), the host's side of each call excluded.
    print!("{:<34}", "flow µs/request (counting host)");
    let warm = knob("WARM_ITERS", 2000).max(1);
    for e in engines {
        let mut rounds: Vec<f64> = (0..5)
            .map(|_| {
                let start = std::time::Instant::now();
                for _ in 0..warm {
                    std::hint::black_box(one_request(&router, e));
                }
                start.elapsed().as_secs_f64() * 1e6 / warm as f64
            })
            .collect();
        rounds.sort_by(f64::total_cmp);
        print!("{:>9.2}", rounds[2]);
    }
    println!();
    // The same with the caches overwritten before each callback, as a
    // request may find them at concurrency 1, where every callback follows
    // a wait on the network: what the flow's code and data footprint costs
    // cold, by callback.
    let evict_mib = knob("EVICT_MB", 64);
    let mut evictor = vec![0u8; evict_mib << 20];
    let phases = [
        "request headers",
        "request body",
        "prefill answer",
        "response headers",
        "response body",
        "stream end",
    ];
    let mut cold: Vec<Vec<f64>> = Vec::new();
    for e in engines {
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
        for i in 0..knob("COLD_ITERS", 30) {
            let mut at: Option<(&str, std::time::Instant)> = None;
            request_with(&router, e, 900, &mut |next| {
                if let Some((name, start)) = at.take() {
                    let t = start.elapsed().as_secs_f64() * 1e6;
                    if let Some(k) = phases.iter().position(|p| *p == name) {
                        samples[k].push(t);
                    }
                }
                evict(&mut evictor, i as u8);
                at = Some((next, std::time::Instant::now()));
            });
        }
        cold.push(samples.iter_mut().map(|v| median(v)).collect());
    }
    println!(
        "flow µs per callback, caches cold ({evict_mib} MiB written before each callback, past this machine's L3 of 32 MiB)"
    );
    for (k, p) in phases.iter().enumerate() {
        print!("{:<34}", format!("  {p}"));
        for c in &cold {
            print!("{:>9.2}", c[k]);
        }
        println!();
    }
    print!("{:<34}", "  all callbacks");
    for c in &cold {
        print!("{:>9.2}", c.iter().sum::<f64>());
    }
    println!();
    // The measurement's own floor: the clock read cold, nothing between.
    let mut empty: Vec<f64> = (0..50u8)
        .map(|i| {
            evict(&mut evictor, i);
            let start = std::time::Instant::now();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    println!(
        "{:<34}{:>9.2}",
        "  (no callback: the clock alone)",
        median(&mut empty)
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A count from the environment: bench/footprint.sh runs this bench under
/// cachegrind with fewer rounds and a smaller eviction (its simulated
/// caches are small).
fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Writes one byte in every cache line of `buf`, pushing whatever the
/// caches held out of them.
fn evict(buf: &mut [u8], v: u8) {
    for line in buf.chunks_mut(64) {
        if let Some(b) = line.first_mut() {
            *b = v;
        }
    }
    std::hint::black_box(&buf);
}

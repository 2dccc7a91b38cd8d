//! A bounded load run: mixed engines, streaming and not, some requests
//! failing on purpose. Every answer must be the expected one, the VMs'
//! memory must stay flat, and the shared counters must end at zero.
//!
//! In `just test` it runs at a size that fits CI; `just soak` runs the full
//! size (PD_SOAK_REQUESTS, PD_SOAK_CONCURRENCY override both).

use crate::harness::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Memory of every pd-router VM, as published by the filter on each tick.
fn vm_memory(envoy: &Envoy) -> Vec<(String, u64)> {
    envoy
        .stats("wasmcustom.pd_router.vm_memory_bytes.")
        .into_iter()
        .collect()
}

#[test]
fn soak() {
    let requests = env_or("PD_SOAK_REQUESTS", 3000);
    let concurrency = env_or("PD_SOAK_CONCURRENCY", 16);
    let pair = |engine: &str, extra: &[&str]| {
        let mut p = vec!["--engine", engine, "--role", "prefill"];
        p.extend(extra);
        let prefill = Mock::start(&format!("{engine}-p"), &p);
        let decode = Mock::start(
            &format!("{engine}-d"),
            &["--engine", engine, "--role", "decode"],
        );
        (prefill, decode)
    };
    let vllm = pair("vllm", &[]);
    let sglang = pair("sglang", &[]);
    let trt = pair("trtllm", &[]);
    let dflt = pair("default", &[]);
    let bad = pair("default", &["--fault", "status:400"]);
    let garbage = pair("default", &["--fault", "garbage"]);
    let m = |name: &str, engine: &str, p: &(Mock, Mock)| {
        json!({"name": name, "engine": engine,
               "rolesets": [{"prefill": [p.0.endpoint()], "decode": [p.1.endpoint()]}]})
    };
    let config = json!({
        "prefill_max_retries": 0,
        "eject_after_failures": 1000000,
        "models": [m("vllm", "vllm", &vllm), m("sglang", "sglang", &sglang), m("trtllm", "trtllm", &trt),
                   m("default", "default", &dflt), m("bad", "default", &bad), m("garbage", "default", &garbage)]
    });
    let envoy = Envoy::start_with(&config, 2);
    let url_c = envoy.url("/v1/completions");
    let url_chat = envoy.url("/v1/chat/completions");

    let kinds = [
        "vllm", "sglang", "trtllm", "default", "vllm", "sglang", "trtllm", "default", "bad",
        "garbage",
    ];
    let expected = |kind: &str| match kind {
        "bad" => 400,
        "garbage" => 502,
        _ => 200,
    };
    let next = AtomicUsize::new(0);
    let tally: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    let unexpected: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut memory_after_warmup = Vec::new();
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..concurrency {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let kind = kinds[i % kinds.len()];
                let stream = i.is_multiple_of(3);
                let (url, body) = if i.is_multiple_of(2) {
                    (&url_c, json!({"model": kind, "prompt": format!("soak {i}"), "max_tokens": 3, "stream": stream}))
                } else {
                    (
                        &url_chat,
                        json!({"model": kind, "messages": [{"role": "user", "content": format!("soak {i}")}],
                               "max_tokens": 3, "stream": stream}),
                    )
                };
                let a = post(url, body.to_string(), &[]);
                let ok = a.status == expected(kind)
                    && (a.status != 200 || !stream || a.body.ends_with("data: [DONE]\n\n"));
                *tally.lock().unwrap().entry(format!("{kind} {}", a.status)).or_insert(0) += 1;
                if !ok {
                    unexpected
                        .lock()
                        .unwrap()
                        .push(format!("#{i} {kind} stream={stream}: {} {}", a.status, &a.body[..a.body.len().min(200)]));
                }
            });
        }
        // Memory once the VMs are warm (a tenth of the run), for comparison.
        while next.load(Ordering::Relaxed) < requests / 10 {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(1100));
        memory_after_warmup = vm_memory(&envoy);
    });
    let elapsed = start.elapsed();
    std::thread::sleep(Duration::from_millis(1300));
    let memory_end = vm_memory(&envoy);
    let tally = tally.into_inner().unwrap();
    let unexpected = unexpected.into_inner().unwrap();

    println!(
        "soak: {requests} requests, concurrency {concurrency}, {:.1} s, {:.0} req/s",
        elapsed.as_secs_f64(),
        requests as f64 / elapsed.as_secs_f64()
    );
    for (k, n) in &tally {
        println!("  {k}: {n}");
    }
    println!("  unexpected: {}", unexpected.len());
    println!("  VM memory after warm-up: {memory_after_warmup:?}");
    println!("  VM memory at the end:    {memory_end:?}");
    assert!(
        unexpected.is_empty(),
        "{} unexpected answers, e.g. {:?}",
        unexpected.len(),
        &unexpected[..unexpected.len().min(5)]
    );
    assert_eq!(tally.values().sum::<usize>(), requests);

    // Flat memory: wasm memory only grows, so growth after warm-up is what a
    // leak would show. 8 MiB is far below what a leak of even 100 bytes per
    // request would add over the full soak.
    assert!(!memory_end.is_empty(), "no VM memory gauge");
    for (name, end) in &memory_end {
        let warm = memory_after_warmup
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or(*end);
        assert!(
            end.saturating_sub(warm) <= 8 << 20,
            "{name} grew from {warm} to {end} bytes"
        );
    }
    envoy.assert_counters_zero();
    assert_eq!(envoy.stat("wasm.pd-router.vm_reload"), 0);
}

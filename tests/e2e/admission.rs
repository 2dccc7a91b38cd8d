//! Admission control through Envoy (four workers) against enforcing vLLM
//! mocks: one prefill pod and one decode pod, `max_in_flight_per_pod` 2,
//! and streams the test holds open to fill the decode pod. Batch is shed
//! at once, premium goes before standard, waits end at the TTL with 429
//! and `retry-after`, a burst of ten times the capacity loses nothing, and
//! every gauge returns to 0.

use crate::harness::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

struct Gateway {
    prefill: Mock,
    _decode: Mock,
    envoy: Envoy,
}

fn gateway(admission: Value) -> Gateway {
    let prefill = Mock::start("adm-p0", &["--engine", "vllm", "--role", "prefill"]);
    let decode = Mock::start(
        "adm-d0",
        &[
            "--engine",
            "vllm",
            "--role",
            "decode",
            "--stream-delay-ms",
            "100",
        ],
    );
    let config = json!({
        "prefill_timeout_ms": 5000,
        "admission": admission,
        "objectives": {"premium": 10, "standard": 0, "batch": -1},
        "models": [{"name": "m", "engine": "vllm",
                    "rolesets": [{"prefill": [prefill.endpoint()], "decode": [decode.endpoint()]}]}]
    });
    let envoy = Envoy::start_with(&config, 4);
    Gateway {
        prefill,
        _decode: decode,
        envoy,
    }
}

/// A streamed completion of `tokens` tokens (100 ms each at the decode).
fn request(g: &Gateway, id: &str, objective: &str, tokens: u32) -> Answer {
    let body = json!({"model": "m", "prompt": format!("prompt of {id}"),
                      "max_tokens": tokens, "stream": true});
    post(
        &g.envoy.url("/v1/completions"),
        body.to_string(),
        &[
            ("x-request-id", id),
            ("x-gateway-inference-objective", objective),
            ("x-gateway-inference-fairness-id", "tenant-a"),
        ],
    )
}

/// Waits until the process-wide waiting gauges sum to `n`.
fn wait_for_waiting(g: &Gateway, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let total: u64 = g
            .envoy
            .stats("wasmcustom.pd_router.admission.waiting")
            .iter()
            .map(|(_, v)| *v)
            .sum();
        if total == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waiting gauges sum to {total}, not {n}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_drained(g: &Gateway) {
    wait_for_waiting(g, 0);
    g.envoy.assert_counters_zero();
}

/// The worker slots the VMs of `g` leased, from their memory gauges (one
/// per VM, tagged with its slot), once `workers` have reported.
fn slots(g: &Gateway, workers: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tags: Vec<String> = g
            .envoy
            .stats("vm_memory_bytes")
            .into_iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, _)| k)
            .collect();
        if tags.len() >= workers || Instant::now() > deadline {
            return tags;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A streamed completion of 1,000 tokens (100 s at the decode) that holds
/// its place on the decode pod until the returned connection is dropped, so
/// the test frees places when it chooses, not when a decode happens to end.
fn hold_place(g: &Gateway, id: &str) -> TcpStream {
    let body = json!({"model": "m", "prompt": format!("prompt of {id}"),
                      "max_tokens": 1000, "stream": true})
    .to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\
         x-request-id: {id}\r\nx-gateway-inference-objective: standard\r\n\r\n",
        body.len()
    );
    let mut s = TcpStream::connect(("127.0.0.1", g.envoy.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    s.write_all(head.as_bytes()).expect("head");
    s.write_all(body.as_bytes()).expect("body");
    // The answer starts once its decode streams: it holds its place.
    let mut start = [0u8; 12];
    s.read_exact(&mut start).expect("the answer starts");
    assert_eq!(&start, b"HTTP/1.1 200", "{id}");
    s
}

#[test]
fn batch_is_shed_and_premium_goes_before_standard() {
    let g = gateway(json!({"max_in_flight_per_pod": 2}));
    // Each worker VM (and the main thread's) leased a slot of its own: two
    // VMs on one slot would share one gauge.
    let leased = slots(&g, 4);
    assert!(leased.len() >= 4, "{leased:?}");
    // Two streams fill the decode pod. Once six requests wait, the first
    // is dropped and the second kept: one place frees and stays the only
    // one, so the queue's requests go through it one at a time, and the
    // order it lets them in is the order they reach the prefill pod.
    let first = hold_place(&g, "slow-0");
    let second = hold_place(&g, "slow-1");
    std::thread::scope(|s| {
        let shed: Vec<_> = (0..3)
            .map(|i| {
                let g = &g;
                s.spawn(move || request(g, &format!("batch-{i}"), "batch", 2))
            })
            .collect();
        // Shed at once, not after a wait: a wait would end `queue_ttl`.
        for h in shed {
            let a = h.join().expect("batch");
            assert_eq!(a.status, 429, "{}", a.body);
            assert_eq!(a.header("x-pd-dropped-reason"), Some("saturated"));
            assert!(a.header("retry-after").is_some());
            assert_eq!(a.json()["error"]["type"], "rate_limit_error");
        }

        let mut queued = Vec::new();
        for (objective, n) in [("standard", 3), ("premium", 3)] {
            for i in 0..n {
                let g = &g;
                let id = format!("{objective}-{i}");
                queued.push(s.spawn(move || request(g, &id, objective, 2)));
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        wait_for_waiting(&g, 6);
        drop(first);
        for h in queued {
            let a = h.join().expect("request");
            assert_eq!(a.status, 200, "{}\n{}", a.body, g.envoy.log());
        }
    });
    drop(second);
    let order: Vec<String> = g
        .prefill
        .requests()
        .iter()
        .filter_map(|r| r.header("x-request-id").map(str::to_owned))
        .filter(|id| !id.starts_with("slow"))
        .collect();
    assert_eq!(order.len(), 6, "{order:?}");
    assert!(
        order[..3].iter().all(|id| id.starts_with("premium")),
        "premium first: {order:?}"
    );
    assert!(g.envoy.stat("wasmcustom.pd_router.admission.shed") >= 3);
    assert_eq!(g.envoy.stat("wasmcustom.pd_router.admission.queued"), 6);
    assert_drained(&g);
}

#[test]
fn a_wait_ends_at_its_ttl_with_retry_after() {
    let g = gateway(json!({"max_in_flight_per_pod": 2, "queue_ttl_ms": 800}));
    // The pod stays full until the test drops these, after the waits are
    // answered: an answer can only be the TTL's.
    let holds = [hold_place(&g, "hold-0"), hold_place(&g, "hold-1")];
    std::thread::scope(|s| {
        let waits: Vec<_> = (0..4)
            .map(|i| {
                let g = &g;
                s.spawn(move || {
                    let start = Instant::now();
                    (
                        request(g, &format!("wait-{i}"), "standard", 2),
                        start.elapsed(),
                    )
                })
            })
            .collect();
        for h in waits {
            let (a, took) = h.join().expect("wait");
            assert_eq!(a.status, 429, "{}", a.body);
            assert_eq!(a.header("x-pd-dropped-reason"), Some("queue_ttl"));
            assert_eq!(a.header("retry-after"), Some("1"));
            assert_eq!(a.json()["error"]["code"], "queue_timeout");
            assert!(
                took >= Duration::from_millis(800),
                "answered after {took:?}"
            );
        }
    });
    drop(holds);
    assert_eq!(g.envoy.stat("wasmcustom.pd_router.admission.expired"), 4);
    assert_drained(&g);
}

#[test]
fn a_burst_of_ten_times_the_capacity_loses_no_request() {
    let ttl = 1500;
    let g = gateway(json!({"max_in_flight_per_pod": 2, "queue_ttl_ms": ttl, "max_queued": 12}));
    let objectives = ["premium", "standard", "standard", "batch"];
    let mut outcomes = std::collections::BTreeMap::new();
    for burst in 0..3 {
        let answers: Vec<(u16, Duration, Option<String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..20)
                .map(|i| {
                    let g = &g;
                    let objective = objectives[i % objectives.len()];
                    s.spawn(move || {
                        let start = Instant::now();
                        let a = request(g, &format!("b{burst}-{i}"), objective, 3);
                        let reason = a.header("x-pd-dropped-reason").map(str::to_owned);
                        (a.status, start.elapsed(), reason)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("burst"))
                .collect()
        });
        assert_eq!(answers.len(), 20);
        for (status, took, reason) in answers {
            assert!(matches!(status, 200 | 429 | 503), "status {status}");
            if status != 200 {
                assert!(reason.is_some(), "a {status} names its reason");
            }
            if reason.as_deref() == Some("queue_ttl") {
                assert!(took >= Duration::from_millis(ttl), "expired after {took:?}");
            }
            *outcomes.entry(status).or_insert(0) += 1;
        }
    }
    assert!(outcomes.get(&200).copied().unwrap_or(0) > 0, "{outcomes:?}");
    assert!(outcomes.get(&429).copied().unwrap_or(0) > 0, "{outcomes:?}");
    assert_drained(&g);
}

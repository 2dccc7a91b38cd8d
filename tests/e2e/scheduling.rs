//! Pod choice under load, through Envoy with four workers (each its own VM):
//! prefix affinity, load-aware decode choice, exact shared counters, failover,
//! and prompt-length buckets.

use crate::harness::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// 2 rolesets × 2 prefill × 2 decode mocks of `engine`.
struct Cluster {
    prefill: Vec<Mock>,
    decode: Vec<Mock>,
}

impl Cluster {
    fn start(engine: &str, prefill_args: &[&str], decode_args: &[&str]) -> Cluster {
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        for rs in 0..2 {
            for i in 0..2 {
                let mut a = vec!["--engine", engine, "--role", "prefill"];
                a.extend(prefill_args);
                prefill.push(Mock::start(&format!("p{rs}{i}"), &a));
                let mut a = vec!["--engine", engine, "--role", "decode"];
                a.extend(decode_args);
                decode.push(Mock::start(&format!("d{rs}{i}"), &a));
            }
        }
        Cluster { prefill, decode }
    }

    fn rolesets(&self) -> Value {
        json!([
            {"name": "rs0", "prefill": [self.prefill[0].endpoint(), self.prefill[1].endpoint()],
             "decode": [self.decode[0].endpoint(), self.decode[1].endpoint()]},
            {"name": "rs1", "prefill": [self.prefill[2].endpoint(), self.prefill[3].endpoint()],
             "decode": [self.decode[2].endpoint(), self.decode[3].endpoint()]}
        ])
    }
}

fn config(engine: &str, cluster: &Cluster, extra: Value) -> Value {
    let mut c = json!({
        "prefill_timeout_ms": 5000,
        "scrape_interval_ms": 200,
        "metrics_ttl_ms": 2000,
        "models": [{"name": "m", "engine": engine, "rolesets": cluster.rolesets()}]
    });
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            if k == "model" {
                if let (Some(m), Some(v)) = (c["models"][0].as_object_mut(), v.as_object()) {
                    m.extend(v.clone());
                }
            } else {
                c.insert(k.clone(), v.clone());
            }
        }
    }
    c
}

/// Runs `n` requests over `threads` threads; returns each answer's status and
/// (prefill pod, decode pod) headers.
fn load(
    url: &str,
    n: usize,
    threads: usize,
    body: impl Fn(usize) -> String + Sync,
) -> Vec<(u16, String, String)> {
    let next = AtomicUsize::new(0);
    let out = Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let a = post(url, body(i), &[]);
                let h = |k: &str| a.header(k).unwrap_or("").to_owned();
                out.lock().unwrap().push((
                    a.status,
                    h("prefill-target-pod"),
                    h("decode-target-pod"),
                ));
            });
        }
    });
    out.into_inner().unwrap()
}

fn shares(picks: impl Iterator<Item = String>) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for p in picks {
        *m.entry(p).or_insert(0) += 1;
    }
    m
}

/// Waits for the scraper to have run a few times.
fn settle() {
    std::thread::sleep(Duration::from_millis(1200));
}

#[test]
fn a_shared_prefix_sticks_to_one_prefill_pod() {
    let cluster = Cluster::start("vllm", &[], &[]);
    let envoy = Envoy::start_with(&config("vllm", &cluster, json!({})), 4);
    let system = "You are a meticulous assistant. ".repeat(150); // ~4.8 KB shared prefix
    let url = envoy.url("/v1/chat/completions");
    let answers = load(&url, 60, 4, |i| {
        json!({"model": "m", "max_tokens": 2, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question number {i}")}]})
        .to_string()
    });
    assert!(answers.iter().all(|a| a.0 == 200), "{answers:?}");
    let by_pod = shares(answers.iter().map(|a| a.1.clone()));
    let top = by_pod.values().max().copied().unwrap_or(0);
    assert!(
        top * 100 >= answers.len() * 90,
        "the shared prefix went to one prefill pod only {top}/{}: {by_pod:?}",
        answers.len()
    );
    // Different prefixes still spread over the pods.
    let answers = load(&url, 40, 4, |i| {
        json!({"model": "m", "max_tokens": 2, "messages": [
            {"role": "system", "content": format!("{i} ").repeat(200)},
            {"role": "user", "content": "hi"}]})
        .to_string()
    });
    assert!(shares(answers.iter().map(|a| a.1.clone())).len() >= 2);
}

#[test]
fn a_heavily_loaded_decode_pod_gets_little_work() {
    let cluster = Cluster::start("vllm", &[], &[]);
    // d00 reports 40 running requests and a 90% full KV cache.
    http()
        .post(format!("http://{}/debug/load", cluster.decode[0].address()))
        .body(r#"{"running": 40, "kv_usage": 0.9}"#)
        .send()
        .expect("set load");
    let envoy = Envoy::start_with(&config("vllm", &cluster, json!({})), 4);
    settle();
    let answers = load(&envoy.url("/v1/completions"), 80, 4, |i| {
        json!({"model": "m", "prompt": format!("unique prompt {i} ").repeat(20), "max_tokens": 2})
            .to_string()
    });
    assert!(answers.iter().all(|a| a.0 == 200));
    let by_pod = shares(answers.iter().map(|a| a.2.clone()));
    let heavy = by_pod.get("d00").copied().unwrap_or(0);
    let peer = by_pod.get("d01").copied().unwrap_or(0);
    assert!(
        heavy * 3 <= peer,
        "heavy d00 got {heavy}, idle d01 {peer}: {by_pod:?}"
    );
}

#[test]
fn counters_return_to_zero_after_successes_failures_and_aborts() {
    let cluster = Cluster::start("vllm", &[], &["--stream-delay-ms", "20"]);
    let bad = Mock::start(
        "bad",
        &[
            "--engine",
            "default",
            "--role",
            "prefill",
            "--fault",
            "status:400",
        ],
    );
    let slow = Mock::start(
        "slow",
        &[
            "--engine",
            "default",
            "--role",
            "prefill",
            "--fault",
            "delay:400",
        ],
    );
    let dd = Mock::start("dd", &["--engine", "default", "--role", "decode"]);
    let mut c = config("vllm", &cluster, json!({}));
    c["models"].as_array_mut().unwrap().extend([
        json!({"name": "bad", "engine": "default", "rolesets": [{"prefill": [bad.endpoint()], "decode": [dd.endpoint()]}]}),
        json!({"name": "slow", "engine": "default", "rolesets": [{"prefill": [slow.endpoint()], "decode": [dd.endpoint()]}]}),
    ]);
    let envoy = Envoy::start_with(&c, 4);
    let url = envoy.url("/v1/completions");
    let short = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .expect("client");
    let statuses = Mutex::new(HashMap::<String, usize>::new());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 2000 {
                    break;
                }
                let kind = match i % 10 {
                    0 => "bad",          // prefill 400: a local reply
                    1 if i % 50 == 1 => "abort-in-prefill",
                    2 => "abort-in-stream",
                    3 => "stream",
                    _ => "ok",
                };
                let outcome = match kind {
                    "bad" => post(&url, r#"{"model":"bad","prompt":"p"}"#, &[]).status.to_string(),
                    "abort-in-prefill" => {
                        // The client gives up while the prefill is in flight.
                        match short.post(&url).body(r#"{"model":"slow","prompt":"p"}"#).send() {
                            Ok(r) => r.status().to_string(),
                            Err(_) => "aborted".into(),
                        }
                    }
                    "abort-in-stream" => {
                        let body = json!({"model": "m", "prompt": format!("s{i}"), "max_tokens": 50, "stream": true});
                        let mut r = http().post(&url).body(body.to_string()).send().expect("send");
                        let mut buf = [0u8; 64];
                        let _ = std::io::Read::read(&mut r, &mut buf);
                        drop(r); // mid-stream
                        "aborted".into()
                    }
                    "stream" => {
                        let body = json!({"model": "m", "prompt": format!("t{i}"), "max_tokens": 3, "stream": true});
                        post(&url, body.to_string(), &[]).status.to_string()
                    }
                    _ => post(&url, json!({"model": "m", "prompt": format!("q{i}"), "max_tokens": 2}).to_string(), &[])
                        .status
                        .to_string(),
                };
                *statuses.lock().unwrap().entry(format!("{kind}:{outcome}")).or_insert(0) += 1;
            });
        }
    });
    let statuses = statuses.into_inner().unwrap();
    for (k, n) in &statuses {
        let ok = k.ends_with(":200") || k.ends_with(":aborted") || k == "bad:400";
        assert!(ok, "unexpected outcome {k} ×{n}: {statuses:?}");
    }
    // In-flight prefills to the slow pod finish within its delay; then every
    // worker's tick republishes the shared counters.
    std::thread::sleep(Duration::from_millis(1500));
    let gauges: Vec<(String, u64)> = envoy
        .stats("wasmcustom.pd_router.pod.")
        .into_iter()
        .filter(|(k, _)| k.contains(".outstanding_prefills.") || k.contains(".pending_decodes."))
        .collect();
    assert!(gauges.len() >= 22, "{gauges:?}");
    let busy: Vec<_> = gauges.iter().filter(|(_, v)| *v != 0).collect();
    assert!(
        busy.is_empty(),
        "counters not back to zero: {busy:?}\n{statuses:?}"
    );
    assert!(envoy.stat("wasmcustom.pd_router.split") >= 1500);
}

#[test]
fn a_killed_prefill_pod_loses_no_request_and_is_skipped_until_it_returns() {
    // The default engine keeps the decode independent of the prefill pod, so
    // what is measured is the router's failover alone.
    let mut cluster = Cluster::start("default", &[], &[]);
    let c = config(
        "default",
        &cluster,
        json!({"unhealthy_cooldown_ms": 1500, "model": {"prefill_policy": "round_robin"}}),
    );
    let envoy = Envoy::start_with(&c, 4);
    let url = envoy.url("/v1/completions");
    let victim_port = cluster.prefill[1].http;
    let killed = AtomicBool::new(false);
    let after_kill = Mutex::new(Vec::new());
    let results = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    let cluster_ref = Arc::new(Mutex::new(&mut cluster));
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 300 {
                    break;
                }
                if i == 60 {
                    cluster_ref.lock().unwrap().prefill[1].kill();
                    killed.store(true, Ordering::SeqCst);
                }
                let was_killed = killed.load(Ordering::SeqCst);
                let a = post(
                    &url,
                    format!(r#"{{"model":"m","prompt":"r{i}","max_tokens":2}}"#),
                    &[],
                );
                let pod = a.header("prefill-target-pod").unwrap_or("").to_owned();
                if was_killed {
                    after_kill.lock().unwrap().push(pod.clone());
                }
                results.lock().unwrap().push((a.status, pod, a.body));
            });
        }
    });
    let results = results.into_inner().unwrap();
    let failed: Vec<_> = results.iter().filter(|r| r.0 != 200).collect();
    assert!(failed.is_empty(), "requests lost: {failed:?}");
    let after = after_kill.into_inner().unwrap();
    assert!(
        !after.iter().any(|p| p == "p01"),
        "the killed pod was chosen again"
    );
    assert!(envoy.pod_stat("ejected", "p01") >= 1);

    // It comes back on the same port; after the cool-down it gets work again.
    let mut revived = Mock::start(
        "p01",
        &[
            "--engine",
            "default",
            "--role",
            "prefill",
            "--listen",
            &format!("127.0.0.1:{victim_port}"),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut back = false;
    while Instant::now() < deadline && !back {
        let a = post(
            &url,
            r#"{"model":"m","prompt":"again","max_tokens":2}"#,
            &[],
        );
        assert_eq!(a.status, 200);
        back = a.header("prefill-target-pod") == Some("p01");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(back, "the revived pod never got work again");
    revived.kill();
}

#[test]
fn a_prompt_outside_every_bucket_goes_to_a_combined_pod() {
    let cluster = Cluster::start("vllm", &[], &[]);
    let combo = Mock::start(
        "combo",
        &["--engine", "vllm", "--role", "decode", "--allow-recompute"],
    );
    let mut rolesets = cluster.rolesets();
    for rs in rolesets.as_array_mut().unwrap() {
        rs["prompt_tokens"] = json!({"max": 100});
    }
    let c = json!({"models": [{"name": "m", "engine": "vllm", "rolesets": rolesets, "combined": [combo.endpoint()]}]});
    let envoy = Envoy::start_with(&c, 4);
    let url = envoy.url("/v1/completions");
    let long = post(
        &url,
        json!({"model": "m", "prompt": "x".repeat(1000), "max_tokens": 2}).to_string(),
        &[],
    );
    assert_eq!(long.status, 200, "{}", long.body);
    assert_eq!(long.header("decode-target-pod"), Some("combo"));
    assert_eq!(long.header("prefill-target-pod"), None);
    assert_eq!(long.header("x-mock-kv"), Some("recomputed"));
    let short = post(
        &url,
        r#"{"model":"m","prompt":"short","max_tokens":2}"#,
        &[],
    );
    assert_eq!(short.status, 200);
    assert!(short
        .header("prefill-target-pod")
        .is_some_and(|p| p.starts_with('p')));
    assert_eq!(short.header("x-mock-kv"), Some("pulled"));
    assert_eq!(
        envoy.stat("wasmcustom.pd_router.unsplit.pd_reason=.=combined;.;"),
        1
    );
}

/// A model with session affinity: a session's turns keep their prefill and
/// decode pods whichever of the four workers takes them, a session named
/// in the body goes where the same id in a header goes, sessions spread
/// over the pods, and a burst of one session spills past its load bound
/// rather than queueing on its home pod, which it returns to after.
#[test]
fn a_session_keeps_its_pods_while_their_load_allows() {
    // Prefills take 150 ms, so a burst's requests overlap on the pods.
    let cluster = Cluster::start("vllm", &["--fault", "delay:150"], &[]);
    let c = config("vllm", &cluster, json!({"model": {"session": {}}}));
    let envoy = Envoy::start_with(&c, 4);
    let url = envoy.url("/v1/completions");
    let body = |i: usize| json!({"model": "m", "prompt": format!("turn {i}"), "max_tokens": 2});
    let pair = |a: &Answer| {
        assert_eq!(a.status, 200, "{}", a.body);
        let h = |k: &str| a.header(k).unwrap_or("").to_owned();
        (h("prefill-target-pod"), h("decode-target-pod"))
    };
    let turn = |session: &str, i: usize| {
        pair(&post(
            &url,
            body(i).to_string(),
            &[("x-session-id", session)],
        ))
    };
    let home = turn("alpha", 0);
    for i in 1..8 {
        assert_eq!(turn("alpha", i), home, "turn {i}");
    }
    let mut named = body(8);
    named["prompt_cache_key"] = json!("alpha");
    assert_eq!(pair(&post(&url, named.to_string(), &[])), home);

    let homes: std::collections::HashSet<String> =
        (0..24).map(|k| turn(&format!("s{k}"), 0).0).collect();
    assert!(homes.len() >= 3, "24 sessions on {homes:?}");

    // 16 requests of the session at once, 8 in flight at a time.
    let next = AtomicUsize::new(0);
    let burst = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 16 {
                    break;
                }
                let p = turn("alpha", 100 + i);
                burst.lock().unwrap().push(p.0);
            });
        }
    });
    let burst = shares(burst.into_inner().unwrap().into_iter());
    let at_home = burst.get(&home.0).copied().unwrap_or(0);
    assert!(burst.len() >= 2 && at_home < 16, "bounded: {burst:?}");
    assert!(at_home >= 4, "the home pod keeps its share: {burst:?}");
    for i in 0..4 {
        assert_eq!(turn("alpha", 200 + i), home, "home again");
    }
    envoy.assert_counters_zero();
}

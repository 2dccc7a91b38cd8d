//! Idle capacity shares the work: with equal, idle pods, every policy sends
//! each complete roleset, and each decode pod within its roleset, between
//! half and one and a half times its fair share. Requests go one at a time,
//! so every placement sees zero load (the case where breaking ties the same
//! way every time leaves whole rolesets idle).

use crate::harness::*;
use serde_json::json;
use std::collections::HashMap;

/// Prefill and decode policies, as a user would configure them.
const POLICIES: [(&str, Option<&str>, Option<&str>); 7] = [
    ("default", None, None),
    ("aibrix", Some("prefix_cache"), Some("load_balancing")),
    (
        "least-request",
        Some("least_request"),
        Some("least_request"),
    ),
    ("round-robin", Some("round_robin"), Some("round_robin")),
    ("power-of-two", Some("power_of_two"), Some("power_of_two")),
    ("random", Some("random"), Some("random")),
    (
        "load-balancing",
        Some("least_request"),
        Some("load_balancing"),
    ),
];

const REQUESTS: usize = 200;
const ROLESETS: usize = 3;

/// A prompt that shares no prefix block with another (so prefix affinity,
/// which decides when scores differ, stays out of it).
fn prompt(policy: &str, i: usize) -> String {
    let seed = pd_router::fleet::fnv1a(format!("{policy}/{i}").as_bytes());
    let words: Vec<String> = (0..40)
        .map(|k| format!("{:x}", seed.rotate_left(k * 7) ^ (k as u64)))
        .collect();
    words.join(" ")
}

#[test]
fn equal_idle_pods_share_the_work_under_every_policy() {
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for rs in 0..ROLESETS {
        prefill.push(Mock::start(
            &format!("p{rs}"),
            &["--engine", "vllm", "--role", "prefill"],
        ));
        for d in 0..2 {
            decode.push(Mock::start(
                &format!("d{rs}{d}"),
                &["--engine", "vllm", "--role", "decode"],
            ));
        }
    }
    let rolesets: Vec<_> = (0..ROLESETS)
        .map(|rs| {
            json!({"name": format!("rs{rs}"),
                   "prefill": [prefill[rs].endpoint()],
                   "decode": [decode[2 * rs].endpoint(), decode[2 * rs + 1].endpoint()]})
        })
        .collect();
    let models: Vec<_> = POLICIES
        .iter()
        .map(|(name, p, d)| {
            let mut m = json!({"name": name, "engine": "vllm", "rolesets": rolesets});
            if let Some(p) = p {
                m["prefill_policy"] = json!(p);
            }
            if let Some(d) = d {
                m["decode_policy"] = json!(d);
            }
            m
        })
        .collect();
    let config = json!({"prefill_timeout_ms": 5000, "scrape_interval_ms": 200, "models": models});
    let envoy = Envoy::start_with(&config, 2);
    let url = envoy.url("/v1/completions");

    let mut failures = Vec::new();
    for (policy, _, _) in POLICIES {
        let mut by_roleset: HashMap<String, usize> = HashMap::new();
        let mut by_decode: HashMap<String, usize> = HashMap::new();
        for i in 0..REQUESTS {
            let body = json!({"model": policy, "prompt": prompt(policy, i), "max_tokens": 2});
            let a = post(&url, body.to_string(), &[]);
            assert_eq!(a.status, 200, "{policy}: {}", a.body);
            let p = a
                .header("prefill-target-pod")
                .unwrap_or_default()
                .to_owned();
            let d = a.header("decode-target-pod").unwrap_or_default().to_owned();
            // The pair comes from one roleset: p<r> with d<r><k>.
            assert_eq!(d.get(1..2), p.get(1..2), "{policy}: {p} with {d}");
            *by_roleset.entry(p).or_default() += 1;
            *by_decode.entry(d).or_default() += 1;
        }
        let fair = REQUESTS as f64 / ROLESETS as f64;
        for rs in 0..ROLESETS {
            let got = by_roleset.get(&format!("p{rs}")).copied().unwrap_or(0);
            if !(0.5 * fair..=1.5 * fair).contains(&(got as f64)) {
                failures.push(format!(
                    "{policy}: roleset rs{rs} got {got} of {REQUESTS} (fair {fair:.0})"
                ));
            }
            // Within the roleset, each of its two decode pods gets about half.
            let within = got as f64 / 2.0;
            for k in 0..2 {
                let name = format!("d{rs}{k}");
                let n = by_decode.get(&name).copied().unwrap_or(0) as f64;
                if !(0.5 * within..=1.5 * within).contains(&n) {
                    failures.push(format!("{policy}: {name} got {n} of rs{rs}'s {got}"));
                }
            }
        }
        eprintln!("{policy}: rolesets {by_roleset:?} decodes {by_decode:?}");
    }
    assert!(
        failures.is_empty(),
        "unfair shares:\n{}",
        failures.join("\n")
    );
    envoy.assert_counters_zero();
}

//! Several gateway replicas as one router: three Envoy processes with the
//! same configuration in front of the same pods (discovered from one mock
//! API server), a client spreading requests over them round robin. Shared
//! data is per process, so anything they agree on they agree on without
//! talking to each other.

use crate::harness::*;
use crate::kube_api::{KubeApi, KubePod};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const TOKEN: &str = "replica-token";
const INTERVAL_MS: u64 = 200;
const REPLICAS: usize = 3;

fn kube_cluster(api: &KubeApi) -> String {
    format!(
        "  clusters:\n  - name: kube_api\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: kube_api\n      endpoints:\n      - lb_endpoints:\n        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}}}\n",
        api.port
    )
}

/// Three replicas of one gateway; `env` per replica.
fn replicas(api: &KubeApi, config: &Value, env: &[Vec<(&str, &str)>]) -> Vec<Envoy> {
    let cluster = kube_cluster(api);
    (0..REPLICAS)
        .map(|i| {
            let mut e: Vec<(&str, &str)> = vec![("PD_ROUTER_KUBE_TOKEN", TOKEN)];
            e.extend(env.get(i).cloned().unwrap_or_default());
            Envoy::start_full(config, 4, &[("  clusters:\n", cluster.as_str())], &e)
        })
        .collect()
}

fn pod(m: &Mock, model: &str, engine: &str, role: &str, roleset: &str) -> KubePod {
    KubePod::new(&m.name, "127.0.0.1", m.http)
        .label("model.aibrix.ai/name", model)
        .label("model.aibrix.ai/engine", engine)
        .label("model.aibrix.ai/port", &m.http.to_string())
        .label("role-name", role)
        .label("roleset-name", roleset)
}

/// Waits until every replica listed the current pod set and each of its
/// VMs applied it.
fn settle(api: &KubeApi, envoys: &[Envoy]) {
    api.clear_requests();
    api.wait_requests(3 * REPLICAS, Duration::from_secs(10));
    for envoy in envoys {
        crate::discovery::wait_until("every VM routes by the published set", || {
            envoy.applied_pod_set().is_some()
        });
    }
}

/// A prompt: one of `groups` long shared prefixes, then a unique question.
fn prompt(group: usize, i: usize) -> String {
    let system = format!("You are assistant number {group}, careful and brief. ").repeat(40);
    format!("{system} Question {i}: what is {i} plus {group}?")
}

/// Sends `per_group` requests per group, round robin over the replicas;
/// returns, per group, how many went to each prefill pod.
fn spread(
    envoys: &[Envoy],
    model: &str,
    groups: usize,
    per_group: usize,
    round: usize,
) -> BTreeMap<usize, HashMap<String, usize>> {
    let next = AtomicUsize::new(0);
    let out = Mutex::new(BTreeMap::<usize, HashMap<String, usize>>::new());
    let total = groups * per_group;
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= total {
                    break;
                }
                let (group, i) = (k % groups, round * 1000 + k / groups);
                let envoy = &envoys[k % envoys.len()];
                let body = json!({"model": model, "prompt": prompt(group, i), "max_tokens": 2});
                let a = post(&envoy.url("/v1/completions"), body.to_string(), &[]);
                assert_eq!(a.status, 200, "{model}: {}", a.body);
                let p = a
                    .header("prefill-target-pod")
                    .unwrap_or_default()
                    .to_owned();
                *out.lock()
                    .unwrap()
                    .entry(group)
                    .or_default()
                    .entry(p)
                    .or_insert(0) += 1;
            });
        }
    });
    out.into_inner().unwrap()
}

/// Each group's pod and the share of its requests that went there.
fn owners(spread: &BTreeMap<usize, HashMap<String, usize>>) -> BTreeMap<usize, (String, f64)> {
    spread
        .iter()
        .map(|(g, pods)| {
            let total: usize = pods.values().sum();
            let (top, n) = pods
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(p, n)| (p.clone(), *n))
                .unwrap();
            (*g, (top, n as f64 / total as f64))
        })
        .collect()
}

#[test]
fn replicas_agree_on_prefix_placement_and_only_the_removed_pods_prefixes_move() {
    let api = KubeApi::start(TOKEN);
    let mocks: Vec<(Mock, Mock)> = (0..4)
        .map(|r| {
            let p = Mock::start(
                &format!("rp-p{r}"),
                &["--engine", "vllm", "--role", "prefill"],
            );
            let d = Mock::start(
                &format!("rp-d{r}"),
                &["--engine", "vllm", "--role", "decode"],
            );
            (p, d)
        })
        .collect();
    // The two models' pods are the same processes under names of their own
    // (a pod serves one model).
    let pods_for = |model: &str, except: Option<&str>| -> Vec<KubePod> {
        mocks
            .iter()
            .enumerate()
            .flat_map(|(r, (p, d))| {
                let rs = format!("rs{r}");
                [
                    pod(p, model, "vllm", "prefill", &rs),
                    pod(d, model, "vllm", "decode", &rs),
                ]
            })
            .map(|mut k| {
                if model != "hashed" {
                    k.name = format!("{}-{model}", k.name);
                }
                k
            })
            .filter(|k| Some(k.name.as_str()) != except)
            .collect()
    };
    let mut all = pods_for("hashed", None);
    all.extend(pods_for("tables", None));
    api.set_pods(&all);
    let config = json!({
        "prefill_timeout_ms": 5000,
        "scrape_interval_ms": 0,
        "discovery": {"kubernetes": {"cluster": "kube_api", "interval_ms": INTERVAL_MS, "timeout_ms": 1000}},
        "models": [
            {"name": "hashed", "engine": "vllm", "prefill_policy": "consistent_hash"},
            {"name": "tables", "engine": "vllm", "prefill_policy": "prefix_cache"}
        ]
    });
    let envoys = replicas(&api, &config, &[]);
    settle(&api, &envoys);
    const GROUPS: usize = 8;
    const PER_GROUP: usize = 15;

    let hashed = owners(&spread(&envoys, "hashed", GROUPS, PER_GROUP, 0));
    let tables = owners(&spread(&envoys, "tables", GROUPS, PER_GROUP, 0));
    let mean = |o: &BTreeMap<usize, (String, f64)>| {
        o.values().map(|(_, s)| s).sum::<f64>() / o.len() as f64
    };
    eprintln!(
        "share of a prefix's requests on its top prefill pod, 3 replicas: consistent_hash {:.0}%, per-process prefix tables {:.0}%",
        100.0 * mean(&hashed),
        100.0 * mean(&tables)
    );
    for (g, (pod, share)) in &hashed {
        assert!(
            *share >= 0.9,
            "group {g}: only {:.0}% on {pod}: {hashed:?}",
            share * 100.0
        );
    }

    // Remove the prefill pod holding the most prefixes.
    let mut held: HashMap<&str, usize> = HashMap::new();
    for (pod, _) in hashed.values() {
        *held.entry(pod.as_str()).or_default() += 1;
    }
    let (removed, _) = held
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(p, n)| (p.to_string(), *n))
        .unwrap();
    let mut all = pods_for("hashed", Some(&removed));
    all.extend(pods_for("tables", None));
    api.set_pods(&all);
    settle(&api, &envoys);
    let after = owners(&spread(&envoys, "hashed", GROUPS, PER_GROUP, 1));
    for (g, (before_pod, _)) in &hashed {
        let (now, share) = &after[g];
        assert!(
            *share >= 0.9,
            "group {g} after the removal: {:.0}% on {now}",
            share * 100.0
        );
        if *before_pod != removed {
            assert_eq!(now, before_pod, "group {g} moved though its pod stayed");
        } else {
            assert_ne!(*now, removed, "group {g} still on the removed pod");
        }
    }
    for e in &envoys {
        e.assert_counters_zero();
    }
}

#[test]
fn tensorrt_llm_ids_never_collide_across_replicas() {
    let api = KubeApi::start(TOKEN);
    let p = Mock::start("ids-ctx", &["--engine", "trtllm", "--role", "prefill"]);
    let d = Mock::start("ids-gen", &["--engine", "trtllm", "--role", "decode"]);
    api.set_pods(&[
        pod(&p, "t", "trtllm", "prefill", "rs0"),
        pod(&d, "t", "trtllm", "decode", "rs0"),
    ]);
    let config = json!({
        "prefill_timeout_ms": 5000,
        "scrape_interval_ms": 0,
        "discovery": {"kubernetes": {"cluster": "kube_api", "interval_ms": INTERVAL_MS, "timeout_ms": 1000}},
    });
    // Each replica its StatefulSet pod name: the machine id is the ordinal.
    let env: Vec<Vec<(&str, &str)>> = ["gw-0", "gw-1", "gw-2"]
        .iter()
        .map(|n| vec![("PD_ROUTER_TRT_MACHINE_ID", *n)])
        .collect();
    let envoys = replicas(&api, &config, &env);
    settle(&api, &envoys);
    const N: usize = 10_000;
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..24 {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= N {
                    break;
                }
                let body = json!({"model": "t", "prompt": format!("p{k}"), "max_tokens": 2});
                let a = post(
                    &envoys[k % REPLICAS].url("/v1/completions"),
                    body.to_string(),
                    &[],
                );
                assert_eq!(a.status, 200, "{}", a.body);
            });
        }
    });
    let ids: Vec<u64> = p
        .requests()
        .iter()
        .map(|r| {
            r.json()["disaggregated_params"]["disagg_request_id"]
                .as_u64()
                .expect("id")
        })
        .collect();
    assert_eq!(ids.len(), N);
    let distinct: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), N, "{} ids minted twice", N - distinct.len());
    // The machine field (bits 12..22 above 2^42) holds each replica's ordinal.
    let machines: HashSet<u64> = ids
        .iter()
        .map(|id| ((id - (1 << 42)) >> 12) & 1023)
        .collect();
    assert_eq!(machines, HashSet::from([0, 1, 2]));
}

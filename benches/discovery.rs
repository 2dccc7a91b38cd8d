//! The cost of one discovery list inside the filter: an API server's
//! PodList answer of 100 and 2 000 pods read (parse, AIBrix's rules), the pod
//! set published (compared with the last and encoded), and the fleet built
//! from it, as the lister VM does each `interval_ms`; then the part every
//! other VM pays when the set changed (decode the published set, build).
//!
//! `just bench` runs it natively and inside wasm32-wasip1 under wasmtime
//! (the filter's own target; V8 in Envoy is of the same order).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::config::Config;
use pd_router::discovery::{build_fleet, pod::read_page, published};
use pd_router::pods::MemoryStore;
use serde_json::json;
use std::hint::black_box;
use std::time::Instant;

/// A PodList as the API server sends it: pods of 10 models, rolesets of
/// 4 (1 prefill, 3 decode), with the labels, annotations, conditions and
/// container spec a real pod carries.
fn pod_list(n: usize) -> Vec<u8> {
    let items: Vec<_> = (0..n)
        .map(|i| {
            let role = if i % 4 == 0 { "prefill" } else { "decode" };
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": format!("model-{}-{role}-{i}", i % 10),
                    "namespace": "llm",
                    "uid": format!("0b7c3a52-0000-4000-8000-{i:012}"),
                    "resourceVersion": format!("{}", 100_000 + i),
                    "creationTimestamp": "2026-11-30T10:00:00Z",
                    "generateName": format!("model-{}-{role}-", i % 10),
                    "labels": {
                        "model.aibrix.ai/name": format!("model-{}", i % 10),
                        "model.aibrix.ai/engine": "vllm",
                        "model.aibrix.ai/port": "8000",
                        "role-name": role,
                        "roleset-name": format!("rs-{}", i / 4),
                        "app.kubernetes.io/name": "vllm",
                        "pod-template-hash": "7c9d8f6b5",
                        "stormservice.orchestration.aibrix.ai/role-replica-index": format!("{}", i % 4)
                    },
                    "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "x", "controller": true}]
                },
                "spec": {
                    "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
                        "args": ["--model", "Qwen/Qwen3-8B", "--kv-transfer-config", "{\"kv_connector\":\"NixlConnector\"}"],
                        "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                    "nodeName": format!("gpu-node-{}", i % 50), "serviceAccountName": "default"
                },
                "status": {
                    "phase": "Running",
                    "podIP": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                    "podIPs": [{"ip": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)}],
                    "hostIP": "192.168.0.10",
                    "startTime": "2026-11-30T10:00:00Z",
                    "conditions": [
                        {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"},
                        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:01:00Z"},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-30T10:01:00Z"},
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"}
                    ],
                    "containerStatuses": [{"name": "vllm", "ready": true, "restartCount": 0, "image": "vllm/vllm-openai:v0.33.0",
                        "state": {"running": {"startedAt": "2026-11-30T10:00:30Z"}}}]
                }
            })
        })
        .collect();
    serde_json::to_vec(&json!({"kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "123456"}, "items": items}))
    .expect("json")
}

fn median_us(rounds: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / iters as f64
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let config =
        Config::parse(br#"{"discovery":{"kubernetes":{"cluster":"kube_api"}}}"#).expect("config");
    let target = if cfg!(target_arch = "wasm32") {
        "wasm32-wasip1, wasmtime"
    } else {
        "native"
    };
    println!("one discovery list inside the filter ({target}, release; µs, median of 5)");
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>10} {:>12} {:>14}",
        "pods", "answer KB", "read", "publish", "fleet", "lister total", "other VMs"
    );
    for n in [100usize, 2000] {
        let body = pod_list(n);
        let iters = if n > 1000 { 3 } else { 30 };
        let page = read_page(&body, false).expect("page");
        assert_eq!(page.pods.len(), n);
        let read = median_us(5, iters, || {
            black_box(read_page(black_box(&body), false).ok());
        });
        let mut pods = page.pods.clone();
        pods.sort();
        // Publishing: compared with the set already there, written when new.
        let mut store = MemoryStore::default();
        published::publish(&mut store, "set", "gen", Some(&pods), None).expect("publish");
        let publish = median_us(5, iters, || {
            black_box(published::publish(&mut store, "set", "gen", Some(&pods), None).ok());
        });
        let fleet = median_us(5, iters, || {
            black_box(build_fleet(&config.models, &pods, &[]));
        });
        let apply = median_us(5, iters, || {
            let set = published::read(&store, "set").expect("set");
            black_box(build_fleet(&config.models, &set.pods, &[]));
        });
        println!(
            "{:>6} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>12.0} {:>14.0}",
            n,
            body.len() as f64 / 1024.0,
            read,
            publish,
            fleet,
            read + publish + fleet,
            apply
        );
    }
    println!("lister total: read + publish + fleet, once per interval_ms (default 2 s) on one VM;");
    println!(
        "other VMs: reading the published set and building the fleet, only when the set changed."
    );
}

//! One gateway, many models, through Envoy against enforcing mocks (a pod
//! that gets another model's request answers vLLM's 404): calls that name
//! a model reach only its pods, the gateway lists its models and adapters,
//! an adapter splits on its base model's pods and counts in their load,
//! the Messages and token-in generate APIs split, and the OpenAI and
//! Anthropic Python SDKs work unchanged.

use crate::harness::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// Three vLLM models; `a` has two adapters and two decode pods whose
/// streams are slow enough to watch their load.
struct Fleet {
    pods: Vec<(Mock, &'static [&'static str])>,
    envoy: Envoy,
}

const A: &[&str] = &["a", "a-sql", "a-chat"];
const B: &[&str] = &["b"];
const C: &[&str] = &["c"];

impl Fleet {
    fn start() -> Fleet {
        let pod = |name: &str, role: &str, served: &[&str], extra: &[&str]| {
            let mut args = vec!["--engine", "vllm", "--role", role, "--model", served[0]];
            for a in &served[1..] {
                args.extend(["--lora", a]);
            }
            args.extend(extra);
            Mock::start(name, &args)
        };
        let slow = ["--stream-delay-ms", "50"];
        let pods = vec![
            (pod("gw-pa", "prefill", A, &[]), A),
            (pod("gw-da0", "decode", A, &slow), A),
            (pod("gw-da1", "decode", A, &slow), A),
            (pod("gw-pb", "prefill", B, &[]), B),
            (pod("gw-db", "decode", B, &[]), B),
            (pod("gw-pc", "prefill", C, &[]), C),
            (pod("gw-dc", "decode", C, &[]), C),
        ];
        let ep = |i: usize| pods[i].0.endpoint();
        let config = json!({
            "prefill_timeout_ms": 5000,
            "models": [
                {"name": "a", "engine": "vllm", "adapters": ["a-sql", "a-chat"],
                 "rolesets": [{"prefill": [ep(0)], "decode": [ep(1), ep(2)]}]},
                {"name": "b", "engine": "vllm", "rolesets": [{"prefill": [ep(3)], "decode": [ep(4)]}]},
                {"name": "c", "engine": "vllm", "rolesets": [{"prefill": [ep(5)], "decode": [ep(6)]}]}
            ]
        });
        let envoy = Envoy::start_with(&config, 2);
        Fleet { pods, envoy }
    }

    fn mock(&self, name: &str) -> &Mock {
        &self
            .pods
            .iter()
            .find(|(m, _)| m.name == name)
            .expect("pod")
            .0
    }
}

#[test]
fn calls_that_name_a_model_reach_only_its_pods() {
    let fleet = Fleet::start();
    let models = ["a", "b", "c", "a-sql", "a-chat"];
    for i in 0..200 {
        let model = models[i % models.len()];
        let (path, body) = match i % 3 {
            0 => (
                "/v1/embeddings",
                json!({"model": model, "input": format!("text {i}")}),
            ),
            1 => (
                "/tokenize",
                json!({"model": model, "prompt": format!("text {i}")}),
            ),
            _ => (
                "/v1/score",
                json!({"model": model, "text_1": "query", "text_2": format!("doc {i}")}),
            ),
        };
        let a = post(&fleet.envoy.url(path), body.to_string(), &[]);
        assert_eq!(
            a.status,
            200,
            "{path} for {model}: {}\n{}",
            a.body,
            fleet.envoy.log()
        );
    }
    let mut misrouted = Vec::new();
    let mut per_pod = BTreeMap::new();
    for (mock, served) in &fleet.pods {
        for r in mock.requests() {
            let named = r.model.clone().unwrap_or_default();
            if !served.contains(&named.as_str()) {
                misrouted.push((mock.name.clone(), r.path.clone(), named));
            }
            *per_pod.entry(mock.name.clone()).or_insert(0) += 1;
        }
    }
    assert!(misrouted.is_empty(), "misrouted: {misrouted:?}");
    for prefill in ["gw-pa", "gw-pb", "gw-pc"] {
        assert!(
            !per_pod.contains_key(prefill),
            "{prefill} got a call: {per_pod:?}"
        );
    }
    assert_eq!(per_pod.values().sum::<usize>(), 200, "{per_pod:?}");
    assert!(
        per_pod["gw-da0"] > 0 && per_pod["gw-da1"] > 0,
        "{per_pod:?}"
    );

    // An unknown model is the gateway's 404, in OpenAI's shape.
    let a = post(
        &fleet.envoy.url("/v1/embeddings"),
        json!({"model": "zzz", "input": "x"}).to_string(),
        &[],
    );
    assert_eq!(a.status, 404);
    assert_eq!(a.json()["error"]["code"], "model_not_found");
    // A form names its model in a field.
    let form = "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--XX\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nc\r\n--XX--\r\n";
    let a = send(
        http()
            .post(fleet.envoy.url("/v1/audio/transcriptions"))
            .header("content-type", "multipart/form-data; boundary=XX")
            .body(form),
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    let last = fleet.mock("gw-dc").requests().pop().expect("the form");
    assert_eq!(
        (last.path.as_str(), last.model.as_deref()),
        ("/v1/audio/transcriptions", Some("c"))
    );
    fleet.envoy.assert_counters_zero();
}

#[test]
fn the_model_list_and_an_adapter_come_from_the_gateway() {
    let fleet = Fleet::start();
    let a = get(&fleet.envoy.url("/v1/models"), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    let cards: Vec<(String, Value)> = a.json()["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap_or_default().to_owned(),
                c["parent"].clone(),
            )
        })
        .collect();
    assert_eq!(
        cards,
        [
            ("a".into(), Value::Null),
            ("a-sql".into(), json!("a")),
            ("a-chat".into(), json!("a")),
            ("b".into(), Value::Null),
            ("c".into(), Value::Null),
        ]
    );
    assert!(
        fleet.pods.iter().all(|(m, _)| m.requests().is_empty()),
        "no pod was asked"
    );

    // An adapter's chat splits on a's pods; while it streams, a's decode
    // pod holds it, in the gauges labelled with model a.
    let url = fleet.envoy.url("/v1/chat/completions");
    let body = json!({"model": "a-sql", "messages": [{"role": "user", "content": "SELECT"}],
                      "max_tokens": 40, "stream": true})
    .to_string();
    let streaming = std::thread::spawn(move || post(&url, body, &[("x-request-id", "gw-lora")]));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut held = Vec::new();
    while held.is_empty() && Instant::now() < deadline {
        held = fleet
            .envoy
            .stats("wasmcustom.pd_router.pod.pending_decodes.")
            .into_iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, _)| k)
            .collect();
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = streaming.join().expect("stream");
    assert_eq!(a.status, 200, "{}\n{}", a.body, fleet.envoy.log());
    assert_eq!(a.header("prefill-target-pod"), Some("gw-pa"));
    let decode = a.header("decode-target-pod").unwrap_or_default().to_owned();
    assert!(decode == "gw-da0" || decode == "gw-da1", "{decode}");
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(
        held[0].contains("pd_model=.=a;.;") && held[0].contains(&format!("pd_pod=.={decode};.;")),
        "{held:?}"
    );
    let prefilled = fleet.mock("gw-pa").requests();
    assert_eq!(prefilled.len(), 1);
    assert_eq!(
        prefilled[0].model.as_deref(),
        Some("a-sql"),
        "the body keeps the adapter"
    );
    fleet.envoy.assert_counters_zero();
}

#[test]
fn messages_and_generate_split_through_envoy() {
    let fleet = Fleet::start();
    let (pb, db) = (fleet.mock("gw-pb"), fleet.mock("gw-db"));
    for stream in [false, true] {
        let body = json!({"model": "b", "system": "Be brief.", "max_tokens": 6, "stream": stream,
                          "messages": [{"role": "user", "content": "Say hi"}]});
        let a = post(&fleet.envoy.url("/v1/messages"), body.to_string(), &[]);
        assert_eq!(a.status, 200, "{}\n{}", a.body, fleet.envoy.log());
        assert_eq!(a.header("prefill-target-pod"), Some("gw-pb"));
        if stream {
            let events = a.events();
            assert!(
                events.iter().any(|e| e.contains("message_stop")),
                "{events:?}"
            );
        } else {
            assert_eq!(a.json()["type"], "message");
        }
    }
    let body = json!({"model": "b", "token_ids": [1, 2, 3, 4], "stream": true,
                      "sampling_params": {"max_tokens": 5, "min_tokens": 2}});
    let a = post(
        &fleet.envoy.url("/inference/v1/generate"),
        body.to_string(),
        &[],
    );
    assert_eq!(a.status, 200, "{}\n{}", a.body, fleet.envoy.log());
    assert_eq!(a.header("prefill-target-pod"), Some("gw-pb"));

    // Each prefill leg had its API's one-token cap; each decode leg the
    // client's limits and the hand-off (the mocks refuse anything else).
    let legs = |m: &Mock| -> Vec<(String, Value)> {
        m.requests()
            .into_iter()
            .map(|r| (r.path.clone(), r.json()))
            .collect()
    };
    let p = legs(pb);
    assert_eq!(p.len(), 3);
    assert!(p[..2]
        .iter()
        .all(|(path, b)| path == "/v1/messages" && b["max_tokens"] == 1));
    assert_eq!(p[2].1["sampling_params"], json!({"max_tokens": 1}));
    let d = legs(db);
    assert_eq!(d.len(), 3);
    assert!(d
        .iter()
        .all(|(_, b)| b["kv_transfer_params"]["remote_block_ids"].is_array()));
    assert_eq!(d[1].1["stream"], true);
    assert_eq!(
        d[2].1["sampling_params"],
        json!({"max_tokens": 5, "min_tokens": 2})
    );
    fleet.envoy.assert_counters_zero();
}

#[test]
fn the_openai_and_anthropic_sdks_work_unchanged() {
    let fleet = Fleet::start();
    let script = repo().join("tests/e2e/sdk_clients.py");
    let out = Command::new(repo().join(".venv/bin/python"))
        .arg(&script)
        .arg(fleet.envoy.url(""))
        .arg("b")
        .output()
        .expect("run the SDK script (just setup installs the SDKs)");
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        fleet.envoy.log()
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON");
    let ids: Vec<&str> = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "a-sql", "a-chat", "b", "c"]);
    assert_eq!(v["models"][1]["parent"], "a");
    assert_eq!(v["embeddings"]["n"], 2);
    assert!(v["embeddings"]["dims"].as_u64().unwrap() > 0);
    assert_eq!(v["message"]["type"], "message");
    assert!(!v["message"]["text"].as_str().unwrap().is_empty());
    let events: Vec<&str> = v["stream"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    assert!(!v["stream"]["text"].as_str().unwrap().is_empty());
    // Both Messages calls were split on b's pods.
    let prefilled = fleet.mock("gw-pb").requests();
    assert_eq!(
        prefilled
            .iter()
            .filter(|r| r.path == "/v1/messages")
            .count(),
        2
    );
    fleet.envoy.assert_counters_zero();
}

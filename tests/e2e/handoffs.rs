//! The hand-offs beyond NIXL pull: vLLM Mooncake, NIXL push and P2P NCCL,
//! TensorRT-LLM's signed generation requests, SGLang data-parallel ranks,
//! and `/v1/responses`, through a real Envoy against mocks that enforce each
//! contract (a decode that is not told where the KV is fails the request).

use crate::engines::Setup;
use crate::harness::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PATHS: [&str; 3] = ["/v1/completions", "/v1/chat/completions", "/v1/responses"];

fn body(model: &str, path: &str, stream: bool) -> String {
    match path {
        "/v1/chat/completions" => format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"Bonjour, ça va ?"}}],"max_tokens":6,"stream":{stream}}}"#
        ),
        "/v1/responses" => format!(
            r#"{{"model":"{model}","input":"Écris un haïku","max_output_tokens":6,"stream":{stream}}}"#
        ),
        _ => format!(
            r#"{{"model":"{model}","prompt":"Il était une fois","max_tokens":6,"stream":{stream}}}"#
        ),
    }
}

/// Waits until the filter has learned what `model`'s prefill says of itself
/// (a Mooncake pod's engine ids, a TensorRT-LLM generation-first context
/// server's `/server_info`): one VM asks, the others copy its answer at
/// their next tick or when a placement finds the pod not ready, and until
/// then a request gets 503 (and reaches no mock). The request that gets
/// through is a real one (counted by the mocks).
pub fn wait_learned(envoy: &Envoy, model: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let a = post(
            &envoy.url("/v1/completions"),
            body(model, "/v1/completions", false),
            &[],
        );
        if a.status != 503 {
            assert_eq!(a.status, 200, "{}", a.body);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the filter never learned what {model}'s prefill says of itself:\n{}",
            envoy.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The engine ids a Mooncake prefill mock's bootstrap server lists, by rank.
fn query(prefill: &Mock) -> Vec<String> {
    let url = format!(
        "http://127.0.0.1:{}/query",
        prefill.bootstrap.expect("bootstrap port")
    );
    let v: Value = http()
        .get(url)
        .send()
        .and_then(|r| r.json())
        .expect("/query");
    let map = v.as_object().expect("object");
    (0..map.len())
        .map(|r| {
            map[&r.to_string()]["engine_id"]
                .as_str()
                .expect("engine_id")
                .to_owned()
        })
        .collect()
}

/// Sends every path in `paths`, streaming and not; checks each answer and
/// that the decode mock got its KV as `handoff` says (`x-mock-kv`).
fn check_paths(s: &Setup, paths: &[&str], handoff: &str) {
    let (p0, d0) = (s.prefill.requests().len(), s.decode.requests().len());
    let mut sent = 0;
    for path in paths {
        for stream in [false, true] {
            let what = format!("{} {path} stream={stream}", s.model);
            let a = post(&s.envoy.url(path), body(&s.model, path, stream), &[]);
            sent += 1;
            assert_eq!(a.status, 200, "{what}: {}\n{}", a.body, s.envoy.log());
            assert_eq!(a.header("x-mock-kv"), Some(handoff), "{what}");
            assert_eq!(
                a.header("x-mock-pod"),
                Some(s.decode.name.as_str()),
                "{what}"
            );
            assert_eq!(
                a.header("prefill-target-pod"),
                Some(s.prefill.name.as_str()),
                "{what}"
            );
            if stream {
                assert!(
                    a.header("content-type")
                        .is_some_and(|c| c.starts_with("text/event-stream")),
                    "{what}"
                );
                if *path == "/v1/responses" {
                    assert!(a.body.contains("event: response."), "{what}: {}", a.body);
                } else {
                    assert_eq!(
                        a.events().last().map(String::as_str),
                        Some("[DONE]"),
                        "{what}"
                    );
                }
            } else if *path == "/v1/responses" {
                assert_eq!(a.json()["object"], "response", "{what}: {}", a.body);
            } else {
                assert!(a.json()["choices"][0].is_object(), "{what}: {}", a.body);
            }
        }
    }
    assert_eq!(
        s.prefill.requests().len() - p0,
        sent,
        "one prefill per request"
    );
    assert_eq!(
        s.decode.requests().len() - d0,
        sent,
        "one decode per request"
    );
    s.envoy.assert_counters_zero();
}

/// The `kv_transfer_params` a logged request carried.
fn params(l: &Logged) -> Value {
    serde_json::from_str(&l.raw("kv_transfer_params").expect("kv_transfer_params")).expect("json")
}

#[test]
fn vllm_mooncake_pairs_concurrent_legs_by_transfer_id() {
    let s = Setup::start("vllm", Some("mooncake"), &[], &[]);
    wait_learned(&s.envoy, &s.model);
    check_paths(&s, &PATHS, "pulled");
    let engine = query(&s.prefill);
    assert_eq!(engine.len(), 1);
    let (p, d) = (s.prefill.requests(), s.decode.requests());
    for (p, d) in p.iter().zip(&d) {
        let (pp, dp) = (params(p), params(d));
        assert_eq!(pp["do_remote_decode"], true);
        assert!(pp["transfer_id"]
            .as_str()
            .is_some_and(|t| t.starts_with("xfer-")));
        assert_eq!(
            dp["remote_engine_id"],
            engine[0].as_str(),
            "the engine /query names"
        );
        assert_eq!(
            dp["remote_bootstrap_addr"],
            format!(
                "http://127.0.0.1:{}",
                s.prefill.bootstrap.expect("bootstrap port")
            )
        );
        assert!(
            p.header("x-data-parallel-rank").is_none(),
            "no DP: no rank pinned"
        );
    }
    let mut ids: Vec<String> = d
        .iter()
        .map(|d| params(d)["transfer_id"].to_string())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), d.len(), "a fresh transfer_id per request");
    // Responses: the prefill is not stored and does not run in the background.
    let r = p
        .iter()
        .find(|l| l.path == "/v1/responses")
        .expect("a responses prefill");
    assert_eq!(r.raw("store").as_deref(), Some("false"));
    assert_eq!(r.raw("max_output_tokens").as_deref(), Some("1"));
}

#[test]
fn vllm_mooncake_pins_the_prefill_rank_and_names_its_engine() {
    let s = Setup::start("vllm", Some("mooncake"), &["--dp-size", "2"], &[]);
    wait_learned(&s.envoy, &s.model);
    let engines = query(&s.prefill);
    assert_eq!(engines.len(), 2);
    // Each request draws its rank at random: with 24 of them, one rank
    // alone is a 1 in 8 million chance (8 left it at 1 in 128).
    for i in 0..24 {
        let path = PATHS[i % 2];
        let a = post(&s.envoy.url(path), body(&s.model, path, i % 4 == 0), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("x-mock-kv"), Some("pulled"));
    }
    let mut ranks = Vec::new();
    for (p, d) in s.prefill.requests().iter().zip(&s.decode.requests()) {
        let rank = p
            .header("x-data-parallel-rank")
            .expect("rank pinned")
            .to_owned();
        let r: usize = rank.parse().expect("a number");
        assert_eq!(
            params(d)["remote_engine_id"],
            engines[r].as_str(),
            "rank {rank}'s engine"
        );
        ranks.push(rank);
    }
    ranks.sort();
    ranks.dedup();
    assert_eq!(ranks, ["0", "1"], "both ranks used over 24 requests");
}

#[test]
fn mooncake_prefill_waits_until_its_query_answers_and_others_serve_meanwhile() {
    // `late` answers /query with 503 for its first 8 s, as a bootstrap
    // server whose engines have not registered yet. The window must outlast
    // Envoy's start and the first requests on a loaded machine (3 s did
    // not, once in CI).
    let late = Mock::start(
        "late",
        &[
            "--engine",
            "vllm",
            "--role",
            "prefill",
            "--connector",
            "mooncake",
            "--query-unavailable-ms",
            "8000",
        ],
    );
    let ready = Mock::start(
        "ready",
        &[
            "--engine",
            "vllm",
            "--role",
            "prefill",
            "--connector",
            "mooncake",
        ],
    );
    let d = Mock::start(
        "d",
        &[
            "--engine",
            "vllm",
            "--role",
            "decode",
            "--connector",
            "mooncake",
        ],
    );
    let model = |name: &str, prefill: Vec<Value>| {
        json!({"name": name, "engine": "vllm", "kv_connector": "mooncake",
               "prefill_policy": "round_robin",
               "rolesets": [{"prefill": prefill, "decode": [d.endpoint()]}]})
    };
    let envoy = Envoy::start(&json!({"models": [
        model("both", vec![late.endpoint(), ready.endpoint()]),
        model("only-late", vec![late.endpoint()]),
        model("only-ready", vec![ready.endpoint()]),
    ]}));
    wait_learned(&envoy, "only-ready");
    let url = envoy.url("/v1/completions");
    let a = post(&url, body("only-late", "/v1/completions", false), &[]);
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(
        a.error_message().contains("engine id not known yet"),
        "{}",
        a.body
    );
    for _ in 0..4 {
        let a = post(&url, body("both", "/v1/completions", false), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(
            a.header("prefill-target-pod"),
            Some("ready"),
            "round robin skips `late`"
        );
    }
    assert!(late.requests().is_empty(), "no prefill went to `late`");
    // Learned in the background once it answers: `late` serves.
    wait_learned(&envoy, "only-late");
    assert_eq!(late.requests().len(), 1);
    envoy.assert_counters_zero();
}

#[test]
fn vllm_nixl_push_tells_the_decode_the_configured_side_channel() {
    let s = Setup::start("vllm", Some("nixl_push"), &[], &[]);
    check_paths(&s, &PATHS, "pulled");
    for (p, d) in s.prefill.requests().iter().zip(&s.decode.requests()) {
        let id = p.header("x-request-id").expect("request id");
        assert_eq!(
            d.header("x-request-id"),
            Some(id),
            "one request id on both legs"
        );
        let dp = params(d);
        assert_eq!(dp["remote_engine_id"], s.prefill.name.as_str());
        assert_eq!(dp["remote_port"], s.prefill.side.expect("side channel"));
        assert_eq!(dp["remote_request_id"], id);
        assert_eq!(params(p)["transfer_id"], dp["transfer_id"]);
    }
}

#[test]
fn nixl_push_pairs_by_an_id_the_router_mints_not_the_clients() {
    // A slow prefill keeps both decodes registered with it at once; the mock
    // refuses a second registration under an id already in flight, as a
    // real prefill would push one request's KV into the other's blocks.
    let s = Setup::start("vllm", Some("nixl_push"), &["--fault", "delay:500"], &[]);
    let url = s.envoy.url("/v1/chat/completions");
    let answers: Vec<Answer> = std::thread::scope(|scope| {
        let sent: Vec<_> = ["the first prompt", "a second, different prompt"]
            .into_iter()
            .map(|prompt| {
                let body = json!({"model": s.model, "max_tokens": 2, "request_id": "same-id",
                                  "messages": [{"role": "user", "content": prompt}]})
                .to_string();
                let url = &url;
                scope.spawn(move || post(url, body, &[("x-request-id", "same-id")]))
            })
            .collect();
        sent.into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("x-mock-kv"), Some("pulled"), "its own KV");
    }
    let ids: Vec<String> = s
        .decode
        .requests()
        .iter()
        .map(|d| d.header("x-request-id").expect("request id").to_owned())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    assert!(ids.iter().all(|id| id != "same-id"), "{ids:?}");
    for d in s.decode.requests() {
        assert_eq!(
            params(&d)["remote_request_id"],
            d.header("x-request-id").unwrap()
        );
    }
}

#[test]
fn vllm_p2p_nccl_names_both_pods_in_the_request_id() {
    let s = Setup::start("vllm", Some("p2p_nccl"), &[], &[]);
    check_paths(&s, &PATHS, "pulled");
    let (zp, zd) = (s.prefill.zmq.expect("zmq"), s.decode.zmq.expect("zmq"));
    for (p, d) in s.prefill.requests().iter().zip(&s.decode.requests()) {
        let id = p.header("x-request-id").expect("request id");
        assert!(
            id.starts_with(&format!(
                "___prefill_addr_127.0.0.1:{zp}___decode_addr_127.0.0.1:{zd}_"
            )),
            "{id}"
        );
        assert_eq!(d.header("x-request-id"), Some(id));
        assert_eq!(
            d.raw("kv_transfer_params"),
            None,
            "the decode gets the client's body"
        );
    }
}

/// A concurrent hand-off whose prefill fails: the decode waits for KV that
/// never comes (20 s here); the filter answers as soon as the prefill fails.
fn concurrent_prefill_failure_is_answered_promptly(connector: &str) {
    let s = Setup::start(
        "vllm",
        Some(connector),
        &["--fault", "status:500"],
        &["--bootstrap-timeout-ms", "20000"],
    );
    let send = |stream: bool| {
        let start = Instant::now();
        let a = post(
            &s.envoy.url("/v1/completions"),
            body(&s.model, "/v1/completions", stream),
            &[],
        );
        (a, start.elapsed())
    };
    if connector == "mooncake" {
        // Until every VM knows the engine id, requests are refused with 503
        // before any leg leaves.
        let deadline = Instant::now() + Duration::from_secs(15);
        while send(false).0.status == 503 {
            assert!(Instant::now() < deadline, "{}", s.envoy.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for stream in [false, true] {
        let (a, took) = send(stream);
        eprintln!(
            "{connector} prefill 500, stream={stream}: answered {} in {took:?}",
            a.status
        );
        assert_eq!(a.status, 502, "{connector}: {}", a.body);
        assert!(
            a.error_message().contains("500"),
            "{connector}: names the prefill's status: {}",
            a.body
        );
        // Far below the decode's 20 s wait: the filter ended it.
        assert!(took < Duration::from_secs(3), "{connector}: took {took:?}");
    }
    s.envoy.assert_counters_zero();
}

#[test]
fn mooncake_prefill_failure_is_answered_promptly() {
    concurrent_prefill_failure_is_answered_promptly("mooncake");
}

#[test]
fn nixl_push_prefill_failure_is_answered_promptly() {
    concurrent_prefill_failure_is_answered_promptly("nixl_push");
}

const TRT_KEY: &str = "replace-with-a-random-shared-key";

fn trt_envoy(p: &Mock, d: &Mock, env: &[(&str, &str)]) -> Envoy {
    Envoy::start_full(
        &plugin_config(&[("test/trtllm", "trtllm", None, &[p], &[d])]),
        1,
        &[],
        env,
    )
}

#[test]
fn trtllm_generation_requests_are_signed_with_the_key_from_the_environment() {
    let p = Mock::start(
        "trt-p",
        &[
            "--engine",
            "trtllm",
            "--role",
            "prefill",
            "--ctx-endpoint-list",
        ],
    );
    let d = Mock::start(
        "trt-d",
        &[
            "--engine",
            "trtllm",
            "--role",
            "decode",
            "--auth-key",
            TRT_KEY,
        ],
    );
    let envoy = trt_envoy(&p, &d, &[("PD_ROUTER_TRT_AUTH_KEY", TRT_KEY)]);
    for path in ["/v1/completions", "/v1/chat/completions"] {
        for stream in [false, true] {
            let a = post(&envoy.url(path), body("test/trtllm", path, stream), &[]);
            assert_eq!(a.status, 200, "{path} stream={stream}: {}", a.body);
            assert_eq!(a.header("x-mock-kv"), Some("pulled"));
        }
    }
    for r in d.requests() {
        let sig = r.header("x-trtllm-disagg-auth").expect("signed");
        assert!(sig.starts_with("sha256=") && sig.len() == 71, "{sig}");
    }
    assert!(
        envoy.log_lines_with("hand-offs are signed with the key in $PD_ROUTER_TRT_AUTH_KEY") > 0
    );
    envoy.assert_counters_zero();
    drop(envoy);
    // The same workers behind a router without the key, or with another:
    // the generation server refuses, and the client hears why.
    for env in [vec![], vec![("PD_ROUTER_TRT_AUTH_KEY", "not-the-key")]] {
        let envoy = trt_envoy(&p, &d, &env);
        let a = post(
            &envoy.url("/v1/completions"),
            body("test/trtllm", "/v1/completions", false),
            &[],
        );
        assert_eq!(a.status, 400, "{env:?}: {}", a.body);
        assert!(
            a.body
                .contains("Invalid internal disaggregated request authentication"),
            "{env:?}: {}",
            a.body
        );
    }
}

#[test]
fn sglang_data_parallel_ranks_agree_on_both_legs() {
    let s = Setup::start("sglang", None, &["--dp-size", "4"], &["--dp-size", "2"]);
    check_paths(&s, &PATHS[..2], "pulled");
    for _ in 0..40 {
        let a = post(
            &s.envoy.url("/v1/completions"),
            body(&s.model, "/v1/completions", false),
            &[],
        );
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let mut ranks = Vec::new();
    for (p, d) in s.prefill.requests().iter().zip(&s.decode.requests()) {
        let (pj, dj) = (p.json(), d.json());
        let rank = pj["routed_dp_rank"].as_u64().expect("prefill rank");
        assert_eq!(dj["disagg_prefill_dp_rank"].as_u64(), Some(rank));
        assert_eq!(
            pj["bootstrap_room"].as_u64().map(|r| r % 4),
            Some(rank),
            "room agrees"
        );
        assert!(
            dj["routed_dp_rank"].as_u64().is_some_and(|r| r < 2),
            "decode rank"
        );
        ranks.push(rank);
    }
    // 4 prefill ranks behind 2 decode ranks: every prefill rank gets work
    // (a uniform draw leaves one idle in 42 requests with p < 1e-5).
    ranks.sort();
    ranks.dedup();
    assert_eq!(ranks, [0, 1, 2, 3], "every prefill rank gets work");
}

#[test]
fn responses_split_for_vllm_nixl_and_the_default_engine() {
    let s = Setup::start("vllm", Some("nixl"), &[], &[]);
    check_paths(&s, &PATHS[2..], "pulled");
    for p in s.prefill.requests() {
        assert_eq!(p.raw("max_output_tokens").as_deref(), Some("1"));
        assert_eq!(p.raw("store").as_deref(), Some("false"));
        assert_eq!(p.raw("stream").as_deref(), Some("false"));
    }
    for d in s.decode.requests() {
        assert_eq!(
            d.raw("max_output_tokens").as_deref(),
            Some("6"),
            "the client's"
        );
        assert!(
            params(&d)["remote_block_ids"].is_array(),
            "the prefill's hand-off"
        );
    }
    drop(s);
    let s = Setup::start("default", None, &[], &[]);
    check_paths(&s, &PATHS[2..], "none");
}

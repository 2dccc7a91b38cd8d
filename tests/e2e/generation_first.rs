//! TensorRT-LLM's generation-first order (`schedule_style:
//! generation_first`): both legs leave at once, the generation naming the
//! context server by what its `GET /server_info` said. The mocks enforce
//! it: the context holds its request until the generation asks for the KV,
//! so a router that awaited the context answer first would fail here.

use crate::engines::client_body;
use crate::handoffs::wait_learned;
use crate::harness::*;
use serde_json::Value;

const MODEL: &str = "test/trtllm";
const KEY: &str = "replace-with-a-random-shared-key";
const PATHS: [&str; 2] = ["/v1/completions", "/v1/chat/completions"];

fn mocks(prefill_args: &[&str], decode_args: &[&str]) -> (Mock, Mock) {
    let mut pa = vec!["--engine", "trtllm", "--role", "prefill"];
    pa.extend(prefill_args);
    let mut da = vec!["--engine", "trtllm", "--role", "decode"];
    da.extend(decode_args);
    (Mock::start("trt-ctx", &pa), Mock::start("trt-gen", &da))
}

fn envoy(p: &Mock, d: &Mock, workers: u32, env: &[(&str, &str)]) -> Envoy {
    let mut config = plugin_config(&[(MODEL, "trtllm", None, &[p], &[d])]);
    config["models"][0]["schedule_style"] = "generation_first".into();
    Envoy::start_full(&config, workers, &[], env)
}

fn params(v: &Value) -> &Value {
    &v["disaggregated_params"]
}

#[test]
fn trtllm_generation_first_sends_both_legs_at_once_paired_by_one_id() {
    // Long waits only bound a failure; a working hand-off never waits them.
    let (p, d) = mocks(
        &["--bootstrap-timeout-ms", "10000", "--ctx-endpoint-list"],
        &["--bootstrap-timeout-ms", "10000", "--auth-key", KEY],
    );
    let envoy = envoy(&p, &d, 2, &[("PD_ROUTER_TRT_AUTH_KEY", KEY)]);
    wait_learned(&envoy, MODEL);
    for path in PATHS {
        for stream in [false, true] {
            let body = client_body(MODEL, path, stream);
            let a = post(&envoy.url(path), body, &[]);
            assert_eq!(a.status, 200, "{path} stream={stream}: {}", a.body);
            assert_eq!(a.header("x-mock-kv"), Some("pulled"), "{path}");
            assert_eq!(a.header("x-mock-pod"), Some("trt-gen"), "{path}");
        }
    }
    let side = p.side.expect("the context server's side channel");
    let (ctxs, gens) = (p.requests(), d.requests());
    assert_eq!(ctxs.len(), 5, "the learned-check request and four more");
    assert_eq!(gens.len(), 5);
    for g in &gens {
        let gj = g.json();
        let gp = params(&gj);
        let id = gp["disagg_request_id"].as_u64().expect("u64 id");
        assert_eq!(gp["request_type"], "generation_only", "{}", g.body);
        assert_eq!(gp["ctx_request_id"].as_u64(), Some(id), "{}", g.body);
        assert_eq!(gp["schedule_style"], 1, "an IntEnum: {}", g.body);
        // The first of the server's list, as TensorRT-LLM's orchestrator
        // takes it.
        assert_eq!(
            gp["ctx_info_endpoint"],
            format!("127.0.0.1:{side}"),
            "{}",
            g.body
        );
        assert_eq!(gp["ctx_dp_rank"], 0, "{}", g.body);
        // No context answer to take ids from: the client's prompt goes.
        assert_eq!(g.raw("prompt_token_ids"), None, "{}", g.body);
        if g.path == "/v1/completions" {
            assert!(gj["prompt"].is_string(), "{}", g.body);
        }
        let sig = g.header("x-trtllm-disagg-auth").expect("signed");
        assert!(sig.starts_with("sha256="), "{sig}");
        let c = ctxs
            .iter()
            .find(|c| params(&c.json())["disagg_request_id"].as_u64() == Some(id))
            .unwrap_or_else(|| panic!("no context leg for {id}"));
        let cj = c.json();
        assert_eq!(params(&cj)["request_type"], "context_only");
        assert_eq!(params(&cj)["schedule_style"], 1);
        assert!(id >= 1 << 42, "{id}");
    }
    envoy.assert_counters_zero();
}

#[test]
fn a_context_that_fails_after_the_generation_left_fails_the_request_at_once() {
    // The context fails once the generation server has asked for the KV,
    // so the generation leg has reached its pod; that pod would wait 30 s
    // for KV that never comes, and the router answers when the context
    // fails instead.
    let (p, d) = mocks(
        &[
            "--fault",
            "fail-when-asked",
            "--bootstrap-timeout-ms",
            "10000",
        ],
        &["--bootstrap-timeout-ms", "30000"],
    );
    let envoy = envoy(&p, &d, 1, &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let a = loop {
        let a = post(
            &envoy.url("/v1/chat/completions"),
            client_body(MODEL, "/v1/chat/completions", true),
            &[],
        );
        if a.status != 503 || std::time::Instant::now() > deadline {
            break a;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(a.status, 502, "{}\n{}", a.body, envoy.log());
    let msg = a.error_message();
    assert!(msg.contains("500"), "{msg}");
    // The generation leg had left: it names the context that failed.
    let gens = d.requests();
    assert_eq!(gens.len(), 1, "one generation leg");
    assert_eq!(params(&gens[0].json())["request_type"], "generation_only");
    assert_eq!(envoy.stat("wasmcustom.pd_router.prefill_failed"), 1);
}

#[test]
fn a_context_server_without_server_info_takes_no_generation_first_prefills() {
    // A vLLM mock answers 404 on /server_info, as a TensorRT-LLM worker
    // without the Python cache transceiver would have nothing to say: the
    // model has no context server to use, and says so.
    let p = Mock::start("not-trt", &["--engine", "vllm", "--role", "prefill"]);
    let (_, d) = mocks(&[], &[]);
    let envoy = envoy(&p, &d, 1, &[]);
    let asked = "GET /server_info failed (status 404)";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while envoy.log_lines_with(asked) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "never asked:\n{}",
            envoy.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let a = post(
        &envoy.url("/v1/completions"),
        client_body(MODEL, "/v1/completions", false),
        &[],
    );
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(a.error_message().contains(MODEL), "{}", a.body);
    assert!(p.requests().is_empty() && d.requests().is_empty());
}

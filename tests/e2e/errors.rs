//! Every error the filter answers with: status, OpenAI-style body, and no
//! upstream reached that should not be.

use crate::harness::*;
use serde_json::json;

#[test]
fn every_error_status() {
    let ok_p = Mock::start("ok-prefill", &["--engine", "default", "--role", "prefill"]);
    let decode = Mock::start("decode", &["--engine", "default", "--role", "decode"]);
    let p500 = Mock::start(
        "p500",
        &[
            "--engine",
            "default",
            "--role",
            "prefill",
            "--fault",
            "status:500",
        ],
    );
    let p400 = Mock::start(
        "p400",
        &[
            "--engine",
            "default",
            "--role",
            "prefill",
            "--fault",
            "status:400",
        ],
    );
    let p429 = Mock::start(
        "p429",
        &[
            "--engine",
            "default",
            "--role",
            "prefill",
            "--fault",
            "status:429",
        ],
    );
    let garbage = Mock::start(
        "garbage",
        &[
            "--engine", "default", "--role", "prefill", "--fault", "garbage",
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
            "delay:5000",
        ],
    );
    let refused = RefusingPort::new();

    let model = |name: &str, prefill: serde_json::Value, decode: &[&Mock]| {
        json!({"name": name, "engine": "default", "rolesets": [{
            "prefill": [prefill],
            "decode": decode.iter().map(|d| d.endpoint()).collect::<Vec<_>>()}]})
    };
    let config = json!({
        "prefill_timeout_ms": 800,
        // No scrapes: a scrape of the refusing pod would eject it first,
        // and its request would get 503 "every pod unhealthy" rather than
        // the 502 of an unreachable prefill (seen on a loaded machine).
        "scrape_interval_ms": 0,
        "max_body_bytes": 65536,
        "models": [
            model("ok", ok_p.endpoint(), &[&decode]),
            model("p500", p500.endpoint(), &[&decode]),
            model("p400", p400.endpoint(), &[&decode]),
            model("p429", p429.endpoint(), &[&decode]),
            model("garbage", garbage.endpoint(), &[&decode]),
            model("slow", slow.endpoint(), &[&decode]),
            model("refused", refused.endpoint(), &[&decode]),
            model("nodecode", ok_p.endpoint(), &[]),
        ]
    });
    let envoy = Envoy::start(&config);
    let url = envoy.url("/v1/completions");
    let body = |m: &str| format!(r#"{{"model":"{m}","prompt":"hello","max_tokens":4}}"#);

    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "malformed JSON",
            r#"{"model":"ok","prompt":"#.into(),
            400,
            "not valid JSON",
        ),
        ("not an object", "[1,2,3]".into(), 400, "JSON object"),
        (
            "wrong type",
            r#"{"model":"ok","prompt":"p","stream":"yes"}"#.into(),
            400,
            "`stream` must be a boolean",
        ),
        (
            "duplicate key",
            r#"{"model":"ok","prompt":"p","max_tokens":1,"max_tokens":99}"#.into(),
            400,
            "more than once",
        ),
        ("unknown model", body("gpt-17"), 404, "gpt-17"),
        (
            "too large",
            format!(r#"{{"model":"ok","prompt":"{}"}}"#, "x".repeat(70_000)),
            413,
            "65536",
        ),
        ("prefill 5xx", body("p500"), 502, "status 500"),
        (
            "prefill 4xx relayed",
            body("p400"),
            400,
            "mock fault: status 400",
        ),
        (
            "prefill 429 relayed",
            body("p429"),
            429,
            "mock fault: status 429",
        ),
        ("unparsable answer", body("garbage"), 502, "not valid JSON"),
        ("prefill timeout", body("slow"), 504, "timed out"),
        ("prefill refused", body("refused"), 502, "unreachable"),
        ("no endpoint", body("nodecode"), 503, "nodecode"),
    ];
    for (what, body, status, needle) in cases {
        let a = post(&url, body, &[]);
        assert_eq!(a.status, status, "{what}: {}", a.body);
        let msg = a.error_message();
        assert!(
            msg.contains(needle),
            "{what}: {msg:?} should mention {needle:?}"
        );
        assert!(
            a.header("content-type")
                .is_some_and(|c| c.contains("application/json")),
            "{what}"
        );
        assert!(
            a.header("x-mock-pod").is_none(),
            "{what}: reached a decode pod"
        );
    }
    let a = post(
        &url,
        b"{\"model\":\"ok\",\"prompt\":\"\xff\"}".to_vec(),
        &[],
    );
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.error_message().contains("UTF-8"));
    // The timeout is the configured one, not the mock's delay.
    let a = post(&url, r#"{"model":"slow","prompt":"p"}"#, &[]);
    assert_eq!(a.status, 504);
    assert!(a.elapsed.as_millis() < 4000, "{:?}", a.elapsed);

    let a = get(&url, &[]);
    assert_eq!(a.status, 405);
    assert!(a.error_message().contains("GET"));

    // No failed request reached the decode pod.
    assert!(decode.requests().is_empty(), "{:?}", decode.requests());
    assert_eq!(envoy.stat("wasm.pd-router.vm_reload"), 0);
}

#[test]
fn a_client_cannot_smuggle_hand_off_data() {
    let prefill = Mock::start("p", &["--engine", "vllm", "--role", "prefill"]);
    let decode = Mock::start("d", &["--engine", "vllm", "--role", "decode"]);
    let sp = Mock::start("sp", &["--engine", "sglang", "--role", "prefill"]);
    let sd = Mock::start("sd", &["--engine", "sglang", "--role", "decode"]);
    let envoy = Envoy::start(&plugin_config(&[
        ("v", "vllm", None, &[&prefill], &[&decode]),
        ("s", "sglang", None, &[&sp], &[&sd]),
        ("t", "trtllm", None, &[&sp], &[&sd]),
    ]));
    for (model, field) in [
        (
            "v",
            r#""kv_transfer_params":{"remote_host":"169.254.169.254","remote_port":80}"#,
        ),
        ("s", r#""bootstrap_host":"169.254.169.254""#),
        (
            "t",
            r#""disaggregated_params":{"request_type":"generation_only"}"#,
        ),
    ] {
        let body = format!(r#"{{"model":"{model}","prompt":"p",{field}}}"#);
        let a = post(&envoy.url("/v1/completions"), body, &[]);
        assert_eq!(a.status, 400, "{}", a.body);
        assert!(a.error_message().contains("set by the router"));
    }
    assert!(prefill.requests().is_empty() && decode.requests().is_empty());
    assert!(sp.requests().is_empty() && sd.requests().is_empty());
}

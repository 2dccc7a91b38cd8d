//! Faults of every kind on either leg: the client's status, the time it
//! took (bounded, far below any engine timeout), and the shared counters back
//! at zero afterwards.

use crate::harness::*;
use serde_json::json;
use std::time::{Duration, Instant};

fn prefill(name: &str, engine: &str, fault: &[&str]) -> Mock {
    let mut a = vec!["--engine", engine, "--role", "prefill"];
    for f in fault {
        a.extend(["--fault", f]);
    }
    Mock::start(name, &a)
}

fn model(
    name: &str,
    engine: &str,
    prefill: serde_json::Value,
    decode: serde_json::Value,
) -> serde_json::Value {
    json!({"name": name, "engine": engine, "rolesets": [{"prefill": [prefill], "decode": [decode]}]})
}

#[test]
fn prefill_faults() {
    let decode = Mock::start("d", &["--engine", "default", "--role", "decode"]);
    let vdecode = Mock::start(
        "vd",
        &["--engine", "vllm", "--role", "decode", "--allow-recompute"],
    );
    let mocks = [
        ("p400", prefill("p400", "default", &["status:400"])),
        ("p429", prefill("p429", "default", &["status:429"])),
        ("p500", prefill("p500", "default", &["status:500"])),
        ("p503", prefill("p503", "default", &["status:503"])),
        ("garbage", prefill("garbage", "default", &["garbage"])),
        ("truncated", prefill("truncated", "default", &["truncate"])),
        ("reset", prefill("reset", "default", &["reset"])),
        ("slow", prefill("slow", "default", &["delay:5000"])),
    ];
    let nohandoff = prefill("nohandoff", "vllm", &["no-kv-params"]);
    let refused = RefusingPort::new();
    let mut models: Vec<_> = mocks
        .iter()
        .map(|(n, m)| model(n, "default", m.endpoint(), decode.endpoint()))
        .collect();
    models.push(model(
        "refused",
        "default",
        refused.endpoint(),
        decode.endpoint(),
    ));
    models.push(model(
        "nohandoff",
        "vllm",
        nohandoff.endpoint(),
        vdecode.endpoint(),
    ));
    let envoy = Envoy::start_with(
        &json!({"prefill_timeout_ms": 700, "prefill_max_retries": 0, "models": models}),
        2,
    );
    let url = envoy.url("/v1/completions");
    let cases: &[(&str, u16, &str)] = &[
        ("p400", 400, "mock fault: status 400"),
        ("p429", 429, "mock fault: status 429"),
        ("p500", 502, "status 500"),
        ("p503", 502, "status 503"),
        ("garbage", 502, "not valid JSON"),
        ("truncated", 502, "prefill"),
        ("reset", 502, "prefill"),
        ("refused", 502, "unreachable"),
        ("slow", 504, "timed out"),
    ];
    for (m, status, needle) in cases {
        let a = post(
            &url,
            format!(r#"{{"model":"{m}","prompt":"p","max_tokens":2}}"#),
            &[],
        );
        assert_eq!(a.status, *status, "{m}: {}", a.body);
        let msg = a.error_message();
        assert!(
            msg.contains(needle),
            "{m}: {msg:?} should mention {needle:?}"
        );
        assert!(
            a.elapsed < Duration::from_secs(3),
            "{m}: took {:?}",
            a.elapsed
        );
    }
    // A prefill answer without hand-off data is not an error: the decode recomputes.
    let a = post(
        &url,
        r#"{"model":"nohandoff","prompt":"p","max_tokens":2}"#,
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-mock-kv"), Some("recomputed"));
    assert!(
        decode.requests().is_empty(),
        "no failed request reached a decode pod"
    );
    envoy.assert_counters_zero();
}

#[test]
fn decode_faults() {
    let p = prefill("p", "default", &[]);
    let fail = Mock::start(
        "dfail",
        &[
            "--engine",
            "default",
            "--role",
            "decode",
            "--fault",
            "status:500",
        ],
    );
    let hang = Mock::start(
        "dhang",
        &["--engine", "default", "--role", "decode", "--fault", "hang"],
    );
    let reset = Mock::start(
        "dreset",
        &[
            "--engine", "default", "--role", "decode", "--fault", "reset",
        ],
    );
    let refused = RefusingPort::new();
    let models = vec![
        model("drefused", "default", p.endpoint(), refused.endpoint()),
        model("dfail", "default", p.endpoint(), fail.endpoint()),
        model("dhang", "default", p.endpoint(), hang.endpoint()),
        model("dreset", "default", p.endpoint(), reset.endpoint()),
    ];
    // The shipped idle timeout (120 s) made short, so a hung decode ends here.
    let envoy = Envoy::start_edited(
        &json!({"models": models}),
        1,
        &[("idle_timeout: 120s", "idle_timeout: 1s")],
    );
    let url = envoy.url("/v1/completions");
    let cases: &[(&str, u16)] = &[
        ("drefused", 503),
        ("dfail", 500),
        ("dhang", 504),
        ("dreset", 503),
    ];
    for (m, status) in cases {
        let a = post(
            &url,
            format!(r#"{{"model":"{m}","prompt":"p","max_tokens":2}}"#),
            &[],
        );
        assert_eq!(a.status, *status, "{m}: {}", a.body);
        // Envoy's own replies are mapped to the OpenAI shape by envoy.yaml.
        assert!(!a.error_message().is_empty(), "{m}");
        assert!(
            a.elapsed < Duration::from_secs(4),
            "{m}: took {:?}",
            a.elapsed
        );
        assert_eq!(a.header("prefill-target-pod"), Some("p"), "{m}");
    }
    envoy.assert_counters_zero();
}

#[test]
fn client_disconnects_on_either_leg() {
    let p = prefill("slowp", "vllm", &["delay:600"]);
    let fast = prefill("fastp", "vllm", &[]);
    let d = Mock::start(
        "d",
        &[
            "--engine",
            "vllm",
            "--role",
            "decode",
            "--stream-delay-ms",
            "100",
        ],
    );
    let envoy = Envoy::start_with(
        &json!({"models": [model("slow", "vllm", p.endpoint(), d.endpoint()), model("fast", "vllm", fast.endpoint(), d.endpoint())]}),
        2,
    );
    let url = envoy.url("/v1/completions");
    // While the prefill is in flight.
    let impatient = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .expect("client");
    for _ in 0..5 {
        assert!(impatient
            .post(&url)
            .body(r#"{"model":"slow","prompt":"p"}"#)
            .send()
            .is_err());
    }
    // While the decode streams.
    for i in 0..5 {
        let body =
            json!({"model": "fast", "prompt": format!("p{i}"), "max_tokens": 40, "stream": true});
        let mut r = http()
            .post(&url)
            .body(body.to_string())
            .send()
            .expect("send");
        let mut buf = [0u8; 32];
        let _ = std::io::Read::read(&mut r, &mut buf);
    }
    // The orphaned prefills finish (600 ms), the aborted streams end.
    std::thread::sleep(Duration::from_millis(700));
    envoy.assert_counters_zero();
    // And the router still serves.
    let a = post(&url, r#"{"model":"fast","prompt":"p","max_tokens":2}"#, &[]);
    assert_eq!(a.status, 200);
}

#[test]
fn async_prefill_failing_after_the_decode_started_keeps_the_stream() {
    let p = prefill("sp", "sglang", &["fail-after-transfer"]);
    let d = Mock::start(
        "sd",
        &[
            "--engine",
            "sglang",
            "--role",
            "decode",
            "--stream-delay-ms",
            "30",
        ],
    );
    let envoy =
        Envoy::start(&json!({"models": [model("s", "sglang", p.endpoint(), d.endpoint())]}));
    let start = Instant::now();
    let a = post(
        &envoy.url("/v1/completions"),
        r#"{"model":"s","prompt":"p","max_tokens":8,"stream":true}"#,
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.events().last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        a.body
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(envoy.stat("wasmcustom.pd_router.prefill_failed"), 1);
    envoy.assert_counters_zero();
}

//! Spans per request received by a real collector: Jaeger's all-in-one
//! (its OTLP/HTTP receiver, in-memory store and query API; `just jaeger`
//! builds it pinned), behind an Envoy cluster the plugin configuration
//! names. The test reads the trace back from Jaeger's query API and checks
//! the spans' parents, and that each leg's request named its span.
//!
//! Without the binary the tests say so and pass, unless
//! `PD_ROUTER_REQUIRE_JAEGER` is set (as `just test-tracing` sets it).

use crate::harness::*;
use crate::kube_real::free_port;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "test/vllm";

fn jaeger_bin() -> Option<PathBuf> {
    let bin = std::env::var_os("JAEGER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".tools/jaeger-v1.75.0/jaeger"));
    if bin.exists() {
        return Some(bin);
    }
    let msg = format!(
        "not found: {} (`just jaeger` builds it; `just test-tracing` builds it and runs these tests)",
        bin.display()
    );
    assert!(
        std::env::var_os("PD_ROUTER_REQUIRE_JAEGER").is_none(),
        "{msg}"
    );
    eprintln!("skipped: {msg}");
    None
}

/// Jaeger on loopback ports of its own, killed on drop.
struct Jaeger {
    _proc: Proc,
    otlp: u16,
    query: u16,
    _scratch: Scratch,
}

impl Jaeger {
    fn start(bin: &PathBuf) -> Jaeger {
        let scratch = Scratch::new("jaeger");
        let (otlp, query, query_grpc) = (free_port(), free_port(), free_port());
        // Every listener on 127.0.0.1; the collector's own telemetry off
        // (it would listen on a fixed port of every interface).
        let config = format!(
            r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: []
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"#
        );
        let path = scratch.0.join("jaeger.yaml");
        std::fs::write(&path, config).expect("write jaeger.yaml");
        let log = std::fs::File::create(scratch.0.join("jaeger.log")).expect("log");
        let proc = Proc::spawn(
            "jaeger",
            Command::new(bin)
                .arg("--config")
                .arg(&path)
                .stdout(Stdio::from(log.try_clone().expect("log")))
                .stderr(Stdio::from(log)),
        );
        let j = Jaeger {
            _proc: proc,
            otlp,
            query,
            _scratch: scratch,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let up = http()
                .get(format!("http://127.0.0.1:{query}/api/services"))
                .send()
                .is_ok_and(|r| r.status().is_success());
            if up && std::net::TcpStream::connect(("127.0.0.1", otlp)).is_ok() {
                return j;
            }
            assert!(
                Instant::now() < deadline,
                "jaeger did not start:\n{}",
                j.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._scratch.0.join("jaeger.log")).unwrap_or_default()
    }

    /// The spans Jaeger holds of `trace`, once it holds `n`.
    fn spans(&self, trace: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got: Vec<Value> = http()
                .get(format!(
                    "http://127.0.0.1:{}/api/traces/{trace}",
                    self.query
                ))
                .send()
                .ok()
                .and_then(|r| r.json::<Value>().ok())
                .and_then(|v| v["data"][0]["spans"].as_array().cloned())
                .unwrap_or_default();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "jaeger holds {} of {n} spans of {trace}: {got:?}",
                got.len()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// envoy.yaml plus an `otel` cluster at `port`.
fn otel_cluster(port: u16) -> String {
    format!(
        "  clusters:\n  - name: otel\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: otel\n      endpoints:\n      - lb_endpoints:\n        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}\n"
    )
}

fn traced_envoy(collector_port: u16, workers: u32, mocks: (&Mock, &Mock)) -> Envoy {
    let mut config = plugin_config(&[(MODEL, "vllm", None, &[mocks.0], &[mocks.1])]);
    config["tracing"] = json!({"cluster": "otel", "service_name": "pd-router-e2e"});
    Envoy::start_full(
        &config,
        workers,
        &[("  clusters:\n", &otel_cluster(collector_port))],
        &[],
    )
}

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

fn parent(span: &Value) -> Option<String> {
    span["references"]
        .as_array()?
        .iter()
        .find(|r| r["refType"] == "CHILD_OF")
        .and_then(|r| r["spanID"].as_str())
        .map(str::to_owned)
}

/// Random lower-case hex: a fresh trace each run (`RandomState` is seeded
/// per instance).
fn random_hex(bytes: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::with_capacity(2 * bytes + 16);
    while out.len() < 2 * bytes {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(out.len());
        out.push_str(&format!("{:016x}", h.finish() | 1));
    }
    out.truncate(2 * bytes);
    out
}

#[test]
fn each_leg_is_a_span_under_the_request_in_the_clients_trace() {
    let Some(bin) = jaeger_bin() else { return };
    let jaeger = Jaeger::start(&bin);
    let prefill = Mock::start("p-traced", &["--engine", "vllm", "--role", "prefill"]);
    let decode = Mock::start("d-traced", &["--engine", "vllm", "--role", "decode"]);
    let envoy = traced_envoy(jaeger.otlp, 2, (&prefill, &decode));
    let (trace, client_span) = (random_hex(16), random_hex(8));
    let traceparent = format!("00-{trace}-{client_span}-01");
    let a = post(
        &envoy.url("/v1/chat/completions"),
        format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Bonjour"}}],"max_tokens":4}}"#
        ),
        &[("traceparent", &traceparent)],
    );
    assert_eq!(a.status, 200, "{}", a.body);

    let spans = jaeger.spans(&trace, 4);
    let by_name = |name: &str| {
        spans
            .iter()
            .find(|s| s["operationName"] == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:?}\n{}", envoy.log()))
    };
    let request = by_name("pd_router.request");
    let request_id = request["spanID"].as_str().expect("span id").to_owned();
    assert_eq!(parent(request).as_deref(), Some(client_span.as_str()));
    for name in ["pd_router.decide", "pd_router.prefill", "pd_router.decode"] {
        assert_eq!(
            parent(by_name(name)).as_deref(),
            Some(request_id.as_str()),
            "{name}"
        );
    }
    let decide = by_name("pd_router.decide");
    assert_eq!(tag(decide, "pd.prefill_pod"), Some(&json!("p-traced")));
    assert_eq!(tag(decide, "pd.decode_pod"), Some(&json!("d-traced")));
    assert!(tag(decide, "pd.cached_tokens").is_some(), "{decide}");
    assert!(tag(decide, "pd.reason").is_some(), "{decide}");
    let prefill_span = by_name("pd_router.prefill");
    assert_eq!(
        tag(prefill_span, "http.response.status_code"),
        Some(&json!(200))
    );
    assert_eq!(tag(request, "http.response.status_code"), Some(&json!(200)));
    // Each leg's request named its own span, in the client's trace.
    let leg = |m: &Mock| {
        m.requests()[0]
            .header("traceparent")
            .expect("traceparent")
            .to_owned()
    };
    let named = |s: &Value| format!("00-{trace}-{}-01", s["spanID"].as_str().unwrap_or(""));
    assert_eq!(leg(&prefill), named(prefill_span));
    assert_eq!(leg(&decode), named(by_name("pd_router.decode")));
    let service = &jaeger_process(&jaeger, &trace, request);
    assert_eq!(service, "pd-router-e2e");
    assert_eq!(envoy.stat("wasmcustom.pd_router.spans_dropped"), 0);
}

/// The service name of `span`'s process in `trace`.
fn jaeger_process(jaeger: &Jaeger, trace: &str, span: &Value) -> String {
    let v: Value = http()
        .get(format!(
            "http://127.0.0.1:{}/api/traces/{trace}",
            jaeger.query
        ))
        .send()
        .expect("query")
        .json()
        .expect("json");
    let pid = span["processID"].as_str().unwrap_or_default();
    v["data"][0]["processes"][pid]["serviceName"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_collector_that_is_down_costs_no_request_and_every_span_is_counted_dropped() {
    if jaeger_bin().is_none() {
        return;
    }
    let prefill = Mock::start("p-lost", &["--engine", "vllm", "--role", "prefill"]);
    let decode = Mock::start("d-lost", &["--engine", "vllm", "--role", "decode"]);
    // Nothing listens there.
    let envoy = traced_envoy(free_port(), 1, (&prefill, &decode));
    for _ in 0..3 {
        let a = post(
            &envoy.url("/v1/completions"),
            format!(r#"{{"model":"{MODEL}","prompt":"hi","max_tokens":2}}"#),
            &[],
        );
        assert_eq!(a.status, 200, "{}", a.body);
    }
    // Four spans a request, each exported once and lost.
    let deadline = Instant::now() + Duration::from_secs(20);
    while envoy.stat("wasmcustom.pd_router.spans_dropped") < 12 {
        assert!(Instant::now() < deadline, "{}", envoy.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(envoy.stat("wasmcustom.pd_router.spans_dropped"), 12);
    assert_eq!(envoy.stat("wasmcustom.pd_router.spans_exported"), 0);
    assert!(envoy.stat("wasmcustom.pd_router.span_exports_failed") >= 1);
    assert!(envoy.log_lines_with("could not export") >= 1);
}

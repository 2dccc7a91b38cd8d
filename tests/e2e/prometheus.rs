//! pd-router's stats as Prometheus sees them: a real Prometheus (Debian's,
//! installed by `just setup`) scrapes Envoy's `/stats/prometheus` after
//! traffic, and finds the per-pod series as one name with labels, the PD
//! histograms with counts, series `promtool` accepts (but for what Envoy's
//! exporter imposes on every series), and data behind every query of the
//! shipped Grafana dashboard.

use crate::harness::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Prometheus on 127.0.0.1, scraping Envoy's admin every 250 ms.
struct Prometheus {
    _proc: Proc,
    url: String,
    _scratch: Scratch,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Prometheus {
    fn start(envoy_admin: u16) -> Prometheus {
        let scratch = Scratch::new("prometheus");
        let config = scratch.0.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{ scrape_interval: 250ms, evaluation_interval: 1s }}\n\
                 scrape_configs:\n\
                 - job_name: envoy\n  metrics_path: /stats/prometheus\n  \
                 static_configs: [ {{ targets: ['127.0.0.1:{envoy_admin}'] }} ]\n"
            ),
        )
        .expect("prometheus.yml");
        // The port is picked before Prometheus binds it, so a mock a
        // parallel test starts meanwhile can take it; Prometheus then exits,
        // and is started again on another.
        let (proc, url) = (0..3)
            .find_map(|_| Prometheus::spawn_ready(&config, &scratch))
            .expect("prometheus exited before it was ready, three times (its port taken each time, or it fails to start: run it by hand)");
        Prometheus {
            _proc: proc,
            url,
            _scratch: scratch,
        }
    }

    /// Prometheus on a port of its own, once it answers ready; `None` if it
    /// exited first (its port taken by another process).
    fn spawn_ready(config: &Path, scratch: &Scratch) -> Option<(Proc, String)> {
        let port = free_port();
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                scratch.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut proc = Proc::spawn("prometheus", &mut cmd);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !http()
            .get(format!("{url}/-/ready"))
            .send()
            .is_ok_and(|r| r.status().is_success())
        {
            if let Ok(Some(_)) = proc.child.try_wait() {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus never became ready (is it installed? `just setup`)"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some((proc, url))
    }

    fn query(&self, q: &str) -> Vec<Value> {
        let encoded: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let v: Value = http()
            .get(format!("{}/api/v1/query?query={encoded}", self.url))
            .send()
            .and_then(|r| r.json())
            .expect("query");
        assert_eq!(v["status"], "success", "{q}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits (15 s at most) until `q` has a result.
    fn wait_for(&self, q: &str) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let r = self.query(q);
            if !r.is_empty() {
                return r;
            }
            assert!(Instant::now() < deadline, "prometheus never saw {q}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn prometheus_sees_per_pod_labels_histograms_and_every_dashboard_query() {
    let p = Mock::start("vllm-p0", &["--engine", "vllm", "--role", "prefill"]);
    let d = Mock::start("vllm-d0", &["--engine", "vllm", "--role", "decode"]);
    // Histograms reach the exporter at each stats flush.
    let envoy = Envoy::start_edited(
        &plugin_config(&[("test/vllm", "vllm", Some("nixl"), &[&p], &[&d])]),
        1,
        &[("\nadmin:\n", "\nstats_flush_interval: 0.2s\nadmin:\n")],
    );
    // Scraping before the traffic, so rates have a before and an after.
    let prom = Prometheus::start(envoy.admin);
    prom.wait_for(r#"up{job="envoy"} == 1"#);
    prom.wait_for("pd_router_split");
    for i in 0..6 {
        let body = json!({"model": "test/vllm", "prompt": format!("p{i}"), "max_tokens": 3, "stream": i % 2 == 0});
        let a = post(&envoy.url("/v1/completions"), body.to_string(), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
    }
    // A local reply, so the by-status series exists.
    let a = post(
        &envoy.url("/v1/completions"),
        r#"{"model":"nope","prompt":"p"}"#,
        &[],
    );
    assert_eq!(a.status, 404, "{}", a.body);

    // Every request counted, on both pods.
    prom.wait_for(r#"sum(pd_router_pod_selected{pd_pod="vllm-p0"}) == 6"#);
    prom.wait_for(r#"sum(pd_router_pod_selected{pd_pod="vllm-d0"}) == 6"#);
    let selected = prom.query("pd_router_pod_selected");
    let pods: BTreeSet<(String, String)> = selected
        .iter()
        .map(|s| {
            let m = &s["metric"];
            assert_eq!(m["pd_model"], "test/vllm", "{s}");
            assert_eq!(m["pd_roleset"], "rs0", "{s}");
            (
                m["pd_pod"].as_str().unwrap_or_default().to_owned(),
                m["pd_role"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        pods,
        BTreeSet::from([
            ("vllm-d0".into(), "decode".into()),
            ("vllm-p0".into(), "prefill".into())
        ]),
        "one series name, a label set per pod"
    );
    // One sample per split request in each (histograms reach the exporter
    // at Envoy's next stats flush).
    for h in [
        "prefill_duration",
        "first_byte_duration",
        "routing_duration",
    ] {
        prom.wait_for(&format!(
            r#"pd_router_{h}_count{{pd_model="test/vllm"}} == 6"#
        ));
    }
    prom.wait_for(r#"pd_router_replies{pd_status="404"}"#);
    // A histogram series is born with its first flush, so when all six
    // samples land in that flush Prometheus has no "before" for `rate`. A
    // second batch after the series is scraped gives it one.
    for i in 0..4 {
        let body = json!({"model": "test/vllm", "prompt": format!("q{i}"), "max_tokens": 3});
        let a = post(&envoy.url("/v1/completions"), body.to_string(), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
    }
    prom.wait_for(r#"pd_router_routing_duration_count{pd_model="test/vllm"} == 10"#);
    prom.wait_for(
        "histogram_quantile(0.5, sum by (le) (rate(pd_router_routing_duration_bucket[1m]))) > 0",
    );

    // promtool: nothing but what Envoy imposes on every series.
    let text = http()
        .get(format!("http://127.0.0.1:{}/stats/prometheus", envoy.admin))
        .send()
        .and_then(|r| r.text())
        .expect("stats");
    let ours: String = text
        .split_inclusive('\n')
        .filter(|l| l.contains("pd_router"))
        .collect();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (just setup installs it)");
    std::io::Write::write_all(promtool.stdin.as_mut().expect("stdin"), ours.as_bytes())
        .expect("write");
    let out = promtool.wait_with_output().expect("promtool");
    let lint =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "promtool refused the exposition:\n{lint}"
    );
    let other: Vec<&str> = lint
        .lines()
        .filter(|l| {
            !l.ends_with("no help text")
                && !l.ends_with(r#"counter metrics should have "_total" suffix"#)
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(other.is_empty(), "promtool: {other:?}");

    // The dashboard: its schema, then every query has data here.
    let queries = Command::new("node")
        .arg(repo().join("deploy/grafana/validate.mjs"))
        .current_dir(repo())
        .output()
        .expect("node (just setup installs it)");
    assert!(
        queries.status.success(),
        "dashboard: {}",
        String::from_utf8_lossy(&queries.stderr)
    );
    let mut check = Command::new("python3")
        .arg(repo().join("deploy/grafana/check_queries.py"))
        .args([
            "--require-data",
            "--allow-empty",
            "discovery",
            // Admission is off here: nothing waits, no queue time.
            "--allow-empty",
            "admission_waiting|queue_duration",
            &prom.url,
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("check_queries");
    std::io::Write::write_all(check.stdin.as_mut().expect("stdin"), &queries.stdout)
        .expect("write");
    let out = check.wait_with_output().expect("check_queries");
    assert!(
        out.status.success(),
        "dashboard queries:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

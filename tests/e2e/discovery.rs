//! Pods discovered from a (mock) Kubernetes API server through Envoy: no
//! static endpoints; one list, then bounded watches; the pod set changes
//! under load; API trouble (watches cut, expired, the API down) keeps the
//! last good pod set, and its age says so.

use crate::harness::*;
use crate::kube_api::{KubeApi, KubePod};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const TOKEN: &str = "t0k3n-e2e";
/// List mode: how often the filter lists pods; watch mode: the backoff's base.
const INTERVAL_MS: u64 = 200;
/// Each watch's window (timeoutSeconds) in these tests.
const WATCH_SECONDS: u64 = 1;

/// envoy.yaml plus a `kube_api` cluster pointing at the mock API server.
pub(crate) fn kube_cluster(api: &KubeApi) -> String {
    format!(
        "  clusters:\n  - name: kube_api\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: kube_api\n      endpoints:\n      - lb_endpoints:\n        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}}}\n",
        api.port
    )
}

pub(crate) fn discovery_config(models: Value) -> Value {
    json!({
        "prefill_timeout_ms": 5000,
        "scrape_interval_ms": 0,
        "discovery": {"kubernetes": {
            "cluster": "kube_api", "namespace": "default",
            "interval_ms": INTERVAL_MS, "timeout_ms": 1000,
            "watch_seconds": WATCH_SECONDS}},
        "models": models
    })
}

fn start_envoy(api: &KubeApi, config: &Value, concurrency: u32) -> Envoy {
    let cluster = kube_cluster(api);
    Envoy::start_full(
        config,
        concurrency,
        &[("  clusters:\n", cluster.as_str())],
        &[("PD_ROUTER_KUBE_TOKEN", TOKEN)],
    )
}

/// The pod as the API lists it, pointing at `mock`.
fn as_pod(mock: &Mock, model: &str, engine: &str, role: &str, roleset: &str) -> KubePod {
    let mut p = KubePod::new(&mock.name, "127.0.0.1", mock.http)
        .label("model.aibrix.ai/name", model)
        .label("model.aibrix.ai/engine", engine)
        .label("model.aibrix.ai/port", &mock.http.to_string());
    if !role.is_empty() {
        p = p.label("role-name", role);
    }
    if !roleset.is_empty() {
        p = p.label("roleset-name", roleset);
    }
    if let Some(b) = mock.bootstrap {
        p = p.annotation("model.aibrix.ai/sglang-bootstrap-port", &b.to_string());
    }
    p
}

/// Waits until the filter has asked for the pods twice since now (a list
/// or a watch: the second began after the first, which saw the change,
/// ended, and what it saw was published) and every worker VM routes by
/// one set.
fn wait_for_lists(api: &KubeApi, envoy: &Envoy) {
    api.clear_requests();
    let deadline = Instant::now() + Duration::from_secs(15);
    while api.pod_requests().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the filter stopped calling the API"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_until("every worker routes by the published set", || {
        envoy.applied_pod_set().is_some()
    });
}

/// Waits until every VM routes by one discovered set newer than generation
/// `after`, for which `ready` holds (given its pod count); returns its
/// generation. Answers alone cannot show this: a request lands on any
/// VM, and a run of them can miss the one that has not applied the change
/// yet.
pub(crate) fn one_set(envoy: &Envoy, after: u64, ready: impl Fn(u64) -> bool) -> u64 {
    let mut agreed = 0;
    wait_until("every VM routes by one set", || {
        match envoy.applied_pod_set() {
            Some((g, pods)) if g > after && ready(pods) => {
                agreed = g;
                envoy.applied_pod_set() == Some((g, pods))
            }
            _ => false,
        }
    });
    agreed
}

/// Waits (15 s at most) until `done`, naming `what` if it never is.
pub(crate) fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn is_watch(r: &crate::kube_api::KubeRequest) -> bool {
    r.query.get("watch").map(String::as_str) == Some("1")
}

fn completion(model: &str, i: usize) -> String {
    json!({"model": model, "prompt": format!("request {i}"), "max_tokens": 2}).to_string()
}

#[test]
fn pods_are_discovered_and_followed_through_changes_under_load() {
    let api = KubeApi::start(TOKEN);
    let vllm = |name: &str, role: &str| {
        Mock::start(
            name,
            &["--engine", "vllm", "--role", role, "--model", "llama"],
        )
    };
    let sglang = |name: &str, role: &str| {
        Mock::start(
            name,
            &[
                "--engine",
                "sglang",
                "--role",
                role,
                "--model",
                "qwen",
                "--bootstrap-timeout-ms",
                "3000",
            ],
        )
    };
    let lp0 = vllm("llama-p0", "prefill");
    let ld0 = vllm("llama-d0", "decode");
    let ld1 = vllm("llama-d1", "decode");
    let lp1 = vllm("llama-p1", "prefill");
    let ld2 = vllm("llama-d2", "decode");
    let qp = sglang("qwen-p0", "prefill");
    let qd = sglang("qwen-d0", "decode");
    let mut pods = vec![
        as_pod(&lp0, "llama", "vllm", "prefill", "rs0"),
        as_pod(&ld0, "llama", "vllm", "decode", "rs0"),
        as_pod(&ld1, "llama", "vllm", "decode", "rs0"),
        as_pod(&lp1, "llama", "vllm", "prefill", "rs1"),
        as_pod(&ld2, "llama", "vllm", "decode", "rs1"),
        as_pod(&qp, "qwen", "sglang", "prefill", "a"),
        as_pod(&qd, "qwen", "sglang", "decode", "a"),
    ];
    api.set_pods(&pods);
    let envoy = start_envoy(&api, &discovery_config(json!([])), 2);
    wait_for_lists(&api, &envoy);
    let url = envoy.url("/v1/completions");

    // Both models, both rolesets, no static endpoint anywhere.
    let mut seen = HashMap::new();
    for i in 0..40 {
        let model = if i % 2 == 0 { "llama" } else { "qwen" };
        let a = post(&url, completion(model, i), &[]);
        assert_eq!(a.status, 200, "{model}: {}\n{}", a.body, envoy.log());
        *seen
            .entry(a.header("prefill-target-pod").unwrap_or("").to_owned())
            .or_insert(0) += 1;
    }
    for p in ["llama-p0", "llama-p1", "qwen-p0"] {
        assert!(seen.contains_key(p), "{p} never used: {seen:?}");
    }
    assert_eq!(envoy.stat("wasmcustom.pd_router.discovery.pods"), 7);
    assert_eq!(envoy.stat("wasmcustom.pd_router.discovery.failures"), 0);
    let listed = api.pod_requests();
    assert!(
        listed.iter().all(|r| r.authorized),
        "the token from the VM environment is sent"
    );
    // One list, then only watches from a resourceVersion.
    let lists: Vec<_> = listed.iter().skip(1).filter(|r| !is_watch(r)).collect();
    assert!(
        lists.is_empty(),
        "the pods are watched, not listed again: {lists:?}\n{}",
        envoy.log()
    );
    for w in listed.iter().filter(|r| is_watch(r)) {
        assert_eq!(w.query.get("timeoutSeconds").map(String::as_str), Some("1"));
        assert_eq!(
            w.query.get("allowWatchBookmarks").map(String::as_str),
            Some("true")
        );
        assert!(w.query.get("resourceVersion").is_some_and(|v| v != "0"));
        assert_eq!(
            w.query.get("fieldSelector").map(String::as_str),
            Some("status.phase=Running")
        );
    }

    // A load runs while the pod set changes under it.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (stop, sent, failures, url) = (
                Arc::clone(&stop),
                Arc::clone(&sent),
                Arc::clone(&failures),
                url.clone(),
            );
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) || i < 130 {
                    let model = if (w + i) % 3 == 0 { "qwen" } else { "llama" };
                    let a = post(&url, completion(model, w * 10_000 + i), &[]);
                    if a.status != 200 {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{model}: {} {}", a.status, a.body));
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    let served = |m: &Mock| m.requests().len();
    let mut must_stay_idle: Vec<(&Mock, usize, &str)> = Vec::new();

    // 1. A decode pod leaves the API (its process stays up: any request it
    //    still got would succeed, so only the counts can tell).
    std::thread::sleep(Duration::from_millis(300));
    pods.retain(|p| p.name != "llama-d1");
    api.set_pods(&pods);
    wait_for_lists(&api, &envoy);
    must_stay_idle.push((&ld1, served(&ld1), "removed decode pod"));

    // 2. A prefill pod turns unready: its roleset has no prefill left.
    if let Some(p) = pods.iter_mut().find(|p| p.name == "llama-p1") {
        *p = p.clone().unready();
    }
    api.set_pods(&pods);
    wait_for_lists(&api, &envoy);
    must_stay_idle.push((&lp1, served(&lp1), "unready prefill pod"));

    // 3. A decode pod joins rs0.
    let ld3 = vllm("llama-d3", "decode");
    pods.push(as_pod(&ld3, "llama", "vllm", "decode", "rs0"));
    api.set_pods(&pods);
    wait_for_lists(&api, &envoy);

    // 4. A pod is re-created at a new address under its old name.
    let ld0_new = vllm("llama-d0", "decode");
    if let Some(p) = pods.iter_mut().find(|p| p.name == "llama-d0") {
        *p = as_pod(&ld0_new, "llama", "vllm", "decode", "rs0");
    }
    api.set_pods(&pods);
    wait_for_lists(&api, &envoy);
    must_stay_idle.push((&ld0, served(&ld0), "old address of a re-created pod"));

    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let total = sent.load(Ordering::Relaxed);
    assert!(total >= 500, "only {total} requests in the load");
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {total} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    for (mock, before, what) in must_stay_idle {
        assert_eq!(
            served(mock),
            before,
            "{what} {} got requests after the next list",
            mock.name
        );
    }
    assert!(served(&ld3) > 0, "the new decode pod serves");
    assert!(
        served(&ld0_new) > 0,
        "the re-created pod serves at its new address"
    );
    envoy.assert_counters_zero();
}

#[test]
fn api_trouble_keeps_the_last_good_pod_set() {
    let api = KubeApi::start(TOKEN);
    let p = Mock::start(
        "m-p0",
        &["--engine", "vllm", "--role", "prefill", "--model", "m"],
    );
    let d = Mock::start(
        "m-d0",
        &["--engine", "vllm", "--role", "decode", "--model", "m"],
    );
    api.set_pods(&[
        as_pod(&p, "m", "vllm", "prefill", "rs0"),
        as_pod(&d, "m", "vllm", "decode", "rs0"),
    ]);
    // A configured model that no pod serves: 503 naming it, as without discovery.
    let envoy = start_envoy(
        &api,
        &discovery_config(json!([
            {"name": "lonely", "engine": "vllm", "rolesets": []},
            {"name": "m", "engine": "vllm", "rolesets": []}
        ])),
        2,
    );
    wait_for_lists(&api, &envoy);
    let url = envoy.url("/v1/completions");
    let ok = |why: &str| {
        for i in 0..5 {
            let a = post(&url, completion("m", i), &[]);
            assert_eq!(a.status, 200, "{why}: {}", a.body);
        }
    };
    ok("before any trouble");
    let a = post(&url, completion("lonely", 0), &[]);
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(a.error_message().contains("`lonely`"), "{}", a.body);

    let failures = || envoy.stat("wasmcustom.pd_router.discovery.failures");
    for mode in [
        "unavailable",
        "unauthorized",
        "garbage",
        "reset",
        "forbidden",
    ] {
        let before = failures();
        api.set_mode(mode);
        wait_for_lists(&api, &envoy);
        ok(mode);
        assert!(failures() > before, "{mode}: counted");
        assert_eq!(
            envoy.stat("wasmcustom.pd_router.discovery.pods"),
            2,
            "{mode}: the set stays"
        );
    }
    // Slower than the call's timeout: no answer, same rule.
    let before = failures();
    api.set_mode_delay("slow", 1500);
    // The ModelAdapters read counts its own timeouts in `failures` and
    // can meet the slow answers first: the log count below needs the pod
    // calls' own failure before the mode changes back.
    wait_until("a timed-out pod call is reported", || {
        envoy.log_lines_with(
            "keeping the last good pod set: the API server did not answer: timed out",
        ) >= 1
    });
    assert!(failures() > before, "slow: counted");
    ok("slow");

    // Back to normal, and a change is picked up again.
    api.set_mode("ok");
    let p1 = Mock::start(
        "m-p1",
        &["--engine", "vllm", "--role", "prefill", "--model", "m"],
    );
    api.set_pods(&[
        as_pod(&p1, "m", "vllm", "prefill", "rs0"),
        as_pod(&d, "m", "vllm", "decode", "rs0"),
    ]);
    wait_for_lists(&api, &envoy);
    let a = post(&url, completion("m", 99), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("m-p1"));
    // One log line per change of state, not one per failed list.
    assert_eq!(
        envoy.log_lines_with("the API server call failed"),
        6,
        "{}",
        envoy.log()
    );
    assert!(
        envoy.log_lines_with("the API server answers again") >= 1,
        "{}",
        envoy.log()
    );
    envoy.assert_counters_zero();
}

#[test]
fn lists_page_through_a_consistent_snapshot() {
    let api = KubeApi::start(TOKEN);
    let p = Mock::start(
        "pg-p0",
        &["--engine", "vllm", "--role", "prefill", "--model", "m"],
    );
    let d = Mock::start(
        "pg-d0",
        &["--engine", "vllm", "--role", "decode", "--model", "m"],
    );
    // 25 pods that do not serve (other roles) around the two that do.
    let mut pods: Vec<KubePod> = (0..25)
        .map(|i| {
            KubePod::new(&format!("pg-x{i:02}"), "127.0.0.1", 1)
                .label("model.aibrix.ai/name", "m")
                .label("role-name", "worker")
        })
        .collect();
    pods.push(as_pod(&p, "m", "vllm", "prefill", "rs0"));
    pods.push(as_pod(&d, "m", "vllm", "decode", "rs0"));
    api.set_pods(&pods);
    let mut config = discovery_config(json!([]));
    config["discovery"]["kubernetes"]["page_size"] = json!(4);
    config["discovery"]["kubernetes"]["list_from_cache"] = json!(false);
    // List mode: a list every interval_ms, no watch.
    config["discovery"]["kubernetes"]["watch"] = json!(false);
    let envoy = start_envoy(&api, &config, 1);
    wait_for_lists(&api, &envoy);
    let a = post(&envoy.url("/v1/completions"), completion("m", 0), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    let requests = api.pod_requests();
    assert!(
        requests.iter().any(|r| r.query.contains_key("continue")),
        "paged"
    );
    assert!(requests
        .iter()
        .all(|r| r.query.get("limit").map(String::as_str) == Some("4")));
    assert!(requests
        .iter()
        .all(|r| !r.query.contains_key("resourceVersion") && !is_watch(r)));
    assert_eq!(envoy.stat("wasmcustom.pd_router.discovery.pods"), 2);
}

/// A load that runs until stopped and records every failure.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(url: &str, model: &'static str, workers: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let workers = (0..workers)
            .map(|w| {
                let (stop, sent, failures, url) = (
                    Arc::clone(&stop),
                    Arc::clone(&sent),
                    Arc::clone(&failures),
                    url.to_owned(),
                );
                std::thread::spawn(move || {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let a = post(&url, completion(model, w * 100_000 + i), &[]);
                        if a.status != 200 {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{} {}", a.status, a.body));
                        }
                        sent.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                })
            })
            .collect();
        Load {
            stop,
            sent,
            failures,
            workers,
        }
    }

    /// Stops it; fails the test if any request failed.
    fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers {
            w.join().unwrap();
        }
        let total = self.sent.load(Ordering::Relaxed);
        let failures = self.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{} of {total} failed: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        total
    }
}

#[test]
fn watches_survive_cuts_expiry_and_an_outage_and_the_age_says_so() {
    let api = KubeApi::start(TOKEN);
    let vllm = |name: &str, role: &str| {
        Mock::start(name, &["--engine", "vllm", "--role", role, "--model", "w"])
    };
    let (p0, d0, d1) = (
        vllm("w-p0", "prefill"),
        vllm("w-d0", "decode"),
        vllm("w-d1", "decode"),
    );
    let pod = |m: &Mock, role: &str| as_pod(m, "w", "vllm", role, "rs0");
    let mut pods = vec![pod(&p0, "prefill"), pod(&d0, "decode")];
    api.set_pods(&pods);
    let mut config = discovery_config(json!([{"name": "w", "engine": "vllm", "rolesets": []}]));
    config["discovery"]["kubernetes"]["stale_after_ms"] = json!(2000);
    let envoy = start_envoy(&api, &config, 2);
    wait_for_lists(&api, &envoy);
    let relists = || envoy.stat("wasmcustom.pd_router.discovery.relists");
    let age = || envoy.stat("wasmcustom.pd_router.discovery.age_ms");
    let load = Load::start(&envoy.url("/v1/completions"), "w", 3);
    // The selector names the configured model only.
    let first = api.pod_requests();
    assert!(
        first
            .iter()
            .all(|r| r.query.get("labelSelector").map(String::as_str)
                == Some("model.aibrix.ai/name in (w)")),
        "{first:?}"
    );

    // 1. The API server's history moves past the watch's resourceVersion
    //    (an ERROR 410 inside a 200): a fresh list, then watches again.
    api.compact();
    wait_until("the expired watch is answered by a list", || relists() >= 1);
    wait_until("a list after the 410", || {
        api.pod_requests().iter().any(|r| !is_watch(r))
    });
    // 2. An HTTP 410 on the watch: the same.
    api.set_mode("gone");
    wait_until("the second relist", || relists() >= 2);
    api.set_mode("ok");
    // 3. A watch cut mid-stream (no final chunk): counted, then watched
    //    again from the same resourceVersion; a change made after the cut
    //    still arrives. (Made before it, the watch open under "ok" could
    //    carry it and the resumed watch would be untested.)
    let failures = envoy.stat("wasmcustom.pd_router.discovery.failures");
    api.set_mode("truncated");
    wait_until("the cut watch is counted", || {
        envoy.stat("wasmcustom.pd_router.discovery.failures") > failures
    });
    assert_eq!(envoy.stat("wasmcustom.pd_router.discovery.pods"), 2);
    pods.push(pod(&d1, "decode"));
    api.set_pods(&pods);
    api.set_mode("ok");
    wait_for_lists(&api, &envoy);
    assert_eq!(envoy.stat("wasmcustom.pd_router.discovery.pods"), 3);
    // 4. The API server down for longer than stale_after_ms: the set stays,
    //    its age rises past the bound and is said; back, it falls again.
    api.set_mode("reset");
    wait_until("the age passes stale_after_ms", || age() > 2000);
    assert!(
        envoy.log_lines_with("s old (stale_after_ms 2000)") >= 1,
        "{}",
        envoy.log()
    );
    api.set_mode("ok");
    wait_until("the age falls again", || age() < 2000);
    assert!(envoy.log_lines_with("the pod set is current again") >= 1);
    assert_eq!(envoy.stat("wasmcustom.pd_router.discovery.pods"), 3);

    let sent = load.finish();
    assert!(sent >= 100, "only {sent} requests in the load");
    assert!(
        !d1.requests().is_empty(),
        "the pod added under a cut watch serves"
    );
    envoy.assert_counters_zero();
}

/// A projected ServiceAccount token volume as kubelet lays it out: the file
/// behind `..data`, a symlink swapped atomically on rotation.
pub(crate) struct ProjectedToken {
    dir: std::path::PathBuf,
    generation: u32,
}

impl ProjectedToken {
    pub(crate) fn new(dir: &std::path::Path, token: &str) -> ProjectedToken {
        let mut t = ProjectedToken {
            dir: dir.to_owned(),
            generation: 0,
        };
        t.rotate(token);
        std::os::unix::fs::symlink("..data/token", dir.join("token")).expect("token symlink");
        t
    }

    /// Writes `token` into a new timestamped directory and renames a fresh
    /// `..data` symlink over the old one, as kubelet's AtomicWriter does.
    pub(crate) fn rotate(&mut self, token: &str) {
        self.generation += 1;
        let ts = format!(
            "..2026_12_03_00_00_{:02}.{}",
            self.generation, self.generation
        );
        std::fs::create_dir(self.dir.join(&ts)).expect("token dir");
        std::fs::write(self.dir.join(&ts).join("token"), token).expect("token");
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&ts, &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
    }
}

/// The minor version of the Envoy under test (`envoy --version`).
pub(crate) fn envoy_minor() -> u32 {
    let out = std::process::Command::new(envoy_bin())
        .arg("--version")
        .output()
        .expect("envoy --version");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split('/')
        .find_map(|part| part.strip_prefix("1.")?.split('.').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no version in {text:?}"))
}

/// The kube_api cluster of deploy/: Envoy adds the token from a file (SDS
/// with a watched directory), here over plain HTTP to the mock. Envoy 1.37
/// and later add the "Bearer " (`header_value_prefix`); for 1.36 (Istio
/// 1.28) the file holds it, as deploy/istio's sidecar writes it.
pub(crate) fn injecting_cluster(
    port: u16,
    sds: &std::path::Path,
    watched: &std::path::Path,
) -> String {
    let prefix = if envoy_minor() >= 37 {
        "\n                header_value_prefix: \"Bearer \""
    } else {
        ""
    };
    format!(
        r#"  clusters:
  - name: kube_api
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: kube_api
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http_protocol_options: {{}}}}
        http_filters:
        - name: envoy.filters.http.credential_injector
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector
            overwrite: true
            credential:
              name: envoy.http.injected_credentials.generic
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic
                credential:
                  name: kube_api_token
                  sds_config:
                    path_config_source:
                      path: {sds}
                      watched_directory: {{path: {watched}}}
                header: Authorization{prefix}
        - name: envoy.filters.http.upstream_codec
          typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec}}
"#,
        sds = sds.display(),
        watched = watched.display(),
    )
}

#[test]
fn envoy_adds_a_projected_token_and_follows_its_rotation() {
    let api = KubeApi::start("token-one");
    let p = Mock::start(
        "t-p0",
        &["--engine", "vllm", "--role", "prefill", "--model", "t"],
    );
    let d = Mock::start(
        "t-d0",
        &["--engine", "vllm", "--role", "decode", "--model", "t"],
    );
    api.set_pods(&[
        as_pod(&p, "t", "vllm", "prefill", ""),
        as_pod(&d, "t", "vllm", "decode", ""),
    ]);
    let scratch = Scratch::new("projected-token");
    let watched = scratch.0.join("token-volume");
    std::fs::create_dir(&watched).expect("volume dir");
    // What the file holds: the token, or (Envoy 1.36) "Bearer <token>".
    let bearer = |t: &str| {
        if envoy_minor() >= 37 {
            t.to_owned()
        } else {
            format!("Bearer {t}")
        }
    };
    let mut token = ProjectedToken::new(&watched, &bearer("token-one"));
    let sds = scratch.0.join("token-sds.yaml");
    std::fs::write(
        &sds,
        format!(
            "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: kube_api_token\n  generic_secret: {{secret: {{filename: {}}}}}\n",
            watched.join("token").display()
        ),
    )
    .expect("sds file");
    let cluster = injecting_cluster(api.port, &sds, &watched);
    // File-based SDS needs a node; no token in the VM environment.
    let envoy = Envoy::start_full(
        &discovery_config(json!([])),
        2,
        &[
            ("  clusters:\n", cluster.as_str()),
            (
                "static_resources:\n",
                "node: {id: pd-router-test, cluster: pd-router-test}\nstatic_resources:\n",
            ),
        ],
        &[],
    );
    wait_for_lists(&api, &envoy);
    let url = envoy.url("/v1/completions");
    assert_eq!(post(&url, completion("t", 0), &[]).status, 200);
    assert!(
        api.requests().iter().all(|r| r.authorized),
        "Envoy adds the token"
    );

    // kubelet rotates the token; the API server stops taking the old one.
    api.set_token("token-two");
    token.rotate(&bearer("token-two"));
    api.clear_requests();
    wait_until("the rotated token is sent", || {
        api.requests().iter().filter(|r| r.authorized).count() >= 2
    });
    let failures = envoy.stat("wasmcustom.pd_router.discovery.failures");
    wait_for_lists(&api, &envoy);
    assert!(
        api.requests().iter().all(|r| r.authorized),
        "only the new token once rotated: {:?}",
        api.requests()
    );
    assert_eq!(
        envoy.stat("wasmcustom.pd_router.discovery.failures"),
        failures
    );
    assert_eq!(post(&url, completion("t", 1), &[]).status, 200);
}

/// A port free on every address of `hosts` (an InferencePool gives all its
/// pods one target port; here each pod has a loopback address of its own).
pub(crate) fn common_port(hosts: &[&str]) -> u16 {
    for _ in 0..50 {
        let probe = std::net::TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
        let port = probe.local_addr().expect("addr").port();
        drop(probe);
        if hosts
            .iter()
            .all(|h| std::net::TcpListener::bind((*h, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no port free on {hosts:?}")
}

#[test]
fn an_inference_pool_of_llm_d_pods_splits_follows_its_selector_and_outlives_deletion() {
    let api = KubeApi::start(TOKEN);
    let hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let port = common_port(&hosts);
    let engine = |name: &str, role: &str, host: &str| {
        let listen = format!("{host}:{port}");
        Mock::start(
            name,
            &[
                "--engine", "vllm", "--role", role, "--model", "qwen", "--listen", &listen,
            ],
        )
    };
    let pa = engine("pool-a-p0", "prefill", hosts[0]);
    let da = engine("pool-a-d0", "decode", hosts[1]);
    let pb = engine("pool-b-p0", "prefill", hosts[2]);
    let db = engine("pool-b-d0", "decode", hosts[3]);
    // llm-d's labels; the pool's port, not the mocks', is the pods' port.
    let pod = |m: &Mock, role: &str, app: &str, host: &str| {
        KubePod::new(&m.name, host, 1)
            .label("llm-d.ai/role", role)
            .label("app", app)
    };
    api.set_pods(&[
        pod(&pa, "prefill", "a", hosts[0]),
        pod(&da, "decode", "a", hosts[1]),
        pod(&pb, "prefill", "b", hosts[2]),
        pod(&db, "decode", "b", hosts[3]),
    ]);
    api.set_pools(&[("qwen-pool", &[("app", "a")], &[port])]);
    let mut config = discovery_config(json!([{"name": "qwen", "engine": "vllm", "rolesets": []}]));
    config["discovery"]["kubernetes"]["labels"] = json!("llm-d");
    config["discovery"]["kubernetes"]["inference_pool"] =
        json!({"name": "qwen-pool", "model": "qwen"});
    let envoy = start_envoy(&api, &config, 2);
    wait_for_lists(&api, &envoy);
    let url = envoy.url("/v1/completions");
    // The pool is read first, then its pods listed: wait for both.
    let first = one_set(&envoy, 0, |pods| pods == 2);
    let a = post(&url, completion("qwen", 0), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("pool-a-p0"));
    assert_eq!(a.header("decode-target-pod"), Some("pool-a-d0"));
    assert!(api
        .requests()
        .iter()
        .any(|r| r.path.ends_with("/inferencepools/qwen-pool")));

    // Under load, the pool selects other pods: within an interval (and a
    // watch window) the requests move there.
    let load = Load::start(&url, "qwen", 3);
    std::thread::sleep(Duration::from_millis(500));
    api.set_pools(&[("qwen-pool", &[("app", "b")], &[port])]);
    one_set(&envoy, first, |_| {
        let a = post(&url, completion("qwen", 1), &[]);
        a.header("decode-target-pod") == Some("pool-b-d0")
    });
    let (pa_seen, da_seen) = (pa.requests().len(), da.requests().len());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(pa.requests().len(), pa_seen, "no prefill on the old pods");
    assert_eq!(da.requests().len(), da_seen, "no decode on the old pods");

    // The pool is deleted: the last good set serves on, a failure counted.
    let failures = envoy.stat("wasmcustom.pd_router.discovery.failures");
    api.set_pools(&[]);
    wait_until("the missing pool is counted", || {
        envoy.stat("wasmcustom.pd_router.discovery.failures") > failures
    });
    assert!(
        envoy.log_lines_with("does not exist") >= 1,
        "{}",
        envoy.log()
    );
    std::thread::sleep(Duration::from_millis(1000));
    let sent = load.finish();
    assert!(sent >= 50, "only {sent} requests");
    let a = post(&url, completion("qwen", 2), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("pool-b-p0"));
    envoy.assert_counters_zero();
}

/// Whether the next `n` answers to `body` on `url` all have `status`.
fn settled(url: &str, body: &str, status: u16, n: usize) -> bool {
    (0..n).all(|_| post(url, body.to_owned(), &[]).status == status)
}

#[test]
fn model_adapters_route_to_their_instance_pods_and_leave_with_their_object() {
    let api = KubeApi::start(TOKEN);
    // The adapter is loaded on p1 and d1 only: the others answer it 404.
    let vllm = |name: &str, role: &str, lora: bool| {
        let mut args = vec!["--engine", "vllm", "--role", role, "--model", "llama"];
        if lora {
            args.extend(["--lora", "sql"]);
        }
        Mock::start(name, &args)
    };
    let (p0, p1) = (
        vllm("ad-p0", "prefill", false),
        vllm("ad-p1", "prefill", true),
    );
    let (d0, d1) = (
        vllm("ad-d0", "decode", false),
        vllm("ad-d1", "decode", true),
    );
    let pods: Vec<KubePod> = [
        (&p0, "prefill"),
        (&p1, "prefill"),
        (&d0, "decode"),
        (&d1, "decode"),
    ]
    .into_iter()
    .map(|(m, role)| as_pod(m, "llama", "vllm", role, "rs0"))
    .collect();
    api.set_pods(&pods);
    let sql: &[&str] = &["ad-p1", "ad-d1"];
    api.set_adapters(&[("sql", "llama", sql)]);
    let envoy = start_envoy(&api, &discovery_config(json!([])), 2);
    let url = envoy.url("/v1/completions");
    let embeddings = envoy.url("/v1/embeddings");
    // The pods and the adapter are listed apart: the set that serves it.
    let served = one_set(&envoy, 0, |_| settled(&url, &completion("sql", 0), 200, 1));
    let models = get(&envoy.url("/v1/models"), &[]).json();
    let ids: Vec<(&str, &Value)> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| (m["id"].as_str().unwrap_or_default(), &m["parent"]))
        .collect();
    assert_eq!(ids, [("llama", &Value::Null), ("sql", &json!("llama"))]);

    // Split and routed-by-model calls of the adapter reach its pods only;
    // the base model keeps all four.
    for i in 0..20 {
        let a = post(&url, completion("sql", i), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(
            (
                a.header("prefill-target-pod"),
                a.header("decode-target-pod")
            ),
            (Some("ad-p1"), Some("ad-d1"))
        );
        let e = post(
            &embeddings,
            json!({"model": "sql", "input": "x"}).to_string(),
            &[],
        );
        assert_eq!(e.status, 200, "{}", e.body);
        let b = post(&url, completion("llama", i), &[]);
        assert_eq!(b.status, 200, "{}", b.body);
    }
    let named = |m: &Mock, model: &str| {
        m.requests()
            .iter()
            .filter(|r| r.model.as_deref() == Some(model))
            .count()
    };
    assert_eq!(
        (named(&p0, "sql"), named(&d0, "sql")),
        (0, 0),
        "no adapter call on a pod without it"
    );
    assert!(
        named(&p1, "sql") >= 20 && named(&d1, "sql") >= 40,
        "split and embeddings"
    );
    assert!(
        named(&p0, "llama") + named(&d0, "llama") > 0,
        "the base model on every pod"
    );

    // Its pods unloaded it (the object stays, its instances empty): 503.
    api.set_adapters(&[("sql", "llama", &[])]);
    let unloaded = one_set(&envoy, served, |_| true);
    assert!(
        settled(&url, &completion("sql", 0), 503, 6),
        "no pod serves it"
    );
    let a = post(
        &embeddings,
        json!({"model": "sql", "input": "x"}).to_string(),
        &[],
    );
    assert_eq!(a.status, 503, "{}", a.body);

    // The object deleted: an unknown model after the next list.
    api.set_adapters(&[]);
    one_set(&envoy, unloaded, |_| true);
    assert!(
        settled(&url, &completion("sql", 0), 404, 6),
        "the adapter is unknown"
    );
    let a = post(&url, completion("sql", 1), &[]);
    assert!(a.error_message().contains("sql"), "{}", a.body);
    assert!(settled(&url, &completion("llama", 0), 200, 4));
    assert_eq!(envoy.stat("wasmcustom.pd_router.discovery.failures"), 0);
    let listed = api.requests();
    assert!(listed.iter().any(|r| r.path
        == "/apis/model.aibrix.ai/v1alpha1/namespaces/default/modeladapters"
        && r.query.get("resourceVersion").map(String::as_str) == Some("0")));
    envoy.assert_counters_zero();
}

/// A vLLM pod pair of model `m` for the admission tests: the decode streams
/// a token every 100 ms, so a request of N tokens holds it N/10 s.
fn slow_pair(name: &str) -> (Mock, Mock) {
    let p = Mock::start(
        &format!("{name}-p"),
        &["--engine", "vllm", "--role", "prefill", "--model", "m"],
    );
    let d = Mock::start(
        &format!("{name}-d"),
        &[
            "--engine",
            "vllm",
            "--role",
            "decode",
            "--model",
            "m",
            "--stream-delay-ms",
            "100",
        ],
    );
    (p, d)
}

fn streamed(url: &str, id: &str, tokens: u32) -> Answer {
    let body = json!({"model": "m", "prompt": format!("prompt of {id}"),
                      "max_tokens": tokens, "stream": true});
    post(url, body.to_string(), &[("x-request-id", id)])
}

fn seen_by(mock: &Mock, prefix: &str) -> usize {
    mock.requests()
        .iter()
        .filter(|r| {
            r.header("x-request-id")
                .is_some_and(|id| id.starts_with(prefix))
        })
        .count()
}

fn admission_config() -> Value {
    let mut c = discovery_config(json!([]));
    c["admission"] = json!({"max_in_flight_per_pod": 1, "queue_ttl_ms": 30000});
    c
}

fn waiting(envoy: &Envoy) -> u64 {
    envoy
        .stats("wasmcustom.pd_router.admission.waiting")
        .iter()
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn queued_requests_go_to_pods_that_join_while_they_wait() {
    let api = KubeApi::start(TOKEN);
    let (p0, d0) = slow_pair("adm-a");
    let (p1, d1) = slow_pair("adm-b");
    let first = vec![
        as_pod(&p0, "m", "vllm", "prefill", "a"),
        as_pod(&d0, "m", "vllm", "decode", "a"),
    ];
    api.set_pods(&first);
    let envoy = start_envoy(&api, &admission_config(), 4);
    wait_for_lists(&api, &envoy);
    let url = envoy.url("/v1/completions");
    let held_done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // 12 s of decode hold the only pair.
        let held = s.spawn(|| {
            let a = streamed(&url, "held", 120);
            held_done.store(true, std::sync::atomic::Ordering::SeqCst);
            a
        });
        wait_until("the held request is placed", || seen_by(&p0, "held") == 1);
        let queued: Vec<_> = (0..3)
            .map(|i| {
                let (url, done) = (&url, &held_done);
                s.spawn(move || {
                    let a = streamed(url, &format!("queued-{i}"), 2);
                    (a, done.load(std::sync::atomic::Ordering::SeqCst))
                })
            })
            .collect();
        wait_until("three requests wait", || waiting(&envoy) == 3);
        // A second pair joins while they wait.
        let mut both = first.clone();
        both.push(as_pod(&p1, "m", "vllm", "prefill", "b"));
        both.push(as_pod(&d1, "m", "vllm", "decode", "b"));
        api.set_pods(&both);
        for q in queued {
            let (a, held_was_done) = q.join().expect("queued");
            assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
            assert_eq!(a.header("prefill-target-pod"), Some("adm-b-p"));
            assert!(
                !held_was_done,
                "served by the new pair, not after the held request"
            );
        }
        assert_eq!(held.join().expect("held").status, 200);
    });
    assert_eq!(seen_by(&p1, "queued-"), 3);
    assert_eq!(seen_by(&p0, "queued-"), 0);
    envoy.assert_counters_zero();
}

#[test]
fn queued_requests_never_go_to_pods_that_left_while_they_wait() {
    let api = KubeApi::start(TOKEN);
    let (p0, d0) = slow_pair("left-a");
    let (p1, d1) = slow_pair("left-b");
    let stays = vec![
        as_pod(&p0, "m", "vllm", "prefill", "a"),
        as_pod(&d0, "m", "vllm", "decode", "a"),
    ];
    let mut both = stays.clone();
    both.push(as_pod(&p1, "m", "vllm", "prefill", "b"));
    both.push(as_pod(&d1, "m", "vllm", "decode", "b"));
    api.set_pods(&both);
    let envoy = start_envoy(&api, &admission_config(), 4);
    wait_for_lists(&api, &envoy);
    let url = envoy.url("/v1/completions");
    std::thread::scope(|s| {
        // One pair held 10 s, then the other 5 s: both full.
        let long = s.spawn(|| streamed(&url, "long", 100));
        wait_until("the long request is placed", || {
            seen_by(&p0, "long") + seen_by(&p1, "long") == 1
        });
        let short = s.spawn(|| streamed(&url, "short", 50));
        wait_until("the short request is placed", || {
            seen_by(&p0, "short") + seen_by(&p1, "short") == 1
        });
        let short_on_b = seen_by(&p1, "short") == 1;
        let queued = s.spawn(|| streamed(&url, "queued", 2));
        wait_until("one request waits", || waiting(&envoy) == 1);
        // The pair serving the shorter request leaves the fleet; its request
        // still ends, and its pods then have no load: they must not read as
        // free.
        let (leaving_p, staying_p) = if short_on_b { (&p1, &p0) } else { (&p0, &p1) };
        let remaining = if short_on_b {
            stays.clone()
        } else {
            both[2..].to_vec()
        };
        api.set_pods(&remaining);
        wait_for_lists(&api, &envoy);
        assert_eq!(short.join().expect("short").status, 200);
        let a = queued.join().expect("queued");
        assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
        assert_eq!(seen_by(leaving_p, "queued"), 0, "a departed pod was chosen");
        assert_eq!(seen_by(staying_p, "queued"), 1);
        assert_eq!(long.join().expect("long").status, 200);
    });
    envoy.assert_counters_zero();
}

/// llm-d's `encode` role (llm-d-router `filter/bylabel/roles.go`): a pod so
/// labelled joins its model as an encoder, and a media request to a model
/// with `ec_connector` is encoded there before its prefill (which fails
/// any item not encoded).
#[test]
fn llm_d_encode_pods_are_discovered_and_encode_the_media() {
    let api = KubeApi::start(TOKEN);
    let hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let port = common_port(&hosts);
    let engine = |name: &str, role: &str, host: &str, extra: &[&str]| {
        let listen = format!("{host}:{port}");
        let mut args = vec![
            "--engine", "vllm", "--role", role, "--model", "qwen", "--listen", &listen,
        ];
        args.extend(extra);
        Mock::start(name, &args)
    };
    let nixl = ["--ec-connector", "nixl"];
    let enc = engine("llmd-e0", "encode", hosts[0], &nixl);
    let p = engine("llmd-p0", "prefill", hosts[1], &nixl);
    let d = engine("llmd-d0", "decode", hosts[2], &[]);
    let pod = |m: &Mock, role: &str, host: &str| {
        KubePod::new(&m.name, host, 1)
            .label("llm-d.ai/role", role)
            .label("app", "epd")
    };
    api.set_pods(&[
        pod(&enc, "encode", hosts[0]),
        pod(&p, "prefill", hosts[1]),
        pod(&d, "decode", hosts[2]),
    ]);
    api.set_pools(&[("qwen-pool", &[("app", "epd")], &[port])]);
    let mut config = discovery_config(json!([{"name": "qwen", "engine": "vllm",
        "ec_connector": "nixl", "rolesets": []}]));
    config["discovery"]["kubernetes"]["labels"] = json!("llm-d");
    config["discovery"]["kubernetes"]["inference_pool"] =
        json!({"name": "qwen-pool", "model": "qwen"});
    let envoy = start_envoy(&api, &config, 2);
    wait_for_lists(&api, &envoy);
    one_set(&envoy, 0, |pods| pods == 3);
    let body = json!({"model": "qwen", "max_tokens": 3, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}]});
    let a = post(&envoy.url("/v1/chat/completions"), body.to_string(), &[]);
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    assert_eq!(a.header("prefill-target-pod"), Some("llmd-p0"));
    assert_eq!(enc.requests().len(), 1, "the image went to the encoder");
    assert!(p.requests()[0].raw("ec_transfer_params").is_some());
    envoy.assert_counters_zero();
}

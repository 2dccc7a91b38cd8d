//! pd-router executing the picks of a real endpoint picker: the Gateway API
//! Inference Extension's EPP (GIE v1.5.0's runner, its ext_proc server over
//! TLS, its InferencePool reconciler and metrics scraping) with llm-d's
//! prefill/decode plugins as `tools/epp/pd.go` writes them (llm-d-router
//! itself is refused by the Go module proxy: docs/testing.md). It runs
//! against a real kube-apiserver and etcd (`kube_real.rs`) holding GIE
//! v1.5.0's own InferencePool CRD, the shipped InferencePool and
//! llm-d-labelled pods whose status the test writes; the pods are mock
//! engines on 127.0.0.2–5, one port for all (the pool's target port).
//! Envoy runs `deploy/envoy-epp`'s envoy.yaml as shipped, with only its
//! addresses, paths and ports made local.
//!
//! The EPP scores KV-cache use only (`tools/epp/pd-config.yaml`) and the
//! mocks report loads on which pd-router's own policies (queues) choose the
//! other pod of each role: where each leg lands says who chose it.
//!
//! The binaries come from `just epp` and `just kube-apiserver`; without them
//! the tests say so and pass, unless `PD_ROUTER_REQUIRE_EPP` is set (as
//! `just test-epp` sets it).

use crate::discovery::{common_port, envoy_minor, ProjectedToken};
use crate::harness::*;
use crate::kube_real::{free_port, shipped_rbac, RealKube};
use serde_json::json;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The shipped pool (deploy/inference-pool/inferencepool.yaml).
const POOL: &str = "qwen3-8b-pool";
const MODEL: &str = "qwen3-8b";

fn path_from(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(default))
}

/// The EPP binary and GIE v1.5.0's InferencePool CRD beside it (`just
/// epp`), when they and the API server's binaries are there.
fn binaries() -> Option<(PathBuf, PathBuf)> {
    let epp = path_from("EPP_BIN", ".tools/epp-v1.5.0/epp");
    let crd = epp.with_file_name("inferencepools.yaml");
    let needed = [
        epp.clone(),
        crd.clone(),
        path_from("KUBE_APISERVER_BIN", ".tools/kube/bin/kube-apiserver"),
        path_from("ETCD_BIN", ".tools/kube/bin/etcd"),
    ];
    let missing: Vec<String> = needed
        .iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return Some((epp, crd));
    }
    let msg = format!(
        "not found: {} (`just epp` builds the endpoint picker, `just kube-apiserver` the API server; `just test-epp` runs both and these tests)",
        missing.join(", ")
    );
    assert!(std::env::var_os("PD_ROUTER_REQUIRE_EPP").is_none(), "{msg}");
    eprintln!("skipped: {msg}");
    None
}

/// The endpoint picker, killed on drop.
struct Epp {
    proc: Proc,
    grpc: u16,
    log: PathBuf,
    _scratch: Scratch,
}

impl Epp {
    fn start(bin: &Path, kube: &RealKube) -> Epp {
        let scratch = Scratch::new("epp");
        let log = scratch.0.join("epp.log");
        let (grpc, health, metrics) = (free_port(), free_port(), free_port());
        let mut cmd = Command::new(bin);
        cmd.args(["--pool-name", POOL, "--pool-namespace", "llm"])
            .args(["--grpc-port", &grpc.to_string()])
            .args(["--grpc-health-port", &health.to_string()])
            .args(["--metrics-port", &metrics.to_string()])
            .arg("--config-file")
            .arg(repo().join("tools/epp/pd-config.yaml"))
            // No collector to send traces to.
            .arg("--tracing=false")
            .env("KUBECONFIG", kube.kubeconfig())
            .stdin(Stdio::null())
            .stdout(File::create(&log).expect("epp log"))
            .stderr(File::create(scratch.0.join("epp.err")).expect("epp err"));
        let proc = Proc::spawn("epp", &mut cmd);
        let epp = Epp {
            proc,
            grpc,
            log,
            _scratch: scratch,
        };
        // Its ext_proc server listens once the manager runs.
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", grpc)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the endpoint picker never listened:\n{}",
                epp.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        epp
    }

    /// Its log (stdout, stderr).
    fn log(&self) -> String {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        format!(
            "{}{}",
            read(self.log.clone()),
            read(self.log.with_file_name("epp.err"))
        )
    }

    /// Its "pd pick" lines (pd.go's PreRequest: the decode and prefill pods
    /// it named), in order.
    fn picks(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains("pd pick"))
            .map(str::to_owned)
            .collect()
    }
}

/// A mock vLLM pod of `role` on `host:port` reporting `load` on /metrics.
fn engine(name: &str, role: &str, host: &str, port: u16, load: &[&str]) -> Mock {
    let listen = format!("{host}:{port}");
    let mut args = vec![
        "--engine", "vllm", "--role", role, "--model", MODEL, "--listen", &listen,
    ];
    args.extend_from_slice(load);
    Mock::start(name, &args)
}

/// The cluster of one test: the API server with the CRD, the pool and four
/// pods; the mocks behind them; the endpoint picker.
struct Fleet {
    p0: Mock,
    p1: Mock,
    d0: Mock,
    d1: Mock,
    epp: Epp,
    /// The API server goes after the picker (fields drop in order).
    kube: RealKube,
}

fn fleet(epp_bin: &Path, crd: &Path) -> Fleet {
    let kube = RealKube::start();
    kube.apply(&shipped_rbac());
    // GIE v1.5.0's CRD as released (`create`: too large for `apply`'s
    // last-applied annotation).
    kube.kubectl(&["create", "-f", &crd.display().to_string()], None);
    kube.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "inferencepools.inference.networking.k8s.io",
        ],
        None,
    );
    kube.kubectl(
        &[
            "get",
            "--raw",
            "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools",
        ],
        None,
    );
    let hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let port = common_port(&hosts);
    // The EPP scores KV-cache use: p1 and d1 (empty caches). pd-router's
    // policies count queues: p0 (nothing queued) and d0 (nothing running).
    let p0 = engine(
        "epp-p0",
        "prefill",
        hosts[0],
        port,
        &["--report-kv-usage", "0.9"],
    );
    let p1 = engine(
        "epp-p1",
        "prefill",
        hosts[1],
        port,
        &["--report-kv-usage", "0", "--report-waiting", "4"],
    );
    let d0 = engine(
        "epp-d0",
        "decode",
        hosts[2],
        port,
        &["--report-kv-usage", "0.9"],
    );
    let d1 = engine(
        "epp-d1",
        "decode",
        hosts[3],
        port,
        &["--report-kv-usage", "0", "--report-running", "4"],
    );
    // The shipped pool, its target port the mocks' one.
    let pool = std::fs::read_to_string(repo().join("deploy/inference-pool/inferencepool.yaml"))
        .expect("inferencepool.yaml");
    assert!(pool.contains("- number: 8000"), "{pool}");
    kube.apply(&pool.replace("- number: 8000", &format!("- number: {port}")));
    for (m, role) in [
        (&p0, "prefill"),
        (&p1, "prefill"),
        (&d0, "decode"),
        (&d1, "decode"),
    ] {
        let labels = json!({"llm-d.ai/guide": "pd-disaggregation", "llm-d.ai/model": MODEL,
                            "llm-d.ai/role": role});
        kube.add_pod(&m.name, &m.host, labels, json!({}));
    }
    let epp = Epp::start(epp_bin, &kube);
    Fleet {
        p0,
        p1,
        d0,
        d1,
        epp,
        kube,
    }
}

/// deploy/envoy-epp's envoy.yaml as shipped, made local: the listener and
/// admin on ports of the kernel's choosing, the built module, the picker
/// and the API server on 127.0.0.1, the token and CA files in `dir`.
/// Each replacement must match, so a changed shipped file fails loudly;
/// `variant`: further replacements, to misconfigure it.
fn shipped_envoy_yaml(fleet: &Fleet, dir: &Path, variant: &[(&str, &str)]) -> String {
    let file = std::fs::read_to_string(repo().join("deploy/envoy-epp/envoy-config.yaml"))
        .expect("deploy/envoy-epp/envoy-config.yaml");
    let mut lines = file.lines().skip_while(|l| l.trim() != "envoy.yaml: |");
    assert!(lines.next().is_some(), "no envoy.yaml in the ConfigMap");
    let mut yaml: String = lines
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();

    // The projected token volume and the SDS file deploy/values ships.
    let volume = dir.join("token-volume");
    std::fs::create_dir(&volume).expect("volume dir");
    let token = fleet.kube.token();
    let token = if envoy_minor() >= 37 {
        token
    } else {
        format!("Bearer {token}")
    };
    let _token = ProjectedToken::new(&volume, &token);
    std::fs::copy(&fleet.kube.ca, volume.join("ca.crt")).expect("ca.crt");
    let sds = dir.join("token-sds.yaml");
    std::fs::write(
        &sds,
        format!(
            "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: kube_api_token\n  generic_secret:\n    secret:\n      filename: {}\n",
            volume.join("token").display()
        ),
    )
    .expect("sds");

    let edits = [
        (
            "socket_address: { address: 0.0.0.0, port_value: 10000 }".to_owned(),
            "socket_address: { address: 127.0.0.1, port_value: 0 }".to_owned(),
        ),
        (
            "socket_address: { address: 127.0.0.1, port_value: 9901 }".to_owned(),
            "socket_address: { address: 127.0.0.1, port_value: 0 }".to_owned(),
        ),
        (
            "filename: /etc/pd-router/plugin.wasm".to_owned(),
            format!("filename: {}", wasm_path().display()),
        ),
        (
            "socket_address: { address: llm-d-epp.llm.svc.cluster.local, port_value: 9002 }"
                .to_owned(),
            format!(
                "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
                fleet.epp.grpc
            ),
        ),
        (
            "socket_address: { address: kubernetes.default.svc, port_value: 443 }".to_owned(),
            format!(
                "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
                fleet.kube.port
            ),
        ),
        (
            "/etc/pd-router-sds/token-sds.yaml".to_owned(),
            sds.display().to_string(),
        ),
        (
            "/var/run/secrets/pd-router".to_owned(),
            volume.display().to_string(),
        ),
    ];
    for (from, to) in &edits {
        assert!(yaml.contains(from.as_str()), "envoy.yaml has no {from:?}");
        yaml = yaml.replace(from.as_str(), to);
    }
    for (from, to) in variant {
        assert!(yaml.contains(from), "envoy.yaml has no {from:?}");
        yaml = yaml.replace(from, to);
    }
    yaml
}

fn completion(i: usize) -> String {
    json!({"model": MODEL, "prompt": format!("picked by the EPP {i}"), "max_tokens": 2}).to_string()
}

/// Waits (up to 60 s) until `n` answers in a row are 200 with the same
/// (prefill, decode) pods: the picker has the pool, its pods and their
/// metrics, and pd-router has discovered the same pods.
fn settled(envoy: &Envoy, fleet: &Fleet, n: usize) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    let mut streak = 0;
    let mut i = 1000;
    loop {
        i += 1;
        let a = post(&envoy.url("/v1/completions"), completion(i), &[]);
        let pods = (a.status == 200).then(|| {
            let pod = |h: &str| a.header(h).unwrap_or_default().to_owned();
            (pod("prefill-target-pod"), pod("decode-target-pod"))
        });
        if pods.is_some() && pods == last {
            streak += 1;
        } else {
            streak = usize::from(pods.is_some());
        }
        last = pods;
        if streak >= n {
            return last.unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "never settled: last answer {} {}\nEnvoy:\n{}\nEPP:\n{}",
            a.status,
            a.body,
            envoy.log(),
            fleet.epp.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn the_real_pickers_prefill_and_decode_picks_are_the_pods_pd_router_uses() {
    let Some((epp_bin, crd)) = binaries() else {
        return;
    };
    let fleet = fleet(&epp_bin, &crd);
    let scratch = Scratch::new("epp-envoy");
    let envoy = Envoy::start_yaml(&shipped_envoy_yaml(&fleet, &scratch.0, &[]), 1, &[]);
    assert_eq!(
        settled(&envoy, &fleet, 3),
        (fleet.p1.name.clone(), fleet.d1.name.clone()),
        "the picker's choice (least KV-cache use)"
    );

    let picks_before = fleet.epp.picks().len();
    let counts = |m: &Mock| m.requests().len();
    let before = [&fleet.p0, &fleet.p1, &fleet.d0, &fleet.d1].map(counts);
    let n = 8;
    for i in 0..n {
        let a = post(&envoy.url("/v1/completions"), completion(i), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("prefill-target-pod"), Some(fleet.p1.name.as_str()));
        assert_eq!(a.header("decode-target-pod"), Some(fleet.d1.name.as_str()));
    }
    let after = [&fleet.p0, &fleet.p1, &fleet.d0, &fleet.d1].map(counts);
    let got: Vec<usize> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    assert_eq!(
        got,
        [0, n, 0, n],
        "requests received by p0, p1, d0, d1: each leg on the picked pod"
    );
    // The picker's own record of its decisions names the same pods.
    let picks = fleet.epp.picks();
    let new = picks.get(picks_before..).unwrap_or_default();
    assert_eq!(new.len(), n, "one pick per request:\n{}", new.join("\n"));
    for line in new {
        assert!(
            line.contains(&fleet.d1.address()) && line.contains(&fleet.p1.address()),
            "the picker named other pods: {line}"
        );
    }
    // The picker's header reached neither engine.
    assert!(fleet
        .d1
        .requests()
        .iter()
        .all(|r| r.header("x-prefiller-host-port").is_none()));
    // Over TLS, the bodies streamed both ways; no request without a pick.
    assert!(envoy.stat("cluster.epp.ssl.handshake") > 0);
    assert_eq!(envoy.stat("http.pd.ext_proc.streams_failed"), 0);
    assert_eq!(envoy.stat("wasmcustom.pd_router.epp_pick_missing"), 0);
    envoy.assert_counters_zero();
}

#[test]
fn an_unreachable_picker_fails_requests_and_a_fail_open_one_is_counted_and_logged() {
    let Some((epp_bin, crd)) = binaries() else {
        return;
    };
    let mut fleet = fleet(&epp_bin, &crd);
    let scratch = Scratch::new("epp-envoy");
    let envoy = Envoy::start_yaml(&shipped_envoy_yaml(&fleet, &scratch.0, &[]), 1, &[]);
    settled(&envoy, &fleet, 2);

    // The picker goes away: as shipped (failure_mode_allow: false) the
    // client gets Envoy's error, never an answer pd-router placed.
    fleet.epp.proc.kill();
    let before = [&fleet.p0, &fleet.p1, &fleet.d0, &fleet.d1].map(|m| m.requests().len());
    for i in 0..3 {
        let a = post(&envoy.url("/v1/completions"), completion(100 + i), &[]);
        assert_eq!(a.status, 500, "{}", a.body);
        assert!(a.header("decode-target-pod").is_none());
    }
    let after = [&fleet.p0, &fleet.p1, &fleet.d0, &fleet.d1].map(|m| m.requests().len());
    assert_eq!(before, after, "no engine saw a request");
    assert!(envoy.stat("http.pd.ext_proc.streams_failed") >= 3);
    assert_eq!(envoy.stat("wasmcustom.pd_router.epp_pick_missing"), 0);
    drop(envoy);

    // failure_mode_allow: true does not open it either: with the bodies
    // FULL_DUPLEX_STREAMED, Envoy (1.40) still answers 500.
    let open = [("failure_mode_allow: false", "failure_mode_allow: true")];
    let scratch = Scratch::new("epp-envoy-allow");
    let envoy = Envoy::start_yaml(&shipped_envoy_yaml(&fleet, &scratch.0, &open), 1, &[]);
    let a = post(&envoy.url("/v1/completions"), completion(110), &[]);
    assert_eq!(a.status, 500, "{}", a.body);
    assert_eq!(envoy.stat("http.pd.ext_proc.failure_mode_allowed"), 0);
    assert_eq!(envoy.stat("wasmcustom.pd_router.epp_pick_missing"), 0);
    drop(envoy);

    // A picker that does fail open (failure_mode_allow: true, the request
    // body buffered and the response's not sent): pd-router places the
    // requests itself, on the pods its own policies prefer, and says so:
    // a counter, and one log line naming the likely cause.
    let open = [
        ("failure_mode_allow: false", "failure_mode_allow: true"),
        (
            "request_body_mode: FULL_DUPLEX_STREAMED",
            "request_body_mode: BUFFERED",
        ),
        (
            "response_body_mode: FULL_DUPLEX_STREAMED",
            "response_body_mode: NONE",
        ),
    ];
    let scratch = Scratch::new("epp-envoy-open");
    let envoy = Envoy::start_yaml(&shipped_envoy_yaml(&fleet, &scratch.0, &open), 1, &[]);
    // Its policies prefer p0 and d0 once it has scraped their queues; until
    // its first scrape (up to a second after Envoy starts) it has no
    // metrics and may place anywhere, which a prefix then keeps.
    let own = (fleet.p0.name.clone(), fleet.d0.name.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while settled(&envoy, &fleet, 3) != own {
        assert!(
            Instant::now() < deadline,
            "pd-router never placed on its own policies' pods {own:?}\n{}",
            envoy.log()
        );
    }
    assert!(envoy.stat("http.pd.ext_proc.failure_mode_allowed") >= 3);
    let missing = envoy.stat("wasmcustom.pd_router.epp_pick_missing");
    assert!(missing >= 3, "every request counted: {missing}");
    assert_eq!(
        envoy.log_lines_with("no x-gateway-destination-endpoint from the endpoint picker"),
        1,
        "logged once a minute, not per request:\n{}",
        envoy.log()
    );
    // It names the likely cause (the whole log: its tail may be past it).
    assert_eq!(
        envoy.log_lines_with("failing open (failure_mode_allow: true)"),
        1
    );
}

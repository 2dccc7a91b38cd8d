//! The mock Kubernetes API server (`tests/kube/mock_kube_api.py`) as a test
//! fixture: pod discovery LISTs Pods from it through an Envoy cluster. It
//! runs under the project's venv (`just setup` installs PyPI `kubernetes`,
//! whose models shape its answers), binds 127.0.0.1 on a port the kernel
//! picks, and is killed on drop like every other process here.

use crate::harness::{http, repo, tail, Proc, Scratch};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::File;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running mock API server. `port` serves both the Kubernetes API (bearer
/// token required) and the unauthenticated control API under `/_mock/`.
#[allow(dead_code)]
pub struct KubeApi {
    pub port: u16,
    // Dropped in order: the process is killed before its files go.
    _proc: Proc,
    scratch: Scratch,
}

#[allow(dead_code)]
impl KubeApi {
    /// Starts the server accepting `Authorization: Bearer <token>`, waiting
    /// (20 s at most) for its READY line.
    pub fn start(token: &str) -> KubeApi {
        let python = repo().join(".venv/bin/python");
        assert!(
            python.exists(),
            "{} not found (run `just setup`, which installs the mock's packages)",
            python.display()
        );
        let scratch = Scratch::new("kube-api");
        let stdout = scratch.0.join("stdout");
        let stderr = scratch.0.join("stderr");
        let mut cmd = Command::new(python);
        cmd.arg(repo().join("tests/kube/mock_kube_api.py"))
            .args(["--listen", "127.0.0.1:0", "--token", token])
            .current_dir(repo())
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("mock kube api stdout"))
            .stderr(File::create(&stderr).expect("mock kube api stderr"));
        let proc = Proc::spawn("mock kube api", &mut cmd);
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            let out = std::fs::read_to_string(&stdout).unwrap_or_default();
            if let Some(line) = out.lines().next().filter(|_| out.contains('\n')) {
                let json = line
                    .strip_prefix("READY ")
                    .unwrap_or_else(|| panic!("mock kube api: unexpected first line {line:?}"));
                let v: Value = serde_json::from_str(json).expect("READY json");
                break v["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .expect("READY port");
            }
            assert!(
                Instant::now() < deadline,
                "mock kube api did not print READY:\n{}",
                tail(&stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        KubeApi {
            port,
            _proc: proc,
            scratch,
        }
    }

    /// `127.0.0.1:port`, for an Envoy cluster's endpoint.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Replaces the whole pod set (the list's resourceVersion grows);
    /// returns the new resourceVersion.
    pub fn set_pods(&self, pods: &[KubePod]) -> String {
        let v = self.control(
            reqwest::Method::PUT,
            "/_mock/pods",
            Some(serde_json::json!(pods)),
        );
        v["resourceVersion"]
            .as_str()
            .expect("resourceVersion")
            .to_owned()
    }

    /// One of `ok`, `unauthorized`, `forbidden`, `unavailable`, `garbage`,
    /// `truncated`, `reset`, `slow`, `expire_continue`, `too_many_requests`,
    /// `gone`, `no_bookmarks` (tests/kube/mock_kube_api.py says what each
    /// does).
    pub fn set_mode(&self, mode: &str) {
        self.control(
            reqwest::Method::PUT,
            "/_mock/mode",
            Some(serde_json::json!({ "mode": mode })),
        );
    }

    /// Like [`KubeApi::set_mode`], with the delay of mode `slow`.
    pub fn set_mode_delay(&self, mode: &str, delay_ms: u64) {
        self.control(
            reqwest::Method::PUT,
            "/_mock/mode",
            Some(serde_json::json!({ "mode": mode, "delay_ms": delay_ms })),
        );
    }

    /// Replaces the InferencePools (in namespace `default`).
    pub fn set_pools(&self, pools: &[Pool]) {
        let body: Vec<Value> = pools
            .iter()
            .map(|(name, labels, ports)| {
                let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
                serde_json::json!({"name": name, "matchLabels": labels, "targetPorts": ports})
            })
            .collect();
        self.control(
            reqwest::Method::PUT,
            "/_mock/pools",
            Some(serde_json::json!(body)),
        );
    }

    /// Replaces AIBrix's ModelAdapters (in namespace `default`): name, base
    /// model, the pods in `status.instances`. The first call installs the
    /// CRD; until then the API answers their path 404.
    pub fn set_adapters(&self, adapters: &[(&str, &str, &[&str])]) {
        let body: Vec<Value> = adapters
            .iter()
            .map(|(name, base, instances)| {
                serde_json::json!({"name": name, "baseModel": base, "instances": instances})
            })
            .collect();
        self.control(
            reqwest::Method::PUT,
            "/_mock/adapters",
            Some(serde_json::json!(body)),
        );
    }

    /// The bearer token accepted from now on (the old one gets 401).
    pub fn set_token(&self, token: &str) {
        self.control(
            reqwest::Method::PUT,
            "/_mock/token",
            Some(serde_json::json!({ "token": token })),
        );
    }

    /// Forgets the watch history: a watch from an older resourceVersion
    /// gets an ERROR event with a 410 inside its 200.
    pub fn compact(&self) {
        self.control(reqwest::Method::POST, "/_mock/compact", None);
    }

    /// Every API request received since start (or the last
    /// [`KubeApi::clear_requests`]), oldest first.
    pub fn requests(&self) -> Vec<KubeRequest> {
        let v = self.control(reqwest::Method::GET, "/_mock/requests", None);
        serde_json::from_value(v).expect("mock kube api request log")
    }

    /// [`KubeApi::requests`] of pods (lists and watches), leaving out the
    /// InferencePool and ModelAdapter calls between them.
    pub fn pod_requests(&self) -> Vec<KubeRequest> {
        let mut all = self.requests();
        all.retain(|r| r.path.ends_with("/pods"));
        all
    }

    pub fn clear_requests(&self) {
        self.control(reqwest::Method::DELETE, "/_mock/requests", None);
    }

    /// Waits (up to `timeout`) until at least `n` API requests have been
    /// answered (or deliberately left unanswered: reset, truncated), and
    /// returns the log. Fails the test, with the server's log, on timeout.
    pub fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<KubeRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.requests();
            if log.len() >= n {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "mock kube api saw {} of {n} requests in {timeout:?}: {log:?}\n{}",
                log.len(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of the server's stderr (one line per request).
    pub fn log(&self) -> String {
        tail(&self.scratch.0.join("stderr"))
    }

    fn control(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("http://{}{path}", self.address());
        let mut req = http().request(method, &url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .unwrap_or_else(|e| panic!("mock kube api {path}: {e}"));
        let status = resp.status();
        let text = resp.text().unwrap_or_default();
        assert!(
            status.is_success(),
            "mock kube api {path}: {status}: {text}"
        );
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("mock kube api {path}: not JSON ({e}): {text}"))
    }
}

/// An InferencePool as the mock takes it: name, `matchLabels`, `targetPorts`.
pub type Pool<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [u16]);

/// A pod as the mock takes it; it serves the full Pod object.
#[allow(dead_code)]
#[derive(Clone, Debug, Serialize)]
pub struct KubePod {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// None: no podIP yet.
    pub ip: Option<String>,
    /// The container port (`spec.containers[0].ports[0].containerPort`).
    pub port: u16,
    pub phase: String,
    /// The Ready condition.
    pub ready: bool,
    /// Has a deletionTimestamp.
    pub terminating: bool,
}

#[allow(dead_code)]
impl KubePod {
    /// A Running, Ready pod in namespace `default`.
    pub fn new(name: &str, ip: &str, port: u16) -> KubePod {
        KubePod {
            name: name.to_owned(),
            namespace: "default".to_owned(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            ip: Some(ip.to_owned()),
            port,
            phase: "Running".to_owned(),
            ready: true,
            terminating: false,
        }
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.namespace);
        self
    }

    pub fn phase(mut self, phase: &str) -> Self {
        phase.clone_into(&mut self.phase);
        self
    }

    /// Ready condition False.
    pub fn unready(mut self) -> Self {
        self.ready = false;
        self
    }

    /// Being deleted (deletionTimestamp set).
    pub fn terminating(mut self) -> Self {
        self.terminating = true;
        self
    }

    /// No podIP (not started yet).
    pub fn no_ip(mut self) -> Self {
        self.ip = None;
        self
    }
}

/// One API request the mock received.
#[allow(dead_code)]
#[derive(Clone, Debug, Deserialize)]
pub struct KubeRequest {
    /// Unix seconds.
    pub t: f64,
    pub method: String,
    pub path: String,
    /// The query, URL-decoded (first value of a repeated key).
    pub query: BTreeMap<String, String>,
    /// The bearer token was the expected one.
    pub authorized: bool,
    /// None when no whole answer went out: modes `reset` and `truncated`,
    /// or a client that left first (mode `slow`).
    pub status: Option<u16>,
}

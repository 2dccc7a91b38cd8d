//! Real processes for end-to-end tests: Envoy running the shipped
//! `envoy.yaml` with the built filter, and mock engines. Every process is
//! bound to 127.0.0.1 on a port it picked itself, killed on drop (a failing
//! test unwinds through the drop), and asked by the kernel to die with the
//! test thread that started it, should the test process itself be killed.

use pd_router::body::Members;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A loopback port that refuses connections and stays reserved while this
/// value lives. It is bound but never listens: a port merely closed after
/// picking it can be handed by the kernel to a mock a parallel test starts,
/// and "refused" then becomes whatever that mock does (CI once answered a
/// refused decode with a 504 where a 503 was due, as a hanging mock would).
pub struct RefusingPort {
    _socket: socket2::Socket,
    pub port: u16,
}

impl RefusingPort {
    pub fn new() -> Self {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket
            .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .expect("bind");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .expect("local address")
            .port();
        RefusingPort {
            _socket: socket,
            port,
        }
    }

    pub fn endpoint(&self) -> Value {
        Value::String(format!("127.0.0.1:{}", self.port))
    }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn artifact(env: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(default));
    assert!(
        path.exists(),
        "{} not found (set {env}, or run `just test`, which builds and installs everything)",
        path.display()
    );
    path
}

pub fn envoy_bin() -> PathBuf {
    artifact("ENVOY_BIN", ".venv/bin/envoy")
}

pub fn wasm_path() -> PathBuf {
    artifact(
        "PD_ROUTER_WASM",
        "target/wasm32-wasip1/release/pd_router.wasm",
    )
}

pub fn mock_bin() -> PathBuf {
    artifact("MOCK_ENGINE_BIN", "target/debug/mock-engine")
}

/// A scratch directory per process, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pd-router-e2e-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (and reaped) on drop.
pub struct Proc {
    /// For waiting on a short-lived command (it is still killed on drop).
    pub child: Child,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command) -> Proc {
        // SAFETY: prctl is async-signal-safe; it only asks the kernel to
        // SIGKILL the child when the spawning thread exits.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {name}: {e}"));
        Proc { child }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One mock engine pod.
pub struct Mock {
    proc: Proc,
    pub name: String,
    /// The loopback address it listens on (`--listen`, else 127.0.0.1).
    pub host: String,
    pub http: u16,
    pub bootstrap: Option<u16>,
    /// vLLM NIXL side channel (pull and push prefills, Mooncake workers).
    pub side: Option<u16>,
    /// vLLM P2P NCCL's ZMQ port (`kv_port`).
    pub zmq: Option<u16>,
    /// `--dp-size`, when given.
    pub dp_size: Option<u32>,
    /// A vLLM NIXL push prefill (its endpoint names its side channel).
    pub push_prefill: bool,
}

impl Mock {
    /// Starts `mock-engine` with `args` (plus `--name`), waiting for READY.
    pub fn start(name: &str, args: &[&str]) -> Mock {
        let mut cmd = Command::new(mock_bin());
        cmd.args(["--name", name])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut proc = Proc::spawn(name, &mut cmd);
        let stdout = proc.child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("mock {name} did not print READY"));
        let json = line
            .trim()
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("mock {name}: unexpected first line {line:?}"));
        let v: Value = serde_json::from_str(json).expect("READY json");
        let port = |k: &str| v[k].as_u64().map(|p| p as u16);
        let arg = |flag: &str| {
            args.iter()
                .position(|a| *a == flag)
                .and_then(|i| args.get(i + 1))
                .copied()
        };
        Mock {
            host: arg("--listen")
                .and_then(|l| l.rsplit_once(':'))
                .map_or("127.0.0.1", |(h, _)| h)
                .to_owned(),
            http: port("http").expect("http port"),
            bootstrap: port("bootstrap"),
            side: port("side"),
            zmq: port("zmq"),
            dp_size: arg("--dp-size").and_then(|n| n.parse().ok()),
            push_prefill: arg("--connector") == Some("nixl_push")
                && arg("--role") == Some("prefill"),
            name: name.to_owned(),
            proc,
        }
    }

    /// Stops the pod (SIGKILL), as a crashed engine would.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.http)
    }

    /// The endpoint as the plugin configuration names it.
    pub fn endpoint(&self) -> Value {
        let mut e = serde_json::json!({"address": self.address(), "name": self.name});
        if let Some(b) = self.bootstrap {
            e["bootstrap_port"] = b.into();
        }
        if let Some(z) = self.zmq {
            e["kv_port"] = z.into();
        }
        if let Some(n) = self.dp_size {
            e["dp_size"] = n.into();
        }
        if let (true, Some(side)) = (self.push_prefill, self.side) {
            e["nixl_push"] = serde_json::json!({"engine_id": self.name, "side_channel_port": side});
        }
        e
    }

    /// Every engine-API POST this mock received, in order.
    pub fn requests(&self) -> Vec<Logged> {
        let v: Value = http()
            .get(format!("http://{}/debug/requests", self.address()))
            .send()
            .and_then(|r| r.json())
            .expect("debug/requests");
        v.as_array()
            .expect("array")
            .iter()
            .map(|r| Logged {
                path: r["path"].as_str().unwrap_or_default().to_owned(),
                model: r["model"].as_str().map(str::to_owned),
                headers: r["headers"].clone(),
                body: r["body"].as_str().unwrap_or_default().to_owned(),
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct Logged {
    pub path: String,
    /// The model the request named (JSON `model` or a form's field).
    pub model: Option<String>,
    pub headers: Value,
    pub body: String,
}

impl Logged {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(Value::as_str)
    }

    /// The exact bytes of a top-level member of the body.
    pub fn raw(&self, key: &str) -> Option<String> {
        raw_member(self.body.as_bytes(), key)
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("logged body is JSON")
    }
}

/// The exact bytes of a top-level member, as the router itself sees them.
pub fn raw_member(body: &[u8], key: &str) -> Option<String> {
    let top = Members::parse(body).ok()?;
    top.raw(body, key)
        .map(|r| String::from_utf8_lossy(r).into_owned())
}

pub fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .no_proxy()
        .build()
        .expect("client")
}

/// Envoy running the repository's `envoy.yaml` with `plugin_config`.
pub struct Envoy {
    _proc: Proc,
    pub port: u16,
    pub admin: u16,
    log: PathBuf,
    /// Worker threads, each with a VM of its own.
    workers: u32,
    _scratch: Scratch,
}

/// The shipped envoy.yaml, made runnable in a test: ports chosen by the
/// kernel, the built module's absolute path, and `plugin_config`.
pub fn test_envoy_yaml(plugin_config: &Value, wasm: &Path) -> String {
    let yaml = std::fs::read_to_string(repo().join("envoy.yaml")).expect("envoy.yaml");
    let mut out = String::with_capacity(yaml.len() + 4096);
    let mut skipping = false;
    for line in yaml.lines() {
        if line.contains("# BEGIN pd-router configuration") {
            let indent = &line[..line.len() - line.trim_start().len()];
            out.push_str(&format!(
                "{indent}configuration:\n{indent}  \"@type\": type.googleapis.com/google.protobuf.StringValue\n{indent}  value: {}\n",
                serde_json::to_string(&plugin_config.to_string()).expect("yaml string")
            ));
            skipping = true;
            continue;
        }
        if line.contains("# END pd-router configuration") {
            skipping = false;
            continue;
        }
        if skipping {
            continue;
        }
        let line = line
            .replace("port_value: 10000", "port_value: 0")
            .replace("port_value: 9901", "port_value: 0")
            .replace(
                "filename: target/wasm32-wasip1/release/pd_router.wasm",
                &format!("filename: {}", wasm.display()),
            );
        out.push_str(&line);
        out.push('\n');
    }
    assert!(!skipping, "envoy.yaml: BEGIN without END marker");
    out
}

impl Envoy {
    pub fn start(plugin_config: &Value) -> Envoy {
        Envoy::start_with(plugin_config, 1)
    }

    pub fn start_with(plugin_config: &Value, concurrency: u32) -> Envoy {
        Envoy::start_edited(plugin_config, concurrency, &[])
    }

    /// Like [`Envoy::start_with`], with text replacements in envoy.yaml
    /// (each must match, so a renamed setting fails loudly).
    pub fn start_edited(plugin_config: &Value, concurrency: u32, edits: &[(&str, &str)]) -> Envoy {
        Envoy::start_full(plugin_config, concurrency, edits, &[])
    }

    /// Like [`Envoy::start_edited`], with environment variables for Envoy
    /// (which hands `PD_ROUTER_KUBE_TOKEN` to the VM).
    pub fn start_full(
        plugin_config: &Value,
        concurrency: u32,
        edits: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Envoy {
        let mut yaml = test_envoy_yaml(plugin_config, &wasm_path());
        for (from, to) in edits {
            assert!(yaml.contains(from), "envoy.yaml has no {from:?}");
            yaml = yaml.replace(from, to);
        }
        Envoy::start_yaml(&yaml, concurrency, env)
    }

    /// Envoy running `yaml` as it is (its listener `pd_listener`).
    pub fn start_yaml(yaml: &str, concurrency: u32, env: &[(&str, &str)]) -> Envoy {
        let scratch = Scratch::new("envoy");
        let yaml_path = scratch.0.join("envoy.yaml");
        std::fs::write(&yaml_path, yaml).expect("write");
        let admin_path = scratch.0.join("admin.txt");
        let log = scratch.0.join("envoy.log");
        let mut cmd = Command::new(envoy_bin());
        cmd.env_remove("PD_ROUTER_KUBE_TOKEN");
        cmd.env_remove("PD_ROUTER_TRT_MACHINE_ID");
        cmd.env_remove("PD_ROUTER_TRT_AUTH_KEY");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.arg("-c")
            .arg(&yaml_path)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                &concurrency.to_string(),
            ])
            .args(["-l", "info", "--component-log-level", "wasm:debug"])
            // The log is read by tests: write it out promptly.
            .args(["--file-flush-interval-msec", "100"])
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("--log-path")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let proc = Proc::spawn("envoy", &mut cmd);
        let deadline = Instant::now() + Duration::from_secs(30);
        let admin = loop {
            if let Ok(a) = std::fs::read_to_string(&admin_path) {
                if let Some(p) = a
                    .trim()
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse::<u16>().ok())
                {
                    break p;
                }
            }
            assert!(
                Instant::now() < deadline,
                "envoy did not start:\n{}",
                tail(&log)
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let client = http();
        let port = loop {
            let listeners = client
                .get(format!("http://127.0.0.1:{admin}/listeners"))
                .send()
                .and_then(|r| r.text())
                .unwrap_or_default();
            let found = listeners
                .lines()
                .find(|l| l.starts_with("pd_listener::"))
                .and_then(|l| l.rsplit(':').next())
                .and_then(|p| p.trim().parse::<u16>().ok())
                .filter(|p| *p != 0);
            let ready = client
                .get(format!("http://127.0.0.1:{admin}/ready"))
                .send()
                .map(|r| r.status().is_success())
                .unwrap_or(false);
            if let (Some(p), true) = (found, ready) {
                break p;
            }
            assert!(
                Instant::now() < deadline,
                "envoy never became ready:\n{}",
                tail(&log)
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        Envoy {
            _proc: proc,
            port,
            admin,
            log,
            workers: concurrency,
            _scratch: scratch,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Envoy's stats whose names contain `filter`, as (name, value).
    pub fn stats(&self, filter: &str) -> Vec<(String, u64)> {
        http()
            .get(format!(
                "http://127.0.0.1:{}/stats?filter={filter}",
                self.admin
            ))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(": ")?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect()
    }

    /// One stat's value; a stat Envoy does not have fails the test (so a
    /// misspelt name cannot pass as 0).
    pub fn stat(&self, name: &str) -> u64 {
        self.stats(name)
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("Envoy has no stat {name}"))
    }

    /// The discovered pod set all VMs route by, as (generation, pods), once
    /// each has applied the generation the lister published last (`None`
    /// before). Envoy's main thread runs a VM of its own beside the
    /// workers' (it ticks, so it applies sets too): more than `workers`
    /// gauges, or the main thread's alone could stand for a worker that has
    /// applied nothing yet. Read twice, so a VM applying a set between the
    /// reads is not taken for agreement.
    pub fn applied_pod_set(&self) -> Option<(u64, u64)> {
        let read = || {
            let stats = self.stats("wasmcustom.pd_router.discovery.");
            let gens: Vec<u64> = stats
                .iter()
                .filter(|(k, _)| k.starts_with("wasmcustom.pd_router.discovery.generation"))
                .map(|(_, v)| *v)
                .collect();
            let gauge = |name: &str| {
                let name = format!("wasmcustom.pd_router.discovery.{name}");
                stats.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
            };
            let (pods, published) = (gauge("pods")?, gauge("published_generation")?);
            (gens.len() > self.workers as usize && gens.iter().all(|g| *g == published))
                .then_some((published, pods))
        };
        let first = read()?;
        (read() == Some(first)).then_some(first)
    }

    /// One pod's per-pod stat (`series`: `selected`, `ejected`,
    /// `outstanding_prefills`, ...), whose labels travel in its name.
    pub fn pod_stat(&self, series: &str, pod: &str) -> u64 {
        let prefix = format!("wasmcustom.pd_router.pod.{series}.");
        let label = format!("pd_pod=.={pod};.;");
        self.stats("wasmcustom.pd_router.pod.")
            .into_iter()
            .find(|(k, _)| k.starts_with(&prefix) && k.contains(&label))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("Envoy has no {series} stat for pod {pod}"))
    }

    pub fn log(&self) -> String {
        tail(&self.log)
    }

    /// How many lines of Envoy's whole log contain `needle`. Envoy writes
    /// its log file in the background, so this waits (up to 5 s) for a first
    /// such line, then a moment more for any that follow.
    pub fn log_lines_with(&self, needle: &str) -> usize {
        let count = || {
            std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(needle))
                .count()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while count() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(300));
        count()
    }

    /// Waits for every worker's tick to republish the shared counters, then
    /// checks that no pod has an outstanding prefill or a pending decode.
    pub fn assert_counters_zero(&self) {
        std::thread::sleep(Duration::from_millis(1300));
        let busy: Vec<(String, u64)> = self
            .stats("wasmcustom.pd_router.pod.")
            .into_iter()
            .filter(|(k, v)| {
                (k.contains(".outstanding_prefills.") || k.contains(".pending_decodes.")) && *v != 0
            })
            .collect();
        assert!(busy.is_empty(), "counters not back to zero: {busy:?}");
    }
}

pub fn tail(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// One model of a test configuration: name, engine, KV connector, prefill
/// mocks, decode mocks.
pub type ModelSpec<'a> = (
    &'a str,
    &'a str,
    Option<&'a str>,
    &'a [&'a Mock],
    &'a [&'a Mock],
);

/// A plugin configuration with one single-roleset model per spec.
pub fn plugin_config(models: &[ModelSpec]) -> Value {
    let models: Vec<Value> = models
        .iter()
        .map(|(name, engine, connector, prefill, decode)| {
            let mut m = serde_json::json!({
                "name": name,
                "engine": engine,
                "rolesets": [{
                    "name": "rs0",
                    "prefill": prefill.iter().map(|p| p.endpoint()).collect::<Vec<_>>(),
                    "decode": decode.iter().map(|d| d.endpoint()).collect::<Vec<_>>(),
                }]
            });
            if let Some(c) = connector {
                m["kv_connector"] = (*c).into();
            }
            m
        })
        .collect();
    serde_json::json!({ "prefill_timeout_ms": 5000, "models": models })
}

/// A response, read whole.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
    pub elapsed: Duration,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The OpenAI error message, asserting the error shape.
    pub fn error_message(&self) -> String {
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].is_string(), "no error.message in {v}");
        assert!(e["type"].is_string(), "no error.type in {v}");
        assert!(!e["code"].is_null(), "no error.code in {v}");
        e["message"].as_str().unwrap_or_default().to_owned()
    }

    /// The `data:` payloads of an SSE body (after an `event:` line, if
    /// the event has one).
    pub fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| {
                e.trim()
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .map(str::to_owned)
            })
            .collect()
    }
}

/// Sends `req` with `headers` and reads the whole answer.
pub fn send(req: reqwest::blocking::RequestBuilder, headers: &[(&str, &str)]) -> Answer {
    let start = Instant::now();
    let mut req = req;
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().unwrap_or_else(|e| panic!("request failed: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().unwrap_or_default();
    Answer {
        status,
        headers,
        body,
        elapsed: start.elapsed(),
    }
}

pub fn post(url: &str, body: impl Into<Vec<u8>>, headers: &[(&str, &str)]) -> Answer {
    let req = http()
        .post(url)
        .header("content-type", "application/json")
        .body(body.into());
    send(req, headers)
}

pub fn get(url: &str, headers: &[(&str, &str)]) -> Answer {
    send(http().get(url), headers)
}

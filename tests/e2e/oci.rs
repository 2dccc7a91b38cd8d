//! The module shipped as an OCI image (`scripts/oci-image.py`): two builds
//! of the layout are byte-for-byte identical, a real registry (Debian
//! `docker-registry`, distribution v2, on 127.0.0.1) keeps the manifest
//! digest users pin through a `skopeo` push and pull, and the pulled image
//! gives back the exact wasm along the path Istio's and Envoy Gateway's
//! image fetchers take (last layer tar+gzip → `plugin.wasm` → wasm magic).

use crate::harness::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const TAG: &str = env!("CARGO_PKG_VERSION");
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// `bin` on PATH, or a failure naming the Debian package that provides it.
fn need(bin: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(bin))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "`{bin}` not found on PATH: install Debian's {package} \
                 (`apt-get install -y --no-install-recommends {package}`, as `just setup` does)"
            )
        })
}

/// Waits up to `timeout` for `proc` to exit by itself: None if it is still
/// running (it is killed on drop, as ever).
fn wait_timeout(proc: &mut Proc, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = proc.child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a finished command said.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` (at most `timeout`; killed on drop if the test fails first),
/// its output kept in files under `dir` so that no pipe can fill up.
fn run(name: &str, cmd: &mut Command, dir: &Path, timeout: Duration) -> Ran {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let out_path = dir.join(format!("{name}-{n}.stdout"));
    let err_path = dir.join(format!("{name}-{n}.stderr"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    let mut proc = Proc::spawn(name, cmd);
    let status = wait_timeout(&mut proc, timeout);
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let status =
        status.unwrap_or_else(|| panic!("{name} still running after {timeout:?}:\n{stderr}"));
    Ran {
        ok: status.success(),
        stdout,
        stderr,
    }
}

/// Like [`run`], failing the test unless the command succeeds.
fn run_ok(name: &str, cmd: &mut Command, dir: &Path, timeout: Duration) -> String {
    let ran = run(name, cmd, dir, timeout);
    assert!(
        ran.ok,
        "{name} failed:\n{}\n{}",
        ran.stdout.trim_end(),
        ran.stderr.trim_end()
    );
    ran.stdout
}

fn script(python: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(repo().join("scripts/oci-image.py"));
    cmd
}

/// `oci-image.py build`; the manifest digest is its last line.
fn build_layout(python: &Path, out: &Path, scratch: &Path) -> String {
    let stdout = run_ok(
        "oci-image build",
        script(python)
            .arg("build")
            .arg(wasm_path())
            .arg(out)
            .arg(TAG),
        scratch,
        Duration::from_secs(60),
    );
    let digest = stdout.lines().last().unwrap_or_default().to_owned();
    assert!(
        digest.len() == 71 && digest.starts_with("sha256:"),
        "build's last line is no digest: {stdout}"
    );
    digest
}

/// Every file under `root`, by relative path, with its bytes.
fn files(root: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                out.push((
                    rel.display().to_string(),
                    std::fs::read(&path).expect("read"),
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    std::fs::read(layout.join("blobs/sha256").join(hex)).expect("blob")
}

/// A port nobody listens on now (the registry is told to bind it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// `docker-registry serve` on 127.0.0.1, storage in `dir`, no auth;
/// killed on drop.
struct Registry {
    proc: Proc,
    port: u16,
    log: PathBuf,
}

impl Registry {
    /// The port is picked before the registry binds it, so a mock a parallel
    /// test starts meanwhile can take it; the registry then exits, and is
    /// started again on another.
    fn start(bin: &Path, dir: &Path) -> Registry {
        for _ in 0..3 {
            if let Some(registry) = Registry::try_start(bin, dir) {
                return registry;
            }
        }
        panic!("docker-registry lost its port to another process three times");
    }

    /// `None` when the port was taken before the registry bound it.
    fn try_start(bin: &Path, dir: &Path) -> Option<Registry> {
        let port = free_port();
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log:\n  level: info\n  accesslog: {{disabled: true}}\n\
                 storage:\n  filesystem: {{rootdirectory: {}}}\n  delete: {{enabled: true}}\n  \
                 maintenance: {{uploadpurging: {{enabled: false}}}}\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )
        .expect("write registry.yml");
        let log = dir.join("registry.log");
        let log_file = std::fs::File::create(&log).expect("registry.log");
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup log"))
            .stderr(log_file);
        let mut registry = Registry {
            proc: Proc::spawn("docker-registry", &mut cmd),
            port,
            log,
        };
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(2))
            .no_proxy()
            .build()
            .expect("client");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = client
                .get(registry.url("/v2/"))
                .send()
                .map(|r| r.status().as_u16());
            if let Ok(200) = status {
                return Some(registry);
            }
            if let Some(exit) = wait_timeout(&mut registry.proc, Duration::ZERO) {
                let log = registry.log();
                if log.contains("address already in use") {
                    return None;
                }
                panic!("docker-registry exited ({exit}):\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry: GET /v2/ is {status:?}, not 200, after 10 s:\n{}",
                registry.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn image(&self) -> String {
        format!("docker://127.0.0.1:{}/pd-router:{TAG}", self.port)
    }

    fn log(&self) -> String {
        tail(&self.log)
    }
}

/// `skopeo` with a policy of its own (no dependence on the host's
/// /etc/containers/policy.json) and anonymous access.
fn skopeo(bin: &Path, dir: &Path) -> Command {
    let policy = dir.join("policy.json");
    std::fs::write(
        &policy,
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .expect("write policy.json");
    let tmp = dir.join("skopeo-tmp");
    std::fs::create_dir_all(&tmp).expect("skopeo tmpdir");
    let mut cmd = Command::new(bin);
    cmd.arg("--policy")
        .arg(policy)
        .arg("--tmpdir")
        .arg(tmp)
        .args(["--command-timeout", "90s"]);
    cmd
}

#[test]
fn the_oci_image_is_reproducible_and_survives_a_registry_round_trip() {
    let python = need("python3", "python3");
    let skopeo_bin = need("skopeo", "skopeo");
    let registry_bin = need("docker-registry", "docker-registry");
    let wasm = std::fs::read(wasm_path()).expect("read wasm");

    // Two builds, two directories: the same digest, the same bytes.
    let one = Scratch::new("oci-one");
    let two = Scratch::new("oci-two");
    let layout = one.0.join("layout");
    let digest = build_layout(&python, &layout, &one.0);
    assert_eq!(
        build_layout(&python, &two.0.join("layout"), &two.0),
        digest,
        "a second build gave another manifest digest"
    );
    let built = files(&layout);
    let names: Vec<&str> = built.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names.len(),
        5,
        "oci-layout, index.json and three blobs: {names:?}"
    );
    assert!(
        built == files(&two.0.join("layout")),
        "two builds differ (files: {names:?})"
    );
    let printed = run_ok(
        "oci-image digest",
        script(&python).arg("digest").arg(&layout),
        &one.0,
        Duration::from_secs(30),
    );
    assert_eq!(printed.trim(), digest);

    // What the fetchers look at: the last layer's media type, and a gzip
    // header without time or name (what a rebuild would otherwise change).
    let manifest_bytes = blob(&layout, &digest);
    let manifest: Value = serde_json::from_slice(&manifest_bytes).expect("manifest JSON");
    assert_eq!(manifest["mediaType"], OCI_MANIFEST);
    let layers = manifest["layers"].as_array().expect("layers");
    let last = layers.last().expect("a layer");
    assert_eq!(last["mediaType"], OCI_LAYER, "{manifest}");
    let layer_digest = last["digest"].as_str().expect("layer digest");
    let layer = blob(&layout, layer_digest);
    assert_eq!(&layer[..4], &[0x1f, 0x8b, 8, 0], "gzip, deflate, no FNAME");
    assert_eq!(&layer[4..8], &[0, 0, 0, 0], "gzip MTIME 0");
    let config = blob(
        &layout,
        manifest["config"]["digest"].as_str().expect("config"),
    );
    let config = String::from_utf8(config).expect("utf-8 config");
    assert!(
        !config.contains("created"),
        "config has a timestamp: {config}"
    );

    // Push to a registry on 127.0.0.1, which must name the same digest.
    let reg_dir = Scratch::new("oci-registry");
    let registry = Registry::start(&registry_bin, &reg_dir.0);
    let ran = run(
        "skopeo push",
        skopeo(&skopeo_bin, &reg_dir.0)
            .args([
                "copy",
                "--preserve-digests",
                "--dest-tls-verify=false",
                "--dest-no-creds",
            ])
            .arg(format!("oci:{}:{TAG}", layout.display()))
            .arg(registry.image()),
        &reg_dir.0,
        Duration::from_secs(120),
    );
    assert!(
        ran.ok,
        "skopeo push failed:\n{}\nregistry log:\n{}",
        ran.stderr.trim_end(),
        registry.log()
    );
    let served = send(
        http()
            .get(registry.url(&format!("/v2/pd-router/manifests/{TAG}")))
            .header("accept", OCI_MANIFEST),
        &[],
    );
    assert_eq!(
        served.status,
        200,
        "GET manifest: {}\n{}",
        served.body,
        registry.log()
    );
    assert_eq!(
        served.header("docker-content-digest"),
        Some(digest.as_str()),
        "the registry names another digest than the one users pin"
    );
    assert_eq!(served.header("content-type"), Some(OCI_MANIFEST));
    assert!(
        served.body.as_bytes() == manifest_bytes.as_slice(),
        "the registry serves other manifest bytes"
    );
    let layer_back = http()
        .get(registry.url(&format!("/v2/pd-router/blobs/{layer_digest}")))
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.bytes())
        .expect("GET layer blob");
    assert!(
        layer_back.as_ref() == layer.as_slice(),
        "the registry serves other layer bytes"
    );

    // Pull it back and take the module out the way Istio does.
    let back = Scratch::new("oci-pulled");
    let pulled = back.0.join("layout");
    let ran = run(
        "skopeo pull",
        skopeo(&skopeo_bin, &back.0)
            .args([
                "copy",
                "--preserve-digests",
                "--src-tls-verify=false",
                "--src-no-creds",
            ])
            .arg(registry.image())
            .arg(format!("oci:{}:{TAG}", pulled.display())),
        &back.0,
        Duration::from_secs(120),
    );
    assert!(
        ran.ok,
        "skopeo pull failed:\n{}\nregistry log:\n{}",
        ran.stderr.trim_end(),
        registry.log()
    );
    let printed = run_ok(
        "oci-image digest (pulled)",
        script(&python).arg("digest").arg(&pulled),
        &back.0,
        Duration::from_secs(30),
    );
    assert_eq!(
        printed.trim(),
        digest,
        "the pulled image has another digest"
    );
    let blobs = |all: Vec<(String, Vec<u8>)>| -> Vec<(String, Vec<u8>)> {
        all.into_iter()
            .filter(|(n, _)| n.starts_with("blobs/"))
            .collect()
    };
    assert!(
        blobs(files(&pulled)) == blobs(built),
        "the pulled blobs differ from the pushed ones"
    );
    let extracted = back.0.join("plugin.wasm");
    run_ok(
        "oci-image extract",
        script(&python).arg("extract").arg(&pulled).arg(&extracted),
        &back.0,
        Duration::from_secs(30),
    );
    assert!(
        std::fs::read(&extracted).expect("extracted") == wasm,
        "the extracted plugin.wasm is not the built module"
    );
}

#[test]
fn the_oci_image_script_refuses_what_is_not_a_wasm_module() {
    let python = need("python3", "python3");
    let scratch = Scratch::new("oci-bad");
    let out = scratch.0.join("layout");
    let ran = run(
        "oci-image build",
        script(&python)
            .arg("build")
            .arg(repo().join("Cargo.toml"))
            .arg(&out)
            .arg(TAG),
        &scratch.0,
        Duration::from_secs(30),
    );
    assert!(!ran.ok, "a non-wasm input was packaged:\n{}", ran.stdout);
    assert_eq!(
        ran.stderr.trim_end().lines().count(),
        1,
        "one line: {}",
        ran.stderr
    );
    assert!(
        ran.stderr.contains("is not a WebAssembly module"),
        "{}",
        ran.stderr
    );
    assert!(!out.exists(), "a layout was written for a non-wasm input");

    let ran = run(
        "oci-image extract",
        script(&python)
            .arg("extract")
            .arg(&scratch.0)
            .arg(scratch.0.join("x.wasm")),
        &scratch.0,
        Duration::from_secs(30),
    );
    assert!(!ran.ok);
    assert!(
        ran.stderr.contains("not an OCI image layout"),
        "{}",
        ran.stderr
    );
}

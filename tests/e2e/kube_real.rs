//! Discovery against a real kube-apiserver and etcd, envtest-style: no
//! kubelet and no controllers, so a pod is an object whose status the test
//! patches (podIP, Running, Ready) as kubelet would. The filter reaches the
//! API server through Envoy's `kube_api` cluster over TLS, with a token the
//! TokenRequest API issued for the shipped ServiceAccount, authorised only by
//! the shipped Role and RoleBinding (rendered from `deploy/envoy`). What the
//! mock API server of `discovery.rs` can only imitate is real here: RBAC,
//! authentication, the watch cache and its bookmarks, a 410 after an etcd
//! compaction, the CRDs' validation.
//!
//! The binaries come from `just kube-apiserver` (pinned in `tools/kube/`):
//! `KUBE_APISERVER_BIN`, `ETCD_BIN`; the objects are applied with `kubectl`.

use crate::discovery::{
    common_port, discovery_config, envoy_minor, injecting_cluster, one_set, wait_until,
    ProjectedToken,
};
use crate::harness::*;
use serde_json::{json, Value};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The shipped values' namespace and ServiceAccount (deploy/values).
const NS: &str = "llm";
const SA: &str = "pd-router";
/// The test's own admin, in the static token file (group system:masters).
const ADMIN_TOKEN: &str = "e2e-admin-token";
/// The name the API server's generated certificate carries and the filter's
/// default `authority`: Envoy checks the certificate against it.
const API_NAME: &str = "kubernetes.default.svc";

fn tool(env: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(default));
    assert!(
        path.exists(),
        "{} not found (set {env}, or run `just kube-apiserver`, which builds kube-apiserver and etcd pinned into .tools/kube/bin; `just test` runs it)",
        path.display()
    );
    path
}

/// A loopback port free now. etcd and kube-apiserver take their ports as
/// flags, so (unlike the mocks) they cannot pick one themselves; a port
/// taken in between fails the start loudly.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// etcd and kube-apiserver on 127.0.0.1, with their data and certificates
/// in a scratch directory. Fields drop in order: the API server is killed
/// before its etcd, and the directory goes last (also on a panic).
pub struct RealKube {
    _apiserver: Proc,
    _etcd: Proc,
    pub port: u16,
    etcd_port: u16,
    /// The API server's generated serving certificate and its CA (one file).
    pub ca: PathBuf,
    kubeconfig: PathBuf,
    apiserver_log: PathBuf,
    scratch: Scratch,
}

impl RealKube {
    pub fn start() -> RealKube {
        RealKube::start_with(&[])
    }

    /// With extra kube-apiserver flags.
    pub fn start_with(extra: &[&str]) -> RealKube {
        let apiserver_bin = tool("KUBE_APISERVER_BIN", ".tools/kube/bin/kube-apiserver");
        let etcd_bin = tool("ETCD_BIN", ".tools/kube/bin/etcd");
        let kubectl = Command::new("kubectl")
            .args(["version", "--client"])
            .output();
        assert!(
            kubectl.is_ok_and(|o| o.status.success()),
            "kubectl not found on PATH: the tests apply their objects with it"
        );
        let scratch = Scratch::new("kube");
        let dir = scratch.0.clone();
        let (etcd_port, peer_port, port) = (free_port(), free_port(), free_port());

        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_log = File::create(dir.join("etcd.log")).expect("etcd log");
        let etcd = Proc::spawn(
            "etcd",
            Command::new(etcd_bin)
                .args(["--name", "e2e", "--data-dir"])
                .arg(dir.join("etcd"))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("e2e={peer_url}")])
                // Nothing here must survive a crash; fsync on a shared
                // disk is most of what a write costs.
                .arg("--unsafe-no-fsync")
                .args(["--log-level", "warn"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(etcd_log),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !http()
            .get(format!("{client_url}/health"))
            .send()
            .and_then(|r| r.text())
            .is_ok_and(|t| t.contains("\"health\":\"true\""))
        {
            assert!(
                Instant::now() < deadline,
                "etcd never became healthy:\n{}",
                tail(&dir.join("etcd.log"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }

        // The key that signs ServiceAccount tokens (and checks them).
        let sa_key = dir.join("sa.key");
        let out = Command::new("openssl")
            .args([
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
            ])
            .arg(&sa_key)
            .output()
            .expect("openssl (generates the ServiceAccount signing key)");
        assert!(out.status.success(), "openssl: {}", text(&out));
        let tokens = dir.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{ADMIN_TOKEN},e2e-admin,e2e-admin,\"system:masters\"\n"),
        )
        .expect("token file");
        let cert_dir = dir.join("certs");
        let apiserver_log = dir.join("kube-apiserver.log");
        let log = File::create(&apiserver_log).expect("apiserver log");
        let mut cmd = Command::new(apiserver_bin);
        cmd.args(["--etcd-servers", &client_url])
            .args(["--bind-address", "127.0.0.1"])
            .args(["--advertise-address", "127.0.0.1"])
            .args(["--secure-port", &port.to_string()])
            // No --tls-cert-file: it generates a self-signed pair here (CA
            // and serving certificate in apiserver.crt), naming 127.0.0.1
            // and kubernetes.default.svc.
            .arg("--cert-dir")
            .arg(&cert_dir)
            .arg("--token-auth-file")
            .arg(&tokens)
            .arg("--service-account-key-file")
            .arg(&sa_key)
            .arg("--service-account-signing-key-file")
            .arg(&sa_key)
            .args(["--service-account-issuer", "https://kubernetes.default.svc"])
            .args(["--authorization-mode", "RBAC"])
            .args(["--service-cluster-ip-range", "10.0.0.0/24"])
            // No controller manager creates the namespaces' `default`
            // ServiceAccount, which this plugin would require of every pod.
            .args(["--disable-admission-plugins", "ServiceAccount"])
            // No Endpoints of its own to reconcile, no flow control: less
            // work on a 2-core machine, nothing the filter reads.
            .args(["--endpoint-reconciler-type", "none"])
            .args(["--enable-priority-and-fairness=false"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let apiserver = Proc::spawn("kube-apiserver", &mut cmd);
        let ca = cert_dir.join("apiserver.crt");
        let kubeconfig = dir.join("kubeconfig");
        let kube = RealKube {
            _apiserver: apiserver,
            _etcd: etcd,
            port,
            etcd_port,
            ca,
            kubeconfig,
            apiserver_log,
            scratch,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        while !kube.ca.exists() {
            assert!(
                Instant::now() < deadline,
                "kube-apiserver wrote no certificate:\n{}",
                kube.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::fs::write(
            &kube.kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster: {{server: \"https://127.0.0.1:{port}\", certificate-authority: \"{}\"}}\nusers:\n- name: admin\n  user: {{token: {ADMIN_TOKEN}}}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: admin, namespace: {NS}}}\ncurrent-context: e2e\n",
                kube.ca.display()
            ),
        )
        .expect("kubeconfig");
        // Ready: etcd reached, RBAC's bootstrap roles written.
        loop {
            let out = kube.try_kubectl(&["get", "--raw", "/readyz"], None);
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver never became ready: {}\n{}",
                text(&out),
                kube.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        kube
    }

    pub fn log(&self) -> String {
        tail(&self.apiserver_log)
    }

    /// The admin's kubeconfig (for other clients of the API server).
    pub fn kubeconfig(&self) -> &std::path::Path {
        &self.kubeconfig
    }

    fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.scratch.0.join("kubectl-cache"))
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl");
        if let Some(input) = stdin {
            use std::io::Write;
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(input.as_bytes()).expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// Runs kubectl as the admin, failing the test if it fails.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.try_kubectl(args, stdin);
        assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn apply(&self, manifest: &str) {
        self.kubectl(&["apply", "-f", "-"], Some(manifest));
    }

    /// The namespace, ServiceAccount, Role and RoleBinding as shipped, the
    /// shared CRDs the filter reads, and a TokenRequest token for the
    /// ServiceAccount (one hour, bound to the API server's audience).
    pub fn install(&self) -> String {
        self.apply(&shipped_rbac());
        self.apply(&inference_pool_crd().to_string());
        self.apply(&model_adapter_crd().to_string());
        for crd in [
            "inferencepools.inference.networking.k8s.io",
            "modeladapters.model.aibrix.ai",
        ] {
            self.kubectl(
                &[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "crd",
                    crd,
                ],
                None,
            );
        }
        // A CRD just established answers lists from its watch cache with
        // 429 "storage is (re)initializing" for a moment (seen here: the
        // filter counts it and reads again). A cluster's CRDs were there
        // long before the gateway; kubectl waits out the 429s.
        for path in [
            "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools?resourceVersion=0",
            "/apis/model.aibrix.ai/v1alpha1/namespaces/llm/modeladapters?resourceVersion=0",
        ] {
            self.kubectl(&["get", "--raw", path], None);
        }
        self.token()
    }

    /// POST .../serviceaccounts/pd-router/token (TokenRequest).
    pub fn token(&self) -> String {
        self.kubectl(&["create", "token", SA, "--duration", "1h"], None)
            .trim()
            .to_owned()
    }

    /// Creates a pod (no kubelet will run it), then writes its status as
    /// kubelet would once it runs and is ready: `ip` the podIP.
    pub fn add_pod(&self, name: &str, ip: &str, labels: Value, annotations: Value) {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
            // Bound to a node no one runs: no scheduler needed.
            "spec": {"nodeName": "e2e-node", "containers": [{"name": "engine", "image": "mock-engine"}]}
        });
        self.kubectl(&["create", "-f", "-"], Some(&pod.to_string()));
        let status = json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}]}});
        self.kubectl(
            &[
                "patch",
                "pod",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ],
            None,
        );
    }

    pub fn delete_pod(&self, name: &str) {
        self.kubectl(&["delete", "pod", name, "--wait=false"], None);
    }

    /// Compacts etcd's history up to its current revision (its JSON
    /// gateway): every watch from an older resourceVersion that etcd itself
    /// must serve now answers 410 Gone.
    pub fn compact(&self) -> u64 {
        let base = format!("http://127.0.0.1:{}/v3", self.etcd_port);
        // A range read answers the current revision in its header.
        let head: Value = http()
            .post(format!("{base}/kv/range"))
            .body(json!({"key": "AA=="}).to_string())
            .send()
            .and_then(|r| r.json())
            .expect("etcd range");
        let revision: u64 = head["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no revision in {head}"));
        let out = http()
            .post(format!("{base}/kv/compaction"))
            .body(json!({"revision": revision.to_string(), "physical": true}).to_string())
            .send()
            .expect("etcd compaction");
        assert!(out.status().is_success(), "compaction: {:?}", out.text());
        revision
    }
}

/// The objects of `deploy/envoy` (the plain overlay, rendered as
/// `deploy.rs` renders it) that give the filter its identity: Namespace,
/// ServiceAccount, Role, RoleBinding.
pub fn shipped_rbac() -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join("deploy/envoy"))
        .output()
        .expect("kubectl kustomize");
    assert!(out.status.success(), "kustomize: {}", text(&out));
    let rendered = String::from_utf8_lossy(&out.stdout).into_owned();
    let kinds = ["Namespace", "ServiceAccount", "Role", "RoleBinding"];
    let docs: Vec<&str> = rendered
        .split("\n---\n")
        .filter(|d| {
            d.lines()
                .any(|l| kinds.iter().any(|k| l == format!("kind: {k}")))
        })
        .collect();
    assert_eq!(docs.len(), 4, "the overlay's identity objects:\n{rendered}");
    docs.join("\n---\n")
}

/// GIE's InferencePool CRD at v1.5.0 (the version llm-d installs, whose
/// schema the repository ships: `deploy/schemas/inferencepool-v1.5.0.json`),
/// turned back into a CRD: the closed objects reopened (the API server
/// prunes unknown fields instead), `metadata` and the fixed apiVersion and
/// kind as any CRD has them. Its CEL rules were left out of that schema.
fn inference_pool_crd() -> Value {
    fn reopen(node: &mut Value) {
        match node {
            Value::Object(map) => {
                if map.get("additionalProperties") == Some(&Value::Bool(false)) {
                    map.remove("additionalProperties");
                }
                map.values_mut().for_each(reopen);
            }
            Value::Array(items) => items.iter_mut().for_each(reopen),
            _ => {}
        }
    }
    let path = repo().join("deploy/schemas/inferencepool-v1.5.0.json");
    let mut schema: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("JSON");
    let top = schema.as_object_mut().expect("object");
    for key in ["$schema", "$id", "title"] {
        top.remove(key);
    }
    reopen(&mut schema);
    schema["properties"]["apiVersion"] = json!({"type": "string"});
    schema["properties"]["kind"] = json!({"type": "string"});
    schema["properties"]["metadata"] = json!({"type": "object"});
    schema["required"] = json!(["spec"]);
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        // A *.k8s.io group: the API server refuses the CRD without this
        // annotation (GIE's release CRDs name their approval PR).
        "metadata": {"name": "inferencepools.inference.networking.k8s.io",
                     "annotations": {"api-approved.kubernetes.io": "unapproved, pd-router e2e copy of GIE v1.5.0's schema"}},
        "spec": {
            "group": "inference.networking.k8s.io", "scope": "Namespaced",
            "names": {"kind": "InferencePool", "listKind": "InferencePoolList",
                      "plural": "inferencepools", "singular": "inferencepool"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": schema}}]
        }
    })
}

/// AIBrix's ModelAdapter CRD as vllm-project/aibrix declares it
/// (`config/crd/model/model.aibrix.ai_modeladapters.yaml`, read at commit
/// 3b2594e6): its group, version, names, status subresource and field
/// types, written out here (the upstream file is not copied in) without
/// its descriptions and condition patterns.
fn model_adapter_crd() -> Value {
    let strings = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let schema = json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object", "required": ["artifactURL", "podSelector"],
                "properties": {
                    "additionalConfig": strings,
                    "artifactURL": {"type": "string"},
                    "baseModel": {"type": "string"},
                    "credentialsSecretRef": {"type": "object", "properties": {"name": {"type": "string"}}},
                    "podSelector": {"type": "object", "properties": {
                        "matchLabels": strings,
                        "matchExpressions": {"type": "array", "items": {
                            "type": "object", "required": ["key", "operator"],
                            "properties": {"key": {"type": "string"}, "operator": {"type": "string"},
                                           "values": {"type": "array", "items": {"type": "string"}}}}}}},
                    "replicas": {"type": "integer", "format": "int32", "default": 1},
                    "schedulerName": {"type": "string", "default": "default"}
                }
            },
            "status": {
                "type": "object",
                "properties": {
                    "conditions": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                    "instances": {"type": "array", "items": {"type": "string"}},
                    "phase": {"type": "string"}
                }
            }
        }
    });
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "modeladapters.model.aibrix.ai"},
        "spec": {
            "group": "model.aibrix.ai", "scope": "Namespaced",
            "names": {"kind": "ModelAdapter", "listKind": "ModelAdapterList",
                      "plural": "modeladapters", "singular": "modeladapter"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                          "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": schema}}]
        }
    })
}

/// envoy.yaml's clusters plus `kube_api` over TLS to the real API server.
fn tls_cluster(kube: &RealKube) -> String {
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
{tls}"#,
        port = kube.port,
        tls = tls_socket(kube),
    )
}

/// The cluster's TLS: the API server's generated certificate is the only
/// trust anchor, and it must name kubernetes.default.svc (the SNI and
/// authority the filter uses), as a cluster's CA bundle and name would.
fn tls_socket(kube: &RealKube) -> String {
    format!(
        r#"    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: {API_NAME}
        common_tls_context:
          validation_context:
            trusted_ca: {{filename: "{ca}"}}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{exact: {API_NAME}}}
"#,
        ca = kube.ca.display(),
    )
}

/// The discovery configuration of these tests: the shipped namespace.
fn config(models: Value) -> Value {
    let mut c = discovery_config(models);
    c["discovery"]["kubernetes"]["namespace"] = json!(NS);
    c
}

/// Envoy's worker threads (each runs a VM of its own) in these tests.
const WORKERS: u32 = 2;

fn start_envoy(kube: &RealKube, config: &Value, token: &str) -> Envoy {
    let cluster = tls_cluster(kube);
    Envoy::start_full(
        config,
        WORKERS,
        &[("  clusters:\n", cluster.as_str())],
        &[("PD_ROUTER_KUBE_TOKEN", token)],
    )
}

fn vllm(name: &str, role: &str, model: &str) -> Mock {
    Mock::start(
        name,
        &["--engine", "vllm", "--role", role, "--model", model],
    )
}

/// AIBrix's labels for a mock engine on 127.0.0.1 (its port in
/// `model.aibrix.ai/port`: every mock has a port of its own).
fn aibrix_labels(mock: &Mock, model: &str, role: &str) -> Value {
    json!({"model.aibrix.ai/name": model, "model.aibrix.ai/engine": "vllm",
           "model.aibrix.ai/port": mock.http.to_string(),
           "role-name": role, "roleset-name": "rs0"})
}

fn add_aibrix_pod(kube: &RealKube, mock: &Mock, model: &str, role: &str) {
    kube.add_pod(
        &mock.name,
        "127.0.0.1",
        aibrix_labels(mock, model, role),
        json!({}),
    );
}

fn completion(model: &str, i: usize) -> String {
    json!({"model": model, "prompt": format!("request {i}"), "max_tokens": 2}).to_string()
}

/// The pods a split request went to, (prefill, decode), once it succeeds.
fn split(envoy: &Envoy, model: &str, i: usize) -> (String, String) {
    let a = post(&envoy.url("/v1/completions"), completion(model, i), &[]);
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    let pod = |h: &str| a.header(h).unwrap_or_default().to_owned();
    (pod("prefill-target-pod"), pod("decode-target-pod"))
}

/// Whether the next `n` answers are all `status`.
fn settled(envoy: &Envoy, model: &str, status: u16, n: usize) -> bool {
    let url = envoy.url("/v1/completions");
    (0..n).all(|i| post(&url, completion(model, i), &[]).status == status)
}

fn stat(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat(&format!("wasmcustom.pd_router.discovery.{name}"))
}

#[test]
fn aibrix_pods_from_a_real_api_server_split_and_are_followed_by_watch() {
    let kube = RealKube::start();
    let token = kube.install();
    let (p0, d0) = (
        vllm("real-p0", "prefill", "m"),
        vllm("real-d0", "decode", "m"),
    );
    add_aibrix_pod(&kube, &p0, "m", "prefill");
    add_aibrix_pod(&kube, &d0, "m", "decode");
    let envoy = start_envoy(&kube, &config(json!([])), &token);
    let listed = one_set(&envoy, 0, |pods| pods == 2);
    assert_eq!(
        split(&envoy, "m", 0),
        ("real-p0".to_owned(), "real-d0".to_owned())
    );
    assert!(!p0.requests().is_empty() && !d0.requests().is_empty());
    assert_eq!(stat(&envoy, "pods"), 2);

    // A decode pod is deleted and another added while the filter watches:
    // the change arrives as watch events, with no new list.
    let d1 = vllm("real-d1", "decode", "m");
    add_aibrix_pod(&kube, &d1, "m", "decode");
    kube.delete_pod("real-d0");
    one_set(&envoy, listed, |pods| pods == 2);
    let before = d0.requests().len();
    for i in 0..10 {
        assert_eq!(split(&envoy, "m", i).1, "real-d1");
    }
    assert_eq!(d0.requests().len(), before, "the deleted pod gets nothing");
    assert!(stat(&envoy, "watches") > 0, "watched");
    assert_eq!(stat(&envoy, "relists"), 0, "no watch expired");
    assert_eq!(stat(&envoy, "failures"), 0, "{}", envoy.log());
    assert_eq!(stat(&envoy, "pods"), 2);
    envoy.assert_counters_zero();
}

#[test]
fn a_role_without_watch_is_reported_and_granting_it_resumes_following() {
    let kube = RealKube::start();
    let token = kube.install();
    // The shipped Role minus `watch` on pods (its first rule).
    let resources = kube.kubectl(
        &["get", "role", SA, "-o", "jsonpath={.rules[0].resources}"],
        None,
    );
    assert_eq!(resources.trim(), r#"["pods"]"#);
    kube.kubectl(
        &[
            "patch",
            "role",
            SA,
            "--type=json",
            "-p",
            r#"[{"op": "replace", "path": "/rules/0/verbs", "value": ["list"]}]"#,
        ],
        None,
    );
    let (p0, d0) = (
        vllm("rbac-p0", "prefill", "m"),
        vllm("rbac-d0", "decode", "m"),
    );
    add_aibrix_pod(&kube, &p0, "m", "prefill");
    add_aibrix_pod(&kube, &d0, "m", "decode");
    let envoy = start_envoy(&kube, &config(json!([])), &token);
    // The list is allowed: the pods serve. Every watch is refused, and
    // the filter says so rather than carrying on quietly.
    let listed = one_set(&envoy, 0, |pods| pods == 2);
    assert!(settled(&envoy, "m", 200, 4));
    wait_until("refused watches are counted", || {
        stat(&envoy, "failures") >= 2
    });
    // The API server's own words, passed on: who may not do what.
    assert!(
        envoy.log_lines_with(r#"cannot watch resource \"pods\""#) >= 1
            || envoy.log_lines_with(r#"cannot watch resource "pods""#) >= 1,
        "{}",
        envoy.log()
    );
    assert!(envoy.log_lines_with("403 Forbidden") >= 1);
    assert_eq!(stat(&envoy, "watches"), 0);
    // So a new pod is not seen.
    let d1 = vllm("rbac-d1", "decode", "m");
    add_aibrix_pod(&kube, &d1, "m", "decode");
    kube.delete_pod("rbac-d0");
    std::thread::sleep(Duration::from_millis(1500));
    for i in 0..6 {
        assert_eq!(split(&envoy, "m", i).1, "rbac-d0", "the last good set");
    }

    // The shipped Role again: the next watch (after the backoff) succeeds.
    kube.apply(&shipped_rbac());
    one_set(&envoy, listed, |pods| pods == 2);
    for i in 0..6 {
        assert_eq!(split(&envoy, "m", i).1, "rbac-d1");
    }
    assert!(envoy.log_lines_with("the API server answers again") >= 1);
    envoy.assert_counters_zero();
}

#[test]
fn an_inference_pool_of_llm_d_pods_from_a_real_api_server() {
    let kube = RealKube::start();
    let token = kube.install();
    // The shipped pool, validated by the CRD; its port made one the mocks
    // can share on loopback addresses of their own.
    let pool_yaml =
        std::fs::read_to_string(repo().join("deploy/inference-pool/inferencepool.yaml"))
            .expect("inferencepool.yaml");
    kube.apply(&pool_yaml);
    let hosts = ["127.0.0.2", "127.0.0.3"];
    let port = common_port(&hosts);
    kube.kubectl(
        &[
            "patch",
            "inferencepool",
            "qwen3-8b-pool",
            "--type=json",
            "-p",
            &json!([{"op": "replace", "path": "/spec/targetPorts/0/number", "value": port}])
                .to_string(),
        ],
        None,
    );
    let engine = |name: &str, role: &str, host: &str| {
        let listen = format!("{host}:{port}");
        Mock::start(
            name,
            &[
                "--engine", "vllm", "--role", role, "--model", "qwen3-8b", "--listen", &listen,
            ],
        )
    };
    let (p, d) = (
        engine("llmd-p0", "prefill", hosts[0]),
        engine("llmd-d0", "decode", hosts[1]),
    );
    // The pool's selector (deploy/inference-pool) and llm-d's role label.
    let labels = |role: &str| {
        json!({"llm-d.ai/guide": "pd-disaggregation", "llm-d.ai/model": "qwen3-8b",
               "llm-d.ai/role": role})
    };
    kube.add_pod("llmd-p0", hosts[0], labels("prefill"), json!({}));
    kube.add_pod("llmd-d0", hosts[1], labels("decode"), json!({}));
    // A pod of the right role outside the pool's selector.
    kube.add_pod(
        "llmd-stranger",
        "127.0.0.4",
        json!({"llm-d.ai/role": "decode", "llm-d.ai/model": "qwen3-8b"}),
        json!({}),
    );
    // The shipped plugin configuration's discovery (llm-d labels, the pool).
    let shipped: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/inference-pool/plugin.json"))
            .expect("plugin.json"),
    )
    .expect("JSON");
    let mut c = config(json!([{"name": "qwen3-8b", "engine": "vllm", "rolesets": []}]));
    for key in ["labels", "inference_pool", "namespace"] {
        c["discovery"]["kubernetes"][key] = shipped["discovery"]["kubernetes"][key].clone();
    }
    let envoy = start_envoy(&kube, &c, &token);
    one_set(&envoy, 0, |pods| pods == 2);
    for i in 0..6 {
        assert_eq!(
            split(&envoy, "qwen3-8b", i),
            ("llmd-p0".to_owned(), "llmd-d0".to_owned())
        );
    }
    assert!(!p.requests().is_empty() && !d.requests().is_empty());
    assert_eq!(stat(&envoy, "pods"), 2, "the stranger is not the pool's");
    assert_eq!(stat(&envoy, "failures"), 0, "{}", envoy.log());
    envoy.assert_counters_zero();
}

#[test]
fn model_adapters_from_a_real_api_server_route_to_their_instances() {
    let kube = RealKube::start();
    let token = kube.install();
    let lora = |name: &str, role: &str, with: bool| {
        let mut args = vec!["--engine", "vllm", "--role", role, "--model", "llama"];
        if with {
            args.extend(["--lora", "sql"]);
        }
        Mock::start(name, &args)
    };
    let (p0, p1) = (
        lora("ad-p0", "prefill", false),
        lora("ad-p1", "prefill", true),
    );
    let (d0, d1) = (
        lora("ad-d0", "decode", false),
        lora("ad-d1", "decode", true),
    );
    for (m, role) in [
        (&p0, "prefill"),
        (&p1, "prefill"),
        (&d0, "decode"),
        (&d1, "decode"),
    ] {
        add_aibrix_pod(&kube, m, "llama", role);
    }
    // The adapter as a user creates it, then its status as AIBrix's
    // controller writes it once loaded on p1 and d1.
    let adapter = json!({
        "apiVersion": "model.aibrix.ai/v1alpha1", "kind": "ModelAdapter",
        "metadata": {"name": "sql", "namespace": NS},
        "spec": {"baseModel": "llama", "artifactURL": "huggingface://e2e/sql-lora",
                 "podSelector": {"matchLabels": {"model.aibrix.ai/name": "llama"}}}
    });
    kube.kubectl(&["create", "-f", "-"], Some(&adapter.to_string()));
    let status = json!({"status": {"phase": "Running", "instances": ["ad-p1", "ad-d1"]}});
    kube.kubectl(
        &[
            "patch",
            "modeladapter",
            "sql",
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
        None,
    );
    let envoy = start_envoy(&kube, &config(json!([])), &token);
    // The pods and the adapter are listed apart: the set that serves it.
    let served = one_set(&envoy, 0, |pods| {
        pods == 4 && settled(&envoy, "sql", 200, 1)
    });
    for i in 0..10 {
        assert_eq!(
            split(&envoy, "sql", i),
            ("ad-p1".to_owned(), "ad-d1".to_owned())
        );
    }
    let named = |m: &Mock| {
        m.requests()
            .iter()
            .filter(|r| r.model.as_deref() == Some("sql"))
            .count()
    };
    assert_eq!((named(&p0), named(&d0)), (0, 0), "not on pods without it");

    // The object deleted: an unknown model once listed again.
    kube.kubectl(&["delete", "modeladapter", "sql"], None);
    one_set(&envoy, served, |pods| pods == 4);
    assert!(settled(&envoy, "sql", 404, 6), "the adapter is unknown");
    assert!(settled(&envoy, "llama", 200, 4));
    assert_eq!(stat(&envoy, "failures"), 0, "{}", envoy.log());
    envoy.assert_counters_zero();
}

#[test]
fn an_etcd_compaction_expires_the_watch_and_a_list_recovers() {
    // No watch cache for pods: their watches are served by etcd itself,
    // whose compacted history answers 410 Gone. (The cache would answer
    // from its own window, which a test cannot move on demand.)
    let kube = RealKube::start_with(&["--watch-cache-sizes=pods#0"]);
    let token = kube.install();
    let (p0, d0) = (
        vllm("gone-p0", "prefill", "m"),
        vllm("gone-d0", "decode", "m"),
    );
    add_aibrix_pod(&kube, &p0, "m", "prefill");
    add_aibrix_pod(&kube, &d0, "m", "decode");
    let envoy = start_envoy(&kube, &config(json!([])), &token);
    let listed = one_set(&envoy, 0, |pods| pods == 2);
    wait_until("watching", || stat(&envoy, "watches") >= 1);
    // History moves on without touching pods, then is compacted away.
    for i in 0..5 {
        kube.kubectl(&["create", "configmap", &format!("bump-{i}")], None);
    }
    kube.compact();
    wait_until("the expired watch is answered by a relist", || {
        stat(&envoy, "relists") >= 1
    });
    assert!(
        envoy.log_lines_with("the watch expired") >= 1,
        "{}",
        envoy.log()
    );
    // The fresh list, then watches again: a change still arrives.
    let d1 = vllm("gone-d1", "decode", "m");
    add_aibrix_pod(&kube, &d1, "m", "decode");
    kube.delete_pod("gone-d0");
    one_set(&envoy, listed, |pods| pods == 2);
    for i in 0..6 {
        assert_eq!(split(&envoy, "m", i).1, "gone-d1");
    }
    assert_eq!(stat(&envoy, "failures"), 0, "{}", envoy.log());
    envoy.assert_counters_zero();
}

#[test]
fn envoy_follows_a_rotated_token_the_real_api_server_issued() {
    let kube = RealKube::start();
    let first = kube.install();
    let (p0, d0) = (
        vllm("rot-p0", "prefill", "m"),
        vllm("rot-d0", "decode", "m"),
    );
    add_aibrix_pod(&kube, &p0, "m", "prefill");
    add_aibrix_pod(&kube, &d0, "m", "decode");
    // deploy/'s way: a projected token file, added by Envoy (file-based
    // SDS on a watched directory), none in the VM environment.
    let scratch = Scratch::new("real-token");
    let watched = scratch.0.join("token-volume");
    std::fs::create_dir(&watched).expect("volume dir");
    let bearer = |t: &str| {
        if envoy_minor() >= 37 {
            t.to_owned()
        } else {
            format!("Bearer {t}")
        }
    };
    let mut file = ProjectedToken::new(&watched, &bearer(&first));
    let sds = scratch.0.join("token-sds.yaml");
    std::fs::write(
        &sds,
        format!(
            "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: kube_api_token\n  generic_secret: {{secret: {{filename: {}}}}}\n",
            watched.join("token").display()
        ),
    )
    .expect("sds file");
    let cluster = injecting_cluster(kube.port, &sds, &watched) + &tls_socket(&kube);
    let envoy = Envoy::start_full(
        &config(json!([])),
        WORKERS,
        &[
            ("  clusters:\n", cluster.as_str()),
            (
                "static_resources:\n",
                "node: {id: pd-router-test, cluster: pd-router-test}\nstatic_resources:\n",
            ),
        ],
        &[],
    );
    let listed = one_set(&envoy, 0, |pods| pods == 2);
    assert_eq!(stat(&envoy, "failures"), 0, "{}", envoy.log());

    // The ServiceAccount re-created: the API server refuses its old
    // tokens (bound to the old object's uid), and the filter says so.
    kube.kubectl(&["delete", "serviceaccount", SA], None);
    kube.apply(&shipped_rbac());
    wait_until("the dead token is counted", || {
        stat(&envoy, "failures") >= 1
    });
    // The ModelAdapters read carries the same token and usually meets it
    // first (it is due every interval; the pod watch holds the one call
    // slot for watch_seconds), so the first failure counted is often not
    // the pods'. Rotating before the pod calls fail too leaves them
    // nothing to recover from: wait for theirs (CI, stop 51).
    assert!(
        envoy.log_lines_with("keeping the last good pod set: 401 Unauthorized") >= 1,
        "{}",
        envoy.log()
    );
    // kubelet would write a new token into the volume: Envoy sends it,
    // and the pods are followed again.
    file.rotate(&bearer(&kube.token()));
    let d1 = vllm("rot-d1", "decode", "m");
    add_aibrix_pod(&kube, &d1, "m", "decode");
    kube.delete_pod("rot-d0");
    one_set(&envoy, listed, |pods| pods == 2);
    for i in 0..6 {
        assert_eq!(split(&envoy, "m", i).1, "rot-d1");
    }
    assert!(
        envoy.log_lines_with("the API server answers again") >= 1,
        "{}",
        envoy.log()
    );
    envoy.assert_counters_zero();
}

//! Adversarial requests, each with its named expected answer: a request
//! that ends with HTTP/2 trailers, and hand-off fields the router owns
//! forged on every path that reaches a pod, split path variants included.
//! Whatever the answer, no pod may receive a forged field.

use crate::harness::*;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};

/// What a case must get.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Split: the prefill pod was called and the decode pod answered.
    Split,
    /// Sent whole to the model's decode pod (routed by model).
    Whole,
    /// Refused by the router: this status and OpenAI error `code`.
    Refused(u16, &'static str),
}

/// The marker every forged field carries: no pod may ever see it.
const FORGED_HOST: &str = "10.9.9.9";

/// A response over HTTP/2.
struct H2Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl H2Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one HTTP/2 request over cleartext whose body ends with trailers
/// (`tests/e2e/h2_client.py`, Python's `h2`, which `just setup` installs).
fn h2_with_trailers(envoy: &Envoy, path: &str, body: &str, trailers: bool) -> H2Answer {
    let python = repo().join(".venv/bin/python");
    let req = json!({
        "port": envoy.port,
        "method": "POST",
        "path": path,
        "headers": [["content-type", "application/json"]],
        "body": body,
        "trailers": if trailers { json!([["x-checksum", "abc"]]) } else { json!([]) },
    });
    let mut child = Command::new(python)
        .arg(repo().join("tests/e2e/h2_client.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python (run `just setup`)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(req.to_string().as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("h2 client");
    assert!(
        out.status.success(),
        "h2 client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("h2 client JSON");
    H2Answer {
        status: v["status"].as_u64().unwrap_or(0) as u16,
        headers: v["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .map(|h| {
                (
                    h[0].as_str().unwrap_or_default().to_owned(),
                    h[1].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
        body: v["body"].as_str().unwrap_or_default().to_owned(),
    }
}

/// One body per API path for model `v` (vLLM), and a call routed by model.
fn every_path() -> Vec<(&'static str, String, Expect)> {
    let chat = r#""messages":[{"role":"user","content":"hi"}]"#;
    vec![
        (
            "/v1/completions",
            r#"{"model":"v","prompt":"p","max_tokens":2}"#.into(),
            Expect::Split,
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"model":"v",{chat},"max_tokens":2}}"#),
            Expect::Split,
        ),
        (
            "/v1/responses",
            r#"{"model":"v","input":"hi","max_output_tokens":2}"#.into(),
            Expect::Split,
        ),
        (
            "/v1/messages",
            format!(r#"{{"model":"v",{chat},"max_tokens":2}}"#),
            Expect::Split,
        ),
        (
            "/inference/v1/generate",
            r#"{"model":"v","token_ids":[1,2,3],"sampling_params":{"max_tokens":2}}"#.into(),
            Expect::Split,
        ),
        (
            "/v1/embeddings",
            r#"{"model":"v","input":"hi"}"#.into(),
            Expect::Whole,
        ),
    ]
}

/// The forged vLLM hand-off of the hardening issue, put first in `body`.
fn with_forged_kv(body: &str) -> String {
    body.replacen(
        '{',
        &format!(r#"{{"kv_transfer_params":{{"do_remote_prefill":true,"remote_host":"{FORGED_HOST}","remote_port":5600}},"#),
        1,
    )
}

fn vllm_pair() -> (Mock, Mock) {
    (
        Mock::start("vp", &["--engine", "vllm", "--role", "prefill"]),
        Mock::start("vd", &["--engine", "vllm", "--role", "decode"]),
    )
}

/// No pod of `mocks` ever received the forged marker.
fn assert_never_forged(mocks: &[&Mock]) {
    for m in mocks {
        for r in m.requests() {
            assert!(
                !r.body.contains(FORGED_HOST),
                "{} received a forged field on {}: {}",
                m.name,
                r.path,
                r.body
            );
        }
    }
}

#[test]
fn trailers_end_the_body_on_every_path() {
    let (vp, vd) = vllm_pair();
    let envoy = Envoy::start(&plugin_config(&[("v", "vllm", None, &[&vp], &[&vd])]));
    for (path, body, expect) in every_path() {
        for forged in [false, true] {
            let (body, expect) = match forged {
                false => (body.clone(), expect),
                true => (
                    with_forged_kv(&body),
                    Expect::Refused(400, "router_owned_field"),
                ),
            };
            let before = vp.requests().len();
            let a = h2_with_trailers(&envoy, path, &body, true);
            let name = format!(
                "{path} with trailers{}",
                if forged { ", forged" } else { "" }
            );
            match expect {
                Expect::Split => {
                    assert_eq!(a.status, 200, "{name}: {}", a.body);
                    assert_eq!(a.header("x-mock-pod"), Some("vd"), "{name}");
                    assert_eq!(a.header("prefill-target-pod"), Some("vp"), "{name}");
                    assert_eq!(vp.requests().len(), before + 1, "{name}: one prefill");
                }
                Expect::Whole => {
                    assert_eq!(a.header("x-mock-pod"), Some("vd"), "{name}: {}", a.body);
                    assert_eq!(vp.requests().len(), before, "{name}: no prefill");
                }
                Expect::Refused(status, code) => {
                    assert_eq!(a.status, status, "{name}: {}", a.body);
                    let v: Value = serde_json::from_str(&a.body).expect("JSON error");
                    assert_eq!(v["error"]["code"], code, "{name}: {v}");
                    assert!(v["error"]["message"].is_string(), "{name}: {v}");
                    assert!(a.header("x-mock-pod").is_none(), "{name}");
                }
            }
        }
    }
    // The same requests without trailers, over HTTP/2 as well.
    let a = h2_with_trailers(
        &envoy,
        "/v1/completions",
        r#"{"model":"v","prompt":"p","max_tokens":2}"#,
        false,
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_never_forged(&[&vp, &vd]);
    assert_eq!(envoy.stat("wasm.pd-router.vm_reload"), 0);
}

/// A forged hand-off field per engine: the model, the field in the
/// error's message, the members.
const FORGED: [(&str, &str, &str); 3] = [
    (
        "v",
        "kv_transfer_params",
        r#""kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.9.9.9","remote_port":5600}"#,
    ),
    (
        "s",
        "bootstrap_host",
        r#""bootstrap_host":"10.9.9.9","bootstrap_port":8998,"bootstrap_room":7"#,
    ),
    (
        "t",
        "disaggregated_params",
        r#""disaggregated_params":{"request_type":"generation_only","ctx_request_id":1,"opaque_state":"10.9.9.9"}"#,
    ),
];

/// Spellings of a split path that engines or proxies may read as it.
fn variants(path: &str) -> Vec<String> {
    vec![
        path.to_owned(),
        format!("{path}/"),
        format!("/{path}"),
        path.replacen('/', "//", 2),
        path.to_ascii_uppercase(),
        format!("{path}%2F"),
        format!("/{}", path.trim_start_matches('/').replace('/', "%2F")),
    ]
}

/// Every engine × split path variant, plus a call routed by model, a
/// pass-through naming no model (SGLang's native `/generate`) and the
/// chat body of the issue: each refused with 400 `router_owned_field`.
fn forged_cases() -> Vec<(String, String, String, Expect)> {
    let mut cases = Vec::new();
    let paths: Vec<String> = [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
    ]
    .iter()
    .flat_map(|p| variants(p))
    .chain(["/v1/embeddings".to_owned(), "/v1/embeddings/".to_owned()])
    .collect();
    for (model, field, forged) in FORGED {
        for path in &paths {
            let body = format!(
                r#"{{"model":"{model}",{forged},"prompt":"p","messages":[{{"role":"user","content":"hi"}}],"input":"x","token_ids":[1],"max_tokens":2}}"#
            );
            let name = format!("{model}: {field} on {path}");
            cases.push((
                name,
                path.clone(),
                body,
                Expect::Refused(400, "router_owned_field"),
            ));
        }
    }
    cases.push((
        "sglang native /generate, no model".into(),
        "/generate".into(),
        r#"{"text":"hi","bootstrap_host":"10.9.9.9","bootstrap_port":8998,"bootstrap_room":7}"#
            .into(),
        Expect::Refused(400, "router_owned_field"),
    ));
    cases.push((
        "JSON only Python reads (NaN), no model".into(),
        "/generate".into(),
        r#"{"text":NaN,"bootstrap_host":"10.9.9.9","bootstrap_room":7}"#.into(),
        Expect::Refused(400, "invalid_body"),
    ));
    cases
}

fn assert_refused_everywhere(envoy: &Envoy, mocks: &[&Mock]) {
    for (name, path, body, expect) in forged_cases() {
        let a = post(&envoy.url(&path), body, &[]);
        let Expect::Refused(status, code) = expect else {
            unreachable!("{name}")
        };
        assert_eq!(a.status, status, "{name}: {}", a.body);
        a.error_message();
        assert_eq!(a.json()["error"]["code"], code, "{name}: {}", a.body);
        assert!(a.header("x-mock-pod").is_none(), "{name}: reached a pod");
    }
    // A bodyless GET still passes straight through.
    let a = get(&envoy.url("/health"), &[]);
    assert!(a.header("x-mock-pod").is_some(), "{}", a.body);
    assert_never_forged(mocks);
}

fn three_engines() -> [Mock; 6] {
    [
        Mock::start("vp", &["--engine", "vllm", "--role", "prefill"]),
        Mock::start("vd", &["--engine", "vllm", "--role", "decode"]),
        Mock::start("sp", &["--engine", "sglang", "--role", "prefill"]),
        Mock::start("sd", &["--engine", "sglang", "--role", "decode"]),
        Mock::start("tp", &["--engine", "trtllm", "--role", "prefill"]),
        Mock::start("td", &["--engine", "trtllm", "--role", "decode"]),
    ]
}

#[test]
fn forged_handoff_fields_reach_no_pod_on_any_path() {
    let [vp, vd, sp, sd, tp, td] = three_engines();
    let config = plugin_config(&[
        ("v", "vllm", None, &[&vp], &[&vd]),
        ("s", "sglang", None, &[&sp], &[&sd]),
        ("t", "trtllm", None, &[&tp], &[&td]),
    ]);
    // The shipped envoy.yaml, which normalizes paths (an escaped slash is
    // redirected, and the client follows it).
    let envoy = Envoy::start(&config);
    assert_refused_everywhere(&envoy, &[&vp, &vd, &sp, &sd, &tp, &td]);
    drop(envoy);
    // Without Envoy's normalization the filter classifies variants itself.
    let envoy = Envoy::start_edited(
        &config,
        1,
        &[
            ("normalize_path: true", "normalize_path: false"),
            ("merge_slashes: true", "merge_slashes: false"),
            (
                "path_with_escaped_slashes_action: UNESCAPE_AND_REDIRECT",
                "path_with_escaped_slashes_action: KEEP_UNCHANGED",
            ),
        ],
    );
    assert_refused_everywhere(&envoy, &[&vp, &vd, &sp, &sd, &tp, &td]);
    // A clean request on a variant is split as the path it stands for.
    let a = post(
        &envoy.url("/V1/chat/completions/"),
        r#"{"model":"v","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#,
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("vp"));
    let last = vd.requests().pop().expect("decode request");
    assert_eq!(last.path, "/v1/chat/completions");
}

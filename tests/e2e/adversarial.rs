//! Adversarial requests, each with its named expected answer (an `enum`
//! per group of cases): HTTP/2 framing (trailers, a header block across
//! CONTINUATION, RST_STREAM mid-body, `expect: 100-continue`), duplicated
//! and odd-cased headers, hand-off fields the router owns forged for every
//! engine and connector on every path that reaches a pod (split path
//! variants included), concurrent requests sharing one request id, and a
//! client that leaves at each phase. Whatever the answer, no pod may
//! receive a forged field, and the shared counters end at zero.

use crate::harness::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

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
    /// The 1xx statuses before the final one.
    informational: Vec<u16>,
    /// Envoy's RST_STREAM code, when it reset the stream.
    reset: Option<u32>,
    /// Envoy's GOAWAY code, when it ended the connection.
    goaway: Option<u32>,
    /// Envoy closed the connection before any answer.
    closed: bool,
    /// The frame types that carried the request's header block.
    head_frames: Vec<u8>,
}

impl H2Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// HTTP/2 frame types (RFC 9113 §6).
const HEADERS_FRAME: u8 = 0x1;
const CONTINUATION_FRAME: u8 = 0x9;

/// Sends one HTTP/2 request over cleartext whose body ends with trailers
/// (`tests/e2e/h2_client.py`, Python's `h2`, which `just setup` installs).
fn h2_with_trailers(envoy: &Envoy, path: &str, body: &str, trailers: bool) -> H2Answer {
    h2_request(
        envoy,
        json!({
            "path": path,
            "body": body,
            "trailers": if trailers { json!([["x-checksum", "abc"]]) } else { json!([]) },
        }),
    )
}

/// Sends one HTTP/2 request described by `req` (keys of
/// `tests/e2e/h2_client.py`; `method`, `headers` and `trailers` default to
/// a POST of JSON with none).
fn h2_request(envoy: &Envoy, mut req: Value) -> H2Answer {
    req["port"] = envoy.port.into();
    if req.get("method").is_none() {
        req["method"] = "POST".into();
    }
    if req.get("headers").is_none() {
        req["headers"] = json!([["content-type", "application/json"]]);
    }
    if req.get("trailers").is_none() {
        req["trailers"] = json!([]);
    }
    let python = repo().join(".venv/bin/python");
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
    let numbers = |key: &str| -> Vec<u64> {
        v[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
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
        informational: numbers("informational")
            .into_iter()
            .map(|n| n as u16)
            .collect(),
        reset: v["reset"].as_u64().map(|c| c as u32),
        goaway: v["goaway"].as_u64().map(|c| c as u32),
        closed: v["closed"].as_bool().unwrap_or(false),
        head_frames: numbers("head_frames")
            .into_iter()
            .map(|n| n as u8)
            .collect(),
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

// ---------------------------------------------------------------------
// Raw HTTP/1.1, for what reqwest will not send: odd-cased names, two
// `content-length`s, a body that waits for `100 Continue`, a body cut off.

/// A response read off a raw HTTP/1.1 connection.
struct RawAnswer {
    status: u16,
    /// The 1xx statuses before the final one.
    interim: Vec<u16>,
    /// The final status line and headers, lowercased names.
    headers: Vec<(String, String)>,
    body: String,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A response head: status, headers (lowercased names), and what follows.
type Head<'a> = (u16, Vec<(String, String)>, &'a [u8]);

/// One head (status line and headers) off the front of `buf`, and the rest.
fn split_head(buf: &[u8]) -> Option<Head<'_>> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some((status, headers, &buf[end + 4..]))
}

/// A chunked body decoded (what follows the head when it says `chunked`).
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
            .unwrap_or(0);
        rest = &rest[eol + 2..];
        if size == 0 || rest.len() < size {
            break;
        }
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    out
}

/// Writes `head` (which must say `connection: close`) and `body` on a new
/// connection, the body only after the interim answer when `wait_100` (as
/// a client honouring `expect: 100-continue` does; after 3 s without one
/// it sends anyway, as curl does after 1 s), then reads until Envoy closes.
fn raw_http1(envoy: &Envoy, head: &str, body: &[u8], wait_100: bool) -> RawAnswer {
    let mut s = TcpStream::connect(("127.0.0.1", envoy.port)).expect("connect");
    s.write_all(head.as_bytes()).expect("write head");
    let mut got = Vec::new();
    if wait_100 {
        s.set_read_timeout(Some(Duration::from_secs(3))).ok();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }
    // Envoy may have answered and closed already.
    let _ = s.write_all(body);
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let _ = s.read_to_end(&mut got);
    let mut rest = got.as_slice();
    let mut interim = Vec::new();
    loop {
        let Some((status, headers, after)) = split_head(rest) else {
            return RawAnswer {
                status: 0,
                interim,
                headers: Vec::new(),
                body: String::from_utf8_lossy(rest).into_owned(),
            };
        };
        if (100..200).contains(&status) {
            interim.push(status);
            rest = after;
            continue;
        }
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked {
            dechunk(after)
        } else {
            after.to_vec()
        };
        return RawAnswer {
            status,
            interim,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        };
    }
}

/// An HTTP/1.1 POST head with `extra` header lines (each ending `\r\n`).
fn h1_head(path: &str, extra: &str, body_len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\ncontent-type: application/json\r\n{extra}content-length: {body_len}\r\n\r\n"
    )
}

const COMPLETION: &str = r#"{"model":"v","prompt":"p","max_tokens":2}"#;

/// The requests `mock` received whose `x-request-id` is `id`.
fn received_with_id(mock: &Mock, id: &str) -> Vec<Logged> {
    mock.requests()
        .into_iter()
        .filter(|r| r.header("x-request-id") == Some(id))
        .collect()
}

/// A clean split still goes through (Envoy and the VM survived the case).
fn assert_still_serving(envoy: &Envoy, decode: &str) {
    let a = post(&envoy.url("/v1/completions"), COMPLETION, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-mock-pod"), Some(decode));
    assert_eq!(envoy.stat("wasm.pd-router.vm_reload"), 0);
}

/// Some pseudo-random hex, which HPACK cannot shrink below ~5/8 of it.
fn noise(len: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x % 16) as u32, 16).unwrap_or('0')
        })
        .collect()
}

/// What a framing case must get, beyond `Expect`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    /// The header block crossed a CONTINUATION frame; the request split.
    SplitAcrossContinuation,
    /// The client reset the stream mid-body: no pod saw any of it.
    AbandonedBeforeAnyPod,
    /// `expect: 100-continue`: a `100` first, then the usual split answer.
    InterimThenSplit,
}

#[test]
fn http2_framing_continuation_reset_mid_body_and_100_continue() {
    let (vp, vd) = vllm_pair();
    let envoy = Envoy::start_with(&plugin_config(&[("v", "vllm", None, &[&vp], &[&vd])]), 2);

    // HEADERS + CONTINUATION: a 40 KB header, past the 16 KiB frame the
    // client may send before Envoy's SETTINGS, so h2 splits the block
    // (Envoy's header limit is 60 KiB).
    let padding = noise(40_000);
    let case = Framing::SplitAcrossContinuation;
    let a = h2_request(
        &envoy,
        json!({
            "path": "/v1/completions",
            "headers": [["content-type", "application/json"], ["x-request-id", "h2-cont"],
                        ["x-padding", padding]],
            "body": COMPLETION,
        }),
    );
    assert_eq!(a.head_frames.first(), Some(&HEADERS_FRAME), "{case:?}");
    assert!(
        a.head_frames.contains(&CONTINUATION_FRAME),
        "{case:?}: the client sent no CONTINUATION: {:?}",
        a.head_frames
    );
    assert_eq!(a.status, 200, "{case:?}: {}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("vp"), "{case:?}");
    assert_eq!(a.header("x-mock-pod"), Some("vd"), "{case:?}");
    let decoded = received_with_id(&vd, "h2-cont");
    assert_eq!(decoded.len(), 1, "{case:?}");
    assert_eq!(
        decoded[0].header("x-padding"),
        Some(padding.as_str()),
        "{case:?}: the decode got the whole header block"
    );
    assert_eq!(received_with_id(&vp, "h2-cont").len(), 1, "{case:?}");

    // RST_STREAM after the first half of the body, before END_STREAM.
    let case = Framing::AbandonedBeforeAnyPod;
    for path in ["/v1/completions", "/v1/embeddings"] {
        let id = format!("h2-rst{}", path.replace('/', "-"));
        let a = h2_request(
            &envoy,
            json!({
                "path": path,
                "headers": [["content-type", "application/json"], ["x-request-id", id]],
                "body": r#"{"model":"v","prompt":"a prompt long enough to cut in two","input":"x","max_tokens":2}"#,
                "reset_after_half": true,
            }),
        );
        assert_eq!(a.status, 0, "{case:?} {path}");
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            received_with_id(&vp, &id).is_empty(),
            "{case:?} {path}: a prefill was sent"
        );
        assert!(
            received_with_id(&vd, &id).is_empty(),
            "{case:?} {path}: a pod got half a body"
        );
    }
    assert!(envoy.stat("http.pd.downstream_rq_rx_reset") >= 2);
    envoy.assert_counters_zero();
    assert_still_serving(&envoy, "vd");

    // `expect: 100-continue` over HTTP/2 and HTTP/1.1: Envoy answers the
    // 1xx itself (proxy_100_continue is off) and the filter splits as usual.
    let case = Framing::InterimThenSplit;
    let a = h2_request(
        &envoy,
        json!({
            "path": "/v1/chat/completions",
            "headers": [["content-type", "application/json"], ["expect", "100-continue"]],
            "body": r#"{"model":"v","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#,
            "wait_100": true,
        }),
    );
    assert_eq!(a.informational, vec![100], "{case:?} over HTTP/2");
    assert_eq!(a.status, 200, "{case:?} over HTTP/2: {}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("vp"), "{case:?}");
    let a = raw_http1(
        &envoy,
        &h1_head(
            "/v1/completions",
            "expect: 100-continue\r\n",
            COMPLETION.len(),
        ),
        COMPLETION.as_bytes(),
        true,
    );
    assert_eq!(a.interim, vec![100], "{case:?} over HTTP/1.1");
    assert_eq!(a.status, 200, "{case:?} over HTTP/1.1: {}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("vp"), "{case:?}");
    assert_eq!(a.header("x-mock-pod"), Some("vd"), "{case:?}");
    // No pod sees the expectation: Envoy consumed it.
    for r in vp.requests().iter().chain(vd.requests().iter()) {
        assert!(r.header("expect").is_none(), "{} got expect", r.path);
    }
    envoy.assert_counters_zero();
}

/// What a duplicated or odd-cased header must get.
#[derive(Debug, Clone, Copy, PartialEq)]
enum HeaderCase {
    /// Split, both legs carrying one and the same request id.
    SplitPairedByOneId,
    /// Split to the configured pods: the client's routing headers went.
    SplitRoutingStripped,
    /// Split, the response naming the pods the router chose, once each.
    SplitPodHeadersTheRouters,
    /// Envoy's codec refuses the request before any filter: this status.
    RefusedByEnvoy(u16),
    /// An uppercase name makes the HTTP/2 request malformed (RFC 9113
    /// §8.2.1); Envoy's codec ends the whole connection, no answer.
    ConnectionClosedByEnvoy,
}

#[test]
fn duplicate_and_odd_cased_headers_get_named_answers() {
    let (vp, vd) = vllm_pair();
    let envoy = Envoy::start_with(&plugin_config(&[("v", "vllm", None, &[&vp], &[&vd])]), 2);
    let url = envoy.url("/v1/completions");
    let prefill_count = || vp.requests().len();
    let decode_count = || vd.requests().len();

    // Two `x-request-id`s (reqwest appends): whatever Envoy makes of them,
    // the prefill leg and the decode leg carry the same one.
    let case = HeaderCase::SplitPairedByOneId;
    let a = post(
        &url,
        COMPLETION,
        &[("x-request-id", "dup-a"), ("x-request-id", "dup-b")],
    );
    assert_eq!(a.status, 200, "{case:?}: {}", a.body);
    let p = vp.requests().pop().expect("prefill");
    let d = vd.requests().pop().expect("decode");
    let pid = p.header("x-request-id").expect("prefill id").to_owned();
    assert!(pid.contains("dup-a"), "{case:?}: {pid}");
    assert_eq!(d.header("x-request-id"), Some(pid.as_str()), "{case:?}");
    // `X-Request-Id` as the client spelt it (HTTP/1.1 names are
    // case-insensitive; Envoy lowercases them).
    let a = raw_http1(
        &envoy,
        &h1_head(
            "/v1/completions",
            "X-Request-Id: OddCase-1\r\n",
            COMPLETION.len(),
        ),
        COMPLETION.as_bytes(),
        false,
    );
    assert_eq!(a.status, 200, "{case:?}: {}", a.body);
    assert_eq!(received_with_id(&vp, "OddCase-1").len(), 1, "{case:?}");
    assert_eq!(received_with_id(&vd, "OddCase-1").len(), 1, "{case:?}");
    // Over HTTP/2 an uppercase name is malformed: Envoy drops the
    // connection (`stream_error_on_invalid_http_message` is off).
    let case = HeaderCase::ConnectionClosedByEnvoy;
    let (p0, d0) = (prefill_count(), decode_count());
    let a = h2_request(
        &envoy,
        json!({
            "path": "/v1/completions",
            "headers": [["content-type", "application/json"], ["X-Request-Id", "h2-upper"]],
            "body": COMPLETION,
            "raw_names": true,
        }),
    );
    assert!(
        a.status == 0 && a.closed,
        "{case:?}: {} reset {:?} goaway {:?} closed {} {}",
        a.status,
        a.reset,
        a.goaway,
        a.closed,
        a.body
    );
    assert_eq!((prefill_count(), decode_count()), (p0, d0), "{case:?}");

    // Routing headers, duplicated and odd-cased, aimed at Envoy's admin.
    let case = HeaderCase::SplitRoutingStripped;
    let admin = format!("127.0.0.1:{}", envoy.admin);
    for routing in [
        "x-envoy-original-dst-host",
        "x-gateway-destination-endpoint",
    ] {
        let a = post(&url, COMPLETION, &[(routing, &admin), (routing, &admin)]);
        assert_eq!(a.status, 200, "{case:?} {routing}: {}", a.body);
        assert_eq!(a.header("x-mock-pod"), Some("vd"), "{case:?} {routing}");
        assert_eq!(a.header("prefill-target-pod"), Some("vp"), "{case:?}");
    }
    let a = raw_http1(
        &envoy,
        &h1_head(
            "/v1/completions",
            &format!(
                "X-Envoy-Original-Dst-Host: {admin}\r\nx-envoy-original-dst-host: {admin}\r\n"
            ),
            COMPLETION.len(),
        ),
        COMPLETION.as_bytes(),
        false,
    );
    assert_eq!(a.status, 200, "{case:?}: {}", a.body);
    assert_eq!(a.header("x-mock-pod"), Some("vd"), "{case:?}");
    for r in vp.requests().iter().chain(vd.requests().iter()) {
        let dst = r.header("x-envoy-original-dst-host").unwrap_or_default();
        assert!(!dst.contains(&admin), "{case:?}: {} got {dst}", r.path);
    }

    // The router's own response headers, sent by the client.
    let case = HeaderCase::SplitPodHeadersTheRouters;
    let a = post(
        &url,
        COMPLETION,
        &[
            ("decode-target-pod", "evil"),
            ("prefill-target-pod", "evil"),
            ("Prefill-Target-Pod-Ip", FORGED_HOST),
        ],
    );
    assert_eq!(a.status, 200, "{case:?}: {}", a.body);
    for (name, want) in [
        ("decode-target-pod", "vd".to_owned()),
        ("prefill-target-pod", "vp".to_owned()),
        ("prefill-target-pod-ip", "127.0.0.1".to_owned()),
    ] {
        let values: Vec<_> = a.headers.get_all(name).iter().collect();
        assert_eq!(values.len(), 1, "{case:?} {name}: {values:?}");
        assert_eq!(a.header(name), Some(want.as_str()), "{case:?} {name}");
    }

    // Two `content-length`s: Envoy's HTTP/1.1 codec refuses both spellings
    // (equal values and different ones) with a 400 before the filter.
    let case = HeaderCase::RefusedByEnvoy(400);
    let (p0, d0) = (prefill_count(), decode_count());
    let n = COMPLETION.len();
    for extra in [
        format!("content-length: {n}\r\n"),
        format!("Content-Length: {}\r\n", n + 5),
    ] {
        let a = raw_http1(
            &envoy,
            &h1_head("/v1/completions", &extra, n),
            COMPLETION.as_bytes(),
            false,
        );
        assert_eq!(a.status, 400, "{case:?} {extra:?}: {}", a.body);
        assert!(a.header("x-mock-pod").is_none(), "{case:?}");
    }
    assert_eq!((prefill_count(), decode_count()), (p0, d0), "{case:?}");

    // Two `content-type`s: the split path reads the body as JSON whatever
    // the type says, so it splits.
    let case = HeaderCase::SplitPairedByOneId;
    let a = raw_http1(
        &envoy,
        &h1_head(
            "/v1/completions",
            "Content-Type: text/plain\r\nx-request-id: two-types\r\n",
            COMPLETION.len(),
        ),
        COMPLETION.as_bytes(),
        false,
    );
    assert_eq!(a.status, 200, "{case:?} two content-types: {}", a.body);
    assert_eq!(received_with_id(&vp, "two-types").len(), 1, "{case:?}");
    assert_eq!(received_with_id(&vd, "two-types").len(), 1, "{case:?}");

    assert_never_forged(&[&vp, &vd]);
    envoy.assert_counters_zero();
    assert_still_serving(&envoy, "vd");
}

// ---------------------------------------------------------------------
// Every engine and connector × every split path and a call routed by
// model × each field the router owns there.

/// The models of the matrix: name, engine, connector, and the owned
/// fields a client may try, as body members.
fn owned_fields() -> Vec<(
    &'static str,
    &'static str,
    Option<&'static str>,
    Vec<String>,
)> {
    let kv = |key: &str, value: &str| format!(r#""kv_transfer_params":{{"{key}":{value}}}"#);
    let host = format!(r#""{FORGED_HOST}""#);
    let vllm = |connector_keys: &[(&str, &str)]| -> Vec<String> {
        connector_keys
            .iter()
            .map(|(k, v)| kv(k, v))
            .chain([format!(r#""disagg_prefill_resp":{{"remote_host":{host}}}"#)])
            .collect()
    };
    vec![
        (
            "vn",
            "vllm",
            Some("nixl"),
            vllm(&[
                ("do_remote_prefill", "true"),
                ("remote_host", &host),
                ("remote_block_ids", "[1,2]"),
                ("remote_engine_id", &host),
            ]),
        ),
        (
            "vm",
            "vllm",
            Some("mooncake"),
            vllm(&[
                ("transfer_id", &host),
                ("remote_bootstrap_addr", &host),
                ("is_request_leader", "true"),
            ]),
        ),
        (
            "vu",
            "vllm",
            Some("nixl_push"),
            vllm(&[
                ("do_remote_decode", "true"),
                ("remote_request_id", &host),
                ("remote_port", "5600"),
            ]),
        ),
        (
            "vc",
            "vllm",
            Some("p2p_nccl"),
            vllm(&[("do_remote_prefill", "true"), ("_marker", &host)]),
        ),
        (
            "s",
            "sglang",
            None,
            [
                ("bootstrap_host", host.as_str()),
                ("bootstrap_port", "8998"),
                ("bootstrap_room", "7"),
                ("routed_dp_rank", "0"),
                ("disagg_prefill_dp_rank", "0"),
                ("data_parallel_rank", "0"),
            ]
            .iter()
            .map(|(k, v)| format!(r#""{k}":{v}"#))
            .collect(),
        ),
        (
            "t",
            "trtllm",
            None,
            vec![
                format!(
                    r#""disaggregated_params":{{"request_type":"generation_only","opaque_state":{host}}}"#
                ),
                r#""prompt_token_ids":[1,2,3]"#.to_owned(),
                r#""prompt_token_ids_b64":"AQID""#.to_owned(),
            ],
        ),
    ]
}

/// What a field-matrix case must get.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FieldCase {
    /// 400 `router_owned_field`, no pod reached.
    RefusedAsOwned,
    /// The same request without the field is not refused as owned: it
    /// gets the path's own answer (split or routed by model; TensorRT-LLM
    /// refuses `/v1/responses` as `unsupported`; the SGLang mock has no
    /// `/v1/responses`, its prefill's 404 is a 502 `prefill_failed`).
    CleanNotRefusedAsOwned,
    /// A forged pairing id (P2P NCCL's `___prefill_addr_…___` in the
    /// client's id) is replaced by the router's: split, to the real pods.
    SplitWithTheRoutersId,
}

#[test]
fn owned_fields_are_refused_for_every_engine_connector_and_path() {
    let specs = owned_fields();
    let mocks: Vec<(Mock, Mock)> = specs
        .iter()
        .map(|(model, engine, connector, _)| {
            let mut pa = vec!["--engine", engine, "--role", "prefill"];
            let mut da = vec!["--engine", engine, "--role", "decode"];
            if let Some(c) = connector {
                pa.extend(["--connector", c]);
                da.extend(["--connector", c]);
            }
            (
                Mock::start(&format!("{model}p"), &pa),
                Mock::start(&format!("{model}d"), &da),
            )
        })
        .collect();
    let pods: Vec<([&Mock; 1], [&Mock; 1])> = mocks.iter().map(|(p, d)| ([p], [d])).collect();
    let models: Vec<ModelSpec> = specs
        .iter()
        .zip(&pods)
        .map(|((m, e, c, _), (p, d))| (*m, *e, *c, &p[..], &d[..]))
        .collect();
    let config = plugin_config(&models);
    let envoy = Envoy::start_with(&config, 2);
    // The Mooncake prefill takes requests once its engine id is learned.
    wait_until("the Mooncake model serves", || {
        post(
            &envoy.url("/v1/completions"),
            r#"{"model":"vm","prompt":"warm","max_tokens":2}"#,
            &[],
        )
        .status
            == 200
    });
    let all: Vec<&Mock> = mocks.iter().flat_map(|(p, d)| [p, d]).collect();
    let received = || all.iter().map(|m| m.requests().len()).sum::<usize>();
    let paths = [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
        "/v1/embeddings",
    ];
    let mut cases = 0;
    for (model, engine, connector, fields) in &specs {
        for path in paths {
            let clean = format!(
                r#"{{"model":"{model}","prompt":"p","messages":[{{"role":"user","content":"hi"}}],"input":"x","token_ids":[1],"max_tokens":2}}"#
            );
            for field in fields {
                let case = FieldCase::RefusedAsOwned;
                let name = format!("{model} ({engine} {connector:?}) {path} {field}: {case:?}");
                let before = received();
                let body = clean.replacen('{', &format!("{{{field},"), 1);
                let a = post(&envoy.url(path), body, &[]);
                assert_eq!(a.status, 400, "{name}: {}", a.body);
                a.error_message();
                assert_eq!(a.json()["error"]["code"], "router_owned_field", "{name}");
                assert_eq!(received(), before, "{name}: reached a pod");
                cases += 1;
            }
            // The clean request is not refused: the refusal was the field's.
            let case = FieldCase::CleanNotRefusedAsOwned;
            let a = post(&envoy.url(path), clean, &[]);
            assert!(
                !a.body.contains("router_owned_field"),
                "{model} {path} {case:?}: {} {}",
                a.status,
                a.body
            );
        }
    }
    assert!(cases >= 6 * 4 * 3, "{cases} cases");

    // P2P NCCL pairs by an id that names the prefill's address: a client's
    // id naming another address never reaches a pod.
    let case = FieldCase::SplitWithTheRoutersId;
    let forged_id =
        format!("___prefill_addr_{FORGED_HOST}:5600___decode_addr_{FORGED_HOST}:5601_x");
    for path in ["/v1/completions", "/v1/responses"] {
        // The body id counts on /v1/responses only (vLLM reads the header
        // elsewhere), and there the router writes its own.
        let mut body = json!({"model": "vc", "prompt": "p", "input": "x", "max_tokens": 2,
                              "max_output_tokens": 2});
        if path == "/v1/responses" {
            body["request_id"] = forged_id.clone().into();
        }
        let a = post(
            &envoy.url(path),
            body.to_string(),
            &[("x-request-id", &forged_id)],
        );
        assert_eq!(a.status, 200, "{case:?} {path}: {}", a.body);
        assert_eq!(a.header("prefill-target-pod"), Some("vcp"), "{case:?}");
    }
    for m in &all {
        for r in m.requests() {
            let id = r.header("x-request-id").unwrap_or_default();
            assert!(!id.contains(FORGED_HOST), "{} got id {id}", m.name);
        }
    }
    assert_never_forged(&all);
    envoy.assert_counters_zero();
}

// ---------------------------------------------------------------------
// Concurrent requests that share one `x-request-id` and one body
// `request_id`: the router's own pairing (KV addresses, rooms, transfer
// and context ids) keeps them apart, and the mocks fail a mispaired KV.

/// What each of the concurrent duplicates must get.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Duplicates {
    /// 200 with its own answer (its own token count and prompt), every
    /// load given back.
    EachItsOwnAnswer,
}

fn concurrent_duplicate_ids(engine: &str, connector: Option<&str>) {
    const N: usize = 8;
    let mut pa = vec!["--engine", engine, "--role", "prefill"];
    let mut da = vec!["--engine", engine, "--role", "decode"];
    if let Some(c) = connector {
        pa.extend(["--connector", c]);
        da.extend(["--connector", c]);
    }
    let p = Mock::start("dup-p", &pa);
    let d = Mock::start("dup-d", &da);
    let envoy = Envoy::start_with(&plugin_config(&[("m", engine, connector, &[&p], &[&d])]), 2);
    let case = Duplicates::EachItsOwnAnswer;
    let url = envoy.url("/v1/completions");
    // A Mooncake prefill takes requests once its engine id is learned.
    wait_until("the model serves", || {
        post(
            &url,
            r#"{"model":"m","prompt":"warm","max_tokens":2}"#,
            &[("x-request-id", "warm")],
        )
        .status
            == 200
    });
    let before = (p.requests().len(), d.requests().len());
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|i| {
                let url = &url;
                s.spawn(move || {
                    let body = json!({"model": "m", "prompt": "word ".repeat(i + 1),
                                      "max_tokens": i + 2, "request_id": "dup-1"});
                    post(url, body.to_string(), &[("x-request-id", "dup-1")])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("request"))
            .collect()
    });
    let mut prompts = Vec::new();
    for (i, a) in answers.iter().enumerate() {
        let name = format!("{engine} {connector:?} #{i}: {case:?}");
        assert_eq!(a.status, 200, "{name}: {}", a.body);
        let v = a.json();
        assert_eq!(v["usage"]["completion_tokens"], i + 2, "{name}: {v}");
        let text = v["choices"][0]["text"].as_str().unwrap_or_default();
        assert_eq!(text.split_whitespace().count(), i + 2, "{name}: {text:?}");
        prompts.push(v["usage"]["prompt_tokens"].as_u64().unwrap_or(0));
        assert_eq!(a.header("x-mock-pod"), Some("dup-d"), "{name}");
    }
    let mut distinct = prompts.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), N, "{engine}: prompt counts {prompts:?}");
    // (P2P NCCL's legs carry the router's id, not the client's: count.)
    assert_eq!(
        p.requests().len() - before.0,
        N,
        "{engine}: one prefill each"
    );
    assert_eq!(
        d.requests().len() - before.1,
        N,
        "{engine}: one decode each"
    );
    envoy.assert_counters_zero();
}

#[test]
fn duplicate_ids_vllm_nixl() {
    concurrent_duplicate_ids("vllm", Some("nixl"));
}

#[test]
fn duplicate_ids_vllm_mooncake() {
    concurrent_duplicate_ids("vllm", Some("mooncake"));
}

#[test]
fn duplicate_ids_vllm_p2p_nccl() {
    concurrent_duplicate_ids("vllm", Some("p2p_nccl"));
}

#[test]
fn duplicate_ids_vllm_nixl_push() {
    concurrent_duplicate_ids("vllm", Some("nixl_push"));
}

#[test]
fn duplicate_ids_sglang() {
    concurrent_duplicate_ids("sglang", None);
}

#[test]
fn duplicate_ids_trtllm() {
    concurrent_duplicate_ids("trtllm", None);
}

// ---------------------------------------------------------------------
// A client that leaves at each phase.

/// Where the client leaves, and what must follow.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Leaves {
    /// While the body is buffered: no pod sees the request.
    WhileBuffering,
    /// While the prefill is in flight: no decode is ever sent.
    DuringPrefill,
    /// While the decode streams: the stream ends, its load is given back.
    DuringDecodeStream,
    /// While queued for admission: it leaves the queue, never placed.
    WhileQueued,
}

/// A client that gives up after `ms`.
fn impatient(ms: u64) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(ms))
        .no_proxy()
        .build()
        .expect("client")
}

#[test]
fn a_client_leaving_at_each_phase_leaves_nothing_behind() {
    let (vp, vd) = (
        Mock::start("vp", &["--engine", "vllm", "--role", "prefill"]),
        Mock::start(
            "vd",
            &[
                "--engine",
                "vllm",
                "--role",
                "decode",
                "--stream-delay-ms",
                "100",
            ],
        ),
    );
    let slow_args = |engine: &'static str, role: &'static str| {
        let mut a = vec!["--engine", engine, "--role", role];
        if role == "prefill" {
            a.extend(["--fault", "delay:1500"]);
        }
        a
    };
    let (sv_p, sv_d) = (
        Mock::start("slow-vp", &slow_args("vllm", "prefill")),
        Mock::start("slow-vd", &slow_args("vllm", "decode")),
    );
    let (st_p, st_d) = (
        Mock::start("slow-tp", &slow_args("trtllm", "prefill")),
        Mock::start("slow-td", &slow_args("trtllm", "decode")),
    );
    let envoy = Envoy::start_with(
        &plugin_config(&[
            ("v", "vllm", None, &[&vp], &[&vd]),
            ("slow-v", "vllm", None, &[&sv_p], &[&sv_d]),
            ("slow-t", "trtllm", None, &[&st_p], &[&st_d]),
        ]),
        2,
    );
    let url = envoy.url("/v1/completions");
    let all = [&vp, &vd, &sv_p, &sv_d, &st_p, &st_d];

    let case = Leaves::WhileBuffering;
    let body = COMPLETION.as_bytes();
    {
        let mut s = TcpStream::connect(("127.0.0.1", envoy.port)).expect("connect");
        let head = h1_head(
            "/v1/completions",
            "x-request-id: leave-buffering\r\n",
            body.len(),
        );
        s.write_all(head.as_bytes()).expect("head");
        s.write_all(&body[..body.len() / 2]).expect("half a body");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(300));
    for m in all {
        assert!(
            received_with_id(m, "leave-buffering").is_empty(),
            "{case:?}: {}",
            m.name
        );
    }
    envoy.assert_counters_zero();
    assert_still_serving(&envoy, "vd");

    let case = Leaves::DuringPrefill;
    for (model, p, d) in [("slow-v", &sv_p, &sv_d), ("slow-t", &st_p, &st_d)] {
        let id = format!("leave-prefill-{model}");
        let body = json!({"model": model, "prompt": "p", "max_tokens": 2});
        let r = impatient(400)
            .post(&url)
            .header("content-type", "application/json")
            .header("x-request-id", &id)
            .body(body.to_string())
            .send();
        assert!(r.is_err(), "{case:?} {model}: answered within 400 ms");
        // The prefill answers at 1.5 s; give it time to, and the flow to
        // (not) send the decode.
        std::thread::sleep(Duration::from_millis(2000));
        assert!(
            received_with_id(d, &id).is_empty(),
            "{case:?} {model}: a decode was sent after the client left"
        );
        assert!(
            d.requests().is_empty(),
            "{case:?} {model}: the decode pod got {:?}",
            d.requests()
        );
        assert!(
            p.requests().len() <= 1,
            "{case:?} {model}: one prefill at most"
        );
        envoy.assert_counters_zero();
        // The slow model itself still serves.
        let a = post(&url, body.to_string(), &[]);
        assert_eq!(a.status, 200, "{case:?} {model} next: {}", a.body);
    }

    let case = Leaves::DuringDecodeStream;
    {
        let body = json!({"model": "v", "prompt": "p", "max_tokens": 40, "stream": true});
        let mut r = http()
            .post(&url)
            .header("content-type", "application/json")
            .header("x-request-id", "leave-stream")
            .body(body.to_string())
            .send()
            .expect("send");
        assert_eq!(r.status(), 200, "{case:?}");
        let mut buf = [0u8; 64];
        let n = r.read(&mut buf).expect("first bytes");
        assert!(n > 0, "{case:?}");
    }
    envoy.assert_counters_zero();
    assert_eq!(received_with_id(&vd, "leave-stream").len(), 1, "{case:?}");
    assert_still_serving(&envoy, "vd");
    assert_eq!(envoy.stat("wasm.pd-router.vm_reload"), 0);
}

/// What an objective header must get while the only pod is full.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Objective {
    /// `batch` (priority -1) is shed at once: 429 `saturated`.
    Shed,
    /// A priority that may wait waits, and is served once there is room.
    QueuedThenSplit,
}

/// Sums the process-wide admission `waiting` gauges.
fn waiting(envoy: &Envoy) -> u64 {
    envoy
        .stats("wasmcustom.pd_router.admission.waiting")
        .iter()
        .map(|(_, v)| *v)
        .sum()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn objective_headers_and_leaving_the_admission_queue() {
    let p = Mock::start("adm-p", &["--engine", "vllm", "--role", "prefill"]);
    let d = Mock::start(
        "adm-d",
        &[
            "--engine",
            "vllm",
            "--role",
            "decode",
            "--stream-delay-ms",
            "100",
        ],
    );
    let config = json!({
        "prefill_timeout_ms": 5000,
        "admission": {"max_in_flight_per_pod": 1},
        "objectives": {"premium": 10, "standard": 0, "batch": -1},
        "models": [{"name": "v", "engine": "vllm",
                    "rolesets": [{"prefill": [p.endpoint()], "decode": [d.endpoint()]}]}]
    });
    let envoy = Envoy::start_with(&config, 2);
    let url = envoy.url("/v1/completions");
    let request = |id: &str, objectives: &[&str], tokens: u32| {
        let body = json!({"model": "v", "prompt": format!("prompt of {id}"),
                          "max_tokens": tokens, "stream": true});
        let mut headers = vec![("x-request-id", id)];
        headers.extend(
            objectives
                .iter()
                .map(|o| ("x-gateway-inference-objective", *o)),
        );
        post(&url, body.to_string(), &headers)
    };
    std::thread::scope(|s| {
        // 30 tokens at 100 ms hold the only decode place for ~3 s.
        let held = s.spawn(|| request("held", &["standard"], 30));
        wait_until("the held request is placed", || {
            !received_with_id(&p, "held").is_empty()
        });

        // Odd-cased, as an HTTP/1.1 client may spell it: the same header.
        let case = Objective::Shed;
        let body = json!({"model": "v", "prompt": "p", "max_tokens": 2}).to_string();
        let a = raw_http1(
            &envoy,
            &h1_head(
                "/v1/completions",
                "X-Gateway-Inference-Objective: batch\r\n",
                body.len(),
            ),
            body.as_bytes(),
            false,
        );
        assert_eq!(a.status, 429, "{case:?} odd-cased: {}", a.body);
        assert_eq!(
            a.header("x-pd-dropped-reason"),
            Some("saturated"),
            "{case:?}"
        );
        // Duplicated: the first value counts (batch, then premium: shed).
        let a = request("dup-batch-first", &["batch", "premium"], 2);
        assert_eq!(a.status, 429, "{case:?} batch first: {}", a.body);
        assert_eq!(
            a.header("x-pd-dropped-reason"),
            Some("saturated"),
            "{case:?}"
        );

        // A client that leaves while queued.
        let case = Leaves::WhileQueued;
        let body = json!({"model": "v", "prompt": "queued", "max_tokens": 2});
        let r = impatient(500)
            .post(&url)
            .header("content-type", "application/json")
            .header("x-request-id", "leave-queued")
            .header("x-gateway-inference-objective", "standard")
            .body(body.to_string())
            .send();
        assert!(r.is_err(), "{case:?}: answered while the pod was full");
        wait_until("the queue empties", || waiting(&envoy) == 0);

        // Premium, then batch: the first counts, so it waits its turn.
        let case = Objective::QueuedThenSplit;
        let queued = s.spawn(|| request("dup-premium-first", &["premium", "batch"], 2));
        wait_until("the premium request queues", || waiting(&envoy) == 1);
        let a = queued.join().expect("queued");
        assert_eq!(a.status, 200, "{case:?}: {}", a.body);
        let a = held.join().expect("held");
        assert_eq!(a.status, 200, "held: {}", a.body);
    });
    let case = Leaves::WhileQueued;
    assert!(
        received_with_id(&p, "leave-queued").is_empty(),
        "{case:?}: placed after it left"
    );
    assert!(received_with_id(&d, "leave-queued").is_empty(), "{case:?}");
    assert_eq!(waiting(&envoy), 0);
    envoy.assert_counters_zero();
    let a = request("after", &["standard"], 2);
    assert_eq!(a.status, 200, "next request: {}", a.body);
    assert_eq!(envoy.stat("wasm.pd-router.vm_reload"), 0);
}

/// SGLang: a client that leaves while its prefill waits for the decode has
/// the prefill aborted on its pod (`POST /abort_request` naming the `rid`
/// the prefill carries) rather than holding its KV until the bootstrap
/// timeout; a stream that ends normally aborts nothing.
#[test]
fn an_sglang_prefill_whose_client_left_is_aborted_on_its_pod() {
    let p = Mock::start("abort-p", &["--engine", "sglang", "--role", "prefill"]);
    // The decode is slow to start, so its room is not registered when the
    // client gives up.
    let d = Mock::start(
        "abort-d",
        &[
            "--engine",
            "sglang",
            "--role",
            "decode",
            "--fault",
            "delay:3000",
        ],
    );
    let (p2, d2) = (
        Mock::start("ok-p", &["--engine", "sglang", "--role", "prefill"]),
        Mock::start("ok-d", &["--engine", "sglang", "--role", "decode"]),
    );
    // A decode that refuses at once: its prefill would wait for nothing.
    let (p3, d3) = (
        Mock::start("refused-p", &["--engine", "sglang", "--role", "prefill"]),
        Mock::start(
            "refused-d",
            &[
                "--engine",
                "sglang",
                "--role",
                "decode",
                "--fault",
                "status:503",
            ],
        ),
    );
    let envoy = Envoy::start_with(
        &plugin_config(&[
            ("s", "sglang", None, &[&p], &[&d]),
            ("t", "sglang", None, &[&p2], &[&d2]),
            ("u", "sglang", None, &[&p3], &[&d3]),
        ]),
        2,
    );
    let url = envoy.url("/v1/completions");
    let body = |model: &str| json!({"model": model, "prompt": "p", "max_tokens": 2}).to_string();
    let r = impatient(500)
        .post(&url)
        .header("content-type", "application/json")
        .header("x-request-id", "leave-sglang")
        .body(body("s"))
        .send();
    assert!(r.is_err(), "answered within 500 ms");
    let aborts = || -> Vec<Logged> {
        p.requests()
            .into_iter()
            .filter(|r| r.path == "/abort_request")
            .collect()
    };
    wait_until("the prefill is aborted", || !aborts().is_empty());
    let abort = &aborts()[0];
    assert_eq!(
        serde_json::from_str::<Value>(&abort.body).expect("json"),
        json!({"rid": "leave-sglang"})
    );
    let prefill = received_with_id(&p, "leave-sglang");
    assert!(
        prefill
            .iter()
            .any(|r| r.body.contains(r#""rid":"leave-sglang""#)),
        "the prefill carried the rid its abort names: {prefill:?}"
    );
    assert_eq!(envoy.stat("wasmcustom.pd_router.prefill_aborts"), 1);

    let a = post(&url, body("t"), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        p2.requests().iter().all(|r| r.path != "/abort_request"),
        "a finished stream aborts nothing"
    );

    let a = post(&url, body("u"), &[("x-request-id", "refused-sglang")]);
    assert!(a.status >= 500, "{}: {}", a.status, a.body);
    wait_until("the refused decode's prefill is aborted", || {
        p3.requests()
            .iter()
            .any(|r| r.path == "/abort_request" && r.body.contains(r#""rid":"refused-sglang""#))
    });
    envoy.assert_counters_zero();
}

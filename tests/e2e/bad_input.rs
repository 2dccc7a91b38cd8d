//! Malformed and hostile requests: each gets the right status and an
//! OpenAI-style error, reaches no upstream it should not, and leaves the
//! filter's VMs alive (Envoy reloads a VM that panicked: `vm_reload` stays 0).

use crate::harness::*;
use std::io::{Read, Write};
use std::net::TcpStream;

struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    status: u16,
    /// Text the error message must contain.
    needle: &'static str,
}

fn case(
    name: &'static str,
    path: &'static str,
    body: impl Into<Vec<u8>>,
    status: u16,
    needle: &'static str,
) -> Case {
    Case {
        name,
        method: "POST",
        path,
        headers: Vec::new(),
        body: body.into(),
        status,
        needle,
    }
}

const C: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

fn cases(admin: u16) -> Vec<Case> {
    let deep = format!(
        r#"{{"model":{}{},"prompt":"p"}}"#,
        "[".repeat(50_000),
        "]".repeat(50_000)
    );
    let mut v = vec![
        case(
            "truncated JSON",
            C,
            r#"{"model":"v","prompt":"ab"#,
            400,
            "not valid JSON",
        ),
        case(
            "trailing garbage",
            C,
            r#"{"model":"v","prompt":"a"} x"#,
            400,
            "not valid JSON",
        ),
        case("two objects", C, "{} {}", 400, "not valid JSON"),
        case("unquoted key", C, r#"{model:"v"}"#, 400, "not valid JSON"),
        case("array body", C, r#"[{"model":"v"}]"#, 400, "JSON object"),
        case("string body", C, r#""hello""#, 400, "JSON object"),
        case("number body", C, "42", 400, "JSON object"),
        case("null body", C, "null", 400, "JSON object"),
        case("empty body", C, "", 400, "empty"),
        case("whitespace body", C, " \n\t ", 400, "empty"),
        case(
            "invalid UTF-8",
            C,
            b"{\"model\":\"v\",\"prompt\":\"\xc3\x28\"}".to_vec(),
            400,
            "UTF-8",
        ),
        case(
            "deeply nested model",
            C,
            deep,
            400,
            "`model` must be a string",
        ),
        case(
            "model is a number",
            C,
            r#"{"model":7,"prompt":"p"}"#,
            400,
            "`model` must be a string",
        ),
        case(
            "model is an array",
            C,
            r#"{"model":["v"],"prompt":"p"}"#,
            400,
            "`model` must be a string",
        ),
        case(
            "model is an object",
            C,
            r#"{"model":{"name":"v"},"prompt":"p"}"#,
            400,
            "`model` must be a string",
        ),
        case(
            "model is empty",
            C,
            r#"{"model":"","prompt":"p"}"#,
            400,
            "`model` must not be empty",
        ),
        case(
            "model missing",
            C,
            r#"{"prompt":"p"}"#,
            400,
            "`model` is required",
        ),
        case(
            "stream is a string",
            C,
            r#"{"model":"v","prompt":"p","stream":"true"}"#,
            400,
            "`stream` must be a boolean",
        ),
        case(
            "stream is a number",
            C,
            r#"{"model":"v","prompt":"p","stream":1}"#,
            400,
            "`stream` must be a boolean",
        ),
        case(
            "n is zero",
            C,
            r#"{"model":"v","prompt":"p","n":0}"#,
            400,
            "`n` must be an integer from 1 to 128",
        ),
        case(
            "n is huge (SGLang rooms)",
            CHAT,
            r#"{"model":"s","messages":[],"n":18446744073709551615}"#,
            400,
            "`n`",
        ),
        case(
            "n above 128",
            CHAT,
            r#"{"model":"s","messages":[],"n":8888888}"#,
            400,
            "`n`",
        ),
        case(
            "n is negative",
            C,
            r#"{"model":"v","prompt":"p","n":-2}"#,
            400,
            "`n`",
        ),
        case(
            "n is fractional",
            C,
            r#"{"model":"v","prompt":"p","n":1.5}"#,
            400,
            "`n`",
        ),
        case(
            "n is a string",
            C,
            r#"{"model":"v","prompt":"p","n":"2"}"#,
            400,
            "`n`",
        ),
        case(
            "prompt is a number",
            C,
            r#"{"model":"v","prompt":5}"#,
            400,
            "`prompt`",
        ),
        case(
            "prompt is an object",
            C,
            r#"{"model":"v","prompt":{}}"#,
            400,
            "`prompt`",
        ),
        case(
            "prompt is empty array",
            C,
            r#"{"model":"v","prompt":[]}"#,
            400,
            "`prompt` must not be empty",
        ),
        case(
            "prompt mixes kinds",
            C,
            r#"{"model":"v","prompt":["a",1]}"#,
            400,
            "`prompt`",
        ),
        case(
            "prompt has float tokens",
            C,
            r#"{"model":"v","prompt":[1.5]}"#,
            400,
            "`prompt`",
        ),
        case(
            "prompt missing",
            C,
            r#"{"model":"v"}"#,
            400,
            "`prompt` is required",
        ),
        case(
            "messages is a string",
            CHAT,
            r#"{"model":"v","messages":"hi"}"#,
            400,
            "`messages` must be an array",
        ),
        case(
            "messages is an object",
            CHAT,
            r#"{"model":"v","messages":{}}"#,
            400,
            "`messages` must be an array",
        ),
        case(
            "messages missing",
            CHAT,
            r#"{"model":"v"}"#,
            400,
            "`messages` is required",
        ),
        case(
            "input is a number",
            "/v1/responses",
            r#"{"model":"v","input":1}"#,
            400,
            "`input`",
        ),
        case(
            "max_tokens is a string",
            C,
            r#"{"model":"v","prompt":"p","max_tokens":"5"}"#,
            400,
            "`max_tokens`",
        ),
        case(
            "max_tokens is negative",
            C,
            r#"{"model":"v","prompt":"p","max_tokens":-1}"#,
            400,
            "`max_tokens`",
        ),
        case(
            "max_completion_tokens fractional",
            CHAT,
            r#"{"model":"v","messages":[],"max_completion_tokens":2.5}"#,
            400,
            "`max_completion_tokens`",
        ),
        case(
            "min_tokens is a string",
            C,
            r#"{"model":"v","prompt":"p","min_tokens":"x"}"#,
            400,
            "`min_tokens`",
        ),
        case(
            "stream_options is a number",
            C,
            r#"{"model":"v","prompt":"p","stream_options":5}"#,
            400,
            "`stream_options`",
        ),
        case(
            "duplicate model",
            C,
            r#"{"model":"v","prompt":"p","model":"other"}"#,
            400,
            "`model` appears more than once",
        ),
        case(
            "duplicate stream",
            C,
            r#"{"model":"v","prompt":"p","stream":false,"stream":true}"#,
            400,
            "`stream` appears more than once",
        ),
        case(
            "duplicate max_tokens",
            C,
            r#"{"model":"v","prompt":"p","max_tokens":1,"max_tokens":4000}"#,
            400,
            "`max_tokens` appears",
        ),
        case(
            "duplicate prompt",
            C,
            r#"{"model":"v","prompt":"a","prompt":"b"}"#,
            400,
            "`prompt` appears",
        ),
        case(
            "duplicate messages",
            CHAT,
            r#"{"model":"v","messages":[],"messages":[]}"#,
            400,
            "`messages` appears",
        ),
        case(
            "client kv_transfer_params",
            C,
            r#"{"model":"v","prompt":"p","kv_transfer_params":{"remote_host":"169.254.169.254"}}"#,
            400,
            "set by the router",
        ),
        case(
            "client kv_transfer_params under a pre-rename offloading key",
            C,
            r#"{"model":"v","prompt":"p","kv_transfer_params":{"p2p":{"kv_request_id":"x","remote_host":"10.0.0.9","remote_port":5555}}}"#,
            400,
            "renamed it to `remote_kv_source`",
        ),
        case(
            "client disagg_prefill_resp",
            C,
            r#"{"model":"v","prompt":"p","disagg_prefill_resp":{}}"#,
            400,
            "set by the router",
        ),
        case(
            "client bootstrap_host",
            C,
            r#"{"model":"s","prompt":"p","bootstrap_host":"10.0.0.1"}"#,
            400,
            "set by the router",
        ),
        case(
            "client bootstrap_port",
            C,
            r#"{"model":"s","prompt":"p","bootstrap_port":1}"#,
            400,
            "set by the router",
        ),
        case(
            "client bootstrap_room",
            C,
            r#"{"model":"s","prompt":"p","bootstrap_room":5}"#,
            400,
            "set by the router",
        ),
        case(
            "client disaggregated_params",
            C,
            r#"{"model":"t","prompt":"p","disaggregated_params":{"request_type":"generation_only"}}"#,
            400,
            "set by the router",
        ),
        case(
            "client prompt_token_ids",
            CHAT,
            r#"{"model":"t","messages":[],"prompt_token_ids":[1]}"#,
            400,
            "set by the router",
        ),
        case(
            "TRT batch prompt",
            C,
            r#"{"model":"t","prompt":["a","b"]}"#,
            400,
            "single prompt",
        ),
        case(
            "unknown model",
            C,
            r#"{"model":"gpt-17","prompt":"p"}"#,
            404,
            "gpt-17",
        ),
        case(
            "model in wrong case",
            C,
            r#"{"model":"V","prompt":"p"}"#,
            404,
            "`V`",
        ),
        case(
            "body over max_body_bytes",
            C,
            format!(r#"{{"model":"v","prompt":"{}"}}"#, "x".repeat(300_000)),
            413,
            "262144",
        ),
    ];
    for method in ["GET", "PUT", "DELETE", "PATCH"] {
        v.push(Case {
            name: "wrong method",
            method,
            path: C,
            headers: Vec::new(),
            body: Vec::new(),
            status: 405,
            needle: method,
        });
    }
    // Hostile headers on an otherwise bad request: still rejected, still no upstream.
    let mut spoofed = case(
        "spoofed routing header on a bad body",
        C,
        "{",
        400,
        "not valid JSON",
    );
    spoofed
        .headers
        .push(("x-envoy-original-dst-host", format!("127.0.0.1:{admin}")));
    v.push(spoofed);
    v
}

fn send_case(envoy: &Envoy, c: &Case) -> Answer {
    let mut req = http().request(c.method.parse().expect("method"), envoy.url(c.path));
    for (k, v) in &c.headers {
        req = req.header(*k, v);
    }
    if !c.body.is_empty() || c.method == "POST" {
        req = req
            .header("content-type", "application/json")
            .body(c.body.clone());
    }
    send(req, &[])
}

/// A chunked body over the limit: no content-length to refuse it early.
fn chunked_too_large(envoy: &Envoy) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", envoy.port)).expect("connect");
    let chunk = vec![b'x'; 65536];
    let _ = s.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n");
    let _ = s.write_all(b"d\r\n{\"model\":\"v\",\r\n");
    for _ in 0..8 {
        if s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .is_err()
            || s.write_all(&chunk).is_err()
            || s.write_all(b"\r\n").is_err()
        {
            break; // Envoy may close once it has answered
        }
    }
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}}") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// A header value that is not UTF-8 must not bother the filter.
fn non_utf8_header(envoy: &Envoy) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", envoy.port)).expect("connect");
    let body = br#"{"model":"v","prompt":"p","max_tokens":2}"#;
    let mut req = Vec::new();
    req.extend_from_slice(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n");
    req.extend_from_slice(b"authorization: Bearer \xff\xfe\r\nx-request-id: \xc3\x28\r\n");
    req.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    req.extend_from_slice(body);
    s.write_all(&req).expect("write");
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn bad_input_is_rejected_cleanly() {
    let vp = Mock::start("vp", &["--engine", "vllm", "--role", "prefill"]);
    let vd = Mock::start("vd", &["--engine", "vllm", "--role", "decode"]);
    let sp = Mock::start("sp", &["--engine", "sglang", "--role", "prefill"]);
    let sd = Mock::start("sd", &["--engine", "sglang", "--role", "decode"]);
    let tp = Mock::start("tp", &["--engine", "trtllm", "--role", "prefill"]);
    let td = Mock::start("td", &["--engine", "trtllm", "--role", "decode"]);
    let mut config = plugin_config(&[
        ("v", "vllm", None, &[&vp], &[&vd]),
        ("s", "sglang", None, &[&sp], &[&sd]),
        ("t", "trtllm", None, &[&tp], &[&td]),
    ]);
    config["max_body_bytes"] = 262_144.into();
    let envoy = Envoy::start_with(&config, 2);
    let cases = cases(envoy.admin);
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for c in &cases {
        let a = send_case(&envoy, c);
        assert_eq!(a.status, c.status, "{}: {}", c.name, a.body);
        let msg = a.error_message();
        assert!(
            msg.contains(c.needle),
            "{}: {msg:?} should mention {:?}",
            c.name,
            c.needle
        );
        assert!(
            a.header("x-mock-pod").is_none(),
            "{}: reached a pod",
            c.name
        );
    }
    let (status, text) = chunked_too_large(&envoy);
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("\"error\""), "{text}");

    // Not one rejected request reached any pod.
    for m in [&vp, &vd, &sp, &sd, &tp, &td] {
        assert!(
            m.requests().is_empty(),
            "{} received {:?}",
            m.name,
            m.requests()
        );
    }

    // Odd but harmless input is served.
    let text = non_utf8_header(&envoy);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let a = post(
        &envoy.url("/v1/completions"),
        r#"{"model":"v","prompt":"p","max_tokens":2}"#,
        &[("prefill-target-pod", "evil")],
    );
    assert_eq!(a.status, 200);
    assert_eq!(
        a.header("prefill-target-pod"),
        Some("vp"),
        "response headers are the router's"
    );

    // A path the router does not split reaches a pod the router chose.
    let a = get(
        &envoy.url("/v1/nonexistent"),
        &[(
            "x-envoy-original-dst-host",
            &format!("127.0.0.1:{}", envoy.admin),
        )],
    );
    assert!(a.header("x-mock-pod").is_some(), "{}", a.body);

    // No VM died along the way.
    assert_eq!(envoy.stat("wasm.pd-router.vm_reload"), 0);
    assert_eq!(envoy.stat("wasm.pd-router.vm_reload_failure"), 0);
}

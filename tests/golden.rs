//! Golden fixtures per engine and connector: client body in, prefill body out,
//! prefill answer in, decode body (or direct answer) out, compared byte for
//! byte. Each case is a folder under `tests/golden/`:
//!
//! - `case.json`: `{"engine", "path", "kv_connector"?, "prefill": <endpoint>,
//!   "decode"?: <endpoint>, "randoms"?: [u64], "disagg_id"?: i64,
//!   "request_id"?, "mooncake_engines"?: [..], "trt_auth_key"?,
//!   "schedule_style"?, "trt_server_info"?: {..}}` (endpoints as in the
//!   plugin configuration; `mooncake_engines`: what the prefill's bootstrap
//!   server would have said; `trt_server_info`: a TensorRT-LLM context
//!   server's `GET /server_info` answer)
//! - `client.json`, `prefill.json`, and for sync engines `answer.json` with
//!   either `decode.json` or `reply.txt` (an answer without a decode).
//! - `prefill-headers.json` / `decode-headers.json`: the headers each leg
//!   sets, when it sets any.
//! - `decode-answer.json` (or `.sse`) with `client-answer.json` (`.sse`):
//!   the decode's answer and what the client gets once the prefill's
//!   `answer.json` was merged into it (a stream is fed in 7-byte chunks).
//!
//! `UPDATE_GOLDEN=1 cargo test --test golden` rewrites the outputs; review the
//! diff before committing it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::api::Api;
use pd_router::config::Config;
use pd_router::engine::{FixedIds, Registry};
use pd_router::handoff::LearnedPods;
use pd_router::reconcile::{PrefillReport, Rewrite};
use pd_router::split::{self, AfterPrefill, DecodeLeg, Placement, Plan, SplitContext, SplitPlan};
use serde::Deserialize;
use std::fs;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    engine: String,
    path: String,
    #[serde(default)]
    kv_connector: Option<String>,
    prefill: serde_json::Value,
    #[serde(default)]
    randoms: Vec<u64>,
    #[serde(default)]
    disagg_id: i64,
    #[serde(default)]
    decode: Option<serde_json::Value>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    mooncake_engines: Option<Vec<String>>,
    #[serde(default)]
    trt_auth_key: Option<String>,
    #[serde(default)]
    schedule_style: Option<String>,
    #[serde(default)]
    trt_server_info: Option<serde_json::Value>,
}

/// Headers as a JSON list of pairs; `None` when there are none.
fn headers_json(headers: &[(String, String)]) -> Option<Vec<u8>> {
    (!headers.is_empty()).then(|| serde_json::to_vec(headers).expect("json"))
}

fn check_headers(dir: &Path, name: &str, headers: &[(String, String)], failures: &mut Vec<String>) {
    match headers_json(headers) {
        Some(h) => check(dir, name, &h, failures),
        None if std::env::var_os("UPDATE_GOLDEN").is_some() => {
            let _ = fs::remove_file(dir.join(name));
        }
        None if dir.join(name).exists() => failures.push(format!(
            "{}/{name}: expected headers, none set",
            dir.display()
        )),
        None => {}
    }
}

fn read(dir: &Path, name: &str) -> Option<Vec<u8>> {
    let mut b = fs::read(dir.join(name)).ok()?;
    // Files end with one newline that is not part of the body.
    if b.last() == Some(&b'\n') {
        b.pop();
    }
    Some(b)
}

fn check(dir: &Path, name: &str, actual: &[u8], failures: &mut Vec<String>) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let mut out = actual.to_vec();
        out.push(b'\n');
        fs::write(dir.join(name), out).expect("write golden");
        return;
    }
    match read(dir, name) {
        Some(expected) if expected == actual => {}
        Some(expected) => failures.push(format!(
            "{}/{name}:\n  expected {}\n  actual   {}",
            dir.display(),
            String::from_utf8_lossy(&expected),
            String::from_utf8_lossy(actual)
        )),
        None => failures.push(format!("{}/{name} is missing", dir.display())),
    }
}

fn run_case(dir: &Path, failures: &mut Vec<String>) {
    let case: Case = serde_json::from_slice(&read(dir, "case.json").expect("case.json"))
        .expect("case.json schema");
    let client = read(dir, "client.json").expect("client.json");
    // The test configuration serves the model the fixture names.
    let client_json: serde_json::Value = serde_json::from_slice(&client).expect("client JSON");
    let name = client_json["model"].as_str().expect("client model");
    let mut model = serde_json::json!({
        "name": name, "engine": case.engine,
        "rolesets": [{"prefill": [case.prefill],
                      "decode": [case.decode.clone().unwrap_or_else(|| "10.9.9.9:8000".into())]}]
    });
    if let Some(c) = &case.kv_connector {
        model["kv_connector"] = c.clone().into();
    }
    if let Some(s) = &case.schedule_style {
        model["schedule_style"] = s.clone().into();
    }
    let config = Config::parse(
        serde_json::json!({ "models": [model] })
            .to_string()
            .as_bytes(),
    )
    .expect("config");
    let fleet = config.fleet();
    let registry = Registry::builtin();
    // What the router would have learned about the prefill pods.
    let server_info = case.trt_server_info.as_ref().map(|info| {
        pd_router::engine::parse_server_info(info.to_string().as_bytes()).expect("server info")
    });
    let learned = LearnedPods {
        said: case
            .mooncake_engines
            .iter()
            .chain(&server_info)
            .flat_map(|ids| {
                fleet
                    .models()
                    .iter()
                    .flat_map(|m| m.endpoints())
                    .map(|e| (e.id, ids.clone()))
            })
            .collect(),
    };
    let mut view = SplitContext::of_config(&config, &fleet, &registry);
    view.learned = &learned;
    view.trt_auth_key = case.trt_auth_key.as_deref().map(str::as_bytes);
    let mut entropy = FixedIds::new(case.randoms.clone(), case.disagg_id);
    let placement = Placement::first_pair(&fleet).expect("pods");

    let api = Api::from_path(&case.path).expect("split path");
    let request_id = case.request_id.as_deref().unwrap_or("golden-1");
    let plan = split::read(&view, api, request_id, client.clone())
        .and_then(|request| split::build(&view, request, placement, &mut entropy));
    let plan = match plan {
        Ok(Plan::Split(plan)) => plan,
        Ok(Plan::Unsplit { .. }) => panic!("{}: not split", dir.display()),
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    check(dir, "prefill.json", &plan.prefill_body, failures);
    check_headers(dir, "prefill-headers.json", &plan.prefill_headers, failures);

    if let DecodeLeg::Ready { body, headers } = &plan.decode {
        check(dir, "decode.json", &body.assemble(&client), failures);
        check_headers(dir, "decode-headers.json", headers, failures);
        if let Some(answer) = read(dir, "answer.json") {
            check_client_answer(dir, &plan, &answer, failures);
        }
        return;
    }
    let answer = read(dir, "answer.json")
        .unwrap_or_else(|| panic!("{}: answer.json for a sync engine", dir.display()));
    match split::merge(&view, &mut entropy, &plan, &answer).expect("merge") {
        AfterPrefill::Reply { body, .. } => check(dir, "reply.txt", &body, failures),
        AfterPrefill::Decode { body, headers, .. } => {
            check(
                dir,
                "decode.json",
                &body.map_or_else(|| client.clone(), |b| b.assemble(&client)),
                failures,
            );
            check_headers(dir, "decode-headers.json", &headers, failures);
        }
    }
    check_client_answer(dir, &plan, &answer, failures);
}

/// The decode's answer rewritten with what the prefill's `answer` says.
fn check_client_answer(dir: &Path, plan: &SplitPlan, answer: &[u8], failures: &mut Vec<String>) {
    for (input, output) in [
        ("decode-answer.json", "client-answer.json"),
        ("decode-answer.sse", "client-answer.sse"),
    ] {
        let Some(decoded) = read(dir, input) else {
            continue;
        };
        let Some(answer_plan) = &plan.rewrite else {
            failures.push(format!(
                "{}: {input} given, but the plan rewrites nothing",
                dir.display()
            ));
            continue;
        };
        let fields = PrefillReport::of(answer_plan, answer);
        let mut rw = Rewrite::new(answer_plan.clone(), Some(fields));
        let out = if input.ends_with(".sse") {
            let mut out = Vec::new();
            let chunks: Vec<&[u8]> = decoded.chunks(7).collect();
            for (i, c) in chunks.iter().enumerate() {
                let sent = rw.chunk(c, i + 1 == chunks.len()).expect("fields known");
                out.extend(sent.unwrap_or_else(|| c.to_vec()));
            }
            out
        } else {
            rw.whole(&decoded)
                .expect("fields known")
                .unwrap_or_else(|| decoded.clone())
        };
        check(dir, output, &out, failures);
    }
}

#[test]
fn golden_fixtures() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut dirs: Vec<_> = fs::read_dir(&root)
        .expect("tests/golden")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 12,
        "expected the golden cases, found {}",
        dirs.len()
    );
    let mut failures = Vec::new();
    for dir in &dirs {
        run_case(dir, &mut failures);
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

//! Golden fixtures per engine and connector: client body in, prefill body out,
//! prefill answer in, decode body (or direct answer) out, compared byte for
//! byte. Each case is a folder under `tests/golden/`:
//!
//! - `case.json`: `{"engine", "path", "kv_connector"?, "prefill": {"address",
//!   "bootstrap_port"?}, "randoms"?: [u64], "disagg_id"?: i64}`
//! - `client.json`, `prefill.json`, and for sync engines `answer.json` with
//!   either `decode.json` or `reply.txt` (an answer without a decode).
//!
//! `UPDATE_GOLDEN=1 cargo test --test golden` rewrites the outputs; review the
//! diff before committing it.

use pd_router::api::{read_facts, Api};
use pd_router::body::TopLevel;
use pd_router::config::Config;
use pd_router::engine::{build_legs, FixedEntropy, Merged, PdContext, PrefillAnswer, Registry};
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
    let mut model = serde_json::json!({
        "name": "golden", "engine": case.engine,
        "rolesets": [{"prefill": [case.prefill], "decode": ["10.9.9.9:8000"]}]
    });
    if let Some(c) = &case.kv_connector {
        model["kv_connector"] = c.clone().into();
    }
    let config = Config::parse(
        serde_json::json!({ "models": [model] })
            .to_string()
            .as_bytes(),
    )
    .expect("config");
    let pod = &config.models[0].rolesets[0].prefill[0];
    let registry = Registry::builtin();
    let handler = registry.resolve(&case.engine);

    let client = read(dir, "client.json").expect("client.json");
    let top = TopLevel::parse(&client).expect("client body parses");
    let api = Api::from_path(&case.path).expect("split path");
    let mut facts = read_facts(api, &client, &top).expect("client body is valid");
    facts.model = "golden".into();
    let mut entropy = FixedEntropy::new(case.randoms.clone(), case.disagg_id);
    let mut ctx = PdContext {
        facts: &facts,
        body: &client,
        top: &top,
        request_id: "golden-1",
        model_connector: config.models[0].kv_connector,
        entropy: &mut entropy,
    };
    assert!(
        handler.should_split(&ctx, pod),
        "{}: not split",
        dir.display()
    );
    let legs = build_legs(handler, &mut ctx, pod).expect("augment");
    check(
        dir,
        "prefill.json",
        &top.render(&client, &legs.prefill),
        failures,
    );

    if handler.is_async() {
        check(
            dir,
            "decode.json",
            &top.render(&client, &legs.decode),
            failures,
        );
        return;
    }
    let answer = read(dir, "answer.json").expect("answer.json for a sync engine");
    let answer_top = TopLevel::parse(&answer).expect("answer parses");
    let mut decode = legs.decode.clone();
    let merged = handler
        .merge_prefill_response(
            &mut ctx,
            &PrefillAnswer {
                body: &answer,
                top: &answer_top,
            },
            pod,
            &mut decode,
        )
        .expect("merge");
    match merged {
        Merged::Answer { body, .. } => check(dir, "reply.txt", &body, failures),
        Merged::Forward | Merged::ForwardWithoutHandoff => {
            check(dir, "decode.json", &top.render(&client, &decode), failures)
        }
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

//! A simulated pod's HTTP API: the completions route with each engine's
//! side of the hand-off, enforced (a leg that breaks the contract is
//! refused, a decode without a valid hand-off computes the prompt itself
//! and says so in its record), and what routers probe (`/health`,
//! `/metrics`, vLLM's `/v1/completions/render` and `/tokenize`, SGLang's
//! server and model info), plus the simulation's own `/sim/records`,
//! `/sim/pods` and `/sim/floor`.

use super::engine::{Counters, EngineConfig};
use super::fleet::{Flavor, Fleet, Offer, Record};
use super::pod::{Pod, Role};
use super::serve::{self, error, Asked, Serving};
use super::text::{parse_prompt, parse_token_ids, token_ids, Shape};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// How long a leg waits for its SGLang partner (real time).
const ROOM_WAIT: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct App {
    pub fleet: Arc<Fleet>,
    pub pod: Arc<Pod>,
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/completions/render", post(render))
        .route("/tokenize", post(tokenize))
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/sim/records", get(records))
        .route("/sim/pods", get(pods))
        .route("/sim/floor", post(floor))
        .with_state(app)
}

fn bad(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

/// The request's fields the simulation reads.
fn asked(v: &Value, shape: Shape) -> Result<Asked, String> {
    let prompt = match v.get("prompt") {
        Some(Value::String(text)) => parse_prompt(text.as_bytes(), shape),
        // Token ids (vllm-router keys on them without asking for a render).
        Some(Value::Array(ids)) => {
            let ids: Option<Vec<u32>> = ids
                .iter()
                .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect();
            parse_token_ids(&ids.ok_or("token ids must be integers below 2^32")?)
        }
        _ => return Err("the simulated pods take `prompt` as one string or token ids".into()),
    };
    let max_tokens = match v.get("max_tokens") {
        None | Some(Value::Null) => 16,
        Some(m) => m.as_u64().ok_or("max_tokens must be an integer")? as u32,
    };
    Ok(Asked {
        prompt,
        max_tokens,
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        user: v
            .get("user")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    })
}

async fn completions(State(app): State<App>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad(&format!("not JSON: {e}")),
    };
    let asked = match asked(&v, app.fleet.text) {
        Ok(a) => a,
        Err(e) => return bad(&e),
    };
    match app.fleet.flavor {
        Flavor::Vllm => vllm(app, &v, asked).await,
        Flavor::Sglang => sglang(app, &v, asked).await,
    }
}

/// vLLM NIXL: a prefill leg asks `do_remote_decode`, a decode leg brings
/// the prefill's `kv_transfer_params` back; anything else is an ordinary
/// request, served whole.
async fn vllm(app: App, v: &Value, asked: Asked) -> Response {
    let kv = v.get("kv_transfer_params").filter(|k| !k.is_null());
    let flag = |k: &str| kv.and_then(|kv| kv.get(k)).and_then(Value::as_bool) == Some(true);
    if flag("do_remote_decode") {
        if app.pod.role != Role::Prefill {
            return bad("do_remote_decode on a decode pod");
        }
        if asked.stream || asked.max_tokens != 1 {
            return bad("a prefill leg asks max_tokens 1 and stream false");
        }
        return vllm_prefill(app, asked).await;
    }
    let mut record = serve::record(&app.pod, &asked, "whole");
    if !flag("do_remote_prefill") {
        return serve::run(app.fleet, app.pod, &asked, record, false).await;
    }
    if app.pod.role != Role::Decode {
        return bad("do_remote_prefill on a prefill pod");
    }
    record.role = "decode";
    let str_of = |k: &str| kv.and_then(|kv| kv.get(k)).and_then(Value::as_str);
    let offer = str_of("remote_request_id").and_then(|id| app.fleet.take_offer(id));
    let now = app.pod.clock.now_s();
    let valid = offer.filter(|o| {
        let prefill = app.fleet.pod(o.prefill);
        prefill.is_some_and(|p| str_of("remote_engine_id") == Some(p.name.as_str()))
            && o.ids == asked.prompt.ids()
    });
    let Some(offer) = valid else {
        // vLLM recomputes a prompt it cannot pull.
        record.handoff = "missing";
        return serve::run(app.fleet, app.pod, &asked, record, false).await;
    };
    record.prefill_pod = app.fleet.pod(offer.prefill).map(|p| p.name.clone());
    if now - offer.at_s > app.fleet.lease_s {
        // The prefill freed its blocks when the lease ended.
        record.handoff = "expired";
        return serve::run(app.fleet, app.pod, &asked, record, false).await;
    }
    record.handoff = "ok";
    pull_and_decode(app, asked, record, offer.prefill).await
}

/// The decode pulls what it does not hold from pod `src`, then decodes.
async fn pull_and_decode(app: App, asked: Asked, mut record: Record, src: usize) -> Response {
    record.cached_tokens = app.pod.cached_tokens(&asked.prompt);
    record.transferred_tokens = asked.prompt.tokens.saturating_sub(record.cached_tokens);
    app.fleet
        .transfer(
            &app.pod.clock,
            src,
            app.pod.index,
            record.transferred_tokens,
        )
        .await;
    serve::run(app.fleet, app.pod, &asked, record, true).await
}

async fn vllm_prefill(app: App, asked: Asked) -> Response {
    let record = serve::record(&app.pod, &asked, "prefill");
    let ticket = app.pod.submit(asked.prompt.clone(), 1, false);
    let mut s = Serving {
        fleet: Arc::clone(&app.fleet),
        pod: Arc::clone(&app.pod),
        ticket,
        record,
        handed_off: false,
    };
    if !s.finish().await {
        s.record.error = Some("the engine dropped it".into());
        s.done();
        return error(StatusCode::INTERNAL_SERVER_ERROR, "prefill dropped");
    }
    let id = app.fleet.offer(Offer {
        prefill: app.pod.index,
        ids: asked.prompt.ids(),
        at_s: app.pod.clock.now_s(),
    });
    let kv = json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": app.pod.name,
        "remote_request_id": id,
        "remote_block_ids": [0],
        "remote_host": app.pod.ip,
        "remote_port": app.pod.port,
        "tp_size": 1,
    });
    let answer = serve::whole_answer(&s, Some(("kv_transfer_params", kv)));
    s.done();
    answer
}

/// SGLang: both legs name the prefill's bootstrap server and a room; the
/// prefill waits for the decode to arrive, the decode for the prefill's KV.
async fn sglang(app: App, v: &Value, asked: Asked) -> Response {
    let room = v.get("bootstrap_room").and_then(Value::as_u64);
    let host = v.get("bootstrap_host").and_then(Value::as_str);
    let port = v
        .get("bootstrap_port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let (Some(room), Some(host), Some(port)) = (room, host, port) else {
        // SGLang's scheduler refuses these in disaggregation mode.
        return bad("Disaggregated request received without bootstrap room id");
    };
    let Some(prefill) = app.fleet.by_bootstrap(host, port).cloned() else {
        return bad(&format!("no prefill pod bootstraps at {host}:{port}"));
    };
    match app.pod.role {
        Role::Prefill if prefill.index != app.pod.index => {
            bad("bootstrap_host:bootstrap_port name another prefill pod")
        }
        Role::Prefill => sglang_prefill(app, asked, room).await,
        Role::Decode => sglang_decode(app, asked, room, prefill).await,
    }
}

async fn sglang_prefill(app: App, asked: Asked, room_id: u64) -> Response {
    let record = serve::record(&app.pod, &asked, "prefill");
    let room = app.fleet.room(room_id);
    let ticket = app.pod.submit(asked.prompt.clone(), 1, false);
    let mut s = Serving {
        fleet: Arc::clone(&app.fleet),
        pod: Arc::clone(&app.pod),
        ticket,
        record,
        handed_off: false,
    };
    let done = s.finish().await;
    if done {
        room.prefill
            .send_replace(Some((app.pod.index, app.pod.clock.now_s())));
    }
    // The KV goes out once the decode has registered its room.
    let mut decode = room.decode_here.subscribe();
    let met = matches!(
        tokio::time::timeout(ROOM_WAIT, decode.wait_for(|here| *here)).await,
        Ok(Ok(_))
    );
    if !met {
        s.record.error = Some("no decode came for the room".into());
        s.record.status = 500;
        s.done();
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "bootstrap timeout: no decode registered the room",
        );
    }
    let answer = serve::whole_answer(&s, None);
    s.done();
    answer
}

async fn sglang_decode(app: App, asked: Asked, room_id: u64, prefill: Arc<Pod>) -> Response {
    let mut record = serve::record(&app.pod, &asked, "decode");
    let room = app.fleet.room(room_id);
    room.decode_here.send_replace(true);
    let mut ready = room.prefill.subscribe();
    let from = match tokio::time::timeout(ROOM_WAIT, ready.wait_for(Option::is_some)).await {
        Ok(Ok(v)) => *v,
        _ => None,
    };
    app.fleet.close_room(room_id);
    match from {
        Some((index, _)) if index == prefill.index => {
            record.prefill_pod = Some(prefill.name.clone());
            record.handoff = "ok";
            pull_and_decode(app, asked, record, index).await
        }
        _ => {
            record.status = 500;
            record.error = Some("no prefill for the room".into());
            app.fleet.record(record);
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "bootstrap timeout: no prefill for the room",
            )
        }
    }
}

async fn render(State(app): State<App>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match v.get("prompt").and_then(Value::as_str) {
        Some(p) => {
            let prompt = parse_prompt(p.as_bytes(), app.fleet.text);
            Json(json!({"token_ids": token_ids(&prompt)})).into_response()
        }
        None => bad("render takes `prompt` as one string"),
    }
}

async fn tokenize(State(app): State<App>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match v.get("prompt").and_then(Value::as_str) {
        Some(p) => {
            let tokens = token_ids(&parse_prompt(p.as_bytes(), app.fleet.text));
            Json(json!({"count": tokens.len(), "max_model_len": 131072, "tokens": tokens}))
                .into_response()
        }
        None => bad("tokenize takes `prompt` as one string"),
    }
}

async fn models(State(app): State<App>) -> Response {
    let m = &app.fleet.model;
    Json(json!({"object": "list", "data": [
        {"id": m, "object": "model", "created": 0, "owned_by": "sim", "root": m, "parent": null, "max_model_len": 131072}
    ]}))
    .into_response()
}

async fn server_info(State(app): State<App>) -> Response {
    Json(json!({
        "model_path": app.fleet.model,
        "served_model_name": app.fleet.model,
        "disaggregation_mode": app.pod.role.name(),
        "tp_size": 1,
        "dp_size": 1,
    }))
    .into_response()
}

async fn model_info(State(app): State<App>) -> Response {
    Json(json!({"model_path": app.fleet.model, "is_generation": true})).into_response()
}

/// The engine's load, as vLLM and SGLang export it.
async fn metrics(State(app): State<App>) -> Response {
    let (running, waiting, kv, c) = app.pod.load();
    let text = metrics_page(app.fleet.flavor, &app.fleet.model, running, waiting, kv, &c);
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// The `/metrics` page: vLLM v1's names (counters with `_total` samples,
/// the prefix-cache ones in prompt tokens) or SGLang's.
fn metrics_page(
    flavor: Flavor,
    model: &str,
    running: usize,
    waiting: usize,
    kv: f64,
    c: &Counters,
) -> String {
    let labels = format!("{{engine=\"0\",model_name=\"{model}\"}}");
    match flavor {
        Flavor::Vllm => format!(
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} {running}\n\
             # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{labels} {waiting}\n\
             # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{labels} {kv}\n\
             # TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{labels} {}\n\
             # TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{labels} {}\n\
             # TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{labels} {}\n\
             # TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{labels} {}\n\
             # TYPE vllm:request_success counter\nvllm:request_success_total{labels} {}\n",
            c.prefix_queries, c.prefix_hits, c.prompt_tokens, c.generated_tokens, c.finished
        ),
        Flavor::Sglang => format!(
            "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{labels} {running}\n\
             # TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{labels} {waiting}\n\
             # TYPE sglang:token_usage gauge\nsglang:token_usage{labels} {kv}\n\
             # TYPE sglang:generation_tokens counter\nsglang:generation_tokens_total{labels} {}\n",
            c.generated_tokens
        ),
    }
}

async fn records(State(app): State<App>) -> Response {
    Json(app.fleet.records()).into_response()
}

/// The unloaded floor of each request's TTFT (`{"requests": [[prompt
/// tokens, cached tokens], ...]}`): alone on idle pods holding its cached
/// prefix ([`super::model::Gpu::floor_ttft_s`]), modelled seconds.
async fn floor(State(app): State<App>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(requests) = v.get("requests").and_then(Value::as_array) else {
        return bad("floor takes `requests`: [[prompt tokens, cached tokens], ...]");
    };
    let step = EngineConfig::default().step_tokens;
    let field = |r: &Value, i: usize| r.get(i).and_then(Value::as_u64).unwrap_or(0) as u32;
    let floors: Vec<f64> = requests
        .iter()
        .map(|r| app.fleet.gpu.floor_ttft_s(field(r, 0), field(r, 1), step))
        .collect();
    Json(json!({"floor_s": floors})).into_response()
}

/// Every pod's counters, for the benchmark's load and cache figures.
async fn pods(State(app): State<App>) -> Response {
    let pods: Vec<Value> = app
        .fleet
        .pods
        .iter()
        .map(|p| {
            let (running, waiting, kv, c) = p.load();
            json!({
                "name": p.name, "role": p.role.name(), "address": p.address(),
                "running": running, "waiting": waiting, "kv_usage": kv,
                "busy_s": c.busy_s, "running_s": c.running_s,
                "prompt_tokens": c.prompt_tokens, "prefix_queries": c.prefix_queries,
                "prefix_hits": c.prefix_hits, "computed_tokens": c.computed_tokens,
                "generated_tokens": c.generated_tokens, "finished": c.finished,
                "evicted_blocks": c.evicted_blocks, "reloaded_tokens": c.reloaded_tokens,
            })
        })
        .collect();
    Json(json!({"now_s": app.pod.clock.now_s(), "pods": pods})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::engine::{Engine, EngineConfig, Job};
    use crate::sim::text::{parse_prompt, prompt_text, Shape};

    /// The samples of a Prometheus page: name (labels cut) → value.
    fn samples(page: &str) -> Vec<(String, f64)> {
        page.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                let name = name.split('{').next()?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    fn value(page: &str, name: &str) -> Option<f64> {
        samples(page)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    #[test]
    fn metrics_carry_vllms_names_and_the_engines_counts() {
        let mut e = Engine::new(EngineConfig::default());
        for (key, last) in [(1, 4), (2, 5)] {
            e.submit(Job {
                key,
                prompt: parse_prompt(
                    prompt_text(&[1, 2, 3, last], 2048, Shape::default()).as_bytes(),
                    Shape::default(),
                ),
                output: 1,
                handed_off: false,
            });
            let mut events = Vec::new();
            while e.plan(&mut events).is_some() {
                e.complete(&mut events);
            }
        }
        let c = e.counters();
        let page = metrics_page(Flavor::Vllm, "m", 3, 2, 0.25, &c);
        for (name, want) in [
            ("vllm:num_requests_running", 3.0),
            ("vllm:num_requests_waiting", 2.0),
            ("vllm:kv_cache_usage_perc", 0.25),
            // The second prompt found its first three blocks of 512 tokens.
            ("vllm:prefix_cache_queries_total", 4096.0),
            ("vllm:prefix_cache_hits_total", 1536.0),
            ("vllm:prompt_tokens_total", 4096.0),
            ("vllm:request_success_total", 2.0),
        ] {
            assert_eq!(value(&page, name), Some(want), "{name} in\n{page}");
        }
        assert!(page.contains("# TYPE vllm:prefix_cache_hits counter\n"));
        assert!(page.contains(r#"model_name="m""#));
        let page = metrics_page(Flavor::Sglang, "m", 3, 2, 0.25, &c);
        assert_eq!(value(&page, "sglang:num_running_reqs"), Some(3.0));
        assert_eq!(value(&page, "sglang:num_queue_reqs"), Some(2.0));
        assert_eq!(value(&page, "sglang:token_usage"), Some(0.25));
    }
}

//! A simulated pod's HTTP API: the completions route with each engine's
//! side of the hand-off, enforced (a leg that breaks the contract is
//! refused, a decode without a valid hand-off computes the prompt itself
//! and says so in its record), and what routers probe (`/health`,
//! `/metrics`, vLLM's `/v1/completions/render` and `/tokenize`, SGLang's
//! server and model info), plus the simulation's own `/sim/records`,
//! `/sim/pods`, `/sim/floor` and `/sim/kv_events`.

use super::engine::{Counters, EngineConfig, Job};
use super::fleet::{pull_tokens, Flavor, Fleet, Offer, Record};
use super::pod::{Pod, Role};
use super::serve::{self, error, Asked, Serving};
use super::text::{parse_prompt, parse_token_ids, token_ids, Shape};
use axum::body::Bytes;
use axum::extract::{Query, State};
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
        .route("/sim/kv_events", get(kv_events))
        .route("/sim/kv_events/tokenizer.json", get(kv_tokenizer))
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
        return vllm_prefill(app, asked, kv).await;
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

/// Whether a prefill leg's `kv_transfer_params` name a decode's KV to pull
/// (vLLM's bidirectional NIXL transfer, the next turn of a conversation):
/// non-empty `remote_block_ids` and the remote engine, request, host and
/// port.
fn names_remote_kv(kv: &Value) -> bool {
    let blocks = kv
        .get("remote_block_ids")
        .and_then(Value::as_array)
        .is_some_and(|b| {
            !b.is_empty() && b.iter().all(|g| g.as_array().is_none_or(|g| !g.is_empty()))
        });
    blocks
        && ["remote_engine_id", "remote_request_id", "remote_host"]
            .iter()
            .all(|k| kv.get(k).is_some_and(Value::is_string))
        && kv.get("remote_port").is_some_and(Value::is_u64)
}

async fn vllm_prefill(app: App, asked: Asked, kv: Option<&Value>) -> Response {
    let mut record = serve::record(&app.pod, &asked, "prefill");
    let mut pulled_to = 0;
    if let Some(kv) = kv.filter(|kv| names_remote_kv(kv)) {
        // The next turn: pull what the last turn's decode holds of this
        // prompt beyond what this pod holds, instead of computing it.
        let remote = kv
            .get("remote_num_tokens")
            .and_then(Value::as_u64)
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
        let cached = app.pod.cached_tokens(&asked.prompt);
        let pull = pull_tokens(remote, asked.prompt.tokens, cached);
        match app.fleet.take_kept(kv, app.pod.clock.now_s()) {
            Ok((decode, _)) if pull > 0 => {
                app.fleet
                    .transfer(&app.pod.clock, decode, app.pod.index, pull)
                    .await;
                record.transferred_tokens = pull;
                pulled_to = cached + pull;
            }
            // Too few to pull (vLLM's kv_recompute_threshold): computed,
            // the decode's blocks freed all the same.
            Ok(_) => {}
            Err(e) if pull > 0 => {
                record.status = 500;
                record.error = Some(format!("KV load failed: {e}"));
                app.fleet.record(record);
                // vLLM's kv_load_failure_policy: fail.
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("KV load failed: {e}"),
                );
            }
            Err(_) => {}
        }
    }
    let ticket = app.pod.submit(Job {
        pulled_to,
        ..Job::new(0, asked.prompt.clone(), 1)
    });
    let mut s = Serving::new(Arc::clone(&app.fleet), Arc::clone(&app.pod), ticket, record);
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
    let ticket = app.pod.submit(Job::new(0, asked.prompt.clone(), 1));
    let mut s = Serving::new(Arc::clone(&app.fleet), Arc::clone(&app.pod), ticket, record);
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

/// The fleet's KV event batches after `after` (`?after=SEQ&wait_ms=MS`),
/// waiting up to `wait_ms` (at most 10 s) for one: `{"batches": [...]}`,
/// those up to `after` dropped as read. 404 without `--kv-events`.
async fn kv_events(
    State(app): State<App>,
    Query(q): Query<std::collections::HashMap<String, u64>>,
) -> Response {
    let Some(ev) = &app.fleet.kv_events else {
        return error(
            StatusCode::NOT_FOUND,
            "this fleet publishes no KV events (--kv-events)",
        );
    };
    let wait = Duration::from_millis(q.get("wait_ms").copied().unwrap_or(0).min(10_000));
    let batches = ev.after(q.get("after").copied().unwrap_or(0), wait).await;
    Json(json!({ "batches": batches })).into_response()
}

async fn kv_tokenizer() -> Response {
    Json(super::kv_events::tokenizer_json()).into_response()
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
            e.submit(Job::new(
                key,
                parse_prompt(
                    prompt_text(&[1, 2, 3, last], 2048, Shape::default()).as_bytes(),
                    Shape::default(),
                ),
                1,
            ));
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

    /// One prefill and one decode pod of vLLM NIXL, the decode pods keeping
    /// their KV for `ttl_s`, engines running at `scale`.
    fn bidirectional(ttl_s: f64, scale: f64) -> (Arc<Fleet>, App, App) {
        pair(Some(ttl_s), scale, false)
    }

    /// One prefill and one decode pod of vLLM NIXL: the decode pods keeping
    /// their KV for `ttl_s` if given, engines running at `scale`, both
    /// publishing KV events if asked.
    fn pair(ttl_s: Option<f64>, scale: f64, kv_events: bool) -> (Arc<Fleet>, App, App) {
        use crate::sim::model::Gpu;
        use crate::sim::pod::Clock;
        let clock = Clock::new(scale);
        let pod = |index, name: &str, role, port| {
            let addr = ("127.0.0.1".to_owned(), port, 0);
            Pod::new(
                index,
                name.into(),
                role,
                addr,
                EngineConfig::default(),
                clock,
            )
        };
        let pods = vec![
            pod(0, "prefill-0", Role::Prefill, 1001),
            pod(1, "decode-0", Role::Decode, 1002),
        ];
        for p in &pods {
            tokio::spawn(Arc::clone(p).drive());
        }
        let mut fleet = Fleet::new(
            Flavor::Vllm,
            "m".into(),
            pods.clone(),
            Gpu::default(),
            30.0,
            Duration::from_millis(1),
            Shape::default(),
        );
        fleet.decoder_kv_ttl_s = ttl_s;
        if kv_events {
            fleet.publish_kv_events();
        }
        let fleet = Arc::new(fleet);
        let app = |p: &Arc<Pod>| App {
            fleet: Arc::clone(&fleet),
            pod: Arc::clone(p),
        };
        let (prefill, decode) = (app(&pods[0]), app(&pods[1]));
        (fleet, prefill, decode)
    }

    async fn post(app: &App, body: Value) -> (StatusCode, Value) {
        let asked = asked(&body, app.fleet.text).unwrap();
        let resp = vllm(app.clone(), &body, asked).await;
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// A decode leg of `ids` / `tokens`, its hand-off from prefill-0 valid;
    /// the decode's `kv_transfer_params`.
    async fn decode_turn(fleet: &Fleet, decode: &App, ids: &[u64], tokens: u32) -> Value {
        let text = prompt_text(ids, tokens, Shape::default());
        let offer = fleet.offer(Offer {
            prefill: 0,
            ids: parse_prompt(text.as_bytes(), Shape::default()).ids(),
            at_s: decode.pod.clock.now_s(),
        });
        let (status, answer) = post(
            decode,
            json!({"prompt": text, "max_tokens": 20, "user": "t1", "kv_transfer_params": {
                "do_remote_prefill": true, "do_remote_decode": false,
                "remote_engine_id": "prefill-0", "remote_request_id": offer}}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer["kv_transfer_params"].clone()
    }

    fn prefill_leg(ids: &[u64], tokens: u32, user: &str, kv: &Value) -> Value {
        let mut kv = kv.clone();
        kv["do_remote_decode"] = json!(true);
        kv["do_remote_prefill"] = json!(false);
        json!({"prompt": prompt_text(ids, tokens, Shape::default()), "max_tokens": 1,
               "stream": false, "user": user, "kv_transfer_params": kv})
    }

    fn record_of(fleet: &Fleet, user: &str) -> Record {
        let records = fleet.records();
        records.into_iter().find(|r| r.user == user).unwrap()
    }

    #[tokio::test]
    async fn the_next_turns_prefill_pulls_the_decodes_kv_once_instead_of_computing_it() {
        let (fleet, prefill, decode) = bidirectional(1e9, 100.0);
        let kv = decode_turn(&fleet, &decode, &[1, 2, 3, 4], 2000).await;
        // vLLM's contract: the decode's blocks, engine, request, side channel.
        assert_eq!(kv["do_remote_decode"], json!(true));
        assert_eq!(kv["do_remote_prefill"], json!(false));
        assert_eq!(kv["remote_engine_id"], json!("decode-0"));
        assert_eq!(
            (kv["remote_host"].as_str(), kv["remote_port"].as_u64()),
            (Some("localhost"), Some(1002))
        );
        assert_eq!(kv["remote_num_tokens"], json!(2000 + 20 - 1));
        assert_eq!(kv["transfer_mode"], json!("pull"));
        assert!(kv["remote_blocks_expiry_time"].is_f64());
        assert!(!kv["remote_block_ids"][0].as_array().unwrap().is_empty());
        let (_, _, held, _) = decode.pod.load();
        assert!(held > 0.0, "the decode pod holds its blocks");
        // The next turn: the history and 1,000 new tokens; the router names
        // the decode pod by its address.
        let mut next = kv.clone();
        next["remote_host"] = json!("127.0.0.1:1002");
        let ids = [1, 2, 3, 4, 5, 6];
        let (status, answer) = post(&prefill, prefill_leg(&ids, 3000, "t2", &next)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let r = record_of(&fleet, "t2");
        assert_eq!(
            (r.cached_tokens, r.transferred_tokens, r.computed_tokens),
            (0, 2019, 981)
        );
        assert_eq!(
            decode.pod.load().2,
            0.0,
            "pulled: the decode's blocks are free"
        );
        // Single use: the same blocks named again are gone.
        let err = fleet
            .take_kept(&next, decode.pod.clock.now_s())
            .unwrap_err();
        assert!(err.contains("already pulled"), "{err}");
    }

    #[tokio::test]
    async fn a_pull_under_the_recompute_threshold_computes_and_an_unknown_pod_fails() {
        let (fleet, prefill, decode) = bidirectional(1e9, 100.0);
        let kv = decode_turn(&fleet, &decode, &[1, 2], 1000).await;
        // The prefill pod holds more than the decode's 1,019 tokens.
        let warm = json!({"prompt": prompt_text(&[1, 2], 1000, Shape::default()),
                          "max_tokens": 1, "user": "w"});
        assert_eq!(post(&prefill, warm).await.0, StatusCode::OK);
        let (status, _) = post(&prefill, prefill_leg(&[1, 2, 7], 1100, "t2", &kv)).await;
        assert_eq!(status, StatusCode::OK);
        let r = record_of(&fleet, "t2");
        assert_eq!(
            (r.cached_tokens, r.transferred_tokens, r.computed_tokens),
            (1024, 0, 76)
        );
        // Another engine named for the blocks: nothing to pull there.
        let kv = decode_turn(&fleet, &decode, &[8, 9, 10], 1500).await;
        let mut wrong = kv.clone();
        wrong["remote_engine_id"] = json!("decode-7");
        let (status, _) = post(&prefill, prefill_leg(&[8, 9, 10, 11], 2000, "t4", &wrong)).await;
        // vLLM's kv_load_failure_policy `fail`: a 500.
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(record_of(&fleet, "t4").status, 500);
        // The right one still holds them.
        let (status, _) = post(&prefill, prefill_leg(&[8, 9, 10, 11], 2000, "t5", &kv)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(record_of(&fleet, "t5").transferred_tokens, 1519);
    }

    /// The KV event batches after `after`, as the bridge reads them.
    async fn read_events(app: &App, after: u64) -> (StatusCode, Value) {
        let q = std::collections::HashMap::from([("after".to_owned(), after)]);
        let resp = kv_events(State(app.clone()), Query(q)).await;
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// The keys llm-d's picker computes for `text`: one id a character,
    /// chunks of one sim block.
    fn picker_keys(text: &str) -> Vec<u64> {
        use crate::sim::kv_events::{chunk_digest, key, seed_digest, token_id};
        let tokens: Vec<u32> = text.bytes().map(token_id).collect();
        let mut parent = seed_digest("");
        tokens
            .chunks_exact(Shape::default().block_bytes())
            .map(|c| {
                parent = chunk_digest(&parent, c);
                key(&parent)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_pod_publishes_the_blocks_a_prompt_leaves_computed_as_the_picker_keys_them() {
        let (_, prefill, _) = pair(None, 100.0, true);
        // Three whole blocks and a tail past the trace's blocks.
        let text = prompt_text(&[1, 2, 3], 3 * 512 + 100, Shape::default());
        let want = picker_keys(&text);
        assert_eq!(want.len(), 3);
        let (status, _) = post(
            &prefill,
            json!({"prompt": text, "max_tokens": 1, "user": "a"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (status, got) = read_events(&prefill, 0).await;
        assert_eq!(status, StatusCode::OK);
        let batches = got["batches"].as_array().unwrap();
        let stored: Vec<u64> = batches
            .iter()
            .flat_map(|b| b["stored"].as_array().unwrap().iter())
            .map(|k| k.as_u64().unwrap())
            .collect();
        assert_eq!(stored, want);
        assert!(batches.iter().all(|b| b["pod"] == json!("127.0.0.1")));
        let last = batches.last().unwrap()["seq"].as_u64().unwrap();
        // The same start and one block more: only the new block is stored.
        let text = prompt_text(&[1, 2, 3, 4], 4 * 512, Shape::default());
        let (status, _) = post(
            &prefill,
            json!({"prompt": text, "max_tokens": 1, "user": "b"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (_, got) = read_events(&prefill, last).await;
        let batches = got["batches"].as_array().unwrap();
        assert_eq!(batches.len(), 1, "{got}");
        assert_eq!(batches[0]["stored"], json!([picker_keys(&text)[3]]));
        assert_eq!(batches[0]["parent"], json!(want[2]));
    }

    #[tokio::test]
    async fn without_kv_events_the_route_says_so() {
        let (_, prefill, _) = pair(None, 100.0, false);
        let (status, body) = read_events(&prefill, 0).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.to_string().contains("--kv-events"), "{body}");
    }

    #[tokio::test]
    async fn kept_kv_expires_at_the_ttl_and_frees_its_blocks() {
        let (fleet, _, decode) = bidirectional(480.0, 100.0);
        let kv = decode_turn(&fleet, &decode, &[1, 2, 3], 1500).await;
        assert!(decode.pod.load().2 > 0.0);
        let expiry = kv["remote_blocks_expiry_time"].as_f64().unwrap();
        let now = decode.pod.clock.now_s();
        assert!(
            (expiry - now - 480.0).abs() < 480.0 * 1e-3 + 1.0,
            "{expiry} {now}"
        );
        let err = fleet.take_kept(&kv, expiry + 1.0).unwrap_err();
        assert!(err.contains("expired"), "{err}");
        assert_eq!(decode.pod.load().2, 0.0, "expired: freed");
        assert!(fleet.take_kept(&kv, now).is_err(), "and gone");
    }
}

//! The pod's main HTTP API: health, models, metrics, the request log, and
//! POST /v1/* (faults first, then the engine contract).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::cli::Fault;
use crate::engines;
use crate::error::{error_body, Fail};
use crate::request::Api;
use crate::state::{lock, DebugRecord, Shared};

/// Bodies larger than axum's 2 MB default are legitimate long prompts.
const BODY_LIMIT: usize = 64 << 20;

/// Attached to a response so the access log can say why it failed.
#[derive(Clone)]
struct Note(String);

pub fn main_router(state: Shared) -> Router {
    let routes = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/debug/requests", get(debug_requests))
        .route("/v1/{*rest}", post(v1_post))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state.clone());
    with_access_log(routes, state, "http")
}

/// Adds `x-mock-pod` and one stderr line per request to any of the pod's
/// servers (main, side channel, bootstrap).
pub fn with_access_log(router: Router, state: Shared, server: &'static str) -> Router {
    router.layer(middleware::from_fn_with_state(
        LogCtx { state, server },
        access_log,
    ))
}

#[derive(Clone)]
struct LogCtx {
    state: Shared,
    server: &'static str,
}

async fn access_log(State(ctx): State<LogCtx>, req: HttpRequest, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let uri = req.uri().clone();
    let mut resp = next.run(req).await;
    let cfg = &ctx.state.config;
    if let Ok(pod) = HeaderValue::from_str(&cfg.name) {
        resp.headers_mut().insert("x-mock-pod", pod);
    }
    let kv = resp
        .headers()
        .get("x-mock-kv")
        .and_then(|v| v.to_str().ok())
        .map(|v| format!(" kv={v}"))
        .unwrap_or_default();
    let note = resp
        .extensions()
        .get::<Note>()
        .map(|n| format!(": {}", n.0))
        .unwrap_or_default();
    eprintln!(
        "[{} {}/{} {}] {method} {uri} -> {} in {}ms{kv}{note}",
        cfg.name,
        cfg.engine.as_str(),
        cfg.role.as_str(),
        ctx.server,
        resp.status().as_u16(),
        started.elapsed().as_millis(),
    );
    resp
}

async fn models(State(state): State<Shared>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{"id": state.config.model, "object": "model", "owned_by": "mock"}],
    }))
    .into_response()
}

/// Prometheus label values escape backslash, quote and newline.
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

async fn metrics(State(state): State<Shared>) -> Response {
    let labels = format!("{{model_name=\"{}\"}}", label_value(&state.config.model));
    let running = state.running.load(Ordering::Relaxed);
    let generated = state.generated_tokens.load(Ordering::Relaxed);
    let text = format!(
        "# HELP vllm:num_requests_running Number of requests currently running.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{labels} {running}\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{labels} 0\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{labels} 0.0\n\
         # HELP vllm:generation_tokens_total Number of generation tokens processed.\n\
         # TYPE vllm:generation_tokens_total counter\n\
         vllm:generation_tokens_total{labels} {generated}\n"
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn debug_requests(State(state): State<Shared>) -> Response {
    let records = lock(&state.debug).clone();
    Json(records).into_response()
}

fn record(state: &Shared, path: &str, headers: &HeaderMap, body: &[u8]) {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        map.entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    lock(&state.debug).push(DebugRecord {
        path: path.to_string(),
        headers: map,
        body: String::from_utf8_lossy(body).into_owned(),
    });
}

fn kv_none(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert("x-mock-kv", HeaderValue::from_static("none"));
    resp
}

fn error_response(status: StatusCode, kind: &str, message: String) -> Response {
    let mut resp = (status, Json(error_body(status, kind, &message))).into_response();
    resp.extensions_mut().insert(Note(message));
    kv_none(resp)
}

fn fail_response(state: &Shared, fail: Fail) -> Response {
    let message = format!("{}: {}", state.label(), fail.message);
    error_response(fail.status, fail.kind, message)
}

async fn v1_post(
    State(state): State<Shared>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    record(&state, uri.path(), &headers, &body);
    let guard = state.in_flight();

    let faults = &state.config.faults;
    for fault in faults {
        if let Fault::Delay(d) = fault {
            tokio::time::sleep(*d).await;
        }
    }
    if faults.contains(&Fault::Hang) {
        std::future::pending::<()>().await;
    }
    if let Some(code) = faults.iter().find_map(|f| match f {
        Fault::Status(c) => Some(*c),
        _ => None,
    }) {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error_response(status, "mock_fault", format!("mock fault: status {code}"));
    }
    if faults.contains(&Fault::Garbage) {
        let mut resp = (
            [(header::CONTENT_TYPE, "application/json")],
            "this is not json",
        )
            .into_response();
        resp.extensions_mut()
            .insert(Note("fault: garbage body".into()));
        return kv_none(resp);
    }

    let api = match uri.path() {
        "/v1/completions" => Api::Completions,
        "/v1/chat/completions" => Api::Chat,
        other => {
            return error_response(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{}: no such endpoint {other}", state.label()),
            )
        }
    };
    match engines::handle(&state, api, &body, guard).await {
        Ok(resp) => resp,
        Err(fail) => fail_response(&state, fail),
    }
}

//! The pod's main HTTP API: health, models, metrics, the debug endpoints
//! (request log, reported load), and the engine API's POSTs (POST /v1/*,
//! `/inference/v1/generate`, `/tokenize`, `/score`, ...: faults first, then
//! the engine contract or the unsplit call, then the faults that spoil the
//! engine's answer).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{header, Extensions, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::anthropic;
use crate::config::{check_load_value, fail_after_transfer, Config, Engine, Fault, Load, Role};
use crate::conn::{truncated_body, ConnCtl, ConnHandle};
use crate::engines;
use crate::error::{error_body, ErrorShape, Fail};
use crate::metrics::{render_metrics, Snapshot};
use crate::models;
use crate::request::Api;
use crate::state::{unix_now, DebugRecord, Shared};
use crate::store::lock;
use crate::unsplit::{self, Call};

/// Bodies larger than axum's 2 MB default are legitimate long prompts.
const BODY_LIMIT: usize = 64 << 20;

/// Attached to a response so the access log can say why it failed.
#[derive(Clone)]
struct Note(String);

/// Attached to a response that is never sent (fault `reset`): the access log
/// shows `RESET` for its status.
#[derive(Clone)]
struct Dropped;

pub fn main_router(state: Shared) -> Router {
    let routes = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/debug/requests", get(debug_requests))
        .route("/debug/reset", post(debug_reset))
        .route("/debug/load", post(debug_load))
        .route("/abort_request", post(abort_request))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/v1/{*rest}", post(api_post))
        // The engine API's paths outside /v1 (vLLM's token-in API and its
        // unsplit calls).
        .route("/inference/v1/generate", post(api_post))
        .route("/tokenize", post(api_post))
        .route("/detokenize", post(api_post))
        .route("/score", post(api_post))
        .route("/rerank", post(api_post))
        .route("/v2/rerank", post(api_post))
        .route("/pooling", post(api_post))
        .route("/classify", post(api_post))
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
    if cfg.quiet {
        return resp;
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
    let status = if resp.extensions().get::<Dropped>().is_some() {
        "RESET".to_string()
    } else {
        resp.status().as_u16().to_string()
    };
    eprintln!(
        "[{} {}/{} {}] {method} {uri} -> {status} in {}ms{kv}{note}",
        cfg.name,
        cfg.engine.as_str(),
        cfg.role.as_str(),
        ctx.server,
        started.elapsed().as_millis(),
    );
    resp
}

async fn models(State(state): State<Shared>) -> Response {
    Json(models::list(&state.config, unix_now())).into_response()
}

async fn metrics(State(state): State<Shared>) -> Response {
    let load = *lock(&state.load);
    if load.metrics_fail {
        let mut resp =
            (StatusCode::INTERNAL_SERVER_ERROR, "mock metrics failure\n").into_response();
        resp.extensions_mut()
            .insert(Note("metrics_fail is set".into()));
        return resp;
    }
    let snapshot = Snapshot {
        in_flight: state.running.load(Ordering::Relaxed),
        generated_tokens: state.generated_tokens.load(Ordering::Relaxed),
        finished: state.finished.load(Ordering::Relaxed),
        load,
    };
    let text = render_metrics(state.config.metrics_format, &state.config.model, snapshot);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// SGLang's `GET /server_info` (and the deprecated `/get_server_info`), and
/// a TensorRT-LLM context server's; 404 elsewhere, as those engines have
/// no such endpoint.
async fn server_info(State(state): State<Shared>) -> Response {
    let info = match state.config.engine {
        Engine::Sglang => Some(engines::sglang_server_info(&state)),
        Engine::Trtllm => engines::trtllm_server_info(&state),
        _ => None,
    };
    match info {
        Some(info) => Json(info).into_response(),
        None => error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{}: no such endpoint /server_info", state.label()),
        ),
    }
}

async fn debug_requests(State(state): State<Shared>) -> Response {
    let records = lock(&state.debug).clone();
    Json(records).into_response()
}

async fn debug_reset(State(state): State<Shared>) -> Response {
    lock(&state.debug).clear();
    Json(json!({"ok": true})).into_response()
}

/// `POST /debug/load` body: each present key replaces that reported value.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
struct LoadUpdate {
    running: Option<f64>,
    waiting: Option<f64>,
    kv_usage: Option<f64>,
    gen_throughput: Option<f64>,
    metrics_fail: Option<bool>,
}

impl LoadUpdate {
    /// `load` with the update applied, or why the update is refused (then
    /// nothing changes).
    fn apply(&self, mut load: Load) -> Result<Load, String> {
        let checked = |what, v: Option<f64>, fraction| {
            v.map(|v| check_load_value(what, v, fraction)).transpose()
        };
        if let Some(v) = checked("running", self.running, false)? {
            load.running = v;
        }
        if let Some(v) = checked("waiting", self.waiting, false)? {
            load.waiting = v;
        }
        if let Some(v) = checked("kv_usage", self.kv_usage, true)? {
            load.kv_usage = v;
        }
        if let Some(v) = checked("gen_throughput", self.gen_throughput, false)? {
            load.gen_throughput = v;
        }
        if let Some(fail) = self.metrics_fail {
            load.metrics_fail = fail;
        }
        Ok(load)
    }
}

/// Changes the reported load at run time; answers the load now in force.
/// The body is read as JSON whatever its content type, so `curl -d` works.
async fn debug_load(State(state): State<Shared>, body: Bytes) -> Response {
    let bad = |message: String| {
        let status = StatusCode::BAD_REQUEST;
        let mut resp = (
            status,
            Json(error_body(status, "mock_bad_request", &message)),
        )
            .into_response();
        resp.extensions_mut().insert(Note(message));
        resp
    };
    let update: LoadUpdate = match serde_json::from_slice(&body) {
        Ok(u) => u,
        Err(e) => return bad(format!("/debug/load: invalid body: {e}")),
    };
    let mut load = lock(&state.load);
    match update.apply(*load) {
        Ok(new) => {
            *load = new;
            Json(new).into_response()
        }
        Err(e) => bad(format!("/debug/load: {e}")),
    }
}

fn record(state: &Shared, path: &str, headers: &HeaderMap, body: &[u8]) {
    if state.config.quiet {
        return;
    }
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
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    lock(&state.debug).push(DebugRecord {
        path: path.to_string(),
        model: models::named(content_type, body),
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
    shaped_error(ErrorShape::OpenAi, status, kind, message, None)
}

/// An error answer in the path's shape (`param`: vLLM's member at fault).
/// SGLang's `POST /abort_request` (`entrypoints/http_server.py`, body
/// `AbortReq`: `rid`, `abort_all`): 200 with an empty body, and a prefill
/// of that `rid` waiting for its decode stops. A router aborts its own
/// request only: `abort_all` or no `rid` breaks the contract. vLLM's and
/// TensorRT-LLM's servers have no such route.
async fn abort_request(
    State(state): State<Shared>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    record(&state, uri.path(), &headers, &body);
    let shape = error_shape(uri.path());
    if state.config.engine != Engine::Sglang {
        let msg = format!("{}: no such endpoint {}", state.label(), uri.path());
        return shaped_error(shape, StatusCode::NOT_FOUND, "not_found", msg, None);
    }
    #[derive(Deserialize)]
    struct AbortReq {
        #[serde(default)]
        rid: Option<String>,
        #[serde(default)]
        abort_all: bool,
    }
    let refused = |msg: String| {
        shaped_error(
            shape,
            StatusCode::BAD_REQUEST,
            "contract_violation",
            msg,
            None,
        )
    };
    let req: AbortReq = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refused(format!("abort_request body: {e}")),
    };
    if req.abort_all {
        return refused(
            "abort_request with abort_all: a router aborts only its own request".into(),
        );
    }
    match req.rid.filter(|r| !r.is_empty()) {
        Some(rid) => {
            state.aborts.abort(&rid);
            StatusCode::OK.into_response()
        }
        None => refused("abort_request without a `rid`".into()),
    }
}

fn shaped_error(
    shape: ErrorShape,
    status: StatusCode,
    kind: &str,
    message: String,
    param: Option<&str>,
) -> Response {
    let body = shape.body(status, kind, &message, param);
    let mut resp = (status, Json(body)).into_response();
    resp.extensions_mut().insert(Note(message));
    kv_none(resp)
}

fn fail_response(state: &Shared, shape: ErrorShape, fail: Fail) -> Response {
    let message = if fail.verbatim {
        fail.message
    } else {
        format!("{}: {}", state.label(), fail.message)
    };
    shaped_error(shape, fail.status, fail.kind, message, fail.param)
}

/// What an API path is to this pod: a call the engines split, or one it
/// answers alone.
#[derive(Clone, Copy)]
enum Route {
    Split(Api),
    Unsplit(Call),
}

/// The route of `path` on this pod; `None`: not served here (404).
fn route(cfg: &Config, path: &str) -> Option<Route> {
    let split = match path {
        "/v1/completions" => Api::Completions,
        "/v1/chat/completions" => Api::Chat,
        "/v1/responses" if cfg.serves_responses() => Api::Responses,
        "/v1/messages" if cfg.serves_messages() => Api::Messages,
        "/inference/v1/generate" if cfg.serves_generate() => Api::Generate,
        other => {
            return Call::of(other)
                .filter(|c| c.served_by(cfg))
                .map(Route::Unsplit)
        }
    };
    Some(Route::Split(split))
}

/// Anthropic's paths answer errors in Anthropic's shape, as vLLM's and
/// SGLang's `/v1/messages` routers translate them.
fn error_shape(path: &str) -> ErrorShape {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        ErrorShape::Anthropic
    } else {
        ErrorShape::OpenAi
    }
}

/// The hand-off faults: a pull from a named prefill that fails, and a
/// stream that opens with an error event (Anthropic's `event: error` on
/// its paths).
fn handoff_fault(
    state: &Shared,
    shape: ErrorShape,
    faults: &[Fault],
    body: &[u8],
) -> Option<Response> {
    if faults.contains(&Fault::ErrorEvent) {
        let message = format!("{}: KV transfer failed", state.label());
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        let event = match shape {
            ErrorShape::Anthropic => {
                anthropic::error_event(&shape.body(status, "InternalServerError", &message, None))
            }
            ErrorShape::OpenAi => format!(
                "data: {}\n\ndata: [DONE]\n\n",
                serde_json::json!({"error": {"message": message,
                    "type": "InternalServerError", "param": null, "code": 500}})
            ),
        };
        let resp = ([(header::CONTENT_TYPE, "text/event-stream")], event).into_response();
        return Some(kv_none(resp));
    }
    let from = faults.iter().find_map(|f| match f {
        Fault::FailFrom(name) => Some(name),
        _ => None,
    })?;
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let engine = v
        .get("kv_transfer_params")?
        .get("remote_engine_id")?
        .as_str()?;
    (engine == format!("mock-engine-{from}")).then(|| {
        shaped_error(
            shape,
            StatusCode::INTERNAL_SERVER_ERROR,
            "mock_kv_load_failure",
            format!(
                "{}: KV transfer failed: could not pull from {from}",
                state.label()
            ),
            None,
        )
    })
}

/// Every engine API POST: recorded, numbered for `fail-after:N`, its
/// faults applied, then routed to the engine's contract or the unsplit
/// call, whose answer the spoiling faults may still cut.
async fn api_post(
    State(state): State<Shared>,
    uri: Uri,
    headers: HeaderMap,
    extensions: Extensions,
    body: Bytes,
) -> Response {
    record(&state, uri.path(), &headers, &body);
    let seq = state.posts.fetch_add(1, Ordering::Relaxed);
    let cfg = &state.config;
    let faults = cfg.faults_for(seq);
    let route = route(cfg, uri.path());
    let shape = error_shape(uri.path());
    let fail_after_transfer = fail_after_transfer(faults).is_some()
        && cfg.engine == Engine::Sglang
        && cfg.role == Role::Prefill
        && matches!(route, Some(Route::Split(_)));
    let truncate = faults.contains(&Fault::Truncate);
    // The engine's answer is spoiled afterwards: not a finished request.
    let guard = if fail_after_transfer || truncate {
        state.in_flight_faulted()
    } else {
        state.in_flight()
    };
    if let Some(resp) = early_fault(&state, shape, faults, &body, &extensions).await {
        return resp;
    }
    let Some(route) = route else {
        return shaped_error(
            shape,
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{}: no such endpoint {}", state.label(), uri.path()),
            None,
        );
    };
    let answered = match route {
        Route::Split(api) => engines::handle(&state, api, &headers, &body, faults, guard).await,
        Route::Unsplit(call) => unsplit::answer(&state, call, &headers, &body).map(|v| {
            guard.finish();
            kv_none(Json(v).into_response())
        }),
    };
    let resp = match answered {
        Ok(resp) => resp,
        Err(fail) => return fail_response(&state, shape, fail),
    };
    if fail_after_transfer {
        // The decode collected the KV (sglang::prefill waited for that) and
        // goes on regardless.
        return shaped_error(
            shape,
            StatusCode::INTERNAL_SERVER_ERROR,
            "mock_fault",
            "mock fault: prefill failed after the KV transfer".into(),
            None,
        );
    }
    if truncate {
        return truncate_response(resp, &extensions).await;
    }
    resp
}

/// The faults that answer before the engine does: delays, `hang`,
/// `reset`, `status:N`, the hand-off faults and `garbage`.
async fn early_fault(
    state: &Shared,
    shape: ErrorShape,
    faults: &[Fault],
    body: &[u8],
    extensions: &Extensions,
) -> Option<Response> {
    for fault in faults {
        if let Fault::Delay(d) = fault {
            tokio::time::sleep(*d).await;
        }
    }
    if faults.contains(&Fault::Hang) {
        std::future::pending::<()>().await;
    }
    if faults.contains(&Fault::Reset) {
        return Some(reset_connection(extensions));
    }
    if let Some(code) = faults.iter().find_map(|f| match f {
        Fault::Status(c) => Some(*c),
        _ => None,
    }) {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = format!("mock fault: status {code}");
        return Some(shaped_error(shape, status, "mock_fault", message, None));
    }
    if let Some(resp) = handoff_fault(state, shape, faults, body) {
        return Some(resp);
    }
    if faults.contains(&Fault::Garbage) {
        let mut resp = (
            [(header::CONTENT_TYPE, "application/json")],
            "this is not json",
        )
            .into_response();
        resp.extensions_mut()
            .insert(Note("fault: garbage body".into()));
        return Some(kv_none(resp));
    }
    None
}

/// The connection's switch, when served by [`crate::conn::CtlListener`].
fn conn_ctl(extensions: &Extensions) -> Option<Arc<ConnCtl>> {
    extensions
        .get::<ConnectInfo<ConnHandle>>()
        .map(|ConnectInfo(ConnHandle(ctl))| ctl.clone())
}

fn no_conn_ctl(fault: &str) -> Response {
    error_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "mock_internal",
        format!("mock fault {fault}: connection not served by the mock's listener"),
    )
}

/// Fault `reset`: throws the connection's switch and returns a stand-in
/// answer, which hyper then fails to write: the client gets an RST and not
/// one byte (see [`crate::conn`]).
fn reset_connection(extensions: &Extensions) -> Response {
    let Some(ctl) = conn_ctl(extensions) else {
        return no_conn_ctl("reset");
    };
    ctl.reset();
    let mut resp = StatusCode::INTERNAL_SERVER_ERROR.into_response();
    let ext = resp.extensions_mut();
    ext.insert(Dropped);
    ext.insert(Note(
        "fault: reset, connection dropped (RST) before any response byte".into(),
    ));
    resp
}

/// Fault `truncate`: a successful answer is sent with the `content-length`
/// of its whole body (streams are collected first), but only the first half
/// of the body follows before the connection is closed. Error answers pass
/// unchanged, so contract violations still show.
async fn truncate_response(resp: Response, extensions: &Extensions) -> Response {
    if !resp.status().is_success() {
        return resp;
    }
    let Some(ctl) = conn_ctl(extensions) else {
        return no_conn_ctl("truncate");
    };
    let (mut parts, body) = resp.into_parts();
    let full = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "mock_internal",
                format!("mock fault truncate: cannot collect the answer: {e}"),
            )
        }
    };
    let half = full.slice(..full.len() / 2);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(full.len()));
    parts.extensions.insert(Note(format!(
        "fault: truncate, {} of {} body bytes sent, then closed",
        half.len(),
        full.len()
    )));
    Response::from_parts(parts, truncated_body(half, ctl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_update() {
        let base = Load {
            running: 1.0,
            waiting: 2.0,
            kv_usage: 0.5,
            gen_throughput: 10.0,
            metrics_fail: false,
        };
        let parse = |s: &str| serde_json::from_str::<LoadUpdate>(s);
        let u = parse(r#"{"waiting": 7, "metrics_fail": true, "running": null}"#).unwrap();
        assert_eq!(
            u.apply(base),
            Ok(Load {
                waiting: 7.0,
                metrics_fail: true,
                ..base
            })
        );
        assert_eq!(parse("{}").unwrap().apply(base), Ok(base));
        assert!(parse(r#"{"kv_usage": 1.5}"#).unwrap().apply(base).is_err());
        assert!(parse(r#"{"running": -1}"#).unwrap().apply(base).is_err());
        assert!(parse(r#"{"runing": 1}"#).is_err());
        assert!(parse(r#"{"running": "1"}"#).is_err());
        assert!(parse("[]").is_err());
    }
}

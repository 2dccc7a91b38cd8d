//! The pod's main HTTP API: health, models, metrics, the debug endpoints
//! (request log, reported load), and POST /v1/* (faults first, then the
//! engine contract, then the faults that spoil the engine's answer).

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

use crate::config::{
    check_load_value, fail_after_transfer, Engine, Fault, Load, MetricsFormat, Role,
};
use crate::conn::{truncated_body, ConnCtl, ConnHandle};
use crate::engines;
use crate::error::{error_body, Fail};
use crate::request::Api;
use crate::state::{DebugRecord, Shared};
use crate::store::lock;

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
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
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

/// What `/metrics` shows at one instant.
#[derive(Clone, Copy, Debug)]
struct Snapshot {
    in_flight: u64,
    generated_tokens: u64,
    finished: u64,
    load: Load,
}

/// One metric family: HELP, TYPE and a single sample.
fn family(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, value: f64) {
    use std::fmt::Write as _;
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {value:?}\n"
    );
}

/// The Prometheus text page, with vLLM's or SGLang's metric names and labels.
/// Running = real in-flight POSTs + reported extra; the other gauges are the
/// reported values; counters count what the pod really did.
fn render_metrics(format: MetricsFormat, model: &str, s: Snapshot) -> String {
    let model = label_value(model);
    let running = s.in_flight as f64 + s.load.running;
    let mut out = String::with_capacity(2048);
    match format {
        MetricsFormat::Vllm => {
            let l = format!("{{model_name=\"{model}\"}}");
            family(
                &mut out,
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                &l,
                running,
            );
            family(
                &mut out,
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                &l,
                s.load.waiting,
            );
            family(
                &mut out,
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                &l,
                s.load.kv_usage,
            );
            family(
                &mut out,
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                &l,
                s.generated_tokens as f64,
            );
            family(
                &mut out,
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                &format!("{{finished_reason=\"length\",model_name=\"{model}\"}}"),
                s.finished as f64,
            );
        }
        MetricsFormat::Sglang => {
            // Scheduler gauges carry the rank labels, tokenizer counters only
            // the model, as in sglang/srt/metrics/collector.py.
            let sched = format!(
                "{{model_name=\"{model}\",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"}}"
            );
            let l = format!("{{model_name=\"{model}\"}}");
            family(
                &mut out,
                "sglang:num_running_reqs",
                "gauge",
                "The number of running requests.",
                &sched,
                running,
            );
            family(
                &mut out,
                "sglang:num_queue_reqs",
                "gauge",
                "The number of requests in the waiting queue.",
                &sched,
                s.load.waiting,
            );
            family(
                &mut out,
                "sglang:token_usage",
                "gauge",
                "The token usage.",
                &sched,
                s.load.kv_usage,
            );
            family(
                &mut out,
                "sglang:gen_throughput",
                "gauge",
                "The generation throughput (token/s).",
                &sched,
                s.load.gen_throughput,
            );
            family(
                &mut out,
                "sglang:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                &l,
                s.generated_tokens as f64,
            );
            family(
                &mut out,
                "sglang:num_requests_total",
                "counter",
                "Number of requests processed.",
                &l,
                s.finished as f64,
            );
        }
    }
    out
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

/// SGLang's `GET /server_info` (and the deprecated `/get_server_info`);
/// 404 on the other engines, which have no such endpoint.
async fn server_info(State(state): State<Shared>) -> Response {
    if state.config.engine != Engine::Sglang {
        return error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{}: no such endpoint /server_info", state.label()),
        );
    }
    Json(engines::sglang_server_info(&state)).into_response()
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
    let message = if fail.verbatim {
        fail.message
    } else {
        format!("{}: {}", state.label(), fail.message)
    };
    error_response(fail.status, fail.kind, message)
}

async fn v1_post(
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
    let fail_after_transfer = fail_after_transfer(faults).is_some()
        && cfg.engine == Engine::Sglang
        && cfg.role == Role::Prefill;
    let truncate = faults.contains(&Fault::Truncate);
    // The engine's answer is spoiled afterwards: not a finished request.
    let guard = if fail_after_transfer || truncate {
        state.in_flight_faulted()
    } else {
        state.in_flight()
    };

    for fault in faults {
        if let Fault::Delay(d) = fault {
            tokio::time::sleep(*d).await;
        }
    }
    if faults.contains(&Fault::Hang) {
        std::future::pending::<()>().await;
    }
    if faults.contains(&Fault::Reset) {
        return reset_connection(&extensions);
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
        "/v1/responses" if cfg.serves_responses() => Api::Responses,
        other => {
            return error_response(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{}: no such endpoint {other}", state.label()),
            )
        }
    };
    let resp = match engines::handle(&state, api, &headers, &body, faults, guard).await {
        Ok(resp) => resp,
        Err(fail) => return fail_response(&state, fail),
    };
    if fail_after_transfer {
        // The decode collected the KV (sglang::prefill waited for that) and
        // goes on regardless.
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "mock_fault",
            "mock fault: prefill failed after the KV transfer".into(),
        );
    }
    if truncate {
        return truncate_response(resp, &extensions).await;
    }
    resp
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

    fn snapshot(in_flight: u64, load: Load) -> Snapshot {
        Snapshot {
            in_flight,
            generated_tokens: 42,
            finished: 3,
            load,
        }
    }

    /// Sample lines (not comments) of a page, as `name{labels} value`.
    fn samples(page: &str) -> Vec<&str> {
        page.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn vllm_page() {
        let load = Load {
            running: 2.5,
            waiting: 4.0,
            kv_usage: 0.75,
            gen_throughput: 99.0,
            metrics_fail: false,
        };
        let page = render_metrics(MetricsFormat::Vllm, "m\"x", snapshot(1, load));
        assert_eq!(
            samples(&page),
            [
                r#"vllm:num_requests_running{model_name="m\"x"} 3.5"#,
                r#"vllm:num_requests_waiting{model_name="m\"x"} 4.0"#,
                r#"vllm:kv_cache_usage_perc{model_name="m\"x"} 0.75"#,
                r#"vllm:generation_tokens_total{model_name="m\"x"} 42.0"#,
                r#"vllm:request_success_total{finished_reason="length",model_name="m\"x"} 3.0"#,
            ]
        );
        assert!(page.contains("# TYPE vllm:request_success_total counter\n"));
        assert!(page.ends_with('\n'));
    }

    #[test]
    fn sglang_page() {
        let page = render_metrics(MetricsFormat::Sglang, "m", snapshot(0, Load::default()));
        let sched = r#"{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"}"#;
        assert_eq!(
            samples(&page),
            [
                format!("sglang:num_running_reqs{sched} 0.0"),
                format!("sglang:num_queue_reqs{sched} 0.0"),
                format!("sglang:token_usage{sched} 0.0"),
                format!("sglang:gen_throughput{sched} 0.0"),
                r#"sglang:generation_tokens_total{model_name="m"} 42.0"#.to_string(),
                r#"sglang:num_requests_total{model_name="m"} 3.0"#.to_string(),
            ]
        );
    }

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

//! The prefill pod's bootstrap server, the HTTP side of the rooms kept in
//! `store/rooms.rs`.
//!
//! SGLang: the decode registers each room (`POST /register {"room":R}`,
//! answered with the prefill's dp size) and then waits (`GET /wait/{room}`)
//! until the prefill has "transferred" it (answered with the prompt hash,
//! the prefill's dp rank that holds it and its cached token count). The
//! prefill only transfers rooms the decode has registered. So the two legs
//! must be in flight at the same time: a router that awaits the prefill
//! before sending the decode makes the prefill time out, as real SGLang
//! does.
//!
//! vLLM Mooncake: `GET /query`, vLLM's shape, one entry per dp rank:
//! `{"<rank>": {"engine_id": E, "worker_addr": {"0": {"0": "tcp://host:side"}}}}`;
//! 503 during the first `--query-unavailable-ms`.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::config::Engine;
use crate::peer::authority;
use crate::state::Shared;
use crate::store::rooms::WaitError;

pub fn router(state: Shared) -> Router {
    if state.config.engine != Engine::Sglang {
        return Router::new()
            .route("/query", get(mooncake_query))
            .with_state(state);
    }
    Router::new()
        .route("/register", post(register))
        .route("/wait/{room}", get(wait))
        .with_state(state)
}

/// vLLM `MooncakeBootstrapServer` `GET /query` (`dict[int, EngineEntry]`).
async fn mooncake_query(State(state): State<Shared>) -> Response {
    let cfg = &state.config;
    if state.started.elapsed() < cfg.query_unavailable {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"detail": "Service Unavailable"})),
        )
            .into_response();
    }
    let Some(side) = state.bound.side else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no side channel bound").into_response();
    };
    let host = cfg
        .advertise_host
        .clone()
        .unwrap_or_else(|| side.ip().to_string());
    let worker = format!("tcp://{}", authority(&host, side.port()));
    let entries: serde_json::Map<String, serde_json::Value> = (0..cfg.dp_size)
        .map(|r| {
            (
                r.to_string(),
                json!({
                    "engine_id": state.mooncake_rank_id(r),
                    "worker_addr": {"0": {"0": worker}},
                }),
            )
        })
        .collect();
    Json(entries).into_response()
}

#[derive(Deserialize)]
struct RegisterBody {
    room: u64,
}

async fn register(State(state): State<Shared>, body: axum::body::Bytes) -> Response {
    let room = match serde_json::from_slice::<RegisterBody>(&body) {
        Ok(b) => b.room,
        Err(e) => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("register body must be {{\"room\": u64}}: {e}"),
            )
                .into_response()
        }
    };
    if state.rooms.register(room) {
        Json(json!({"room": room, "dp_size": state.config.dp_size})).into_response()
    } else {
        (
            StatusCode::CONFLICT,
            format!("room {room} is already registered"),
        )
            .into_response()
    }
}

#[derive(Deserialize)]
struct WaitQuery {
    timeout_ms: Option<u64>,
}

async fn wait(
    State(state): State<Shared>,
    Path(room): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Response {
    let Ok(room) = room.parse::<u64>() else {
        return (
            StatusCode::BAD_REQUEST,
            format!("room {room:?} is not a u64"),
        )
            .into_response();
    };
    // The waiting decode may pass its own timeout; default to the prefill's.
    let timeout = q
        .timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(state.config.bootstrap_timeout);
    match state.rooms.await_transferred(room, timeout).await {
        Ok(t) => Json(json!({
            "prompt_hash": t.prompt_hash,
            "dp_rank": t.dp_rank,
            "dp_size": state.config.dp_size,
            "cached_tokens": t.cached_tokens,
        }))
        .into_response(),
        Err(WaitError::NotRegistered) => (
            StatusCode::CONFLICT,
            format!("room {room} was never registered"),
        )
            .into_response(),
        Err(WaitError::Timeout) => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("room {room} was not transferred within {timeout:?}"),
        )
            .into_response(),
    }
}

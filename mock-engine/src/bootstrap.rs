//! The prefill pod's bootstrap server.
//!
//! SGLang: the decode registers each room (`POST /register {"room":R}`,
//! answered with the prefill's dp size) and then waits (`GET /wait/{room}`)
//! until the prefill has "transferred" it (answered with the prompt hash,
//! the prefill's dp rank that holds it and its cached token count). The
//! prefill only transfers rooms the decode has registered. So the two legs
//! must be in flight at the same
//! time: a router that awaits the prefill before sending the decode makes
//! the prefill time out, as real SGLang does.
//!
//! vLLM Mooncake: `GET /query`, vLLM's shape, one entry per dp rank:
//! `{"<rank>": {"engine_id": E, "worker_addr": {"0": {"0": "tcp://host:side"}}}}`;
//! 503 during the first `--query-unavailable-ms`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::Engine;
use crate::peer::authority;
use crate::state::{lock, Shared};

/// What the prefill leaves for a room: its prompt hash, the dp rank that
/// holds the KV and its cached token count (SGLang's metadata buffer
/// carries `req.cached_tokens` to the decode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub prompt_hash: String,
    pub dp_rank: u64,
    pub cached_tokens: u64,
}

#[derive(Clone, Default)]
struct RoomStatus {
    registered: bool,
    /// What the prefill that handled the room left, once it has.
    transferred: Option<Transfer>,
    /// The decode has collected the transfer (its GET /wait was answered).
    collected: bool,
}

/// Rooms by id. A watch channel per room lets any number of waiters see
/// changes without missing one that happened before they started waiting.
#[derive(Default)]
pub struct Rooms {
    map: Mutex<HashMap<u64, Arc<watch::Sender<RoomStatus>>>>,
}

pub enum WaitError {
    NotRegistered,
    Timeout,
}

impl Rooms {
    fn entry(&self, room: u64) -> Arc<watch::Sender<RoomStatus>> {
        lock(&self.map)
            .entry(room)
            .or_insert_with(|| Arc::new(watch::Sender::new(RoomStatus::default())))
            .clone()
    }

    /// Decode side. A second registration of a live room is refused: two
    /// requests sharing a room would swap KV in a real deployment.
    fn register(&self, room: u64) -> bool {
        self.entry(room).send_if_modified(|s| {
            if s.registered {
                false
            } else {
                s.registered = true;
                true
            }
        })
    }

    /// Prefill side: waits until the decode registered `room`.
    pub async fn await_registered(&self, room: u64, deadline: Instant) -> bool {
        let tx = self.entry(room);
        let mut rx = tx.subscribe();
        tokio::time::timeout_at(deadline, rx.wait_for(|s| s.registered))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Prefill side. The returned future resolves once the decode has
    /// collected the transfer (it holds the room, which the collection
    /// removes from the map).
    pub fn mark_transferred(
        &self,
        room: u64,
        transfer: Transfer,
    ) -> impl Future<Output = ()> + Send + 'static {
        let tx = self.entry(room);
        let mut rx = tx.subscribe();
        tx.send_modify(|s| s.transferred = Some(transfer));
        async move {
            let _ = rx.wait_for(|s| s.collected).await;
        }
    }

    /// Decode side (via GET /wait): what the prefill left once it has
    /// transferred `room`. The room is then freed, single-consumer.
    async fn await_transferred(&self, room: u64, timeout: Duration) -> Result<Transfer, WaitError> {
        let tx = lock(&self.map)
            .get(&room)
            .cloned()
            .ok_or(WaitError::NotRegistered)?;
        if !tx.borrow().registered {
            return Err(WaitError::NotRegistered);
        }
        let mut rx = tx.subscribe();
        let transfer =
            match tokio::time::timeout(timeout, rx.wait_for(|s| s.transferred.is_some())).await {
                Ok(Ok(status)) => status.transferred.clone(),
                _ => return Err(WaitError::Timeout),
            };
        let Some(transfer) = transfer else {
            return Err(WaitError::Timeout);
        };
        lock(&self.map).remove(&room);
        tx.send_modify(|s| s.collected = true);
        Ok(transfer)
    }
}

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

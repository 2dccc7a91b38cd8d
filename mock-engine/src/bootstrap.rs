//! SGLang's bootstrap rendezvous, as served by the prefill pod.
//!
//! The decode registers each room (`POST /register {"room":R}`) and then
//! waits (`GET /wait/{room}`) until the prefill has "transferred" it. The
//! prefill only transfers rooms the decode has registered. So the two legs
//! must be in flight at the same time: a router that awaits the prefill
//! before sending the decode makes the prefill time out, as real SGLang does.

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

use crate::state::{lock, Shared};

#[derive(Clone, Default)]
struct RoomStatus {
    registered: bool,
    /// Prompt hash of the prefill that handled the room, once it has.
    transferred: Option<String>,
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
        prompt_hash: String,
    ) -> impl Future<Output = ()> + Send + 'static {
        let tx = self.entry(room);
        let mut rx = tx.subscribe();
        tx.send_modify(|s| s.transferred = Some(prompt_hash));
        async move {
            let _ = rx.wait_for(|s| s.collected).await;
        }
    }

    /// Decode side (via GET /wait): the prefill's prompt hash once it has
    /// transferred `room`. The room is then freed, single-consumer.
    async fn await_transferred(&self, room: u64, timeout: Duration) -> Result<String, WaitError> {
        let tx = lock(&self.map)
            .get(&room)
            .cloned()
            .ok_or(WaitError::NotRegistered)?;
        if !tx.borrow().registered {
            return Err(WaitError::NotRegistered);
        }
        let mut rx = tx.subscribe();
        let hash =
            match tokio::time::timeout(timeout, rx.wait_for(|s| s.transferred.is_some())).await {
                Ok(Ok(status)) => status.transferred.clone().unwrap_or_default(),
                _ => return Err(WaitError::Timeout),
            };
        lock(&self.map).remove(&room);
        tx.send_modify(|s| s.collected = true);
        Ok(hash)
    }
}

pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/register", post(register))
        .route("/wait/{room}", get(wait))
        .with_state(state)
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
        Json(json!({"room": room})).into_response()
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
        Ok(hash) => Json(json!({"prompt_hash": hash})).into_response(),
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

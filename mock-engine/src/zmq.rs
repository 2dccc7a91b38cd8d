//! The "ZMQ" listener of a vLLM P2P NCCL pod (plain HTTP in the mock):
//! where a prefill PUTs the KV for a request onto its decode.
//!
//! `PUT /p2p/kv {"request_id", "sender", "prompt_hash"}`: `sender` is the
//! prefill's own ZMQ address (`ip:port`), which the decode compares with
//! the prefill address in the request id. A decode keeps the KV until a
//! request with that id takes it (409 while one is already waiting); a
//! prefill pod receives no KV (409).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::config::Role;
use crate::state::Shared;
use crate::store::offers::Kv;

pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/p2p/kv", put(put_kv))
        .with_state(state)
}

#[derive(Deserialize)]
struct PutBody {
    request_id: String,
    sender: String,
    prompt_hash: String,
}

async fn put_kv(State(state): State<Shared>, body: axum::body::Bytes) -> Response {
    let body: PutBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("body must be {{\"request_id\",\"sender\",\"prompt_hash\"}}: {e}"),
            )
                .into_response()
        }
    };
    if state.config.role != Role::Decode {
        return (
            StatusCode::CONFLICT,
            "this pod is a prefill: it receives no KV (the request id's ___decode_addr_ names a \
             prefill)",
        )
            .into_response();
    }
    let kv = Kv {
        prompt_hash: body.prompt_hash,
        sender: Some(body.sender),
    };
    if state.offers.offer(body.request_id.clone(), kv) {
        Json(json!({"ok": true})).into_response()
    } else {
        (
            StatusCode::CONFLICT,
            format!(
                "KV for request id {:?} is already waiting here: request ids must be unique",
                body.request_id
            ),
        )
            .into_response()
    }
}

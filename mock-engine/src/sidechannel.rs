//! The prefill pod's side channel: where a decode pulls the "KV cache".
//!
//! vLLM NIXL/shfs: `GET /kv/{remote_request_id}?engine_id=E&block_ids=1,2,3`.
//! TRT-LLM: `GET /ctx/{disagg_request_id}`.
//! Entries are single-consumer, like NIXL freeing blocks after the read: a
//! router that makes two decodes pull one prefill fails the second.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::cli::Engine;
use crate::state::{lock, Shared};

pub struct KvEntry {
    pub engine_id: String,
    pub block_ids: Vec<u64>,
    pub prompt_hash: String,
}

#[derive(Default)]
pub struct SideStore {
    kv: Mutex<HashMap<String, KvEntry>>,
    ctx: Mutex<HashMap<u64, Vec<u64>>>,
}

impl SideStore {
    pub fn put_kv(&self, remote_request_id: String, entry: KvEntry) {
        lock(&self.kv).insert(remote_request_id, entry);
    }

    /// Stores a TRT-LLM context; false if the id is still pending, since
    /// reusing a live disagg_request_id would mix two requests' KV.
    pub fn put_ctx(&self, id: u64, token_ids: Vec<u64>) -> bool {
        let mut ctx = lock(&self.ctx);
        if ctx.contains_key(&id) {
            return false;
        }
        ctx.insert(id, token_ids);
        true
    }
}

pub fn router(state: Shared) -> Router {
    let r = Router::new();
    let r = match state.config.engine {
        Engine::Trtllm => r.route("/ctx/{id}", get(get_ctx)),
        _ => r.route("/kv/{id}", get(get_kv)),
    };
    r.with_state(state)
}

fn plain(status: StatusCode, msg: String) -> Response {
    (status, msg).into_response()
}

async fn get_kv(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(engine_id) = q.get("engine_id") else {
        return plain(StatusCode::BAD_REQUEST, "missing engine_id".into());
    };
    let Some(blocks) = q.get("block_ids") else {
        return plain(StatusCode::BAD_REQUEST, "missing block_ids".into());
    };
    let block_ids: Result<Vec<u64>, _> = blocks.split(',').map(str::parse::<u64>).collect();
    let Ok(block_ids) = block_ids else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("block_ids {blocks:?} is not a comma-separated list of integers"),
        );
    };
    let mut kv = lock(&state.side.kv);
    let Some(entry) = kv.get(&id) else {
        return plain(
            StatusCode::NOT_FOUND,
            format!("no KV for remote_request_id {id:?} (unknown or already pulled)"),
        );
    };
    if entry.engine_id != *engine_id {
        return plain(
            StatusCode::CONFLICT,
            format!(
                "engine_id {engine_id:?} does not match {:?}",
                entry.engine_id
            ),
        );
    }
    if entry.block_ids != block_ids {
        return plain(
            StatusCode::CONFLICT,
            format!("block_ids {block_ids:?} do not match {:?}", entry.block_ids),
        );
    }
    let hash = entry.prompt_hash.clone();
    kv.remove(&id);
    Json(json!({"prompt_hash": hash})).into_response()
}

async fn get_ctx(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("ctx id {id:?} is not a u64"),
        );
    };
    match lock(&state.side.ctx).remove(&id) {
        Some(token_ids) => Json(json!({"token_ids": token_ids})).into_response(),
        None => plain(
            StatusCode::NOT_FOUND,
            format!("no context for disagg_request_id {id} (unknown or already pulled)"),
        ),
    }
}

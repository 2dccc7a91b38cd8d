//! The prefill pod's side channel: where a decode pulls the "KV cache"
//! (NIXL and TRT-LLM entries are kept in `store/side.rs`, Mooncake and NIXL
//! push offers in `store/offers.rs`).
//!
//! vLLM NIXL/shfs: `GET /kv/{remote_request_id}?engine_id=E&block_ids=1,2,3`.
//! vLLM Mooncake: `GET /mooncake/kv?engine_id=E&transfer_id=T&timeout_ms=N`
//! (waits up to N ms for the prefill to offer the KV).
//! vLLM NIXL push: `GET /push/handshake` (the engine id), then
//! `GET /push/kv?request_id=R&timeout_ms=N` (waits for the KV of R).
//! TRT-LLM: `GET /ctx/{disagg_request_id}`; generation-first:
//! `GET /gen_first/{disagg_request_id}?timeout_ms=N` (asks for the KV,
//! which lets the waiting context run, and waits up to N ms for it).
//! Entries are single-consumer, like NIXL freeing blocks after the read: a
//! router that makes two decodes pull one prefill fails the second.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::config::{Connector, Engine, Role};
use crate::engines::{base_request_id, ec_encoded_item, mooncake_offer_key};
use crate::state::Shared;
use crate::store::gen_first::AskMiss;
use crate::store::side::KvMiss;

pub fn router(state: Shared) -> Router {
    let r = Router::new();
    if state.config.role == Role::Encode {
        return r.route("/ec/{hash}", get(get_encoded)).with_state(state);
    }
    let r = match (state.config.engine, state.config.connector) {
        (Engine::Trtllm, _) => r
            .route("/ctx/{id}", get(get_ctx))
            .route("/gen_first/{id}", get(ask_gen_first)),
        (_, Connector::Mooncake) => r.route("/mooncake/kv", get(get_mooncake_kv)),
        (_, Connector::NixlPush) => r
            .route("/push/handshake", get(push_handshake))
            .route("/push/kv", get(get_pushed_kv)),
        _ => r.route("/kv/{id}", get(get_kv)),
    };
    r.with_state(state)
}

/// The waiting decode passes its own timeout; default to the prefill's.
/// Errors are the 400 message.
fn wait_time(state: &Shared, q: &HashMap<String, String>) -> Result<Duration, String> {
    match q.get("timeout_ms") {
        None => Ok(state.config.bootstrap_timeout),
        Some(ms) => ms
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("timeout_ms {ms:?} is not a number")),
    }
}

fn query_param<'q>(q: &'q HashMap<String, String>, name: &str) -> Result<&'q str, String> {
    q.get(name)
        .map(String::as_str)
        .ok_or_else(|| format!("missing {name}"))
}

async fn get_mooncake_kv(
    State(state): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (engine_id, transfer_id, wait) = match (
        query_param(&q, "engine_id"),
        query_param(&q, "transfer_id"),
        wait_time(&state, &q),
    ) {
        (Ok(e), Ok(t), Ok(w)) => (e, t, w),
        (Err(m), _, _) | (_, Err(m), _) | (_, _, Err(m)) => {
            return plain(StatusCode::BAD_REQUEST, m)
        }
    };
    let ours = (0..state.config.dp_size).any(|r| state.mooncake_rank_id(r) == engine_id);
    if !ours {
        return plain(
            StatusCode::NOT_FOUND,
            format!("engine_id {engine_id:?} is not served by this worker"),
        );
    }
    let key = mooncake_offer_key(engine_id, transfer_id);
    match state.offers.take(&key, |_| false, wait).await {
        Some(kv) => Json(json!({"prompt_hash": kv.prompt_hash})).into_response(),
        None => plain(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "transfer_id {transfer_id:?} was not ready on engine {engine_id} within {wait:?}"
            ),
        ),
    }
}

async fn push_handshake(State(state): State<Shared>) -> Response {
    Json(json!({
        "engine_id": state.config.engine_id,
        "tp_size": 1,
        "pp_size": 1,
        "transfer_mode": "push",
    }))
    .into_response()
}

async fn get_pushed_kv(
    State(state): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (id, wait) = match (query_param(&q, "request_id"), wait_time(&state, &q)) {
        (Ok(i), Ok(w)) => (i, w),
        (Err(m), _) | (_, Err(m)) => return plain(StatusCode::BAD_REQUEST, m),
    };
    // vLLM's _pop_matching_registration: exact id first, then ids equal
    // once the randomisation suffix is stripped from both.
    let base = base_request_id(id);
    // Two decodes registered under one id at once would be pushed each
    // other's KV: the router must give every request in flight its own.
    let Some(_registered) = state.offers.register(base) else {
        return plain(
            StatusCode::CONFLICT,
            format!(
                "request id {id:?} already has a decode registered on this prefill: in-flight \
                 push request ids must be unique"
            ),
        );
    };
    match state
        .offers
        .take(id, |k| base_request_id(k) == base, wait)
        .await
    {
        Some(kv) => Json(json!({"prompt_hash": kv.prompt_hash})).into_response(),
        None => plain(
            StatusCode::GATEWAY_TIMEOUT,
            format!("no finished prefill for request {id:?} within {wait:?}"),
        ),
    }
}

/// vLLM E/P/D (NIXL): a prefill pulls an item this encoder encoded.
async fn get_encoded(State(state): State<Shared>, Path(hash): Path<String>) -> Response {
    match ec_encoded_item(&state, &hash) {
        Some(tokens) => Json(json!({"num_encoder_tokens": tokens})).into_response(),
        None => plain(
            StatusCode::NOT_FOUND,
            format!("item {hash:?} was not encoded here"),
        ),
    }
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
    match state.side.take_kv(&id, engine_id, &block_ids) {
        Ok(hash) => Json(json!({"prompt_hash": hash})).into_response(),
        Err(KvMiss::Unknown) => plain(
            StatusCode::NOT_FOUND,
            format!("no KV for remote_request_id {id:?} (unknown or already pulled)"),
        ),
        Err(KvMiss::Engine(theirs)) => plain(
            StatusCode::CONFLICT,
            format!("engine_id {engine_id:?} does not match {theirs:?}"),
        ),
        Err(KvMiss::Blocks(theirs)) => plain(
            StatusCode::CONFLICT,
            format!("block_ids {block_ids:?} do not match {theirs:?}"),
        ),
    }
}

async fn get_ctx(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("ctx id {id:?} is not a u64"),
        );
    };
    match state.side.take_ctx(id) {
        Some(ctx) => ctx.encode().into_response(),
        None => plain(
            StatusCode::NOT_FOUND,
            format!("no context for disagg_request_id {id} (unknown or already pulled)"),
        ),
    }
}

async fn ask_gen_first(
    State(state): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("ctx id {id:?} is not a u64"),
        );
    };
    let wait = match wait_time(&state, &q) {
        Ok(w) => w,
        Err(e) => return plain(StatusCode::BAD_REQUEST, e),
    };
    match state.gen_first.ask(id, wait).await {
        Ok(ctx) => ctx.encode().into_response(),
        Err(AskMiss::Taken) => plain(
            StatusCode::CONFLICT,
            format!("disagg_request_id {id} was already asked for by another generation request"),
        ),
        Err(AskMiss::Timeout) => plain(
            StatusCode::NOT_FOUND,
            format!("no generation-first context ran for disagg_request_id {id} within {wait:?}"),
        ),
    }
}

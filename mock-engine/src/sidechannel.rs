//! The prefill pod's side channel: where a decode pulls the "KV cache".
//!
//! vLLM NIXL/shfs: `GET /kv/{remote_request_id}?engine_id=E&block_ids=1,2,3`.
//! vLLM Mooncake: `GET /mooncake/kv?engine_id=E&transfer_id=T&timeout_ms=N`
//! (waits up to N ms for the prefill to offer the KV).
//! vLLM NIXL push: `GET /push/handshake` (the engine id), then
//! `GET /push/kv?request_id=R&timeout_ms=N` (waits for the KV of R).
//! TRT-LLM: `GET /ctx/{disagg_request_id}`.
//! Entries are single-consumer, like NIXL freeing blocks after the read: a
//! router that makes two decodes pull one prefill fails the second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::config::{Connector, Engine};
use crate::engines::{base_request_id, mooncake_offer_key};
use crate::state::{lock, Shared};

pub struct KvEntry {
    pub engine_id: String,
    pub block_ids: Vec<u64>,
    pub prompt_hash: String,
}

/// The form in which a TRT-LLM context answered the prompt's ids; the
/// generation request must carry them in that form (an orchestrator relays
/// what it got, and drops nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdsForm {
    /// Not answered (older chat endpoints, `--fault no-token-ids`).
    Absent,
    /// `prompt_token_ids`.
    Array,
    /// `prompt_token_ids_b64`.
    Base64,
}

impl IdsForm {
    fn tag(self) -> u8 {
        match self {
            IdsForm::Absent => b'-',
            IdsForm::Array => b'a',
            IdsForm::Base64 => b'b',
        }
    }

    fn from_tag(tag: u8) -> Option<IdsForm> {
        [IdsForm::Absent, IdsForm::Array, IdsForm::Base64]
            .into_iter()
            .find(|f| f.tag() == tag)
    }
}

/// What a TRT-LLM context leaves for its generation request.
#[derive(Debug, PartialEq, Eq)]
pub struct CtxEntry {
    pub token_ids: Vec<u64>,
    /// The `encoded_opaque_state` the context answered.
    pub encoded_opaque_state: String,
    pub answered: IdsForm,
}

impl CtxEntry {
    /// The body of `GET /ctx/{id}`: the form's tag byte, the opaque state
    /// (base64, so no newline), a newline, then the ids as little-endian
    /// u64s. Binary, as
    /// the cache transfer it stands in for: 131 000 ids as JSON made the
    /// mocks, not the router, bind the bench's 512 KB rate.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(self.encoded_opaque_state.len() + 2 + 8 * self.token_ids.len());
        out.push(self.answered.tag());
        out.extend_from_slice(self.encoded_opaque_state.as_bytes());
        out.push(b'\n');
        for id in &self.token_ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    pub fn decode(body: &[u8]) -> Result<CtxEntry, String> {
        let (&tag, body) = body.split_first().ok_or("empty body")?;
        let answered =
            IdsForm::from_tag(tag).ok_or_else(|| format!("unknown ids form {tag:#x}"))?;
        let mut lines = body.splitn(2, |b| *b == b'\n');
        let state = lines.next().unwrap_or_default();
        let ids = lines.next().ok_or("no opaque state line")?;
        let encoded_opaque_state = std::str::from_utf8(state)
            .map_err(|e| format!("opaque state: {e}"))?
            .to_string();
        let words = ids.chunks_exact(8);
        if !words.remainder().is_empty() {
            return Err(format!(
                "{} id bytes is not a whole number of u64s",
                ids.len()
            ));
        }
        let token_ids = words
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        Ok(CtxEntry {
            token_ids,
            encoded_opaque_state,
            answered,
        })
    }
}

#[derive(Default)]
pub struct SideStore {
    kv: Mutex<HashMap<String, KvEntry>>,
    ctx: Mutex<HashMap<u64, CtxEntry>>,
}

impl SideStore {
    pub fn put_kv(&self, remote_request_id: String, entry: KvEntry) {
        lock(&self.kv).insert(remote_request_id, entry);
    }

    /// Stores a TRT-LLM context; false if the id is still pending, since
    /// reusing a live disagg_request_id would mix two requests' KV.
    pub fn put_ctx(&self, id: u64, entry: CtxEntry) -> bool {
        let mut ctx = lock(&self.ctx);
        if ctx.contains_key(&id) {
            return false;
        }
        ctx.insert(id, entry);
        true
    }
}

pub fn router(state: Shared) -> Router {
    let r = Router::new();
    let r = match (state.config.engine, state.config.connector) {
        (Engine::Trtllm, _) => r.route("/ctx/{id}", get(get_ctx)),
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
        Some(ctx) => ctx.encode().into_response(),
        None => plain(
            StatusCode::NOT_FOUND,
            format!("no context for disagg_request_id {id} (unknown or already pulled)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctx_body_round_trips() {
        for answered in [IdsForm::Absent, IdsForm::Array, IdsForm::Base64] {
            let ctx = CtxEntry {
                token_ids: vec![0, 151_935, u64::MAX],
                encoded_opaque_state: "bW9jaw+/=".into(),
                answered,
            };
            assert_eq!(CtxEntry::decode(&ctx.encode()), Ok(ctx));
        }
    }

    #[test]
    fn ctx_body_must_be_whole() {
        assert!(CtxEntry::decode(b"").is_err());
        assert!(CtxEntry::decode(b"ano newline").is_err());
        assert!(CtxEntry::decode(b"astate\n1234567").is_err());
        assert!(CtxEntry::decode(b"?state\n").is_err(), "unknown form");
        let empty = CtxEntry::decode(b"-\n").expect("no ids is well formed");
        assert!(empty.token_ids.is_empty() && empty.encoded_opaque_state.is_empty());
    }
}

//! vLLM's bidirectional NIXL transfer (`bidirectional_kv_xfer`, PR 32553;
//! `nixl/pull_scheduler.py` in vLLM 0.34): a decode pod started with it
//! keeps a finished request's blocks and names them in its answer's
//! `kv_transfer_params` (`do_remote_decode: true`, its own engine, request
//! and blocks, its side channel); the conversation's next prefill, sent
//! those params, reads the prefix from the decode's side channel instead
//! of computing it. The blocks serve one read. A read that fails answers
//! 500, as vLLM's default `kv_load_failure_policy: fail` does.
//!
//! vLLM does not check that the prompt extends what the blocks hold
//! (vLLM issue 43094: wrong output, no error). This mock does: it keeps
//! the conversation the blocks hold (the messages and the generated reply,
//! or the prompt and its continuation) and refuses a prefill whose history
//! does not begin with it.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Map, Value};

use super::contract::{str_member, u64_member};
use crate::error::{Checked, Fail};
use crate::logprobs as lp;
use crate::peer::{authority, pct};
use crate::request::{short, u64_array, Api, Request};
use crate::state::Shared;
use crate::store::side::KvEntry;

const P: &str = "kv_transfer_params";
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The generated text of a decode of `max_tokens` tokens.
fn reply(max_tokens: u64) -> String {
    (0..max_tokens).map(|k| lp::generated(k).text).collect()
}

/// What the blocks hold after this decode: chat, the messages and the
/// reply; completions, the prompt and its continuation. `None` on the
/// other paths (no handle).
fn conversation(req: &Request<'_>, max_tokens: u64) -> Checked<Option<Value>> {
    Ok(match req.api {
        Api::Chat => {
            let Some(Value::Array(mut messages)) = req.value("messages")? else {
                return Ok(None);
            };
            messages.push(json!({"role": "assistant", "content": reply(max_tokens)}));
            Some(Value::Array(messages))
        }
        Api::Completions => match req.value("prompt")? {
            Some(Value::String(p)) => Some(Value::String(p + &reply(max_tokens))),
            _ => None,
        },
        _ => None,
    })
}

/// A decode that finished: its blocks kept for one read, and the
/// `kv_transfer_params` its answer carries.
pub fn keep(state: &Shared, req: &Request<'_>, max_tokens: u64) -> Checked<Map<String, Value>> {
    let mut top = Map::new();
    let Some(held) = conversation(req, max_tokens)? else {
        return Ok(top);
    };
    let side = state
        .bound
        .side
        .ok_or_else(|| Fail::internal("bidirectional decode has no side channel bound"))?;
    let request_id = format!("{}-{:016x}", state.next_id(), state.random_u64());
    let block_ids: Vec<u64> = (0..2)
        .map(|_| state.random_u64() & u64::from(u32::MAX))
        .collect();
    let engine_id = format!("mock-engine-{}", state.config.name);
    state.side.put_kv(
        request_id.clone(),
        KvEntry {
            engine_id: engine_id.clone(),
            block_ids: block_ids.clone(),
            prompt_hash: held.to_string(),
        },
    );
    top.insert(
        P.into(),
        json!({
            "do_remote_prefill": false,
            "do_remote_decode": true,
            // One list per KV-cache group, as vLLM answers them.
            "remote_block_ids": [block_ids],
            "remote_engine_id": engine_id,
            "remote_request_id": request_id,
            // vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST default: the router must
            // put the pod's address here.
            "remote_host": "localhost",
            "remote_port": side.port(),
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": max_tokens,
            "remote_blocks_expiry_time": 480.0,
            "remote_registration_generation": 0,
            "transfer_mode": "pull",
        }),
    );
    Ok(top)
}

/// Whether a prefill's `kv_transfer_params` name a decode's blocks to read
/// (vLLM's `get_num_new_matched_tokens`: `do_remote_decode`, non-empty
/// `remote_block_ids` and the four `remote_*` keys).
fn names_source(params: &Map<String, Value>) -> bool {
    params.get("do_remote_decode") == Some(&Value::Bool(true))
        && params
            .get("remote_block_ids")
            .is_some_and(|b| b.as_array().is_some_and(|b| !b.is_empty()))
}

/// A prefill sent a decode's params reads the prefix from that decode's
/// side channel. `Ok(false)`: it names none.
pub async fn read_source(
    state: &Shared,
    req: &Request<'_>,
    params: &Map<String, Value>,
) -> Checked<bool> {
    if !names_source(params) {
        return Ok(false);
    }
    let engine = str_member(params, P, "remote_engine_id")?;
    let id = str_member(params, P, "remote_request_id")?;
    let host = str_member(params, P, "remote_host")?;
    if host == "localhost" {
        return Err(Fail::contract(format!(
            "`{P}.remote_host` is \"localhost\", the decode's own default: the router must name the decode pod's address"
        )));
    }
    let port = u64_member(params, P, "remote_port")?;
    let port = u16::try_from(port)
        .map_err(|_| Fail::contract(format!("`{P}.remote_port` {port} is not a TCP port")))?;
    let blocks: Vec<u64> = params
        .get("remote_block_ids")
        .and_then(Value::as_array)
        .map(|groups| groups.iter().filter_map(u64_array).flatten().collect())
        .unwrap_or_default();
    let path = format!(
        "/kv/{}?engine_id={}&block_ids={}",
        pct(id),
        pct(engine),
        blocks
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let at = authority(host, port);
    // vLLM's default kv_load_failure_policy "fail": a read that fails is
    // the request's 500.
    let failed = |why: String| {
        Fail::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            format!("KV load from {at} failed: {why}"),
        )
    };
    let resp = state
        .peers
        .get(&at, &path, READ_TIMEOUT)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if resp.status != StatusCode::OK {
        return Err(failed(format!("{} {}", resp.status.as_u16(), resp.text())));
    }
    #[derive(serde::Deserialize)]
    struct Pulled {
        prompt_hash: String,
    }
    let pulled: Pulled =
        serde_json::from_slice(&resp.body).map_err(|e| failed(format!("bad body: {e}")))?;
    let held: Value = serde_json::from_str(&pulled.prompt_hash)
        .map_err(|e| Fail::internal(format!("held conversation: {e}")))?;
    extends(req, &held)?;
    Ok(true)
}

/// The prefill's history begins with what the blocks hold.
fn extends(req: &Request<'_>, held: &Value) -> Checked<()> {
    let ok = match (req.api, held) {
        (Api::Chat, Value::Array(held)) => match req.value("messages")? {
            Some(Value::Array(now)) => {
                now.len() > held.len()
                    && held.iter().zip(&now).all(|(h, n)| {
                        h.get("role") == n.get("role") && h.get("content") == n.get("content")
                    })
            }
            _ => false,
        },
        (Api::Completions, Value::String(held)) => matches!(
            req.value("prompt")?,
            Some(Value::String(now)) if now.len() > held.len() && now.starts_with(held.as_str())
        ),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(Fail::contract(format!(
        "the prompt does not extend the conversation the source decode's blocks hold ({}): vLLM would read them anyway and answer wrong output (vLLM issue 43094)",
        short(held)
    )))
}

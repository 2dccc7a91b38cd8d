//! vLLM disaggregated prefill.
//!
//! NIXL / shfs: the prefill is asked (`kv_transfer_params.do_remote_decode`)
//! to keep its KV blocks and answers with `kv_transfer_params` telling the
//! decode where to pull them from; the router must relay that object to the
//! decode verbatim. Neuron: the router passes the whole prefill response to
//! the decode as `disagg_prefill_resp`. (Mooncake, NIXL push and P2P NCCL
//! have their own modules.)

use std::time::Duration;

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::contract::{object_field, prefill_constraints, same_prompt, str_member, u64_member};
use super::vllm_request::{vllm_prefill_params, vllm_recompute};
use crate::error::{Checked, Fail};
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::peer::{authority, pct};
use crate::request::{approx_tokens, prompt_hash, short, u64_array, Request};
use crate::state::Shared;
use crate::store::side::KvEntry;

const PULL_TIMEOUT: Duration = Duration::from_secs(2);
const P: &str = "kv_transfer_params";

/// An unknown member the router must relay untouched: nested values and a
/// u64::MAX that any f64 round-trip would corrupt.
fn future_field() -> Value {
    json!({"nested": [1, 2, {"k": "v"}], "big": u64::MAX})
}

/// `no_kv_params`: the `no-kv-params` fault is in force for this request.
pub fn prefill(state: &Shared, req: &Request<'_>, no_kv_params: bool) -> Checked<PrefillOut> {
    prefill_constraints(req, true, state.config.lenient_prefill)?;
    vllm_prefill_params(req)?;
    let key = req.prompt_key()?;
    let mut out = PrefillOut::new(approx_tokens(&key));
    if no_kv_params {
        return Ok(out);
    }

    let cfg = &state.config;
    let side = state
        .bound
        .side
        .ok_or_else(|| Fail::internal("vllm prefill has no side channel bound"))?;
    let remote_request_id = format!("{}-{:016x}", state.next_id(), state.random_u64());
    let block_ids: Vec<u64> = (0..3)
        .map(|_| state.random_u64() & u64::from(u32::MAX))
        .collect();
    let engine_id = format!("mock-engine-{}", cfg.name);
    let host = cfg
        .advertise_host
        .clone()
        .unwrap_or_else(|| side.ip().to_string());
    state.side.put_kv(
        remote_request_id.clone(),
        KvEntry {
            engine_id: engine_id.clone(),
            block_ids: block_ids.clone(),
            prompt_hash: prompt_hash(&key),
        },
    );
    out.top.insert(
        "kv_transfer_params".into(),
        json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": block_ids,
            "remote_engine_id": engine_id,
            "remote_request_id": remote_request_id,
            "remote_host": host,
            "remote_port": side.port(),
            "tp_size": 1,
            "x_mock_future_field": future_field(),
        }),
    );
    Ok(out)
}

#[derive(Deserialize)]
struct Pulled {
    prompt_hash: String,
}

pub async fn decode(state: &Shared, req: &Request<'_>) -> Checked<DecodeOut> {
    let key = req.prompt_key()?;
    let own_hash = prompt_hash(&key);
    let prompt_tokens = approx_tokens(&key);
    let Some(params) = object_field(req, P)? else {
        // vLLM's own proxy sends n > 1 without a hand-off; anything else
        // means the prompt is recomputed on the decode, a silent perf bug.
        return vllm_recompute(state, req, "no kv_transfer_params");
    };
    let (at, path) = pull_source(&params)?;
    let pulled = pull(state, &at, &path).await?;
    same_prompt(&pulled.prompt_hash, &own_hash)?;
    Ok(DecodeOut::new(Kv::Pulled, prompt_tokens))
}

/// Where the prefill's `kv_transfer_params`, relayed verbatim, say its KV
/// is: the side channel's authority and the pull's path.
fn pull_source(params: &Map<String, Value>) -> Checked<(String, String)> {
    match params.get("do_remote_prefill") {
        Some(Value::Bool(true)) => {}
        Some(v) => {
            return Err(Fail::contract(format!(
                "`{P}.do_remote_prefill` must be true, got {}",
                short(v)
            )))
        }
        None => {
            return Err(Fail::contract(format!(
                "`{P}.do_remote_prefill` is missing"
            )))
        }
    }
    if params.get("do_remote_decode") == Some(&Value::Bool(true)) {
        return Err(Fail::contract(format!(
            "`{P}.do_remote_decode` is true on the decode leg"
        )));
    }
    let block_ids = match params.get("remote_block_ids") {
        Some(v) => match u64_array(v) {
            Some(ids) if !ids.is_empty() => ids,
            _ => {
                return Err(Fail::contract(format!(
                    "`{P}.remote_block_ids` must be a non-empty array of integers, got {}",
                    short(v)
                )))
            }
        },
        None => return Err(Fail::contract(format!("`{P}.remote_block_ids` is missing"))),
    };
    let engine_id = str_member(params, P, "remote_engine_id")?;
    let request_id = str_member(params, P, "remote_request_id")?;
    let host = str_member(params, P, "remote_host")?;
    let port = u64_member(params, P, "remote_port")?;
    let port = u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Fail::contract(format!("`{P}.remote_port` {port} is not a TCP port")))?;
    match params.get("x_mock_future_field") {
        Some(v) if *v == future_field() => {}
        Some(v) => {
            return Err(Fail::contract(format!(
                "`{P}.x_mock_future_field` was altered: got {}, expected {}",
                short(v),
                future_field()
            )))
        }
        None => {
            return Err(Fail::contract(format!(
                "`{P}.x_mock_future_field` is missing: the router must relay the prefill's \
                 kv_transfer_params verbatim, unknown fields included"
            )))
        }
    }

    let at = authority(host, port);
    let blocks: Vec<String> = block_ids.iter().map(u64::to_string).collect();
    let path = format!(
        "/kv/{}?engine_id={}&block_ids={}",
        pct(request_id),
        pct(engine_id),
        blocks.join(",")
    );
    Ok((at, path))
}

/// Pulls the KV from the prefill's side channel.
async fn pull(state: &Shared, at: &str, path: &str) -> Checked<Pulled> {
    let pull_err = |what: String| Fail::contract(format!("could not pull KV from {at}: {what}"));
    let resp = state
        .peers
        .get(at, path, PULL_TIMEOUT)
        .await
        .map_err(|e| pull_err(e.to_string()))?;
    if resp.status != StatusCode::OK {
        return Err(pull_err(format!(
            "side channel answered {}: {}",
            resp.status.as_u16(),
            resp.text()
        )));
    }
    serde_json::from_slice(&resp.body).map_err(|e| pull_err(format!("bad side-channel body: {e}")))
}

pub fn neuron_prefill(req: &Request<'_>, lenient: bool) -> Checked<PrefillOut> {
    prefill_constraints(req, true, lenient)?;
    if req.has("kv_transfer_params") {
        return Err(Fail::contract(
            "neuron prefill request must not carry `kv_transfer_params`",
        ));
    }
    let key = req.prompt_key()?;
    let mut out = PrefillOut::new(approx_tokens(&key));
    out.id_prefix = Some("mock-prefill-");
    out.top
        .insert("mock_prompt_hash".into(), json!(prompt_hash(&key)));
    Ok(out)
}

pub fn neuron_decode(req: &Request<'_>) -> Checked<DecodeOut> {
    const P: &str = "disagg_prefill_resp";
    let key = req.prompt_key()?;
    let own_hash = prompt_hash(&key);
    let resp = object_field(req, P)?.ok_or_else(|| {
        Fail::contract(format!(
            "no `{P}`: the neuron decode needs the prefill's response"
        ))
    })?;
    let id = str_member(&resp, P, "id")?;
    if !id.starts_with("mock-prefill-") {
        return Err(Fail::contract(format!(
            "`{P}.id` {id:?} is not a prefill response id (mock-prefill-...)"
        )));
    }
    let hash = str_member(&resp, P, "mock_prompt_hash")?;
    same_prompt(hash, &own_hash)?;
    Ok(DecodeOut::new(Kv::Pulled, approx_tokens(&key)))
}

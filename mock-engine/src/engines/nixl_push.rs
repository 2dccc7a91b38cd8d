//! vLLM NixlPushConnector (0.33, `kv_connector/v1/nixl/push_*`).
//!
//! The legs run concurrently and pair by REQUEST ID (not `transfer_id`):
//! the prefill's finished blocks wait for the decode's registration of the
//! same internal id (exact, else with the `-xxxxxxxx` randomisation suffix
//! stripped from both). So both legs carry the same `X-Request-Id` (body
//! `request_id` on `/v1/responses`) on the same endpoint. The decode learns
//! the prefill's coordinates from configuration, not from the prefill's
//! answer: `kv_transfer_params {do_remote_prefill: true, remote_engine_id,
//! remote_host, remote_port, tp_size [, pp_size]}`, read by direct indexing
//! (a missing key is a KeyError in vLLM, no recompute). The prefill still
//! answers the push-mode `kv_transfer_params` (`transfer_mode: "push"`).

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::contract::{object_field, prefill_constraints, same_prompt, str_member, u64_member};
use super::vllm_request::{
    request_id_source, vllm_internal_id, vllm_prefill_params, vllm_recompute, vllm_request_id,
};
use crate::error::{Checked, Fail};
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::peer::{authority, pct, Polled};
use crate::request::{approx_tokens, prompt_hash, short, Api, Request};
use crate::state::Shared;
use crate::store::offers;

const P: &str = "kv_transfer_params";

/// vLLM's `get_base_request_id`: the id without a trailing `-` and 8 hex
/// digits (`_RANDOM_SUFFIX_RE = r"-[0-9a-f]{8}$"`, case-insensitive).
pub fn base_request_id(id: &str) -> &str {
    let b = id.as_bytes();
    if b.len() >= 9 {
        let (head, tail) = b.split_at(b.len() - 9);
        if tail.first() == Some(&b'-') && tail.iter().skip(1).all(u8::is_ascii_hexdigit) {
            return id.get(..head.len()).unwrap_or(id);
        }
    }
    id
}

fn needs_id(api: Api, leg: &str) -> Fail {
    Fail::contract(format!(
        "nixl_push pairs the legs by request id: the {leg} needs {}",
        request_id_source(api)
    ))
}

pub fn prefill(
    state: &Shared,
    req: &Request<'_>,
    headers: &HeaderMap,
    spoiled: bool,
    no_kv_params: bool,
) -> Checked<PrefillOut> {
    let cfg = &state.config;
    prefill_constraints(req, true, cfg.lenient_prefill)?;
    vllm_prefill_params(req)?;
    let id = vllm_request_id(req, headers)?.ok_or_else(|| needs_id(req.api, "prefill"))?;
    let internal = vllm_internal_id(req.api, &id);
    let key = req.prompt_key()?;
    let mut out = PrefillOut::new(approx_tokens(&key));
    if !spoiled {
        let offered = state.offers.offer(
            internal.clone(),
            offers::Kv {
                prompt_hash: prompt_hash(&key),
                sender: None,
            },
        );
        if !offered {
            return Err(Fail::contract(format!(
                "request id {internal:?} already has KV waiting for its decode on this prefill: \
                 request ids must be unique per request"
            )));
        }
    }
    if no_kv_params {
        return Ok(out);
    }
    let side = state
        .bound
        .side
        .ok_or_else(|| Fail::internal("vllm nixl_push prefill has no side channel bound"))?;
    let host = cfg
        .advertise_host
        .clone()
        .unwrap_or_else(|| side.ip().to_string());
    let block_ids: Vec<u64> = (0..3)
        .map(|_| state.random_u64() & u64::from(u32::MAX))
        .collect();
    out.top.insert(
        P.into(),
        json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": block_ids,
            "remote_engine_id": cfg.engine_id,
            "remote_request_id": internal,
            "remote_host": host,
            "remote_port": side.port(),
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": approx_tokens(&key),
            "transfer_mode": "push",
        }),
    );
    Ok(out)
}

/// `params[field]` must exist: vLLM's push scheduler indexes it.
fn required<'p>(params: &'p Map<String, Value>, field: &str) -> Checked<&'p Value> {
    params.get(field).ok_or_else(|| {
        Fail::contract(format!(
            "`{P}.{field}` is missing (vLLM's push scheduler reads params[\"{field}\"]: a \
             KeyError, not a recompute)"
        ))
    })
}

/// A size member: an integer >= 1.
fn size_member(params: &Map<String, Value>, field: &str) -> Checked<u64> {
    let v = u64_member(params, P, field)?;
    if v == 0 {
        return Err(Fail::contract(format!("`{P}.{field}` must be >= 1, got 0")));
    }
    Ok(v)
}

#[derive(Deserialize)]
struct Handshake {
    engine_id: String,
}

#[derive(Deserialize)]
struct Pushed {
    prompt_hash: String,
}

pub async fn decode(state: &Shared, req: &Request<'_>, headers: &HeaderMap) -> Checked<DecodeOut> {
    let Some(params) = object_field(req, P)? else {
        return vllm_recompute(state, req, "no kv_transfer_params");
    };
    let (engine_id, at) = push_source(&params)?;
    let id = vllm_request_id(req, headers)?.ok_or_else(|| needs_id(req.api, "decode"))?;
    let internal = vllm_internal_id(req.api, &id);
    let key = req.prompt_key()?;
    let own_hash = prompt_hash(&key);
    handshake(state, &at, engine_id).await?;
    let pushed = await_push(state, &at, &internal, engine_id, req.api).await?;
    same_prompt(&pushed.prompt_hash, &own_hash)?;
    Ok(DecodeOut::new(Kv::Pulled, approx_tokens(&key)))
}

/// The prefill the decode's `kv_transfer_params` (from configuration)
/// name: its engine id and where it listens.
fn push_source(params: &Map<String, Value>) -> Checked<(&str, String)> {
    if params.get("do_remote_decode") == Some(&Value::Bool(true)) {
        return Err(Fail::contract(format!(
            "`{P}.do_remote_decode` is true on the decode leg"
        )));
    }
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
    for field in ["remote_engine_id", "remote_host", "remote_port", "tp_size"] {
        required(params, field)?;
    }
    let engine_id = str_member(params, P, "remote_engine_id")?;
    let host = str_member(params, P, "remote_host")?;
    let port = u64_member(params, P, "remote_port")?;
    let port = u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Fail::contract(format!("`{P}.remote_port` {port} is not a TCP port")))?;
    size_member(params, "tp_size")?;
    if params.contains_key("pp_size") {
        size_member(params, "pp_size")?;
    }
    Ok((engine_id, authority(host, port)))
}

/// The NIXL handshake: the engine at `at` must be the one named.
async fn handshake(state: &Shared, at: &str, engine_id: &str) -> Checked<()> {
    let shake_err =
        |what: String| Fail::kv_load(format!("NIXL handshake with {at} failed: {what}"));
    let resp = state
        .peers
        .get(at, "/push/handshake", Duration::from_secs(2))
        .await
        .map_err(|e| shake_err(e.to_string()))?;
    if resp.status != StatusCode::OK {
        return Err(shake_err(format!(
            "{} {}",
            resp.status.as_u16(),
            resp.text()
        )));
    }
    let shake: Handshake = serde_json::from_slice(&resp.body)
        .map_err(|e| shake_err(format!("bad handshake body: {e}")))?;
    if shake.engine_id != engine_id {
        return Err(Fail::kv_load(format!(
            "`{P}.remote_engine_id` {engine_id:?} does not match the engine at {at} ({:?})",
            shake.engine_id
        )));
    }
    Ok(())
}

/// Waits at `at` for the KV the prefill pushes for `internal`.
async fn await_push(
    state: &Shared,
    at: &str,
    internal: &str,
    engine_id: &str,
    api: Api,
) -> Checked<Pushed> {
    let wait = state.config.bootstrap_timeout;
    let path = format!(
        "/push/kv?request_id={}&timeout_ms={}",
        pct(internal),
        wait.as_millis()
    );
    let resp = match state.peers.long_poll(at, &path, wait).await {
        Polled::Ready(r) => r,
        Polled::TimedOut => {
            return Err(Fail::timeout(format!(
                "no KV pushed for request {internal:?} by engine {engine_id} within {} ms: both \
                 legs must carry the same request id ({}) on the same endpoint, and the prefill \
                 must not fail",
                wait.as_millis(),
                request_id_source(api)
            )))
        }
        Polled::Failed(e) => return Err(Fail::kv_load(format!("KV push from {at} failed: {e}"))),
        Polled::Refused(r) => {
            return Err(Fail::kv_load(format!(
                "KV push from {at} failed: {} {}",
                r.status.as_u16(),
                r.text()
            )))
        }
    };
    serde_json::from_slice(&resp.body)
        .map_err(|e| Fail::kv_load(format!("bad side-channel body from {at}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_the_randomisation_suffix() {
        assert_eq!(base_request_id("chatcmpl-abc-1a2B3c4d"), "chatcmpl-abc");
        assert_eq!(base_request_id("chatcmpl-abc"), "chatcmpl-abc");
        assert_eq!(base_request_id("-1a2b3c4d"), "");
        assert_eq!(base_request_id("x-1a2b3c4"), "x-1a2b3c4");
        assert_eq!(base_request_id("x_1a2b3c4d"), "x_1a2b3c4d");
        assert_eq!(base_request_id("x-1a2b3c4g"), "x-1a2b3c4g");
        assert_eq!(base_request_id("é-1a2b3c4d"), "é");
    }
}

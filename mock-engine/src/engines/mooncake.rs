//! vLLM MooncakeConnector (0.33, `kv_connector/v1/mooncake/`).
//!
//! The prefill pod runs a bootstrap server whose `GET /query` lists, per
//! data-parallel rank, the engine id and the worker's side-channel address.
//! The engine id is drawn at start (vLLM: a uuid4 unless configured), so a
//! router must read it there. The prefill leg carries
//! `kv_transfer_params {do_remote_decode: true, transfer_id}` (and, under DP,
//! header `X-data-parallel-rank` pins its rank); the prefill then holds the
//! KV under (engine id of that rank, transfer_id) and answers WITHOUT
//! `kv_transfer_params`. The decode leg carries `do_remote_prefill: true,
//! remote_engine_id, remote_bootstrap_addr ("http://host:port"),
//! transfer_id`; it queries the bootstrap server, finds the engine, and
//! pulls the KV from its worker, waiting for the prefill (the legs run
//! concurrently, the decode may come first).
//!
//! Failures as in vLLM: missing decode keys are a silent recompute (422
//! here unless `--allow-recompute`); an unknown engine id, an unreachable
//! bootstrap server or a KV that never comes fail the request (the default
//! `kv_load_failure_policy` "fail"): 500.

use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::contract::{object_field, prefill_constraints, same_prompt, str_member};
use super::vllm_request::{vllm_prefill_params, vllm_recompute};
use crate::error::{Checked, Fail};
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::peer::{authority, pct, split_authority, Polled};
use crate::request::{approx_tokens, prompt_hash, short, Request};
use crate::state::Shared;
use crate::store::offers;

const P: &str = "kv_transfer_params";

/// The key an offer is kept under: engine id and transfer id, unambiguous.
pub fn offer_key(engine_id: &str, transfer_id: &str) -> String {
    format!("{}:{engine_id}{transfer_id}", engine_id.len())
}

/// The prefill's data-parallel rank, from header `X-data-parallel-rank`:
/// required with `--dp-size` N > 1 (vLLM ignores a missing or non-integer
/// header and lets the request land on any rank, whose engine id the decode
/// would not be told); with N = 1 absent or 0.
fn dp_rank(state: &Shared, headers: &HeaderMap) -> Checked<u64> {
    let n = state.config.dp_size;
    let Some(v) = headers.get("x-data-parallel-rank") else {
        if n > 1 {
            return Err(Fail::contract(format!(
                "header `X-data-parallel-rank` is missing: with dp size {n} the prefill's rank \
                 must be pinned, or the decode cannot know which engine holds the KV"
            )));
        }
        return Ok(0);
    };
    let text = String::from_utf8_lossy(v.as_bytes());
    let rank = text.trim().parse::<i64>().map_err(|_| {
        Fail::contract(format!(
            "header `X-data-parallel-rank` {text:?} is not an integer (vLLM ignores it: the \
             request would land on any rank)"
        ))
    })?;
    u64::try_from(rank).ok().filter(|r| *r < n).ok_or_else(|| {
        Fail::contract(format!(
            "header `X-data-parallel-rank` {rank} is out of range for dp size {n}"
        ))
    })
}

/// `spoiled`: a fault spoils this prefill's answer; it then never offers
/// the KV (as a failed vLLM prefill never gets its blocks ready).
pub fn prefill(
    state: &Shared,
    req: &Request<'_>,
    headers: &HeaderMap,
    spoiled: bool,
) -> Checked<PrefillOut> {
    prefill_constraints(req, true, state.config.lenient_prefill)?;
    let params = vllm_prefill_params(req)?;
    let transfer_id = match params.get("transfer_id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(v) => {
            return Err(Fail::contract(format!(
                "`{P}.transfer_id` must be a non-empty string, got {}",
                short(v)
            )))
        }
        None => {
            return Err(Fail::contract(format!(
                "`{P}.transfer_id` is missing (vLLM logs \"Missing transfer_id in \
                 kv_transfer_params from router!\" and never sends the KV)"
            )))
        }
    };
    let rank = dp_rank(state, headers)?;
    let key = req.prompt_key()?;
    let out = PrefillOut::new(approx_tokens(&key));
    if !spoiled {
        let engine_id = state.mooncake_rank_id(rank);
        let offered = state.offers.offer(
            offer_key(&engine_id, &transfer_id),
            offers::Kv {
                prompt_hash: prompt_hash(&key),
                sender: None,
            },
        );
        if !offered {
            return Err(Fail::contract(format!(
                "`{P}.transfer_id` {transfer_id:?} is already pending on engine {engine_id}: \
                 transfer ids must be unique per request"
            )));
        }
    }
    // Like vLLM's Mooncake prefill: no kv_transfer_params in the answer.
    Ok(out)
}

/// `http://host:port`, nothing after the port (vLLM appends "/query").
fn bootstrap_base(addr: &str) -> Checked<(String, u16)> {
    addr.strip_prefix("http://")
        .and_then(split_authority)
        .ok_or_else(|| {
            Fail::contract(format!(
                "`{P}.remote_bootstrap_addr` {addr:?} is not a URL http://host:port (no path, \
                 no trailing slash: vLLM requests remote_bootstrap_addr + \"/query\")"
            ))
        })
}

#[derive(Deserialize)]
struct Pulled {
    prompt_hash: String,
}

pub async fn decode(state: &Shared, req: &Request<'_>) -> Checked<DecodeOut> {
    let Some(params) = object_field(req, P)? else {
        return vllm_recompute(state, req, "no kv_transfer_params");
    };
    if params.get("do_remote_decode") == Some(&Value::Bool(true)) {
        return Err(Fail::contract(format!(
            "`{P}.do_remote_decode` is true on the decode leg"
        )));
    }
    match params.get("do_remote_prefill") {
        Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) | None => {
            return vllm_recompute(
                state,
                req,
                &format!("`{P}.do_remote_prefill` is not true (vLLM then does no KV transfer)"),
            )
        }
        Some(v) => {
            return Err(Fail::contract(format!(
                "`{P}.do_remote_prefill` must be true, got {}",
                short(v)
            )))
        }
    }
    let missing: Vec<&str> = ["remote_engine_id", "remote_bootstrap_addr", "transfer_id"]
        .into_iter()
        .filter(|k| !params.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return vllm_recompute(
            state,
            req,
            &format!(
                "`{P}` lacks {} (vLLM: \"Got invalid KVTransferParams\", no KV transfer)",
                missing.join(", ")
            ),
        );
    }
    let engine_id = str_member(&params, P, "remote_engine_id")?;
    let addr = str_member(&params, P, "remote_bootstrap_addr")?;
    let transfer_id = str_member(&params, P, "transfer_id")?;
    let (host, port) = bootstrap_base(addr)?;
    let key = req.prompt_key()?;
    let own_hash = prompt_hash(&key);

    let worker = find_worker(state, &authority(&host, port), addr, engine_id).await?;
    let wait = state.config.bootstrap_timeout;
    let path = format!(
        "/mooncake/kv?engine_id={}&transfer_id={}&timeout_ms={}",
        pct(engine_id),
        pct(transfer_id),
        wait.as_millis()
    );
    let timed_out = || {
        Fail::timeout(format!(
            "KV for transfer_id {transfer_id:?} was not offered by engine {engine_id} within \
             {} ms (the prefill failed, never ran, or got another transfer_id or rank; vLLM's \
             kv_load_failure_policy \"fail\" ends the request with an error)",
            wait.as_millis()
        ))
    };
    let resp = match state.peers.long_poll(&worker, &path, wait).await {
        Polled::Ready(r) => r,
        Polled::TimedOut => return Err(timed_out()),
        Polled::Failed(e) => {
            return Err(Fail::kv_load(format!(
                "could not pull KV from worker {worker} of engine {engine_id}: {e}"
            )))
        }
        Polled::Refused(r) => {
            return Err(Fail::kv_load(format!(
                "worker {worker} of engine {engine_id} refused the pull: {} {}",
                r.status.as_u16(),
                r.text()
            )))
        }
    };
    let pulled: Pulled = serde_json::from_slice(&resp.body)
        .map_err(|e| Fail::kv_load(format!("bad side-channel body from {worker}: {e}")))?;
    same_prompt(&pulled.prompt_hash, &own_hash)?;
    Ok(DecodeOut::new(Kv::Pulled, approx_tokens(&key)))
}

/// `GET {addr}/query`, then the `tcp://host:port` worker of the entry whose
/// `engine_id` is `engine_id` (tp rank 0, pp rank 0), as an authority.
async fn find_worker(state: &Shared, at: &str, addr: &str, engine_id: &str) -> Checked<String> {
    let not_found = |why: String| {
        Fail::kv_load(format!(
            "remote engine_id {engine_id} not found from bootstrap server {addr}{why}"
        ))
    };
    let resp = state
        .peers
        .get(at, "/query", state.config.bootstrap_timeout)
        .await
        .map_err(|e| not_found(format!(" (GET /query failed: {e})")))?;
    if resp.status != StatusCode::OK {
        return Err(not_found(format!(
            " (GET /query answered {}: {})",
            resp.status.as_u16(),
            resp.text()
        )));
    }
    let entries: Map<String, Value> = serde_json::from_slice(&resp.body)
        .map_err(|e| not_found(format!(" (bad /query body: {e})")))?;
    let entry = entries
        .values()
        .find(|e| e.get("engine_id").and_then(Value::as_str) == Some(engine_id))
        .ok_or_else(|| not_found(String::new()))?;
    let worker = entry
        .get("worker_addr")
        .and_then(|w| w.get("0"))
        .and_then(|w| w.get("0"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    worker
        .strip_prefix("tcp://")
        .and_then(split_authority)
        .map(|(h, p)| authority(&h, p))
        .ok_or_else(|| {
            Fail::kv_load(format!(
                "engine {engine_id} on bootstrap server {addr} has no usable worker_addr \
                 (got {worker:?})"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_addr_must_be_a_base_url() {
        assert_eq!(
            bootstrap_base("http://127.0.0.1:8998").ok(),
            Some(("127.0.0.1".to_string(), 8998))
        );
        assert_eq!(
            bootstrap_base("http://[::1]:8998").ok(),
            Some(("::1".to_string(), 8998))
        );
        for bad in [
            "http://127.0.0.1:8998/",
            "http://127.0.0.1:8998/query",
            "127.0.0.1:8998",
            "https://127.0.0.1:8998",
            "http://127.0.0.1",
            "tcp://127.0.0.1:8998",
        ] {
            assert!(bootstrap_base(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn offer_keys_do_not_collide() {
        assert_ne!(offer_key("ab", "c"), offer_key("a", "bc"));
        assert_eq!(offer_key("e", "t"), offer_key("e", "t"));
    }
}

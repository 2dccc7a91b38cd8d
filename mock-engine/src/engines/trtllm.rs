//! TensorRT-LLM disaggregated serving: a "context_only" request on the
//! context (prefill) server, then a "generation_only" request on the
//! generation (decode) server built from the context response: its
//! `disaggregated_params` and, when the context echoed them, its
//! `prompt_token_ids`. As in TensorRT-LLM, a generation request without
//! token ids is tokenised by the generation server itself (the tokens must
//! still be the context's), and a request without `disaggregated_params` is
//! served as an ordinary full request.

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{object_field, prefill_constraints, str_member, u64_member};
use crate::cli::Fault;
use crate::error::{Checked, Fail};
use crate::generate::{DecodeOut, Kv, PrefillOut};
use crate::peer::pct;
use crate::request::{short, token_ids, u64_array, Api, Request};
use crate::state::Shared;

/// TRT-LLM's disaggregated request ids live above 2^42 (below are ordinary
/// request ids), so a router that mints small ids is wrong.
const MIN_DISAGG_ID: u64 = 1 << 42;
const P: &str = "disaggregated_params";

fn disagg_params(req: &Request<'_>) -> Checked<Map<String, Value>> {
    object_field(req, P)?.ok_or_else(|| Fail::contract(format!("`{P}` is missing")))
}

fn expect_request_type(params: &Map<String, Value>, expected: &str) -> Checked<()> {
    let got = str_member(params, P, "request_type")?;
    if got != expected {
        return Err(Fail::contract(format!(
            "`{P}.request_type` must be {expected:?}, got {got:?}"
        )));
    }
    Ok(())
}

pub fn prefill(state: &Shared, req: &Request<'_>, faults: &[Fault]) -> Checked<PrefillOut> {
    prefill_constraints(req, false, state.config.lenient_prefill)?;
    let params = disagg_params(req)?;
    expect_request_type(&params, "context_only")?;
    let id = u64_member(&params, P, "disagg_request_id")?;
    if id < MIN_DISAGG_ID {
        return Err(Fail::contract(format!(
            "`{P}.disagg_request_id` {id} is below 2^42"
        )));
    }
    if req.api == Api::Completions {
        match req.value("prompt")? {
            Some(Value::String(_)) => {}
            Some(v) => {
                return Err(Fail::contract(format!(
                    "context request `prompt` must be a single string, got {}",
                    short(&v)
                )))
            }
            None => return Err(Fail::contract("completions request has no `prompt`")),
        }
    }
    let key = req.prompt_key()?;
    let tokens = token_ids(&key);
    let side = state
        .bound
        .side
        .ok_or_else(|| Fail::internal("trtllm prefill has no side channel bound"))?;
    if !state.side.put_ctx(id, tokens.clone()) {
        return Err(Fail::contract(format!(
            "`{P}.disagg_request_id` {id} is reused while its context is still pending"
        )));
    }
    let mut out = PrefillOut::new(tokens.len() as u64);
    // "[[finish]]" makes the context finish the request by itself, so tests
    // can check the router answers without a generation leg.
    if key.windows(10).any(|w| w == b"[[finish]]") {
        out.finish_reason = "stop";
    }
    if !faults.contains(&Fault::NoDisaggParams) {
        out.choice.insert(
            P.into(),
            json!({
            "request_type": "context_only",
            "first_gen_tokens": [42],
            "ctx_request_id": id,
            "opaque_state": null,
            "draft_tokens": null,
            "disagg_request_id": id,
            "ctx_info_endpoint": side.to_string(),
            }),
        );
    }
    if !faults.contains(&Fault::NoTokenIds) {
        out.top.insert("prompt_token_ids".into(), json!(tokens));
    }
    Ok(out)
}

#[derive(Deserialize)]
struct Ctx {
    token_ids: Vec<u64>,
}

/// The token ids a generation request carries in `name`, if any.
fn int_array(req: &Request<'_>, name: &str) -> Checked<Option<Vec<u64>>> {
    match req.value(name)? {
        Some(v) => u64_array(&v).map(Some).ok_or_else(|| {
            Fail::contract(format!(
                "generation request `{name}` must be an array of token ids, got {}",
                short(&v)
            ))
        }),
        None => Ok(None),
    }
}

pub async fn decode(state: &Shared, req: &Request<'_>) -> Checked<DecodeOut> {
    if !req.has(P) {
        // No hand-off at all: TensorRT-LLM runs it as a full request, the
        // context phase included.
        let key = req.prompt_key()?;
        return Ok(DecodeOut {
            kv: Kv::Recomputed,
            prompt_tokens: token_ids(&key).len() as u64,
        });
    }
    let params = disagg_params(req)?;
    expect_request_type(&params, "generation_only")?;
    let ctx_id = u64_member(&params, P, "ctx_request_id")?;
    let disagg_id = u64_member(&params, P, "disagg_request_id")?;
    if ctx_id != disagg_id {
        return Err(Fail::contract(format!(
            "`{P}.ctx_request_id` {ctx_id} differs from `{P}.disagg_request_id` {disagg_id}"
        )));
    }
    let endpoint = str_member(&params, P, "ctx_info_endpoint")?;
    let well_formed = endpoint.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains(['/', '@', '?', '#'])
            && port.parse::<u16>().is_ok_and(|p| p != 0)
    });
    if !well_formed {
        return Err(Fail::contract(format!(
            "`{P}.ctx_info_endpoint` {endpoint:?} is not HOST:PORT"
        )));
    }
    let sent = match req.api {
        // Completions carry the ids as the prompt, or the prompt text.
        Api::Completions => match req.value("prompt")? {
            Some(Value::String(_)) => None,
            _ => int_array(req, "prompt")?,
        },
        Api::Chat => {
            if !req.has("messages") {
                return Err(Fail::contract("generation chat request has no `messages`"));
            }
            int_array(req, "prompt_token_ids")?
        }
    };
    // Without ids the generation server tokenises the prompt itself.
    let received = match sent {
        Some(ids) => ids,
        None => token_ids(&req.prompt_key()?),
    };

    let pull_err =
        |what: String| Fail::contract(format!("could not pull context from {endpoint}: {what}"));
    let resp = state
        .peers
        .get(
            endpoint,
            &format!("/ctx/{}", pct(&ctx_id.to_string())),
            state.config.bootstrap_timeout,
        )
        .await
        .map_err(|e| pull_err(e.to_string()))?;
    if resp.status != StatusCode::OK {
        return Err(pull_err(format!(
            "side channel answered {}: {}",
            resp.status.as_u16(),
            resp.text()
        )));
    }
    let ctx: Ctx = serde_json::from_slice(&resp.body)
        .map_err(|e| pull_err(format!("bad side-channel body: {e}")))?;
    if ctx.token_ids != received {
        let first_diff = ctx
            .token_ids
            .iter()
            .zip(&received)
            .position(|(a, b)| a != b)
            .unwrap_or(ctx.token_ids.len().min(received.len()));
        return Err(Fail::contract(format!(
            "prompt token ids differ from the context's ({} received vs {} prefilled, first \
             difference at index {first_diff})",
            received.len(),
            ctx.token_ids.len()
        )));
    }
    Ok(DecodeOut {
        kv: Kv::Pulled,
        prompt_tokens: received.len() as u64,
    })
}

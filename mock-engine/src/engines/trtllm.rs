//! TensorRT-LLM disaggregated serving: a "context_only" request on the
//! context (prefill) server, then a "generation_only" request on the
//! generation (decode) server built from the context response: its
//! `disaggregated_params` and, when the context echoed them, its
//! `prompt_token_ids` (or, for chat contexts asked with
//! `return_prompt_token_ids_b64`, `prompt_token_ids_b64`: the ids as base64
//! little-endian int32s, the array nulled), relayed in the form the context
//! answered. As in TensorRT-LLM, a generation request without token ids
//! (its context answered none) is tokenised by the generation server itself
//! (the tokens must still be the context's), and a request without
//! `disaggregated_params` is served as an ordinary full request.
//!
//! The context answers an `encoded_opaque_state` (base64) that the
//! generation must get back unaltered; with `--auth-key` the generation
//! also checks TensorRT-LLM's `x-trtllm-disagg-auth` signature of it and of
//! `ctx_info_endpoint` (see [`crate::disagg_auth`]).
//!
//! Generation-first (`disaggregated_params.schedule_style: 1`,
//! TensorRT-LLM's `DisaggScheduleStyle.GENERATION_FIRST`): the context
//! holds the request until the generation server asks for its KV, and the
//! generation request carries no context answer: the client's prompt, and
//! `ctx_request_id` = `disagg_request_id` with the context server's
//! `ctx_info_endpoint` and `ctx_dp_rank` from its `GET /server_info`
//! ([`server_info`]). See `store/gen_first.rs`.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::contract::{object_field, prefill_constraints, str_member, u64_member};
use crate::config::Fault;
use crate::disagg_auth;
use crate::error::{Checked, Fail};
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::peer::pct;
use crate::request::{compact_ids, short, token_ids, u64_array, Api, Request};
use crate::state::Shared;
use crate::store::side::{CtxEntry, IdsForm};

/// Standard base64 with padding (RFC 4648), as Python's `b64encode`.
fn base64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// `prompt_token_ids_b64`: the ids as little-endian int32s, base64, as
/// TensorRT-LLM's context worker encodes them (numpy `int32` `tobytes`).
fn ids_b64(ids: &[u64]) -> Checked<String> {
    let mut bytes = Vec::with_capacity(4 * ids.len());
    for &id in ids {
        let id =
            i32::try_from(id).map_err(|_| Fail::internal(format!("token id {id} is no int32")))?;
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    Ok(base64(&bytes))
}

/// The ids a context answers, in the form it answers them.
enum AnsweredIds {
    Array(Box<RawValue>),
    Base64(String),
}

impl AnsweredIds {
    fn form(&self) -> IdsForm {
        match self {
            AnsweredIds::Array(_) => IdsForm::Array,
            AnsweredIds::Base64(_) => IdsForm::Base64,
        }
    }
}

/// The ids a generation worker decodes from `prompt_token_ids_b64`.
fn ids_from_b64(s: &str) -> Option<Vec<u64>> {
    let bytes = STANDARD.decode(s).ok()?;
    if bytes.len() % 4 != 0 {
        return None;
    }
    let mut ids = Vec::with_capacity(bytes.len() / 4);
    for w in bytes.chunks_exact(4) {
        let w: [u8; 4] = w.try_into().ok()?;
        ids.push(u64::try_from(i32::from_le_bytes(w)).ok()?);
    }
    Some(ids)
}

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

pub async fn prefill(state: &Shared, req: &Request<'_>, faults: &[Fault]) -> Checked<PrefillOut> {
    prefill_constraints(req, false, state.config.lenient_prefill)?;
    let (id, b64, style) = context_params(req)?;
    context_prompt(req)?;
    let key = req.prompt_key()?;
    let tokens = token_ids(&key);
    let side = state
        .bound
        .side
        .ok_or_else(|| Fail::internal("trtllm prefill has no side channel bound"))?;
    let encoded_opaque_state = opaque_state(state, id);
    let ids = answered_ids(req, faults, b64, &tokens)?;
    let prompt_tokens = tokens.len() as u64;
    let entry = CtxEntry {
        token_ids: tokens,
        encoded_opaque_state: encoded_opaque_state.clone(),
        answered: ids.as_ref().map_or(IdsForm::Absent, AnsweredIds::form),
    };
    match style {
        Style::ContextFirst => {
            if !state.side.put_ctx(id, entry) {
                return Err(Fail::contract(format!(
                    "`{P}.disagg_request_id` {id} is reused while its context is still pending"
                )));
            }
        }
        Style::GenerationFirst => {
            let deadline = tokio::time::Instant::now() + state.config.bootstrap_timeout;
            if !state.gen_first.await_asked(id, deadline).await {
                return Err(Fail::contract(format!(
                    "generation-first context {id}: no generation server asked for its KV within \
                     {:?}; the generation leg must leave with the context leg (awaiting the \
                     context answer first deadlocks)",
                    state.config.bootstrap_timeout
                )));
            }
            if faults.contains(&Fault::FailWhenAsked) {
                return Err(Fail::internal(format!(
                    "context {id} failed after its generation server asked for the KV (--fault fail-when-asked)"
                )));
            }
            state.gen_first.leave(id, entry);
        }
    }
    let mut out = PrefillOut::new(prompt_tokens);
    // "[[finish]]" makes the context finish the request by itself, so tests
    // can check the router answers without a generation leg.
    if key.windows(10).any(|w| w == b"[[finish]]") {
        out.finish_reason = "stop";
    }
    if !faults.contains(&Fault::NoDisaggParams) {
        let params = answered_params(state, side, id, &encoded_opaque_state);
        out.choice.insert(P.into(), params);
    }
    if let Some(ids) = ids {
        push_ids(&mut out, ids)?;
    }
    Ok(out)
}

/// The order of the legs, `disaggregated_params.schedule_style`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    ContextFirst,
    GenerationFirst,
}

/// `schedule_style`: absent or null, 0 or 1 (an IntEnum on the wire).
fn schedule_style(params: &Map<String, Value>) -> Checked<Style> {
    match params.get("schedule_style") {
        None | Some(Value::Null) => Ok(Style::ContextFirst),
        Some(v) if v.as_u64() == Some(0) => Ok(Style::ContextFirst),
        Some(v) if v.as_u64() == Some(1) => Ok(Style::GenerationFirst),
        Some(v) => Err(Fail::contract(format!(
            "`{P}.schedule_style` must be 0 (context first) or 1 (generation first), got {}",
            short(v)
        ))),
    }
}

/// A context request's `disaggregated_params`: its disaggregated request
/// id (at least 2^42), whether it asks for the ids as base64, and the
/// order of the legs.
fn context_params(req: &Request<'_>) -> Checked<(u64, bool, Style)> {
    let params = disagg_params(req)?;
    expect_request_type(&params, "context_only")?;
    let style = schedule_style(&params)?;
    let b64 = match params.get("return_prompt_token_ids_b64") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(Fail::contract(format!(
                "`{P}.return_prompt_token_ids_b64` must be a boolean, got {}",
                short(v)
            )))
        }
    };
    let id = u64_member(&params, P, "disagg_request_id")?;
    if id < MIN_DISAGG_ID {
        return Err(Fail::contract(format!(
            "`{P}.disagg_request_id` {id} is below 2^42"
        )));
    }
    Ok((id, b64, style))
}

/// A completions context carries one prompt, a string.
fn context_prompt(req: &Request<'_>) -> Checked<()> {
    if req.api != Api::Completions {
        return Ok(());
    }
    match req.value("prompt")? {
        Some(Value::String(_)) => Ok(()),
        Some(v) => Err(Fail::contract(format!(
            "context request `prompt` must be a single string, got {}",
            short(&v)
        ))),
        None => Err(Fail::contract("completions request has no `prompt`")),
    }
}

/// Some opaque bytes per request, as the context's cache-transceiver
/// state would be; base64 brings '+' and '/' to relay and sign.
fn opaque_state(state: &Shared, id: u64) -> String {
    let mut opaque = b"mock-ctx-state:".to_vec();
    opaque.extend_from_slice(&id.to_be_bytes());
    opaque.extend_from_slice(&state.random_u64().to_le_bytes());
    base64(&opaque)
}

/// What the answer carries of the ids; TensorRT-LLM answers the base64
/// form on chat only.
fn answered_ids(
    req: &Request<'_>,
    faults: &[Fault],
    b64: bool,
    tokens: &[u64],
) -> Checked<Option<AnsweredIds>> {
    if faults.contains(&Fault::NoTokenIds) {
        return Ok(None);
    }
    if b64 && req.api == Api::Chat {
        return Ok(Some(AnsweredIds::Base64(ids_b64(tokens)?)));
    }
    let raw = serde_json::value::to_raw_value(tokens)
        .map_err(|e| Fail::internal(format!("token ids: {e}")))?;
    Ok(Some(AnsweredIds::Array(raw)))
}

/// The context's `disaggregated_params`, which the generation request must
/// carry back.
fn answered_params(state: &Shared, side: SocketAddr, id: u64, encoded_opaque_state: &str) -> Value {
    let endpoint = if state.config.ctx_endpoint_list {
        // The first is the real one; the second (this pod's main HTTP
        // port) has no context to give.
        let other = format!("{}:{}", side.ip(), state.bound.http.port());
        json!([side.to_string(), other])
    } else {
        json!(side.to_string())
    };
    json!({
    "request_type": "context_only",
    "first_gen_tokens": [42],
    "ctx_request_id": id,
    "encoded_opaque_state": encoded_opaque_state,
    "draft_tokens": null,
    "disagg_request_id": id,
    "ctx_dp_rank": 0,
    "ctx_info_endpoint": endpoint,
    })
}

/// The ids as top-level members, last. As TensorRT-LLM's chat handler,
/// the base64 form comes with the array nulled, both last, as its response
/// model orders them; base64 needs no escaping, so the string goes in as
/// it is.
fn push_ids(out: &mut PrefillOut, ids: AnsweredIds) -> Checked<()> {
    match ids {
        AnsweredIds::Array(array) => out.top_raw.push(("prompt_token_ids", array)),
        AnsweredIds::Base64(b64) => {
            let raw = |json: String| {
                RawValue::from_string(json).map_err(|e| Fail::internal(format!("token ids: {e}")))
            };
            out.top_raw.push(("prompt_token_ids", raw("null".into())?));
            out.top_raw
                .push(("prompt_token_ids_b64", raw(format!("\"{b64}\""))?));
        }
    }
    Ok(())
}

/// `--auth-key`: TensorRT-LLM's check of `x-trtllm-disagg-auth`, before
/// anything else: 400 "Invalid internal disaggregated request
/// authentication" when the protected fields are there and the header is
/// missing or wrong. Without a key the worker only warns.
fn check_auth(state: &Shared, params: &Map<String, Value>, headers: &HeaderMap) -> Checked<()> {
    let Some(key) = &state.config.auth_key else {
        return Ok(());
    };
    if !disagg_auth::required(params) {
        return Ok(());
    }
    let expected = disagg_auth::sign(key, params);
    let got = headers
        .get(disagg_auth::HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if got == expected.as_bytes() {
        Ok(())
    } else {
        Err(Fail::new(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            disagg_auth::INVALID,
        )
        .verbatim())
    }
}

/// `ctx_info_endpoint`: HOST:PORT, or a non-empty list of them (the first
/// is used, as TensorRT-LLM reduces a list to its first element).
fn ctx_endpoint(params: &Map<String, Value>) -> Checked<String> {
    let field = "ctx_info_endpoint";
    let endpoint = match params.get(field) {
        Some(Value::Array(items)) => match items.first() {
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                return Err(Fail::contract(format!(
                    "`{P}.{field}[0]` must be a string, got {}",
                    short(v)
                )))
            }
            None => return Err(Fail::contract(format!("`{P}.{field}` is an empty list"))),
        },
        _ => str_member(params, P, field)?.to_string(),
    };
    let well_formed = endpoint.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains(['/', '@', '?', '#'])
            && port.parse::<u16>().is_ok_and(|p| p != 0)
    });
    if !well_formed {
        return Err(Fail::contract(format!(
            "`{P}.{field}` {endpoint:?} is not HOST:PORT"
        )));
    }
    Ok(endpoint)
}

fn form_name(form: IdsForm) -> &'static str {
    match form {
        IdsForm::Absent => "none",
        IdsForm::Array => "an array (`prompt_token_ids`, or `prompt` on completions)",
        IdsForm::Base64 => "a base64 string (`prompt_token_ids_b64`)",
    }
}

/// The token ids a generation request carries in `name`, if any.
fn int_array(req: &Request<'_>, name: &str) -> Checked<Option<Vec<u64>>> {
    // Read straight into integers (by the parse itself, when it could): the
    // `Value` tree below, built only to word the error, costs several times
    // as much for 131 000 ids.
    if name == "prompt_token_ids" {
        if let Some(ids) = req.take_token_ids() {
            return Ok(Some(ids));
        }
    }
    if let Some(ids) = req
        .raw(name)
        .and_then(|raw| compact_ids(raw.get().as_bytes()))
    {
        return Ok(Some(ids));
    }
    if let Some(Ok(ids)) = req.raw(name).map(|raw| serde_json::from_str(raw.get())) {
        return Ok(Some(ids));
    }
    match req.value(name)? {
        // TensorRT-LLM's models read a null as absent.
        None | Some(Value::Null) => Ok(None),
        Some(v) => u64_array(&v).map(Some).ok_or_else(|| {
            Fail::contract(format!(
                "generation request `{name}` must be an array of token ids, got {}",
                short(&v)
            ))
        }),
    }
}

/// A chat generation's ids: the array, or the base64 string the
/// orchestrator relays instead (never both: it sends one form).
fn chat_ids(req: &Request<'_>) -> Checked<(IdsForm, Option<Vec<u64>>)> {
    let ids = int_array(req, "prompt_token_ids")?;
    let name = "prompt_token_ids_b64";
    // Base64 needs no escapes, so the string is read in place; anything
    // else takes the `Value` path, which words the error.
    let text = match req
        .raw(name)
        .map(|r| serde_json::from_str::<Option<&str>>(r.get()))
    {
        None => None,
        Some(Ok(s)) => s.map(Cow::Borrowed),
        Some(Err(_)) => match req.value(name)? {
            Some(Value::String(s)) => Some(Cow::Owned(s)),
            Some(v) => {
                return Err(Fail::contract(format!(
                    "generation request `{name}` must be a string, got {}",
                    short(&v)
                )))
            }
            None => None,
        },
    };
    let Some(text) = text else {
        let form = if ids.is_some() {
            IdsForm::Array
        } else {
            IdsForm::Absent
        };
        return Ok((form, ids));
    };
    let decoded = ids_from_b64(&text).ok_or_else(|| {
        Fail::contract(format!(
            "generation request `{name}` is not base64 of little-endian non-negative int32s"
        ))
    })?;
    if ids.is_some() {
        return Err(Fail::contract(format!(
            "generation request carries both `prompt_token_ids` and `{name}`"
        )));
    }
    Ok((IdsForm::Base64, Some(decoded)))
}

pub async fn decode(state: &Shared, req: &Request<'_>, headers: &HeaderMap) -> Checked<DecodeOut> {
    if !req.has(P) {
        // No hand-off at all: TensorRT-LLM runs it as a full request, the
        // context phase included.
        let key = req.prompt_key()?;
        return Ok(DecodeOut::new(Kv::Recomputed, token_ids(&key).len() as u64));
    }
    let params = disagg_params(req)?;
    check_auth(state, &params, headers)?;
    expect_request_type(&params, "generation_only")?;
    let ctx_id = context_id(&params)?;
    let endpoint = ctx_endpoint(&params)?;
    if schedule_style(&params)? == Style::GenerationFirst {
        return generation_first(state, req, &params, &endpoint, ctx_id).await;
    }
    let opaque = sent_opaque_state(&params)?;
    let (form, sent) = generation_ids(req)?;
    // Without ids the generation server tokenises the prompt itself.
    let received = match sent {
        Some(ids) => ids,
        None => token_ids(&req.prompt_key()?),
    };
    let path = format!("/ctx/{}", pct(&ctx_id.to_string()));
    let ctx = pull_context(state, &endpoint, &path, state.config.bootstrap_timeout).await?;
    same_context(&ctx, form, opaque, &received)?;
    Ok(DecodeOut::new(Kv::Pulled, received.len() as u64))
}

/// A generation-first generation request: no context has answered, so it
/// carries the client's prompt (the server tokenises it) and names the
/// context server by what its `/server_info` says; it asks that context
/// for the KV, which lets the waiting context run.
async fn generation_first(
    state: &Shared,
    req: &Request<'_>,
    params: &Map<String, Value>,
    endpoint: &str,
    ctx_id: u64,
) -> Checked<DecodeOut> {
    if !params.contains_key("ctx_dp_rank") {
        return Err(Fail::contract(format!(
            "`{P}.ctx_dp_rank` is missing: a generation-first request carries the context \
             server's `disaggregated_params` from its GET /server_info"
        )));
    }
    let (_, sent) = generation_ids(req)?;
    let received = match sent {
        Some(ids) => ids,
        None => token_ids(&req.prompt_key()?),
    };
    // The wait is the context's to bound; the call outlives it a little.
    let wait = state.config.bootstrap_timeout;
    let path = format!(
        "/gen_first/{}?timeout_ms={}",
        pct(&ctx_id.to_string()),
        wait.as_millis()
    );
    let ctx = pull_context(state, endpoint, &path, wait + Duration::from_secs(1)).await?;
    if ctx.token_ids != received {
        return Err(Fail::contract(format!(
            "prompt token ids differ from the context's ({} received vs {} prefilled)",
            received.len(),
            ctx.token_ids.len()
        )));
    }
    Ok(DecodeOut::new(Kv::Pulled, received.len() as u64))
}

/// A context server's `GET /server_info`: what a generation-first
/// generation request must carry of it (TensorRT-LLM's
/// `KvCacheTransceiverV2.get_disaggregated_params`: `ctx_dp_rank`, and
/// `ctx_info_endpoint` as a list).
pub fn server_info(state: &Shared) -> Option<Value> {
    let side = state.bound.side?;
    Some(json!({"disaggregated_params": {
        "ctx_dp_rank": 0,
        "ctx_info_endpoint": [side.to_string()],
    }}))
}

/// The context's request id, which `ctx_request_id` and
/// `disagg_request_id` must both name.
fn context_id(params: &Map<String, Value>) -> Checked<u64> {
    let ctx_id = u64_member(params, P, "ctx_request_id")?;
    let disagg_id = u64_member(params, P, "disagg_request_id")?;
    if ctx_id != disagg_id {
        return Err(Fail::contract(format!(
            "`{P}.ctx_request_id` {ctx_id} differs from `{P}.disagg_request_id` {disagg_id}"
        )));
    }
    Ok(ctx_id)
}

/// The `encoded_opaque_state` the generation request relays, if any.
fn sent_opaque_state(params: &Map<String, Value>) -> Checked<Option<String>> {
    match params.get("encoded_opaque_state") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(Fail::contract(format!(
            "`{P}.encoded_opaque_state` must be a string, got {}",
            short(v)
        ))),
    }
}

/// The prompt's ids a generation request carries, and in which form.
fn generation_ids(req: &Request<'_>) -> Checked<(IdsForm, Option<Vec<u64>>)> {
    match req.api {
        // Completions carry the ids as the prompt, or the prompt text.
        Api::Completions => {
            if req.has("prompt_token_ids_b64") {
                return Err(Fail::contract(
                    "generation completions request carries `prompt_token_ids_b64`: TensorRT-LLM \
                     reads it on chat only (completions take the ids as `prompt`)",
                ));
            }
            match req.value("prompt")? {
                Some(Value::String(_)) => Ok((IdsForm::Absent, None)),
                _ => Ok((IdsForm::Array, int_array(req, "prompt")?)),
            }
        }
        Api::Chat => {
            if !req.has("messages") {
                return Err(Fail::contract("generation chat request has no `messages`"));
            }
            chat_ids(req)
        }
        Api::Responses | Api::Messages | Api::Generate => Err(Fail::contract(
            "the trtllm mock serves only /v1/completions and /v1/chat/completions",
        )),
    }
}

/// What the context at `endpoint` left, from its side channel's `path`.
async fn pull_context(
    state: &Shared,
    endpoint: &str,
    path: &str,
    timeout: Duration,
) -> Checked<CtxEntry> {
    let pull_err =
        |what: String| Fail::contract(format!("could not pull context from {endpoint}: {what}"));
    let resp = state
        .peers
        .get(endpoint, path, timeout)
        .await
        .map_err(|e| pull_err(e.to_string()))?;
    if resp.status != StatusCode::OK {
        return Err(pull_err(format!(
            "side channel answered {}: {}",
            resp.status.as_u16(),
            resp.text()
        )));
    }
    CtxEntry::decode(&resp.body).map_err(|e| pull_err(format!("bad side-channel body: {e}")))
}

/// The generation request relays what the context answered: the ids in
/// the same form, the opaque state unaltered, the same tokens.
fn same_context(
    ctx: &CtxEntry,
    form: IdsForm,
    opaque: Option<String>,
    received: &[u64],
) -> Checked<()> {
    if form != ctx.answered {
        return Err(Fail::contract(format!(
            "the context answered the prompt's ids as {}, but the generation request carries {}: \
             relay them as the context answered them",
            form_name(ctx.answered),
            form_name(form)
        )));
    }
    match opaque {
        Some(o) if o == ctx.encoded_opaque_state => {}
        Some(o) => {
            return Err(Fail::contract(format!(
                "`{P}.encoded_opaque_state` {o:?} differs from the context's {:?}: the router must \
                 relay the context's disaggregated_params unaltered",
                ctx.encoded_opaque_state
            )))
        }
        None => {
            return Err(Fail::contract(format!(
                "`{P}.encoded_opaque_state` is missing: the generation needs the context's opaque \
                 state (relay the context's disaggregated_params whole)"
            )))
        }
    }
    if ctx.token_ids != received {
        let first_diff = ctx
            .token_ids
            .iter()
            .zip(received)
            .position(|(a, b)| a != b)
            .unwrap_or(ctx.token_ids.len().min(received.len()));
        return Err(Fail::contract(format!(
            "prompt token ids differ from the context's ({} received vs {} prefilled, first \
             difference at index {first_diff})",
            received.len(),
            ctx.token_ids.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b64_ids_are_little_endian_int32s() {
        // numpy.asarray([1, 151935], dtype=np.int32).tobytes(), base64.
        assert_eq!(ids_b64(&[1, 151_935]).ok().as_deref(), Some("AQAAAH9RAgA="));
        assert_eq!(ids_from_b64("AQAAAH9RAgA="), Some(vec![1, 151_935]));
        assert_eq!(ids_from_b64(""), Some(vec![]));
        assert_eq!(ids_from_b64("AQAA"), None, "3 bytes is no int32");
        assert_eq!(ids_from_b64("/////w=="), None, "-1 is no token id");
        assert_eq!(ids_from_b64("not base64!"), None);
    }

    #[test]
    fn base64_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"opaque"), "b3BhcXVl");
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), "+/+/");
    }

    #[test]
    fn endpoint_forms() {
        let p = |s: &str| match serde_json::from_str::<Value>(s).unwrap() {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        assert_eq!(
            ctx_endpoint(&p(r#"{"ctx_info_endpoint":"127.0.0.1:5"}"#)).unwrap(),
            "127.0.0.1:5"
        );
        assert_eq!(
            ctx_endpoint(&p(r#"{"ctx_info_endpoint":["127.0.0.1:5","127.0.0.1:6"]}"#)).unwrap(),
            "127.0.0.1:5"
        );
        for bad in [
            r#"{"ctx_info_endpoint":[]}"#,
            r#"{"ctx_info_endpoint":[5]}"#,
            r#"{"ctx_info_endpoint":"tcp://h:5/x"}"#,
            r#"{"ctx_info_endpoint":"h"}"#,
            r#"{}"#,
        ] {
            assert!(ctx_endpoint(&p(bad)).is_err(), "{bad}");
        }
    }
}

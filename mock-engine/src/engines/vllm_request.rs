//! How vLLM reads a disaggregated request whatever its connector: the
//! request id and the internal id legs pair by, the prefill's
//! `kv_transfer_params`, and the silent recompute a decode without a
//! hand-off falls back to.

use axum::http::HeaderMap;
use serde_json::{Map, Value};

use super::contract::object_field;
use crate::error::{Checked, Fail};
use crate::leg::{DecodeOut, Kv};
use crate::request::{approx_tokens, short, Api, Request};
use crate::state::Shared;

/// The request id vLLM gives this request (`_base_request_id`): chat,
/// completions and the token-in generate take header `X-Request-Id`, else
/// the body `request_id`; `/v1/responses` only the body `request_id` (the
/// header is ignored); `/v1/messages` only the header (its request becomes a
/// chat request without the body's id). `None`: vLLM would draw a random one.
pub fn vllm_request_id(req: &Request<'_>, headers: &HeaderMap) -> Checked<Option<String>> {
    if req.api != Api::Responses {
        if let Some(v) = headers.get("x-request-id") {
            let id = v
                .to_str()
                .map_err(|_| Fail::contract("header `X-Request-Id` is not visible ASCII"))?;
            return Ok(Some(id.to_string()));
        }
    }
    if req.api == Api::Messages {
        return Ok(None);
    }
    req.str_field("request_id")
}

/// Where the request id comes from, for messages.
pub fn request_id_source(api: Api) -> &'static str {
    match api {
        Api::Responses => "body `request_id` (/v1/responses ignores X-Request-Id)",
        Api::Messages => "header `X-Request-Id` (/v1/messages ignores a body `request_id`)",
        _ => "header `X-Request-Id` (or body `request_id`)",
    }
}

/// The engine's internal id for external id `id` (request-id randomisation
/// off, VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1): `chatcmpl-{id}` (chat,
/// and messages, which vLLM serves as chat), `cmpl-{id}-0` (first prompt),
/// `{id}_0` (responses) or `generate-tokens-{id}`. So, as in vLLM, legs
/// that pair by id must also hit the same endpoint.
pub fn vllm_internal_id(api: Api, id: &str) -> String {
    match api {
        Api::Chat | Api::Messages => format!("chatcmpl-{id}"),
        Api::Completions => format!("cmpl-{id}-0"),
        Api::Responses => format!("{id}_0"),
        Api::Generate => format!("generate-tokens-{id}"),
    }
}

/// The no-hand-off case of a vLLM decode (no `kv_transfer_params`, or, for
/// Mooncake, incomplete ones): a silent recompute, which only `n` > 1
/// (vLLM's proxies send no hand-off then) or `--allow-recompute` lets
/// through.
pub fn vllm_recompute(state: &Shared, req: &Request<'_>, why: &str) -> Checked<DecodeOut> {
    // Only chat and completions have a top-level `n`.
    let n = match req.api {
        Api::Chat | Api::Completions => req.u64_field("n")?.unwrap_or(1),
        _ => 1,
    };
    if n > 1 || state.config.allow_recompute {
        return Ok(DecodeOut::new(
            Kv::Recomputed,
            approx_tokens(&req.prompt_key()?),
        ));
    }
    Err(Fail::contract(format!(
        "{why}: the decode would silently recompute the prompt"
    )))
}

/// `kv_transfer_params.do_remote_decode` must be true on a vLLM prefill,
/// `do_remote_prefill` not true.
pub fn vllm_prefill_params(req: &Request<'_>) -> Checked<Map<String, Value>> {
    let params = object_field(req, "kv_transfer_params")?.ok_or_else(|| {
        Fail::contract(
            "prefill request has no `kv_transfer_params` (needs {\"do_remote_decode\": true})",
        )
    })?;
    match params.get("do_remote_decode") {
        Some(Value::Bool(true)) => {}
        Some(v) => {
            return Err(Fail::contract(format!(
                "`kv_transfer_params.do_remote_decode` must be true, got {}",
                short(v)
            )))
        }
        None => {
            return Err(Fail::contract(
                "`kv_transfer_params.do_remote_decode` is missing (must be true)",
            ))
        }
    }
    // The decode's params sent to the prefill would make it pull, not serve.
    if params.get("do_remote_prefill") == Some(&Value::Bool(true)) {
        return Err(Fail::contract(
            "`kv_transfer_params.do_remote_prefill` is true on the prefill leg",
        ));
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_request_ids() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", "hdr".parse().unwrap());
        let none = HeaderMap::new();
        let chat = Request::parse(Api::Chat, br#"{"request_id":"body"}"#).unwrap();
        assert_eq!(vllm_request_id(&chat, &h).unwrap().as_deref(), Some("hdr"));
        assert_eq!(
            vllm_request_id(&chat, &none).unwrap().as_deref(),
            Some("body")
        );
        let resp = Request::parse(Api::Responses, br#"{"request_id":"body"}"#).unwrap();
        assert_eq!(vllm_request_id(&resp, &h).unwrap().as_deref(), Some("body"));
        let resp = Request::parse(Api::Responses, br#"{}"#).unwrap();
        assert_eq!(vllm_request_id(&resp, &h).unwrap(), None);
        assert_eq!(vllm_internal_id(Api::Chat, "a"), "chatcmpl-a");
        assert_eq!(vllm_internal_id(Api::Completions, "a"), "cmpl-a-0");
        assert_eq!(vllm_internal_id(Api::Responses, "a"), "a_0");
        assert_eq!(vllm_internal_id(Api::Messages, "a"), "chatcmpl-a");
        assert_eq!(vllm_internal_id(Api::Generate, "a"), "generate-tokens-a");
        let msg = Request::parse(Api::Messages, br#"{"request_id":"body"}"#).unwrap();
        assert_eq!(vllm_request_id(&msg, &h).unwrap().as_deref(), Some("hdr"));
        assert_eq!(vllm_request_id(&msg, &none).unwrap(), None);
        let gen = Request::parse(Api::Generate, br#"{"request_id":"body"}"#).unwrap();
        assert_eq!(vllm_request_id(&gen, &h).unwrap().as_deref(), Some("hdr"));
        assert_eq!(
            vllm_request_id(&gen, &none).unwrap().as_deref(),
            Some("body")
        );
    }
}

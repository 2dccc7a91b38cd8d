//! Per-engine prefill/decode contracts. Each engine module checks what the
//! router sent, performs the hand-off (side channel, bootstrap, ...) and says
//! what to add to the answer; `handle` turns that into the HTTP response.

mod default;
mod mooncake;
mod nixl_push;
mod p2p_nccl;
mod sglang;
mod trtllm;
mod vllm;

pub use mooncake::offer_key as mooncake_offer_key;
pub use nixl_push::base_request_id;
pub use sglang::server_info as sglang_server_info;

use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Map, Number, Value};

use crate::config::{fail_after_transfer, Connector, Engine, Fault, Flavor, Role};
use crate::error::{Checked, Fail};
use crate::generate::{self, DecodeOut, GenParams, Kv, Look};
use crate::logprobs::{Asked, Prompt};
use crate::request::{approx_tokens, short, Api, Request};
use crate::state::{InFlight, Shared};

/// `faults`: those in force for this request (only `no-kv-params`,
/// `no-token-ids`, `no-disagg-params`, `fail-after-transfer` and
/// `truncate` matter here; the dispatcher applies the others).
pub async fn handle(
    state: &Shared,
    api: Api,
    headers: &HeaderMap,
    body: &[u8],
    faults: &[Fault],
    guard: InFlight,
) -> Checked<Response> {
    let req = Request::parse(api, body)?;
    // Validated first so a malformed knob never consumes a hand-off.
    let params = GenParams::from_request(&req)?;
    let cfg = &state.config;
    let flavor = cfg.flavor();
    let asked = Asked::from_request(&req, flavor, params.stream)?;
    if api == Api::Responses {
        responses_checks(&req, cfg.role == Role::Decode || cfg.lenient_prefill)?;
    }
    // A prefill whose answer a fault spoils never hands its KV over.
    let spoiled = faults.contains(&Fault::Truncate);
    match cfg.role {
        Role::Prefill => {
            let no_kv_params = faults.contains(&Fault::NoKvParams);
            let mut out = match (cfg.engine, cfg.connector) {
                (Engine::Vllm, Connector::Neuron) => {
                    vllm::neuron_prefill(&req, cfg.lenient_prefill)?
                }
                (Engine::Vllm, Connector::Mooncake) => {
                    mooncake::prefill(state, &req, headers, spoiled)?
                }
                (Engine::Vllm, Connector::NixlPush) => {
                    nixl_push::prefill(state, &req, headers, spoiled, no_kv_params)?
                }
                (Engine::Vllm, Connector::P2pNccl) => {
                    p2p_nccl::prefill(state, &req, headers, spoiled).await?
                }
                (Engine::Vllm, Connector::Nixl | Connector::Shfs) => {
                    vllm::prefill(state, &req, no_kv_params)?
                }
                (Engine::Sglang, _) => {
                    sglang::prefill(state, &req, headers, &asked, fail_after_transfer(faults))
                        .await?
                }
                (Engine::Trtllm, _) => trtllm::prefill(state, &req, faults)?,
                (Engine::Default, _) => default::prefill(&req, cfg.lenient_prefill)?,
            };
            out.cached_tokens = own_cached(state, &asked, out.prompt_tokens).into();
            remote_cached_field(state, &mut out);
            let look = look(state, &req, asked)?;
            let resp = generate::prefill_response(state, api, &params, look, out);
            guard.finish();
            Ok(resp)
        }
        Role::Decode => {
            let mut out = if cfg.engine == Engine::Vllm && asked.skips_prefix_cache(flavor) {
                skip_handoff(state, &req, headers)?
            } else {
                match (cfg.engine, cfg.connector) {
                    (Engine::Vllm, Connector::Neuron) => vllm::neuron_decode(&req)?,
                    (Engine::Vllm, Connector::Mooncake) => mooncake::decode(state, &req).await?,
                    (Engine::Vllm, Connector::NixlPush) => {
                        nixl_push::decode(state, &req, headers).await?
                    }
                    (Engine::Vllm, Connector::P2pNccl) => {
                        p2p_nccl::decode(state, &req, headers).await?
                    }
                    (Engine::Vllm, Connector::Nixl | Connector::Shfs) => {
                        vllm::decode(state, &req).await?
                    }
                    (Engine::Sglang, _) => sglang::decode(state, &req, headers).await?,
                    (Engine::Trtllm, _) => trtllm::decode(state, &req, headers).await?,
                    (Engine::Default, _) => default::decode(&req),
                }
            };
            out.cached_tokens = decode_cached(state, &req, &asked, &out);
            let look = look(state, &req, asked)?;
            Ok(generate::decode_response(
                state, api, params, look, out, guard,
            ))
        }
    }
}

/// The decode's prompt is the one the prefill computed the KV for: the KV a
/// decode is handed belongs to one prompt, and a router that mixes up legs
/// must be caught here.
fn same_prompt(prefill_hash: &str, own_hash: &str) -> Checked<()> {
    if prefill_hash != own_hash {
        return Err(Fail::contract(format!(
            "prompt differs from the prefilled prompt (prefill hashed {prefill_hash}, decode hashes {own_hash})"
        )));
    }
    Ok(())
}

/// The pod's own prefix-cache hits for a prompt of `prompt_tokens`:
/// `--cached-tokens`, at most the prompt; none when the request makes the
/// engine compute the whole prompt (vLLM prompt logprobs skip reading the
/// prefix cache; SGLang's `logprob_start_len` 0 caps its radix match).
fn own_cached(state: &Shared, asked: &Asked, prompt_tokens: u64) -> u64 {
    if asked.no_prefix_cache {
        0
    } else {
        state.config.cached_tokens.min(prompt_tokens)
    }
}

/// vLLM >= 0.31's scheduler at request finish: a prefill whose
/// `kv_transfer_params` ask the decode to pull (`do_remote_prefill`, i.e.
/// NIXL pull and push; Mooncake answers none) gets
/// `remote_prefill_cached_tokens` = its own cached count.
fn remote_cached_field(state: &Shared, out: &mut generate::PrefillOut) {
    let cfg = &state.config;
    if cfg.engine != Engine::Vllm || !cfg.remote_cached_field {
        return;
    }
    if let Some(Value::Object(p)) = out.top.get_mut("kv_transfer_params") {
        if p.get("do_remote_prefill") == Some(&Value::Bool(true)) {
            p.insert(
                "remote_prefill_cached_tokens".into(),
                Value::Number(out.cached_tokens.clone()),
            );
        }
    }
}

/// vLLM's output processor (>= 0.31): a request whose
/// `kv_transfer_params` have `do_remote_prefill` true and an integer
/// `remote_prefill_cached_tokens` reports that value, unchecked.
fn remote_prefill_cached(req: &Request<'_>) -> Option<Number> {
    let Ok(Some(Value::Object(p))) = req.value("kv_transfer_params") else {
        return None;
    };
    if p.get("do_remote_prefill") != Some(&Value::Bool(true)) {
        return None;
    }
    match p.get("remote_prefill_cached_tokens") {
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.clone()),
        _ => None,
    }
}

/// What a decode reports as cached. vLLM: a relayed
/// `remote_prefill_cached_tokens` (>= 0.31), else the whole prompt when
/// the KV came over a hand-off (the transfer counts as cached: what the
/// router fixes), else its own hits. SGLang: the prefill's count from the
/// bootstrap exchange (plus the whole prompt with `--double-count-cached`).
fn decode_cached(state: &Shared, req: &Request<'_>, asked: &Asked, out: &DecodeOut) -> Number {
    let cfg = &state.config;
    let p = out.prompt_tokens;
    let own = own_cached(state, asked, p);
    match cfg.engine {
        Engine::Vllm => {
            if cfg.remote_cached_field {
                if let Some(n) = remote_prefill_cached(req) {
                    return n;
                }
            }
            match out.kv {
                Kv::Pulled => p.into(),
                Kv::Recomputed | Kv::None => own.into(),
            }
        }
        Engine::Sglang => match out.prefill_cached {
            Some(x) if cfg.double_count_cached => x.saturating_add(p).into(),
            Some(x) => x.into(),
            None => own.into(),
        },
        Engine::Default | Engine::Trtllm => own.into(),
    }
}

/// A vLLM decode asked for prompt logprobs (`prompt_logprobs`,
/// completions `echo` + `logprobs`, chat `echo`) skips reading the prefix
/// cache, external KV included: it leaves a hand-off unused (the
/// prefill's KV is never pulled) and recomputes the whole prompt. Without
/// any hand-off it is the usual silent recompute.
fn skip_handoff(state: &Shared, req: &Request<'_>, headers: &HeaderMap) -> Checked<DecodeOut> {
    let handoff = match state.config.connector {
        Connector::Neuron => req.has("disagg_prefill_resp"),
        // The hand-off travels in the request id.
        Connector::P2pNccl => vllm_request_id(req, headers)?.is_some(),
        _ => req.has("kv_transfer_params"),
    };
    if handoff {
        return Ok(DecodeOut::new(
            Kv::Recomputed,
            approx_tokens(&req.prompt_key()?),
        ));
    }
    vllm_recompute(state, req, "no KV hand-off")
}

/// How the answer looks: the tokenised prompt, echo text and whether the
/// completions logprobs start with the prompt (not on an SGLang decode:
/// PD moves no input logprobs to it, an UNVERIFIED reading of SGLang).
fn look(state: &Shared, req: &Request<'_>, asked: Asked) -> Checked<Look> {
    let flavor = state.config.flavor();
    let prompt = if asked.needs_prompt() {
        Some(Prompt::of(req)?)
    } else {
        None
    };
    let echo = match (asked.echo, req.api) {
        (true, Api::Completions) => prompt.as_ref().map(|p| p.text.clone()),
        (true, Api::Chat) => Some(crate::logprobs::chat_echo(req)?),
        _ => None,
    };
    let sglang_decode = flavor == Flavor::Sglang && state.config.role == Role::Decode;
    let echo_logprobs =
        req.api == Api::Completions && asked.echo && asked.logprobs.is_some() && !sglang_decode;
    Ok(Look {
        flavor: Some(flavor),
        asked,
        prompt,
        echo,
        echo_logprobs,
    })
}

/// What vLLM's Responses endpoint refuses whatever the leg: a
/// `previous_response_id` (the mock's pod-local store is empty, as a
/// decode's or prefill's is for a response the other pod stored: vLLM
/// answers 404) and, unless `background_ok` is false (the strict prefill
/// refuses it as a contract break instead), `background: true` (400:
/// vLLM needs the response store for it, which is off by default).
fn responses_checks(req: &Request<'_>, background_ok: bool) -> Checked<()> {
    if let Some(id) = req.str_field("previous_response_id")? {
        return Err(Fail::new(
            axum::http::StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "Response with id '{id}' not found (previous_response_id: the mock's pod-local \
                 response store is empty)"
            ),
        ));
    }
    if background_ok && req.bool_field("background")? == Some(true) {
        let msg = if req.bool_field("store")? == Some(false) {
            "background can only be used when `store` is true"
        } else {
            "This vLLM engine does not support `store=True` and therefore does not support the \
             background mode. To enable these features, set the environment variable \
             `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
        };
        return Err(Fail::bad_request(msg));
    }
    Ok(())
}

/// The request id vLLM 0.33 gives this request (`_base_request_id`):
/// chat and completions take header `X-Request-Id`, else the body
/// `request_id`; `/v1/responses` only the body `request_id` (the header is
/// ignored). `None`: vLLM would draw a random one.
fn vllm_request_id(req: &Request<'_>, headers: &HeaderMap) -> Checked<Option<String>> {
    if req.api != Api::Responses {
        if let Some(v) = headers.get("x-request-id") {
            let id = v
                .to_str()
                .map_err(|_| Fail::contract("header `X-Request-Id` is not visible ASCII"))?;
            return Ok(Some(id.to_string()));
        }
    }
    req.str_field("request_id")
}

/// Where the request id comes from, for messages.
fn request_id_source(api: Api) -> &'static str {
    match api {
        Api::Responses => "body `request_id` (/v1/responses ignores X-Request-Id)",
        _ => "header `X-Request-Id` (or body `request_id`)",
    }
}

/// The engine's internal id for external id `id` (request-id randomisation
/// off, VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1): `chatcmpl-{id}`,
/// `cmpl-{id}-0` (first prompt) or `{id}_0` (responses). So, as in vLLM,
/// legs that pair by id must also hit the same endpoint.
fn vllm_internal_id(api: Api, id: &str) -> String {
    match api {
        Api::Chat => format!("chatcmpl-{id}"),
        Api::Completions => format!("cmpl-{id}-0"),
        Api::Responses => format!("{id}_0"),
    }
}

/// The no-hand-off case of a vLLM decode (no `kv_transfer_params`, or, for
/// Mooncake, incomplete ones): a silent recompute, which only `n` > 1
/// (vLLM's proxies send no hand-off then) or `--allow-recompute` lets
/// through.
fn vllm_recompute(state: &Shared, req: &Request<'_>, why: &str) -> Checked<DecodeOut> {
    let n = req.u64_field("n")?.unwrap_or(1);
    if (n > 1 && req.api != Api::Responses) || state.config.allow_recompute {
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
fn vllm_prefill_params(req: &Request<'_>) -> Checked<Map<String, Value>> {
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

/// What every prefill leg must look like: exactly one token, not streamed,
/// and nothing that would force more than one token. TRT-LLM refuses
/// `max_completion_tokens` outright, the others accept it when it is 1.
/// `lenient` (`--lenient-prefill`): only what a real engine refuses, see
/// [`lenient_prefill_constraints`].
fn prefill_constraints(
    req: &Request<'_>,
    max_completion_tokens_ok: bool,
    lenient: bool,
) -> Checked<()> {
    if req.api == Api::Responses {
        return responses_prefill_constraints(req, lenient);
    }
    if lenient {
        return lenient_prefill_constraints(req);
    }
    match req.u64_field("max_tokens")? {
        Some(1) => {}
        Some(m) => {
            return Err(Fail::contract(format!(
                "prefill needs `max_tokens` == 1, got {m}"
            )))
        }
        None => {
            return Err(Fail::contract(
                "prefill needs `max_tokens` == 1, it is absent",
            ))
        }
    }
    if req.bool_field("stream")? == Some(true) {
        return Err(Fail::contract("prefill must not stream, `stream` is true"));
    }
    for field in ["stream_options", "min_tokens", "min_completion_tokens"] {
        if req.has(field) {
            return Err(Fail::contract(format!(
                "prefill request must not carry `{field}`"
            )));
        }
    }
    if max_completion_tokens_ok {
        match req.u64_field("max_completion_tokens")? {
            None | Some(1) => {}
            Some(m) => {
                return Err(Fail::contract(format!(
                    "prefill needs `max_completion_tokens` absent or 1, got {m}"
                )))
            }
        }
    } else if req.has("max_completion_tokens") {
        return Err(Fail::contract(
            "prefill request must not carry `max_completion_tokens`",
        ));
    }
    Ok(())
}

/// The prefill leg of `/v1/responses`: `max_output_tokens` == 1, `stream`
/// not true, `store` false (its default is true, and only the prefill's
/// pod-local store would keep it), `background` not true, no
/// `stream_options`. Lenient: the types only (GenParams checked them).
fn responses_prefill_constraints(req: &Request<'_>, lenient: bool) -> Checked<()> {
    if lenient {
        return Ok(());
    }
    match req.u64_field("max_output_tokens")? {
        Some(1) => {}
        Some(m) => {
            return Err(Fail::contract(format!(
                "prefill needs `max_output_tokens` == 1, got {m}"
            )))
        }
        None => {
            return Err(Fail::contract(
                "prefill needs `max_output_tokens` == 1, it is absent",
            ))
        }
    }
    if req.bool_field("stream")? == Some(true) {
        return Err(Fail::contract("prefill must not stream, `stream` is true"));
    }
    match req.bool_field("store")? {
        Some(false) => {}
        Some(true) => return Err(Fail::contract("prefill needs `store` false, got true")),
        None => {
            return Err(Fail::contract(
                "prefill needs `store` false, it is absent (the default is true)",
            ))
        }
    }
    if req.bool_field("background")? == Some(true) {
        return Err(Fail::contract(
            "prefill must not run in the background, `background` is true",
        ));
    }
    if req.has("stream_options") {
        return Err(Fail::contract(
            "prefill request must not carry `stream_options`",
        ));
    }
    Ok(())
}

/// `--lenient-prefill`: a real engine's prefill server takes the client's
/// knobs as they are (sglang-router and vllm-router send them so): any
/// `max_tokens` / `max_completion_tokens`, `stream` with `stream_options`;
/// it refuses only `min_tokens` / `min_completion_tokens` above the token
/// limit. The answer is still one token per choice.
fn lenient_prefill_constraints(req: &Request<'_>) -> Checked<()> {
    let limit = match req.u64_field("max_tokens")? {
        Some(m) => Some(("max_tokens", m)),
        None => req
            .u64_field("max_completion_tokens")?
            .map(|m| ("max_completion_tokens", m)),
    };
    req.bool_field("stream")?;
    for field in ["min_tokens", "min_completion_tokens"] {
        if let (Some(min), Some((max_field, max))) = (req.u64_field(field)?, limit) {
            if min > max {
                return Err(Fail::contract(format!(
                    "prefill `{field}` {min} exceeds `{max_field}` {max}"
                )));
            }
        }
    }
    Ok(())
}

/// The named top-level member as a JSON object.
fn object_field(req: &Request<'_>, name: &str) -> Checked<Option<Map<String, Value>>> {
    match req.value(name)? {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(v) => Err(Fail::contract(format!(
            "`{name}` must be an object, got {}",
            short(&v)
        ))),
    }
}

/// `obj.field` as a string, or a violation naming `parent.field`.
fn str_member<'o>(obj: &'o Map<String, Value>, parent: &str, field: &str) -> Checked<&'o str> {
    match obj.get(field) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(Fail::contract(format!(
            "`{parent}.{field}` must be a string, got {}",
            short(v)
        ))),
        None => Err(Fail::contract(format!("`{parent}.{field}` is missing"))),
    }
}

/// `obj.field` as an exact u64, or a violation naming `parent.field`.
fn u64_member(obj: &Map<String, Value>, parent: &str, field: &str) -> Checked<u64> {
    match obj.get(field) {
        Some(v) => v.as_u64().ok_or_else(|| {
            Fail::contract(format!(
                "`{parent}.{field}` must be a non-negative integer, got {}",
                short(v)
            ))
        }),
        None => Err(Fail::contract(format!("`{parent}.{field}` is missing"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, mct_ok: bool) -> Result<(), String> {
        let req = Request::parse(Api::Completions, body.as_bytes()).map_err(|f| f.message)?;
        prefill_constraints(&req, mct_ok, false).map_err(|f| f.message)
    }

    fn lenient(body: &str, mct_ok: bool) -> Result<(), String> {
        let req = Request::parse(Api::Completions, body.as_bytes()).map_err(|f| f.message)?;
        prefill_constraints(&req, mct_ok, true).map_err(|f| f.message)
    }

    #[test]
    fn lenient_prefill_cases() {
        // What sglang-router sends: the client's body as it is.
        assert!(lenient(
            r#"{"max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}"#,
            true
        )
        .is_ok());
        // What vllm-router sends.
        assert!(lenient(r#"{"max_tokens":1,"stream":false,"min_tokens":1}"#, true).is_ok());
        assert!(lenient(
            r#"{"max_completion_tokens":8,"min_completion_tokens":8}"#,
            false
        )
        .is_ok());
        assert!(lenient(r#"{}"#, true).is_ok());
        assert!(lenient(r#"{"min_tokens":5}"#, true).is_ok());
        let e = lenient(r#"{"max_tokens":1,"min_tokens":2}"#, true).unwrap_err();
        assert!(e.contains("`min_tokens` 2 exceeds `max_tokens` 1"), "{e}");
        assert!(lenient(
            r#"{"max_completion_tokens":3,"min_completion_tokens":4}"#,
            true
        )
        .is_err());
        assert!(lenient(r#"{"max_tokens":1.0}"#, true).is_err());
        assert!(lenient(r#"{"stream":"yes"}"#, true).is_err());
        assert!(lenient(r#"{"max_tokens":4,"min_tokens":-1}"#, true).is_err());
    }

    fn responses(body: &str, lenient: bool) -> Result<(), String> {
        let req = Request::parse(Api::Responses, body.as_bytes()).map_err(|f| f.message)?;
        GenParams::from_request(&req).map_err(|f| f.message)?;
        prefill_constraints(&req, true, lenient).map_err(|f| f.message)
    }

    #[test]
    fn responses_prefill_cases() {
        let ok = r#"{"input":"x","max_output_tokens":1,"store":false}"#;
        assert!(responses(ok, false).is_ok());
        assert!(responses(
            r#"{"input":[],"max_output_tokens":1,"store":false,"stream":false,"background":false}"#,
            false
        )
        .is_ok());
        for bad in [
            r#"{"input":"x","store":false}"#,
            r#"{"input":"x","max_output_tokens":2,"store":false}"#,
            r#"{"input":"x","max_tokens":1,"store":false}"#,
            r#"{"input":"x","max_output_tokens":1}"#,
            r#"{"input":"x","max_output_tokens":1,"store":true}"#,
            r#"{"input":"x","max_output_tokens":1,"store":false,"stream":true}"#,
            r#"{"input":"x","max_output_tokens":1,"store":false,"background":true}"#,
            r#"{"input":"x","max_output_tokens":1,"store":false,"stream_options":{}}"#,
            r#"{"input":{},"max_output_tokens":1,"store":false}"#,
            r#"{"max_output_tokens":1,"store":false}"#,
            r#"{"input":"x","max_output_tokens":1,"store":"no"}"#,
            r#"{"input":"x","max_output_tokens":1,"store":false,"request_id":1}"#,
        ] {
            assert!(responses(bad, false).is_err(), "{bad}");
        }
        // Lenient: the client's knobs, types still checked.
        assert!(responses(
            r#"{"input":"x","max_output_tokens":64,"stream":true}"#,
            true
        )
        .is_ok());
        assert!(responses(r#"{"input":"x","stream":"yes"}"#, true).is_err());
    }

    #[test]
    fn responses_checks_cases() {
        let parse = |b: &'static str| Request::parse(Api::Responses, b.as_bytes()).unwrap();
        let e = responses_checks(&parse(r#"{"previous_response_id":"r"}"#), false).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::NOT_FOUND);
        let e = responses_checks(&parse(r#"{"background":true}"#), true).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        let e = responses_checks(&parse(r#"{"background":true,"store":false}"#), true).unwrap_err();
        assert!(e.message.contains("only be used when `store` is true"));
        assert!(responses_checks(&parse(r#"{"background":true}"#), false).is_ok());
        assert!(responses_checks(&parse(r#"{"background":false}"#), true).is_ok());
    }

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
    }

    #[test]
    fn prefill_constraints_cases() {
        assert!(check(r#"{"max_tokens":1}"#, true).is_ok());
        assert!(check(
            r#"{"max_tokens":1,"stream":false,"max_completion_tokens":1}"#,
            true
        )
        .is_ok());
        assert!(check(r#"{"max_tokens":1,"max_completion_tokens":1}"#, false).is_err());
        assert!(check(r#"{"max_tokens":1.0}"#, true).is_err());
        assert!(check(r#"{"max_tokens":2}"#, true).is_err());
        assert!(check(r#"{}"#, true).is_err());
        assert!(check(r#"{"max_tokens":1,"stream":true}"#, true).is_err());
        assert!(check(r#"{"max_tokens":1,"min_tokens":1}"#, true).is_err());
        assert!(check(r#"{"max_tokens":1,"stream_options":{}}"#, true).is_err());
    }
}

//! The rules every engine's contract shares: what a prefill leg must look
//! like (strict, lenient, Responses), what vLLM's Responses endpoint refuses
//! on any leg, that a decode's prompt is its prefill's, and typed readers of
//! a request's members that word a violation the same way everywhere.

use serde_json::{Map, Value};

use crate::error::{Checked, Fail};
use crate::request::{short, Api, Request};

/// The decode's prompt is the one the prefill computed the KV for: the KV a
/// decode is handed belongs to one prompt, and a router that mixes up legs
/// must be caught here.
pub fn same_prompt(prefill_hash: &str, own_hash: &str) -> Checked<()> {
    if prefill_hash != own_hash {
        return Err(Fail::contract(format!(
            "prompt differs from the prefilled prompt (prefill hashed {prefill_hash}, decode hashes {own_hash})"
        )));
    }
    Ok(())
}

/// What vLLM's Responses endpoint refuses whatever the leg: a
/// `previous_response_id` (the mock's pod-local store is empty, as a
/// decode's or prefill's is for a response the other pod stored: vLLM
/// answers 404) and, unless `background_ok` is false (the strict prefill
/// refuses it as a contract break instead), `background: true` (400:
/// vLLM needs the response store for it, which is off by default).
pub fn responses_checks(req: &Request<'_>, background_ok: bool) -> Checked<()> {
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

/// What every prefill leg must look like: exactly one token, not streamed,
/// and nothing that would force more than one token. TRT-LLM refuses
/// `max_completion_tokens` outright, the others accept it when it is 1.
/// `lenient` (`--lenient-prefill`): only what a real engine refuses, see
/// [`lenient_prefill_constraints`].
pub fn prefill_constraints(
    req: &Request<'_>,
    max_completion_tokens_ok: bool,
    lenient: bool,
) -> Checked<()> {
    match req.api {
        Api::Responses => return responses_prefill_constraints(req, lenient),
        Api::Generate => return generate_prefill_constraints(req, lenient),
        // Anthropic's `max_tokens` is the chat limit (vLLM converts it to
        // chat's `max_tokens` and `max_completion_tokens`).
        Api::Completions | Api::Chat | Api::Messages => {}
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

/// The prefill leg of vLLM's token-in `/inference/v1/generate`: the limits
/// live in `sampling_params` (`max_tokens` == 1, no `min_tokens`),
/// `stream` not true, no `stream_options`. Lenient: `min_tokens` at most
/// `max_tokens`.
fn generate_prefill_constraints(req: &Request<'_>, lenient: bool) -> Checked<()> {
    const S: &str = "sampling_params";
    let sp = req.sampling_params()?;
    let limit = |field: &str| -> Checked<Option<u64>> {
        sp.get(field)
            .filter(|v| !v.is_null())
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    Fail::contract(format!(
                        "`{S}.{field}` must be a non-negative integer, got {}",
                        short(v)
                    ))
                })
            })
            .transpose()
    };
    let (max, min) = (limit("max_tokens")?, limit("min_tokens")?);
    if lenient {
        req.bool_field("stream")?;
        return match (min, max) {
            (Some(min), Some(max)) if min > max => Err(Fail::contract(format!(
                "prefill `{S}.min_tokens` {min} exceeds `{S}.max_tokens` {max}"
            ))),
            _ => Ok(()),
        };
    }
    match max {
        Some(1) => {}
        Some(m) => {
            return Err(Fail::contract(format!(
                "prefill needs `{S}.max_tokens` == 1, got {m}"
            )))
        }
        None => {
            return Err(Fail::contract(format!(
                "prefill needs `{S}.max_tokens` == 1, it is absent"
            )))
        }
    }
    if min.is_some() {
        return Err(Fail::contract(format!(
            "prefill request must not carry `{S}.min_tokens`"
        )));
    }
    if req.bool_field("stream")? == Some(true) {
        return Err(Fail::contract("prefill must not stream, `stream` is true"));
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
pub fn object_field(req: &Request<'_>, name: &str) -> Checked<Option<Map<String, Value>>> {
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
pub fn str_member<'o>(obj: &'o Map<String, Value>, parent: &str, field: &str) -> Checked<&'o str> {
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
pub fn u64_member(obj: &Map<String, Value>, parent: &str, field: &str) -> Checked<u64> {
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
    use crate::params::GenParams;

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

    fn api_check(api: Api, body: &str, lenient: bool) -> Result<(), String> {
        let req = Request::parse(api, body.as_bytes()).map_err(|f| f.message)?;
        prefill_constraints(&req, true, lenient).map_err(|f| f.message)
    }

    #[test]
    fn messages_prefill_is_chat_s() {
        let m = |b: &str| api_check(Api::Messages, b, false);
        assert!(m(r#"{"messages":[],"max_tokens":1}"#).is_ok());
        assert!(m(r#"{"max_tokens":1,"stream":false,"max_completion_tokens":1}"#).is_ok());
        for (bad, why) in [
            (
                r#"{"max_tokens":1024}"#,
                "prefill needs `max_tokens` == 1, got 1024",
            ),
            (r#"{}"#, "prefill needs `max_tokens` == 1, it is absent"),
            (
                r#"{"max_tokens":1,"stream":true}"#,
                "prefill must not stream, `stream` is true",
            ),
            (
                r#"{"max_tokens":1,"min_tokens":1}"#,
                "prefill request must not carry `min_tokens`",
            ),
            (
                r#"{"max_tokens":1,"stream_options":{"include_usage":true}}"#,
                "prefill request must not carry `stream_options`",
            ),
        ] {
            assert_eq!(m(bad).unwrap_err(), why, "{bad}");
        }
        assert!(api_check(Api::Messages, r#"{"max_tokens":64,"stream":true}"#, true).is_ok());
    }

    #[test]
    fn generate_prefill_limits_are_in_sampling_params() {
        let g = |b: &str| api_check(Api::Generate, b, false);
        assert!(g(r#"{"token_ids":[1],"sampling_params":{"max_tokens":1}}"#).is_ok());
        assert!(
            g(r#"{"sampling_params":{"max_tokens":1,"temperature":0},"stream":false}"#).is_ok()
        );
        for (bad, why) in [
            (
                r#"{"sampling_params":{"max_tokens":8}}"#,
                "prefill needs `sampling_params.max_tokens` == 1, got 8",
            ),
            (
                r#"{"sampling_params":{}}"#,
                "prefill needs `sampling_params.max_tokens` == 1, it is absent",
            ),
            // The chat limit at the top is not the token-in API's.
            (
                r#"{"max_tokens":1,"sampling_params":{}}"#,
                "prefill needs `sampling_params.max_tokens` == 1, it is absent",
            ),
            (
                r#"{"sampling_params":{"max_tokens":1,"min_tokens":1}}"#,
                "prefill request must not carry `sampling_params.min_tokens`",
            ),
            (
                r#"{"sampling_params":{"max_tokens":1},"stream":true}"#,
                "prefill must not stream, `stream` is true",
            ),
            (
                r#"{"sampling_params":{"max_tokens":1},"stream_options":{}}"#,
                "prefill request must not carry `stream_options`",
            ),
            (
                r#"{"sampling_params":{"max_tokens":1.0}}"#,
                "`sampling_params.max_tokens` must be a non-negative integer, got 1.0",
            ),
            (
                r#"{"token_ids":[1]}"#,
                "generate request has no `sampling_params`",
            ),
        ] {
            assert_eq!(g(bad).unwrap_err(), why, "{bad}");
        }
        let lenient = |b: &str| api_check(Api::Generate, b, true);
        assert!(
            lenient(r#"{"sampling_params":{"max_tokens":9,"min_tokens":9},"stream":true}"#).is_ok()
        );
        assert!(lenient(r#"{"sampling_params":{"max_tokens":1,"min_tokens":2}}"#).is_err());
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

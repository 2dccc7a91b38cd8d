//! Per-engine prefill/decode contracts. Each engine module checks what the
//! router sent, performs the hand-off (side channel, bootstrap, ...) and says
//! what to add to the answer; `handle` turns that into the HTTP response.

mod default;
mod sglang;
mod trtllm;
mod vllm;

use axum::response::Response;
use serde_json::{Map, Value};

use crate::cli::{fail_after_transfer, Connector, Engine, Fault, Role};
use crate::error::{Checked, Fail};
use crate::generate::{self, GenParams};
use crate::request::{short, Api, Request};
use crate::state::{InFlight, Shared};

/// `faults`: those in force for this request (only `no-kv-params`,
/// `no-token-ids`, `no-disagg-params` and `fail-after-transfer` matter here;
/// the dispatcher applies the others).
pub async fn handle(
    state: &Shared,
    api: Api,
    body: &[u8],
    faults: &[Fault],
    guard: InFlight,
) -> Checked<Response> {
    let req = Request::parse(api, body)?;
    // Validated first so a malformed knob never consumes a hand-off.
    let params = GenParams::from_request(&req)?;
    let cfg = &state.config;
    match cfg.role {
        Role::Prefill => {
            let out = match (cfg.engine, cfg.connector) {
                (Engine::Vllm, Connector::Neuron) => {
                    vllm::neuron_prefill(&req, cfg.lenient_prefill)?
                }
                (Engine::Vllm, _) => {
                    vllm::prefill(state, &req, faults.contains(&Fault::NoKvParams))?
                }
                (Engine::Sglang, _) => {
                    sglang::prefill(state, &req, fail_after_transfer(faults)).await?
                }
                (Engine::Trtllm, _) => trtllm::prefill(state, &req, faults)?,
                (Engine::Default, _) => default::prefill(&req, cfg.lenient_prefill)?,
            };
            let resp = generate::prefill_response(state, api, &params, out);
            guard.finish();
            Ok(resp)
        }
        Role::Decode => {
            let out = match (cfg.engine, cfg.connector) {
                (Engine::Vllm, Connector::Neuron) => vllm::neuron_decode(&req)?,
                (Engine::Vllm, _) => vllm::decode(state, &req).await?,
                (Engine::Sglang, _) => sglang::decode(state, &req).await?,
                (Engine::Trtllm, _) => trtllm::decode(state, &req).await?,
                (Engine::Default, _) => default::decode(&req),
            };
            Ok(generate::decode_response(state, api, params, out, guard))
        }
    }
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

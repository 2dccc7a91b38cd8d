//! The sampling knobs an answer depends on (`max_tokens`, `n`, `stream`,
//! `stream_options.include_usage`, ...), read from the request and
//! validated before any side effect, for every API the mock serves.

use serde_json::Value;

use crate::error::{Checked, Fail};
use crate::request::{short, u64_array, Api, Request};

/// Caps that keep a silly request from making the mock allocate or stream
/// for minutes; far above anything a test needs.
const MAX_TOKENS_LIMIT: u64 = 16_384;
const MAX_N: u64 = 64;

/// Sampling knobs the output depends on, validated before any side effect.
pub struct GenParams {
    pub max_tokens: u64,
    pub n: u64,
    pub stream: bool,
    pub include_usage: bool,
    /// The decode stops at `max_tokens` (finish reason "length"). Always for
    /// chat and completions; for responses only when `max_output_tokens` is
    /// given, else it stops by itself ("stop": status "completed").
    pub capped: bool,
    /// Responses: the body `request_id`, which vLLM uses as the response id.
    pub request_id: Option<String>,
}

impl GenParams {
    pub fn from_request(req: &Request<'_>) -> Checked<Self> {
        match req.api {
            Api::Responses => return Self::from_responses_request(req),
            Api::Messages => return Self::from_messages_request(req),
            Api::Generate => return Self::from_generate_request(req),
            Api::Completions | Api::Chat => {}
        }
        let max_tokens = match req.u64_field("max_tokens")? {
            Some(m) => m,
            None => req.u64_field("max_completion_tokens")?.unwrap_or(16),
        };
        if max_tokens > MAX_TOKENS_LIMIT {
            return Err(Fail::contract(format!(
                "max_tokens {max_tokens} exceeds the mock's limit of {MAX_TOKENS_LIMIT}"
            )));
        }
        let n = req.u64_field("n")?.unwrap_or(1);
        if n == 0 || n > MAX_N {
            return Err(Fail::contract(format!(
                "`n` must be in 1..={MAX_N}, got {n}"
            )));
        }
        let stream = req.bool_field("stream")?.unwrap_or(false);
        let include_usage = include_usage(req)?;
        Ok(GenParams {
            max_tokens,
            n,
            stream,
            include_usage,
            capped: true,
            request_id: None,
        })
    }

    /// `/v1/messages`: `model` (a non-empty string), `messages` (an
    /// array) and `max_tokens` (>= 1) are required, as vLLM's and SGLang's
    /// request models have them; `stream`; one answer (no `n`).
    fn from_messages_request(req: &Request<'_>) -> Checked<Self> {
        match req.value("model")? {
            Some(Value::String(m)) if !m.is_empty() => {}
            Some(v) => {
                return Err(Fail::contract(format!(
                    "`model` must be a non-empty string, got {}",
                    short(&v)
                )))
            }
            None => return Err(Fail::contract("messages request has no `model`")),
        }
        match req.value("messages")? {
            Some(Value::Array(_)) => {}
            Some(v) => {
                return Err(Fail::contract(format!(
                    "`messages` must be an array, got {}",
                    short(&v)
                )))
            }
            None => return Err(Fail::contract("messages request has no `messages`")),
        }
        let max_tokens = match req.u64_field("max_tokens")? {
            Some(0) => return Err(Fail::contract("`max_tokens` must be positive, got 0")),
            Some(m) if m > MAX_TOKENS_LIMIT => {
                return Err(Fail::contract(format!(
                    "max_tokens {m} exceeds the mock's limit of {MAX_TOKENS_LIMIT}"
                )))
            }
            Some(m) => m,
            None => {
                return Err(Fail::contract(
                    "messages request has no `max_tokens` (required by the Messages API)",
                ))
            }
        };
        Ok(GenParams {
            max_tokens,
            n: 1,
            stream: req.bool_field("stream")?.unwrap_or(false),
            include_usage: false,
            capped: true,
            request_id: None,
        })
    }

    /// `/inference/v1/generate`: `token_ids` (at least one non-negative
    /// integer) and `sampling_params` (an object: `max_tokens`, default 16,
    /// and `n`) are required; `stream`, `stream_options`, `request_id`.
    fn from_generate_request(req: &Request<'_>) -> Checked<Self> {
        match req.value("token_ids")? {
            Some(v) if u64_array(&v).is_some_and(|ids| !ids.is_empty()) => {}
            Some(v) => {
                return Err(Fail::contract(format!(
                    "`token_ids` must be a non-empty array of non-negative integers, got {}",
                    short(&v)
                )))
            }
            None => return Err(Fail::contract("generate request has no `token_ids`")),
        }
        let sp = req.sampling_params()?;
        let member = |name: &str, default: u64| match sp.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_u64().ok_or_else(|| {
                Fail::contract(format!(
                    "`sampling_params.{name}` must be a non-negative integer, got {}",
                    short(v)
                ))
            }),
        };
        let max_tokens = member("max_tokens", 16)?;
        if max_tokens > MAX_TOKENS_LIMIT {
            return Err(Fail::contract(format!(
                "sampling_params.max_tokens {max_tokens} exceeds the mock's limit of \
                 {MAX_TOKENS_LIMIT}"
            )));
        }
        let n = member("n", 1)?;
        if n == 0 || n > MAX_N {
            return Err(Fail::contract(format!(
                "`sampling_params.n` must be in 1..={MAX_N}, got {n}"
            )));
        }
        Ok(GenParams {
            max_tokens,
            n,
            stream: req.bool_field("stream")?.unwrap_or(false),
            include_usage: include_usage(req)?,
            capped: true,
            request_id: req.str_field("request_id")?,
        })
    }

    /// `/v1/responses`: `input` (string or array), `max_output_tokens`,
    /// `stream`, `store`, `background`, `request_id`; one answer (no `n`).
    fn from_responses_request(req: &Request<'_>) -> Checked<Self> {
        match req.value("input")? {
            Some(Value::String(_) | Value::Array(_)) => {}
            Some(v) => {
                return Err(Fail::contract(format!(
                    "`input` must be a string or an array, got {}",
                    short(&v)
                )))
            }
            None => return Err(Fail::contract("responses request has no `input`")),
        }
        let max_output_tokens = req.u64_field("max_output_tokens")?;
        let max_tokens = max_output_tokens.unwrap_or(16);
        if max_tokens > MAX_TOKENS_LIMIT {
            return Err(Fail::contract(format!(
                "max_output_tokens {max_tokens} exceeds the mock's limit of {MAX_TOKENS_LIMIT}"
            )));
        }
        let stream = req.bool_field("stream")?.unwrap_or(false);
        req.bool_field("store")?;
        req.bool_field("background")?;
        let request_id = req.str_field("request_id")?;
        Ok(GenParams {
            max_tokens,
            n: 1,
            stream,
            include_usage: false,
            capped: max_output_tokens.is_some(),
            request_id,
        })
    }
}

/// `stream_options.include_usage`, false when absent.
fn include_usage(req: &Request<'_>) -> Checked<bool> {
    match req.value("stream_options")? {
        None => Ok(false),
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(Fail::contract(format!(
                "`stream_options.include_usage` must be a boolean, got {}",
                short(v)
            ))),
        },
        Some(v) => Err(Fail::contract(format!(
            "`stream_options` must be an object, got {}",
            short(&v)
        ))),
    }
}

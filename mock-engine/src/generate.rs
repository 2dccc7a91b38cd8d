//! Completion output: the prefill's one-token answer and the decode's
//! `tok0 tok1 ...` answer, as JSON or as an SSE stream.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::error::{Checked, Fail};
use crate::request::{short, Api, Request};
use crate::responses;
use crate::state::{InFlight, Shared};

/// Caps that keep a silly request from making the mock allocate or stream
/// for minutes; far above anything a test needs.
const MAX_TOKENS_LIMIT: u64 = 16_384;
const MAX_N: u64 = 64;

/// Where the decode's KV came from; sent as `x-mock-kv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kv {
    Pulled,
    Recomputed,
    None,
}

impl Kv {
    pub fn as_str(self) -> &'static str {
        match self {
            Kv::Pulled => "pulled",
            Kv::Recomputed => "recomputed",
            Kv::None => "none",
        }
    }
}

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
        if req.api == Api::Responses {
            return Self::from_responses_request(req);
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
        let include_usage = match req.value("stream_options")? {
            None => false,
            Some(Value::Object(o)) => match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(Fail::contract(format!(
                        "`stream_options.include_usage` must be a boolean, got {}",
                        short(v)
                    )))
                }
            },
            Some(v) => {
                return Err(Fail::contract(format!(
                    "`stream_options` must be an object, got {}",
                    short(&v)
                )))
            }
        };
        Ok(GenParams {
            max_tokens,
            n,
            stream,
            include_usage,
            capped: true,
            request_id: None,
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

/// What a prefill engine adds to the common one-token answer.
pub struct PrefillOut {
    /// Overrides the default `cmpl-mock-`/`chatcmpl-mock-` id prefix.
    pub id_prefix: Option<&'static str>,
    pub finish_reason: &'static str,
    pub prompt_tokens: u64,
    /// Extra top-level members (e.g. kv_transfer_params).
    pub top: Map<String, Value>,
    /// Extra members of every choice (e.g. TRT-LLM disaggregated_params).
    pub choice: Map<String, Value>,
}

impl PrefillOut {
    pub fn new(prompt_tokens: u64) -> Self {
        PrefillOut {
            id_prefix: None,
            finish_reason: "length",
            prompt_tokens,
            top: Map::new(),
            choice: Map::new(),
        }
    }
}

pub struct DecodeOut {
    pub kv: Kv,
    pub prompt_tokens: u64,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn default_id(state: &Shared, api: Api) -> String {
    let prefix = match api {
        Api::Completions => "cmpl-mock-",
        Api::Chat => "chatcmpl-mock-",
        Api::Responses => "resp_mock-",
    };
    format!("{prefix}{}", state.next_id())
}

/// A Responses answer for this request: its id is the body `request_id`,
/// as in vLLM, else a fresh `resp_...`.
fn responses_answer(
    state: &Shared,
    params: &GenParams,
    pieces: Vec<String>,
    length_capped: bool,
    prompt_tokens: u64,
    top: Map<String, Value>,
) -> responses::Answer {
    responses::Answer {
        id: params
            .request_id
            .clone()
            .unwrap_or_else(|| default_id(state, Api::Responses)),
        created: now(),
        model: state.config.model.clone(),
        item_id: format!("msg_{:016x}", state.random_u64()),
        pieces,
        length_capped,
        max_output_tokens: params.capped.then_some(params.max_tokens),
        prompt_tokens,
        top,
    }
}

fn usage(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

fn choice(api: Api, index: u64, text: &str, finish_reason: &str) -> Map<String, Value> {
    let mut c = Map::new();
    c.insert("index".into(), json!(index));
    match api {
        Api::Completions => {
            c.insert("text".into(), json!(text));
        }
        Api::Chat | Api::Responses => {
            c.insert(
                "message".into(),
                json!({"role": "assistant", "content": text}),
            );
        }
    }
    c.insert("finish_reason".into(), json!(finish_reason));
    c.insert("logprobs".into(), Value::Null);
    c
}

fn object_name(api: Api, stream: bool) -> &'static str {
    match (api, stream) {
        (Api::Completions, _) => "text_completion",
        (Api::Chat, false) => "chat.completion",
        (Api::Chat, true) => "chat.completion.chunk",
        (Api::Responses, _) => "response",
    }
}

fn head(id: &str, api: Api, stream: bool, model: &str, created: u64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("id".into(), json!(id));
    m.insert("object".into(), json!(object_name(api, stream)));
    m.insert("created".into(), json!(created));
    m.insert("model".into(), json!(model));
    m
}

fn with_kv(mut resp: Response, kv: Kv) -> Response {
    resp.headers_mut()
        .insert("x-mock-kv", HeaderValue::from_static(kv.as_str()));
    resp
}

/// The prefill's answer: one token "P" per choice. Streamed only when the
/// request asked for it, which only `--lenient-prefill` lets through: then
/// one SSE event per choice (the last one also carries the engine's
/// top-level members), a usage event if asked, and `[DONE]`.
pub fn prefill_response(state: &Shared, api: Api, params: &GenParams, out: PrefillOut) -> Response {
    if api == Api::Responses {
        state.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let length_capped = out.finish_reason == "length";
        let answer = responses_answer(
            state,
            params,
            vec!["P".to_string()],
            length_capped,
            out.prompt_tokens,
            out.top,
        );
        return with_kv(responses::at_once(&answer, params.stream), Kv::None);
    }
    let id = match out.id_prefix {
        Some(prefix) => format!("{prefix}{}", state.next_id()),
        None => default_id(state, api),
    };
    if params.stream {
        state
            .generated_tokens
            .fetch_add(params.n, Ordering::Relaxed);
        let text = prefill_sse(&id, api, &state.config.model, now(), params, out);
        let mut resp = Response::new(Body::from(text));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return with_kv(resp, Kv::None);
    }
    let mut body = head(&id, api, false, &state.config.model, now());
    let choices: Vec<Value> = (0..params.n)
        .map(|i| {
            let mut c = choice(api, i, "P", out.finish_reason);
            c.extend(out.choice.clone());
            Value::Object(c)
        })
        .collect();
    body.insert("choices".into(), Value::Array(choices));
    body.insert("usage".into(), usage(out.prompt_tokens, params.n));
    body.extend(out.top);
    state
        .generated_tokens
        .fetch_add(params.n, Ordering::Relaxed);
    with_kv(axum::Json(Value::Object(body)).into_response(), Kv::None)
}

/// The whole SSE body of a streamed (lenient) prefill answer.
fn prefill_sse(
    id: &str,
    api: Api,
    model: &str,
    created: u64,
    params: &GenParams,
    out: PrefillOut,
) -> String {
    let mut body = String::new();
    for i in 0..params.n {
        let mut c = Map::new();
        c.insert("index".into(), json!(i));
        match api {
            Api::Completions => {
                c.insert("text".into(), json!("P"));
            }
            Api::Chat | Api::Responses => {
                c.insert("delta".into(), json!({"role": "assistant", "content": "P"}));
            }
        }
        c.insert("finish_reason".into(), json!(out.finish_reason));
        c.insert("logprobs".into(), Value::Null);
        c.extend(out.choice.clone());
        let mut chunk = head(id, api, true, model, created);
        chunk.insert("choices".into(), json!([c]));
        if i + 1 == params.n {
            chunk.extend(out.top.clone());
        }
        body.push_str(&data(&Value::Object(chunk)));
    }
    if params.include_usage {
        let mut chunk = head(id, api, true, model, created);
        chunk.insert("choices".into(), json!([]));
        chunk.insert("usage".into(), usage(out.prompt_tokens, params.n));
        body.push_str(&data(&Value::Object(chunk)));
    }
    body.push_str("data: [DONE]\n\n");
    body
}

/// Text of token `k`, with the separating space, so that the streamed
/// pieces concatenate to exactly the non-streamed text.
fn token_text(k: u64) -> String {
    if k == 0 {
        "tok0".to_string()
    } else {
        format!(" tok{k}")
    }
}

/// The decode's answer: `max_tokens` tokens per choice.
pub fn decode_response(
    state: &Shared,
    api: Api,
    params: GenParams,
    out: DecodeOut,
    guard: InFlight,
) -> Response {
    let completion_tokens = params.max_tokens * params.n;
    state
        .generated_tokens
        .fetch_add(completion_tokens, Ordering::Relaxed);
    if api == Api::Responses {
        let pieces = (0..params.max_tokens).map(token_text).collect();
        let mut top = Map::new();
        top.insert("kv_transfer_params".into(), Value::Null);
        let answer = responses_answer(
            state,
            &params,
            pieces,
            params.capped,
            out.prompt_tokens,
            top,
        );
        if !params.stream {
            guard.finish();
            return with_kv(responses::at_once(&answer, false), out.kv);
        }
        let resp = responses::streamed(&answer, state.config.stream_delay, move || guard.finish());
        return with_kv(resp, out.kv);
    }
    let id = default_id(state, api);
    let created = now();
    let model = state.config.model.clone();
    if !params.stream {
        let text: String = (0..params.max_tokens).map(token_text).collect();
        let mut body = head(&id, api, false, &model, created);
        let choices: Vec<Value> = (0..params.n)
            .map(|i| Value::Object(choice(api, i, &text, "length")))
            .collect();
        body.insert("choices".into(), Value::Array(choices));
        body.insert("usage".into(), usage(out.prompt_tokens, completion_tokens));
        guard.finish();
        return with_kv(axum::Json(Value::Object(body)).into_response(), out.kv);
    }

    let sse = Sse {
        api,
        id,
        model,
        created,
        params,
        prompt_tokens: out.prompt_tokens,
        delay: state.config.stream_delay,
    };
    let stream = futures_util::stream::unfold(
        (sse, Step::Token { k: 0, i: 0 }, guard),
        |(sse, step, guard)| async move {
            let Some((event, next)) = sse.event(step) else {
                // Sent to the end: a finished request. A client that hangs
                // up earlier drops the stream, and the guard unfinished.
                guard.finish();
                return None;
            };
            if !matches!(step, Step::Token { k: 0, i: 0 }) && !sse.delay.is_zero() {
                tokio::time::sleep(sse.delay).await;
            }
            Some((Ok::<_, Infallible>(Bytes::from(event)), (sse, next, guard)))
        },
    );
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    with_kv(resp, out.kv)
}

#[derive(Clone, Copy)]
enum Step {
    /// Token `k` of choice `i`.
    Token {
        k: u64,
        i: u64,
    },
    Usage,
    Done,
    End,
}

struct Sse {
    api: Api,
    id: String,
    model: String,
    created: u64,
    params: GenParams,
    prompt_tokens: u64,
    delay: Duration,
}

impl Sse {
    /// The event for `step` and the step after it; None when finished.
    fn event(&self, step: Step) -> Option<(String, Step)> {
        // max_tokens 0 still sends one (empty) finishing chunk per choice.
        let last_k = self.params.max_tokens.saturating_sub(1);
        match step {
            Step::Token { k, i } => {
                let text = if self.params.max_tokens == 0 {
                    String::new()
                } else {
                    token_text(k)
                };
                let finish = if k == last_k {
                    json!("length")
                } else {
                    Value::Null
                };
                let mut c = Map::new();
                c.insert("index".into(), json!(i));
                match self.api {
                    Api::Completions => {
                        c.insert("text".into(), json!(text));
                    }
                    Api::Chat | Api::Responses => {
                        let delta = if k == 0 {
                            json!({"role": "assistant", "content": text})
                        } else {
                            json!({"content": text})
                        };
                        c.insert("delta".into(), delta);
                    }
                }
                c.insert("finish_reason".into(), finish);
                c.insert("logprobs".into(), Value::Null);
                let mut chunk = head(&self.id, self.api, true, &self.model, self.created);
                chunk.insert("choices".into(), json!([c]));
                let next = if i + 1 < self.params.n {
                    Step::Token { k, i: i + 1 }
                } else if k < last_k {
                    Step::Token { k: k + 1, i: 0 }
                } else if self.params.include_usage {
                    Step::Usage
                } else {
                    Step::Done
                };
                Some((data(&Value::Object(chunk)), next))
            }
            Step::Usage => {
                let mut chunk = head(&self.id, self.api, true, &self.model, self.created);
                chunk.insert("choices".into(), json!([]));
                chunk.insert(
                    "usage".into(),
                    usage(self.prompt_tokens, self.params.max_tokens * self.params.n),
                );
                Some((data(&Value::Object(chunk)), Step::Done))
            }
            Step::Done => Some(("data: [DONE]\n\n".to_string(), Step::End)),
            Step::End => None,
        }
    }
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(api: Api, max_tokens: u64, n: u64, include_usage: bool) -> Vec<String> {
        let sse = Sse {
            api,
            id: "x".into(),
            model: "m".into(),
            created: 0,
            params: GenParams {
                max_tokens,
                n,
                stream: true,
                include_usage,
                capped: true,
                request_id: None,
            },
            prompt_tokens: 3,
            delay: Duration::ZERO,
        };
        let mut out = Vec::new();
        let mut step = Step::Token { k: 0, i: 0 };
        while let Some((e, next)) = sse.event(step) {
            out.push(e);
            step = next;
        }
        out
    }

    #[test]
    fn stream_shape() {
        let ev = events(Api::Completions, 3, 2, true);
        assert_eq!(ev.len(), 3 * 2 + 2);
        assert!(ev[0].contains(r#""text":"tok0""#));
        assert!(ev[5].contains(r#""finish_reason":"length""#));
        assert!(ev[4].contains(r#""finish_reason":"length""#));
        assert!(ev[3].contains(r#""finish_reason":null"#));
        assert!(ev[6].contains(r#""total_tokens":9"#));
        assert_eq!(ev[7], "data: [DONE]\n\n");
    }

    #[test]
    fn chat_stream_role_then_content() {
        let ev = events(Api::Chat, 2, 1, false);
        assert_eq!(ev.len(), 3);
        assert!(ev[0].contains(r#""delta":{"content":"tok0","role":"assistant"}"#));
        assert!(ev[1].contains(r#""delta":{"content":" tok1"}"#));
    }

    #[test]
    fn streamed_prefill_is_one_token_per_choice() {
        let params = GenParams {
            max_tokens: 64,
            n: 2,
            stream: true,
            include_usage: true,
            capped: true,
            request_id: None,
        };
        let mut out = PrefillOut::new(7);
        out.top.insert("kv_transfer_params".into(), json!({"k": 1}));
        let body = prefill_sse("x", Api::Chat, "m", 0, &params, out);
        let ev: Vec<&str> = body.split_inclusive("\n\n").collect();
        assert_eq!(ev.len(), 4);
        assert!(ev[0].contains(r#""delta":{"content":"P","role":"assistant"}"#));
        assert!(ev[0].contains(r#""finish_reason":"length""#));
        assert!(!ev[0].contains("kv_transfer_params"));
        assert!(ev[1].contains(r#""index":1"#));
        assert!(ev[1].contains(r#""kv_transfer_params":{"k":1}"#));
        assert!(ev[2].contains(r#""total_tokens":9"#));
        assert_eq!(ev[3], "data: [DONE]\n\n");
    }

    #[test]
    fn zero_tokens_still_finishes() {
        let ev = events(Api::Completions, 0, 1, false);
        assert_eq!(ev.len(), 2);
        assert!(ev[0].contains(r#""finish_reason":"length""#));
    }
}

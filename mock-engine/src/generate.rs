//! Completion output: the prefill's one-token answer and the decode's
//! `tok0 tok1 ...` answer, as JSON or as an SSE stream, with the usage
//! (cached tokens), echo and logprobs the engine would report.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use serde_json::{json, Map, Number, Value};

use crate::config::{Config, Flavor};
use crate::error::{Checked, Fail};
use crate::logprobs::{self as lp, Asked, Prompt, Token};
use crate::request::{short, u64_array, Api, Request};
use crate::state::{InFlight, Shared};
use crate::{anthropic, responses, sse, token_in};

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

/// `usage.prompt_tokens_details`, as the engine reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum Details {
    /// No such member (TensorRT-LLM, as before).
    Absent,
    /// `"prompt_tokens_details": null` (vLLM without
    /// `--enable-prompt-tokens-details`, SGLang without
    /// `--enable-cache-report` or with nothing cached).
    Null,
    /// `{"cached_tokens": N}`. Any JSON integer: a vLLM decode reports a
    /// relayed `remote_prefill_cached_tokens` unchecked, negative included.
    Cached(Number),
}

impl Details {
    /// What the engine reports for `count` cached tokens.
    pub fn of(cfg: &Config, count: &Number) -> Details {
        match cfg.flavor() {
            Flavor::Vllm if cfg.prompt_tokens_details => Details::Cached(count.clone()),
            Flavor::Vllm => Details::Null,
            // SGLang's `_details_if_cached`: only a count > 0.
            Flavor::Sglang if cfg.enable_cache_report && count.as_u64().is_some_and(|n| n > 0) => {
                Details::Cached(count.clone())
            }
            Flavor::Sglang => Details::Null,
            Flavor::Trtllm => Details::Absent,
        }
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
    /// Extra top-level members already serialised, written after all the
    /// others: TRT-LLM's `prompt_token_ids` (131 000 ids at 512 KB) cost the
    /// mock several times the router's whole work as a `Value` tree.
    pub top_raw: Vec<(&'static str, Box<RawValue>)>,
    /// Extra members of every choice (e.g. TRT-LLM disaggregated_params).
    pub choice: Map<String, Value>,
    /// The pod's prefix-cache hits for this prompt (set by the dispatcher).
    pub cached_tokens: Number,
}

impl PrefillOut {
    pub fn new(prompt_tokens: u64) -> Self {
        PrefillOut {
            id_prefix: None,
            finish_reason: "length",
            prompt_tokens,
            top: Map::new(),
            top_raw: Vec::new(),
            choice: Map::new(),
            cached_tokens: Number::from(0u64),
        }
    }
}

pub struct DecodeOut {
    pub kv: Kv,
    pub prompt_tokens: u64,
    /// SGLang: the prefill's cached count, learnt in the bootstrap exchange.
    pub prefill_cached: Option<u64>,
    /// What the decode reports as cached (set by the dispatcher).
    pub cached_tokens: Number,
}

impl DecodeOut {
    pub fn new(kv: Kv, prompt_tokens: u64) -> Self {
        DecodeOut {
            kv,
            prompt_tokens,
            prefill_cached: None,
            cached_tokens: Number::from(0u64),
        }
    }
}

/// How an answer looks beyond its tokens, from what the request asked
/// (built by the dispatcher, which has the request).
#[derive(Clone, Debug, Default)]
pub struct Look {
    pub flavor: Option<Flavor>,
    /// The model the answer names: the adapter asked for, else the pod's.
    pub model: String,
    pub asked: Asked,
    /// The tokenised prompt, when echo or logprobs need it.
    pub prompt: Option<Prompt>,
    /// Prepended to every choice's text (echo).
    pub echo: Option<String>,
    /// Completions: the `logprobs` arrays start with the prompt tokens
    /// (echo + logprobs; not on an SGLang decode, which has no input
    /// logprobs).
    pub echo_logprobs: bool,
}

impl Look {
    fn flavor(&self) -> Flavor {
        self.flavor.unwrap_or(Flavor::Trtllm)
    }
}

fn now() -> u64 {
    crate::state::unix_now()
}

fn default_id(state: &Shared, api: Api) -> String {
    let prefix = match api {
        Api::Completions => "cmpl-mock-",
        // vLLM answers a message with its chat id; SGLang draws `msg_...`.
        Api::Messages if state.config.flavor() == Flavor::Sglang => "msg_mock-",
        Api::Chat | Api::Messages => "chatcmpl-mock-",
        Api::Responses => "resp_mock-",
        Api::Generate => "generate-tokens-mock-",
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
    cached_tokens: Number,
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
        cached_tokens,
        top,
    }
}

fn usage(prompt_tokens: u64, completion_tokens: u64, details: &Details) -> Value {
    let mut u = Map::new();
    u.insert("prompt_tokens".into(), json!(prompt_tokens));
    u.insert("completion_tokens".into(), json!(completion_tokens));
    u.insert(
        "total_tokens".into(),
        json!(prompt_tokens + completion_tokens),
    );
    match details {
        Details::Absent => {}
        Details::Null => {
            u.insert("prompt_tokens_details".into(), Value::Null);
        }
        Details::Cached(n) => {
            u.insert("prompt_tokens_details".into(), json!({"cached_tokens": n}));
        }
    }
    Value::Object(u)
}

fn choice(
    api: Api,
    index: u64,
    text: &str,
    finish_reason: &str,
    logprobs: Value,
) -> Map<String, Value> {
    let mut c = Map::new();
    c.insert("index".into(), json!(index));
    match api {
        Api::Completions => {
            c.insert("text".into(), json!(text));
        }
        Api::Chat | Api::Responses | Api::Messages | Api::Generate => {
            c.insert(
                "message".into(),
                json!({"role": "assistant", "content": text}),
            );
        }
    }
    c.insert("finish_reason".into(), json!(finish_reason));
    c.insert("logprobs".into(), logprobs);
    c
}

fn object_name(api: Api, stream: bool) -> &'static str {
    match (api, stream) {
        (Api::Completions, _) => "text_completion",
        (Api::Chat, false) => "chat.completion",
        (Api::Chat, true) => "chat.completion.chunk",
        (Api::Responses, _) => "response",
        // Answered in their own shapes (anthropic.rs, token_in.rs).
        (Api::Messages, _) => "message",
        (Api::Generate, _) => "generate",
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

/// A chat/completions answer: `n` identical choices of `pieces`, as one
/// JSON body or as SSE events.
struct Completion {
    api: Api,
    id: String,
    model: String,
    created: u64,
    n: u64,
    include_usage: bool,
    pieces: Vec<Token>,
    /// Of the last token (and so of the answer).
    finish_reason: &'static str,
    prompt_tokens: u64,
    details: Details,
    /// Added to every choice.
    choice_extra: Map<String, Value>,
    /// Added to the body, or to the last token's event.
    top_extra: Map<String, Value>,
    look: Look,
    /// Code points of text before each piece, echo included (streamed
    /// completions logprobs), computed once.
    starts: OnceLock<Vec<u64>>,
}

/// One step of the stream.
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

impl Completion {
    fn m(&self) -> u64 {
        self.pieces.len() as u64
    }

    fn echo(&self) -> &str {
        self.look.echo.as_deref().unwrap_or("")
    }

    fn gen_step(&self, k: u64) -> Option<lp::Step<'_>> {
        let token = self.pieces.get(usize::try_from(k).ok()?)?;
        Some(lp::Step {
            position: self.prompt_tokens + k,
            token,
            first: false,
        })
    }

    fn prompt_steps(&self) -> Vec<lp::Step<'_>> {
        if !self.look.echo_logprobs {
            return Vec::new();
        }
        let Some(p) = &self.look.prompt else {
            return Vec::new();
        };
        p.tokens
            .iter()
            .enumerate()
            .map(|(j, token)| lp::Step {
                position: j as u64,
                token,
                first: j == 0,
            })
            .collect()
    }

    fn shape(&self, k: u64) -> lp::LogprobsShape {
        lp::LogprobsShape {
            flavor: self.look.flavor(),
            k,
            prompt_k: self.look.asked.prompt_logprobs.unwrap_or(k),
            prompt_len: self.prompt_tokens,
        }
    }

    /// A choice's `logprobs` over the whole answer.
    fn logprobs(&self) -> Value {
        let Some(k) = self.look.asked.logprobs else {
            return Value::Null;
        };
        match self.api {
            Api::Completions => {
                let mut steps = self.prompt_steps();
                steps.extend((0..self.m()).filter_map(|k| self.gen_step(k)));
                lp::completion_logprobs(&self.shape(k), &steps, 0)
            }
            Api::Chat => {
                let content: Vec<Value> = (0..self.m())
                    .filter_map(|j| self.gen_step(j))
                    .map(|s| lp::chat_logprob(self.look.flavor(), s.position, s.token, k))
                    .collect();
                json!({ "content": content })
            }
            Api::Responses | Api::Messages | Api::Generate => Value::Null,
        }
    }

    /// The `logprobs` of token `k`'s event: the first also covers the
    /// echoed prompt; offsets continue from the text sent so far.
    fn chunk_logprobs(&self, k: u64) -> Value {
        let Some(top) = self.look.asked.logprobs else {
            return Value::Null;
        };
        match self.api {
            Api::Completions => {
                let mut steps = if k == 0 {
                    self.prompt_steps()
                } else {
                    Vec::new()
                };
                steps.extend(self.gen_step(k));
                let offset = if k == 0 {
                    0
                } else {
                    let starts = self.starts.get_or_init(|| {
                        let mut at = self.echo().chars().count() as u64;
                        self.pieces
                            .iter()
                            .map(|t| {
                                let start = at;
                                at += t.text.chars().count() as u64;
                                start
                            })
                            .collect()
                    });
                    usize::try_from(k)
                        .ok()
                        .and_then(|k| starts.get(k))
                        .copied()
                        .unwrap_or(0)
                };
                lp::completion_logprobs(&self.shape(top), &steps, offset)
            }
            Api::Chat => {
                let content: Vec<Value> = self
                    .gen_step(k)
                    .map(|s| lp::chat_logprob(self.look.flavor(), s.position, s.token, top))
                    .into_iter()
                    .collect();
                json!({ "content": content })
            }
            Api::Responses | Api::Messages | Api::Generate => Value::Null,
        }
    }

    /// vLLM's `prompt_logprobs` (null when not asked).
    fn prompt_logprobs(&self) -> Value {
        match (self.look.asked.prompt_logprobs, &self.look.prompt) {
            (Some(k), Some(p)) => lp::vllm_prompt_logprobs(p, k),
            _ => Value::Null,
        }
    }

    fn body(&self) -> Value {
        let mut text = self.echo().to_string();
        text.extend(self.pieces.iter().map(|t| t.text.as_str()));
        let vllm = self.look.flavor() == Flavor::Vllm;
        let logprobs = self.logprobs();
        let prompt_logprobs = if vllm {
            self.prompt_logprobs()
        } else {
            Value::Null
        };
        let mut body = head(&self.id, self.api, false, &self.model, self.created);
        let choices: Vec<Value> = (0..self.n)
            .map(|i| {
                let mut c = choice(self.api, i, &text, self.finish_reason, logprobs.clone());
                c.extend(self.choice_extra.clone());
                if vllm && self.api == Api::Completions {
                    c.insert("prompt_logprobs".into(), prompt_logprobs.clone());
                }
                Value::Object(c)
            })
            .collect();
        body.insert("choices".into(), Value::Array(choices));
        body.insert(
            "usage".into(),
            usage(self.prompt_tokens, self.n * self.m(), &self.details),
        );
        body.extend(self.top_extra.clone());
        if vllm && self.api == Api::Chat {
            body.insert("prompt_logprobs".into(), prompt_logprobs);
        }
        Value::Object(body)
    }

    /// The event for `step` and the step after it; None when finished.
    fn event(&self, step: Step) -> Option<(String, Step)> {
        let m = self.m();
        // max_tokens 0 still sends one (empty) finishing chunk per choice.
        let last_k = m.saturating_sub(1);
        match step {
            Step::Token { k, i } => {
                let mut text = if k == 0 {
                    self.echo().to_string()
                } else {
                    String::new()
                };
                if let Some(t) = self.pieces.get(usize::try_from(k).unwrap_or(usize::MAX)) {
                    text.push_str(&t.text);
                }
                let finish = if k == last_k {
                    json!(self.finish_reason)
                } else {
                    Value::Null
                };
                let mut c = Map::new();
                c.insert("index".into(), json!(i));
                match self.api {
                    Api::Completions => {
                        c.insert("text".into(), json!(text));
                    }
                    Api::Chat | Api::Responses | Api::Messages | Api::Generate => {
                        let delta = if k == 0 {
                            json!({"role": "assistant", "content": text})
                        } else {
                            json!({"content": text})
                        };
                        c.insert("delta".into(), delta);
                    }
                }
                c.insert("finish_reason".into(), finish);
                c.insert("logprobs".into(), self.chunk_logprobs(k));
                c.extend(self.choice_extra.clone());
                let mut chunk = head(&self.id, self.api, true, &self.model, self.created);
                chunk.insert("choices".into(), json!([c]));
                if self.look.asked.continuous_usage {
                    // Per-chunk usage has no details (vLLM, as of 0.33).
                    let so_far = if m == 0 { 0 } else { k + 1 };
                    chunk.insert(
                        "usage".into(),
                        usage(self.prompt_tokens, so_far, &Details::Absent),
                    );
                }
                if k == last_k && i + 1 == self.n {
                    chunk.extend(self.top_extra.clone());
                }
                let next = if i + 1 < self.n {
                    Step::Token { k, i: i + 1 }
                } else if k < last_k {
                    Step::Token { k: k + 1, i: 0 }
                } else if self.include_usage {
                    Step::Usage
                } else {
                    Step::Done
                };
                Some((data(&Value::Object(chunk)), next))
            }
            Step::Usage => {
                // vLLM serialises the final usage chunk with exclude_none.
                let details = match (&self.details, self.look.flavor()) {
                    (Details::Null, Flavor::Vllm) => Details::Absent,
                    (d, _) => d.clone(),
                };
                let mut chunk = head(&self.id, self.api, true, &self.model, self.created);
                chunk.insert("choices".into(), json!([]));
                chunk.insert(
                    "usage".into(),
                    usage(self.prompt_tokens, self.n * m, &details),
                );
                Some((data(&Value::Object(chunk)), Step::Done))
            }
            Step::Done => Some(("data: [DONE]\n\n".to_string(), Step::End)),
            Step::End => None,
        }
    }

    /// Every event at once.
    fn sse(&self) -> String {
        let mut body = String::new();
        let mut step = Step::Token { k: 0, i: 0 };
        while let Some((event, next)) = self.event(step) {
            body.push_str(&event);
            step = next;
        }
        body
    }
}

/// The prefill's answer: one token "P" per choice. Streamed only when the
/// request asked for it, which only `--lenient-prefill` lets through: then
/// one SSE event per choice (the last one also carries the engine's
/// top-level members), a usage event if asked, and `[DONE]`.
pub fn prefill_response(
    state: &Shared,
    api: Api,
    params: &GenParams,
    look: Look,
    mut out: PrefillOut,
) -> Response {
    // Only a plain JSON answer splices serialised members; the rarer
    // shapes (streamed with --lenient-prefill, Responses, Messages,
    // token-in) take them as values.
    let own_shape = matches!(api, Api::Messages | Api::Generate);
    if api == Api::Responses || own_shape || params.stream {
        for (name, raw) in std::mem::take(&mut out.top_raw) {
            // A RawValue holds valid JSON, so this cannot fail; if it ever
            // did, the answer says so rather than carry a quiet null.
            let value = serde_json::from_str(raw.get())
                .unwrap_or_else(|e| Value::String(format!("mock-engine: member {name}: {e}")));
            out.top.insert(name.into(), value);
        }
    }
    if own_shape {
        state
            .generated_tokens
            .fetch_add(params.n, Ordering::Relaxed);
        let output = Output {
            pieces: vec![lp::prefill_token()],
            length_capped: out.finish_reason == "length",
            prompt_tokens: out.prompt_tokens,
            cached_tokens: out.cached_tokens,
            top: out.top,
        };
        return own_shape_response(state, api, params, &look, output, Kv::None, None);
    }
    if api == Api::Responses {
        state.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let length_capped = out.finish_reason == "length";
        let answer = responses::Answer {
            model: look.model,
            ..responses_answer(
                state,
                params,
                vec!["P".to_string()],
                length_capped,
                out.prompt_tokens,
                out.cached_tokens,
                out.top,
            )
        };
        return with_kv(responses::at_once(&answer, params.stream), Kv::None);
    }
    let id = match out.id_prefix {
        Some(prefix) => format!("{prefix}{}", state.next_id()),
        None => default_id(state, api),
    };
    state
        .generated_tokens
        .fetch_add(params.n, Ordering::Relaxed);
    let answer = Completion {
        api,
        id,
        model: look.model.clone(),
        created: now(),
        n: params.n,
        include_usage: params.include_usage,
        pieces: vec![lp::prefill_token()],
        finish_reason: out.finish_reason,
        prompt_tokens: out.prompt_tokens,
        details: Details::of(&state.config, &out.cached_tokens),
        choice_extra: out.choice,
        top_extra: out.top,
        look,
        starts: OnceLock::new(),
    };
    if params.stream {
        return with_kv(crate::sse::sse(Body::from(answer.sse())), Kv::None);
    }
    if out.top_raw.is_empty() {
        return with_kv(axum::Json(answer.body()).into_response(), Kv::None);
    }
    let body = with_raw_members(answer.body(), &out.top_raw);
    let resp = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    with_kv(resp, Kv::None)
}

/// `object` serialised, with `members` added at its end.
fn with_raw_members(object: Value, members: &[(&'static str, Box<RawValue>)]) -> String {
    let mut object = object.to_string();
    let extra: usize = members
        .iter()
        .map(|(n, r)| n.len() + r.get().len() + 4)
        .sum();
    object.reserve(extra);
    let closing = object.pop();
    debug_assert_eq!(closing, Some('}'), "an answer is a JSON object");
    for (name, raw) in members {
        if !object.ends_with('{') {
            object.push(',');
        }
        object.push_str(&Value::from(*name).to_string());
        object.push(':');
        object.push_str(raw.get());
    }
    object.push('}');
    object
}

/// The decode's answer: `max_tokens` tokens per choice.
pub fn decode_response(
    state: &Shared,
    api: Api,
    params: GenParams,
    look: Look,
    out: DecodeOut,
    guard: InFlight,
) -> Response {
    let completion_tokens = params.max_tokens * params.n;
    state
        .generated_tokens
        .fetch_add(completion_tokens, Ordering::Relaxed);
    if matches!(api, Api::Messages | Api::Generate) {
        let output = Output {
            pieces: (0..params.max_tokens).map(lp::generated).collect(),
            length_capped: params.capped,
            prompt_tokens: out.prompt_tokens,
            cached_tokens: out.cached_tokens,
            top: Map::new(),
        };
        return own_shape_response(state, api, &params, &look, output, out.kv, Some(guard));
    }
    if api == Api::Responses {
        let pieces = (0..params.max_tokens)
            .map(|k| lp::generated(k).text)
            .collect();
        let mut top = Map::new();
        top.insert("kv_transfer_params".into(), Value::Null);
        let answer = responses::Answer {
            model: look.model.clone(),
            ..responses_answer(
                state,
                &params,
                pieces,
                params.capped,
                out.prompt_tokens,
                out.cached_tokens,
                top,
            )
        };
        if !params.stream {
            guard.finish();
            return with_kv(responses::at_once(&answer, false), out.kv);
        }
        let resp = sse::streamed(answer.events(), state.config.stream_delay, move || {
            guard.finish()
        });
        return with_kv(resp, out.kv);
    }
    let answer = Completion {
        api,
        id: default_id(state, api),
        model: look.model.clone(),
        created: now(),
        n: params.n,
        include_usage: params.include_usage,
        pieces: (0..params.max_tokens).map(lp::generated).collect(),
        finish_reason: "length",
        prompt_tokens: out.prompt_tokens,
        details: Details::of(&state.config, &out.cached_tokens),
        choice_extra: Map::new(),
        top_extra: Map::new(),
        look,
        starts: OnceLock::new(),
    };
    if !params.stream {
        guard.finish();
        return with_kv(axum::Json(answer.body()).into_response(), out.kv);
    }
    let delay = state.config.stream_delay;
    let stream = futures_util::stream::unfold(
        (answer, Step::Token { k: 0, i: 0 }, guard),
        move |(answer, step, guard)| async move {
            let Some((event, next)) = answer.event(step) else {
                // Sent to the end: a finished request. A client that hangs
                // up earlier drops the stream, and the guard unfinished.
                guard.finish();
                return None;
            };
            if !matches!(step, Step::Token { k: 0, i: 0 }) && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Some((
                Ok::<_, Infallible>(Bytes::from(event)),
                (answer, next, guard),
            ))
        },
    );
    with_kv(crate::sse::sse(Body::from_stream(stream)), out.kv)
}

/// A Messages or token-in answer's content, whichever the leg.
struct Output {
    pieces: Vec<Token>,
    length_capped: bool,
    prompt_tokens: u64,
    cached_tokens: Number,
    /// The engine's top-level members (a vLLM prefill's `kv_transfer_params`).
    top: Map<String, Value>,
}

/// An answer as one JSON body or as SSE events.
enum Rendered {
    Json(Value),
    Events(Vec<String>),
}

/// `/v1/messages` and `/inference/v1/generate` answers, each in its API's
/// shape (anthropic.rs, token_in.rs), with the usage the chat path would
/// report. `guard` (a decode's) paces a stream and is finished at its end;
/// without one (a prefill, whose caller finishes it) a stream is sent at once.
fn own_shape_response(
    state: &Shared,
    api: Api,
    params: &GenParams,
    look: &Look,
    out: Output,
    kv: Kv,
    guard: Option<InFlight>,
) -> Response {
    let cfg = &state.config;
    let details = Details::of(cfg, &out.cached_tokens);
    let rendered = if api == Api::Messages {
        let answer = anthropic::Answer {
            id: default_id(state, api),
            model: look.model.clone(),
            pieces: out.pieces.into_iter().map(|t| t.text).collect(),
            length_capped: out.length_capped,
            prompt_tokens: out.prompt_tokens,
            cached: match details {
                Details::Cached(n) => Some(n),
                Details::Null | Details::Absent => None,
            },
            top: out.top,
            flavor: cfg.flavor(),
        };
        if params.stream {
            Rendered::Events(answer.events())
        } else {
            Rendered::Json(answer.body())
        }
    } else {
        let completion = params.n * out.pieces.len() as u64;
        // vLLM serialises the final usage chunk with exclude_none.
        let stream_details = match (&details, cfg.flavor()) {
            (Details::Null, Flavor::Vllm) => Details::Absent,
            (d, _) => d.clone(),
        };
        let id = params.request_id.clone().unwrap_or_else(|| state.next_id());
        let answer = token_in::Answer {
            request_id: format!("generate-tokens-{id}"),
            model: look.model.clone(),
            created: now(),
            n: params.n,
            token_ids: out.pieces.iter().map(|t| t.id).collect(),
            length_capped: out.length_capped,
            usage: usage(out.prompt_tokens, completion, &details),
            stream_usage: params
                .include_usage
                .then(|| usage(out.prompt_tokens, completion, &stream_details)),
            top: out.top,
        };
        if params.stream {
            Rendered::Events(answer.events())
        } else {
            Rendered::Json(answer.body())
        }
    };
    let resp = match (rendered, guard) {
        (Rendered::Json(body), guard) => {
            if let Some(g) = guard {
                g.finish();
            }
            axum::Json(body).into_response()
        }
        (Rendered::Events(events), Some(g)) => {
            sse::streamed(events, cfg.stream_delay, move || g.finish())
        }
        (Rendered::Events(events), None) => sse::at_once(events),
    };
    with_kv(resp, kv)
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(api: Api, max_tokens: u64, n: u64, include_usage: bool) -> Completion {
        Completion {
            api,
            id: "x".into(),
            model: "m".into(),
            created: 0,
            n,
            include_usage,
            pieces: (0..max_tokens).map(lp::generated).collect(),
            finish_reason: "length",
            prompt_tokens: 3,
            details: Details::Absent,
            choice_extra: Map::new(),
            top_extra: Map::new(),
            look: Look::default(),
            starts: OnceLock::new(),
        }
    }

    #[test]
    fn raw_members_come_last_and_verbatim() {
        let raw = |s: &str| RawValue::from_string(s.to_string()).expect("raw");
        let members = [
            ("ids", raw("[1,2, 3]")),
            ("big", raw("18446744073709551615")),
        ];
        let body = with_raw_members(json!({"a": 1}), &members);
        assert_eq!(body, r#"{"a":1,"ids":[1,2, 3],"big":18446744073709551615}"#);
        assert_eq!(
            with_raw_members(json!({}), &members[..1]),
            r#"{"ids":[1,2, 3]}"#
        );
    }

    fn events(c: &Completion) -> Vec<String> {
        c.sse()
            .split_inclusive("\n\n")
            .map(str::to_string)
            .collect()
    }

    fn json_events(c: &Completion) -> Vec<Value> {
        events(c)
            .iter()
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|e| !e.starts_with("[DONE]"))
            .map(|e| serde_json::from_str(e.trim()).expect("json"))
            .collect()
    }

    #[test]
    fn stream_shape() {
        let ev = events(&completion(Api::Completions, 3, 2, true));
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
        let ev = events(&completion(Api::Chat, 2, 1, false));
        assert_eq!(ev.len(), 3);
        assert!(ev[0].contains(r#""delta":{"content":"tok0","role":"assistant"}"#));
        assert!(ev[1].contains(r#""delta":{"content":" tok1"}"#));
    }

    #[test]
    fn streamed_prefill_is_one_token_per_choice() {
        let mut c = completion(Api::Chat, 0, 2, true);
        c.pieces = vec![lp::prefill_token()];
        c.prompt_tokens = 7;
        c.top_extra
            .insert("kv_transfer_params".into(), json!({"k": 1}));
        let body = c.sse();
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
        let ev = events(&completion(Api::Completions, 0, 1, false));
        assert_eq!(ev.len(), 2);
        assert!(ev[0].contains(r#""finish_reason":"length""#));
    }

    #[test]
    fn usage_details() {
        let mut c = completion(Api::Chat, 2, 1, true);
        assert_eq!(
            c.body()["usage"],
            json!({"prompt_tokens":3,"completion_tokens":2,"total_tokens":5})
        );
        c.details = Details::Cached(Number::from(2u64));
        let b = c.body();
        assert_eq!(
            b["usage"],
            json!({"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,
                   "prompt_tokens_details":{"cached_tokens":2}})
        );
        assert_eq!(
            b["usage"].to_string(),
            r#"{"completion_tokens":2,"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":2},"total_tokens":5}"#
        );
        let ev = json_events(&c);
        assert_eq!(
            ev.last().unwrap()["usage"]["prompt_tokens_details"]["cached_tokens"],
            2
        );
        assert_eq!(ev.last().unwrap()["choices"], json!([]));
        // Null in a body; vLLM's final usage chunk leaves it out, SGLang's
        // keeps it.
        c.details = Details::Null;
        c.look.flavor = Some(Flavor::Vllm);
        assert_eq!(c.body()["usage"]["prompt_tokens_details"], Value::Null);
        assert!(c.body()["usage"]
            .as_object()
            .unwrap()
            .contains_key("prompt_tokens_details"));
        let last = json_events(&c).pop().unwrap();
        assert!(!last["usage"]
            .as_object()
            .unwrap()
            .contains_key("prompt_tokens_details"));
        c.look.flavor = Some(Flavor::Sglang);
        let last = json_events(&c).pop().unwrap();
        assert!(last["usage"]
            .as_object()
            .unwrap()
            .contains_key("prompt_tokens_details"));
    }

    #[test]
    fn continuous_usage_has_no_details() {
        let mut c = completion(Api::Completions, 2, 2, true);
        c.details = Details::Cached(Number::from(1u64));
        c.look.asked.continuous_usage = true;
        let ev = json_events(&c);
        assert_eq!(ev.len(), 5);
        assert_eq!(
            ev[0]["usage"],
            json!({"prompt_tokens":3,"completion_tokens":1,"total_tokens":4})
        );
        assert_eq!(ev[3]["usage"]["completion_tokens"], 2);
        assert_eq!(ev[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
        assert_eq!(ev[4]["usage"]["completion_tokens"], 4);
    }

    fn echo_look(flavor: Flavor, body: &'static str) -> (Look, u64) {
        let req = Request::parse(Api::Completions, body.as_bytes()).unwrap();
        let asked = Asked::from_request(&req, flavor, false).unwrap();
        let prompt = Prompt::of(&req).unwrap();
        let n = prompt.tokens.len() as u64;
        let look = Look {
            flavor: Some(flavor),
            model: "m".into(),
            echo: Some(prompt.text.clone()),
            echo_logprobs: asked.logprobs.is_some(),
            prompt: Some(prompt),
            asked,
        };
        (look, n)
    }

    #[test]
    fn completions_echo_logprobs() {
        let (look, n) = echo_look(
            Flavor::Vllm,
            r#"{"prompt":"Bonjour à tous","echo":true,"logprobs":1}"#,
        );
        let mut c = completion(Api::Completions, 2, 1, false);
        c.prompt_tokens = n;
        c.look = look;
        let b = c.body();
        let ch = &b["choices"][0];
        assert_eq!(ch["text"], "Bonjour à toustok0 tok1");
        let lps = &ch["logprobs"];
        let tokens: Vec<&str> = lps["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(tokens.len() as u64, n + 2);
        assert_eq!(tokens.concat(), "Bonjour à toustok0 tok1");
        let offsets: Vec<u64> = lps["text_offset"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_u64().unwrap())
            .collect();
        let mut at = 0;
        for (o, t) in offsets.iter().zip(&tokens) {
            assert_eq!(*o, at);
            at += t.chars().count() as u64;
        }
        assert_eq!(lps["token_logprobs"][0], Value::Null);
        assert_eq!(lps["top_logprobs"][0], Value::Null);
        assert!(lps["token_logprobs"][1].is_f64());
        // vLLM: echo turns into prompt_logprobs = logprobs, per choice.
        assert_eq!(ch["prompt_logprobs"].as_array().unwrap().len() as u64, n);
        assert_eq!(
            ch["prompt_logprobs"],
            lp::vllm_prompt_logprobs(c.look.prompt.as_ref().unwrap(), 1)
        );
        assert_eq!(b.get("prompt_logprobs"), None);

        // Streamed: the first chunk carries the prompt and the first token.
        let ev = json_events(&c);
        assert_eq!(ev[0]["choices"][0]["text"], "Bonjour à toustok0");
        let first = &ev[0]["choices"][0]["logprobs"];
        assert_eq!(first["tokens"].as_array().unwrap().len() as u64, n + 1);
        assert_eq!(first["text_offset"][0], 0);
        let second = &ev[1]["choices"][0]["logprobs"];
        assert_eq!(second["tokens"], json!([" tok1"]));
        assert_eq!(second["text_offset"], json!([offsets[offsets.len() - 1]]));
        assert_eq!(
            second["token_logprobs"][0],
            lps["token_logprobs"][n as usize + 1]
        );
    }

    #[test]
    fn logprobs_without_echo_are_the_generated_tokens() {
        let req =
            Request::parse(Api::Completions, br#"{"prompt":"Hi there","logprobs":2}"#).unwrap();
        let asked = Asked::from_request(&req, Flavor::Vllm, false).unwrap();
        let mut c = completion(Api::Completions, 3, 1, false);
        c.look = Look {
            flavor: Some(Flavor::Vllm),
            asked,
            ..Look::default()
        };
        let b = c.body();
        let lps = &b["choices"][0]["logprobs"];
        assert_eq!(lps["tokens"], json!(["tok0", " tok1", " tok2"]));
        assert_eq!(lps["text_offset"], json!([0, 4, 9]));
        assert_eq!(
            lps["token_logprobs"][1],
            json!(lp::logprob(3 + 1, &lp::generated(1)))
        );
        assert_eq!(b["choices"][0]["prompt_logprobs"], Value::Null);
    }

    #[test]
    fn sglang_decode_echo_has_generated_logprobs_only() {
        let (mut look, n) = echo_look(
            Flavor::Sglang,
            r#"{"prompt":"abcdefgh","echo":true,"logprobs":2}"#,
        );
        look.echo_logprobs = false;
        let mut c = completion(Api::Completions, 2, 1, false);
        c.prompt_tokens = n;
        c.look = look;
        let b = c.body();
        assert_eq!(b["choices"][0]["text"], "abcdefghtok0 tok1");
        let lps = &b["choices"][0]["logprobs"];
        assert_eq!(lps["tokens"], json!(["tok0", " tok1"]));
        assert_eq!(lps["text_offset"], json!([-1, -1]));
        assert_eq!(lps["top_logprobs"][0].as_object().unwrap().len(), 2);
        assert_eq!(b["choices"][0].get("prompt_logprobs"), None);
    }

    #[test]
    fn chat_prompt_logprobs_and_logprobs() {
        let req = Request::parse(
            Api::Chat,
            br#"{"messages":[{"role":"user","content":"Hello"}],"prompt_logprobs":1,"logprobs":true,"top_logprobs":2}"#,
        )
        .unwrap();
        let asked = Asked::from_request(&req, Flavor::Vllm, false).unwrap();
        let prompt = Prompt::of(&req).unwrap();
        let mut c = completion(Api::Chat, 2, 1, false);
        c.prompt_tokens = prompt.tokens.len() as u64;
        c.look = Look {
            flavor: Some(Flavor::Vllm),
            asked,
            prompt: Some(prompt.clone()),
            ..Look::default()
        };
        let b = c.body();
        assert_eq!(b["prompt_logprobs"], lp::vllm_prompt_logprobs(&prompt, 1));
        let content = b["choices"][0]["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_eq!(content[0]["token"], "tok0");
        assert_eq!(content[0]["bytes"], json!(b"tok0".to_vec()));
        assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
        assert_eq!(content[0]["top_logprobs"][0]["token"], "tok0");
        // Not asked: null.
        let mut c = completion(Api::Chat, 1, 1, false);
        c.look.flavor = Some(Flavor::Vllm);
        assert_eq!(c.body()["prompt_logprobs"], Value::Null);
        assert!(c
            .body()
            .as_object()
            .unwrap()
            .contains_key("prompt_logprobs"));
    }
}

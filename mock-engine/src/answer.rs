//! The answer to a request, from what its engine's leg produced: the
//! prefill's one-token answer and the decode's `tok0 tok1 ...` answer, in
//! the shape of the API asked (chat and completions through completion.rs,
//! Responses, Messages, token-in), as JSON or as an SSE stream.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use serde_json::{Map, Number, Value};

use crate::completion::{Completion, Step};
use crate::config::Flavor;
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::logprobs::{self as lp, Token};
use crate::look::Look;
use crate::params::GenParams;
use crate::request::Api;
use crate::state::{InFlight, Shared};
use crate::usage::{usage, Details};
use crate::{anthropic, responses, sse, token_in};

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

fn with_kv(mut resp: Response, kv: Kv) -> Response {
    resp.headers_mut()
        .insert("x-mock-kv", HeaderValue::from_static(kv.as_str()));
    resp
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
        top_extra: out.top,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}

//! A simulated request's life on a pod, whatever its leg: queued on the
//! engine, admitted, answered once (a prefill leg, a whole answer) or
//! streamed (tokens sent as they are generated, at most one chunk per flush
//! interval after the first), and recorded when it ends.

use super::engine::{Event, Job};
use super::fleet::{Fleet, Record};
use super::pod::{Pod, Ticket};
use super::text::Prompt;
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;
use std::sync::Arc;
use tokio::time::Instant;

/// What a request asked for, as the handlers read it.
#[derive(Debug, Clone)]
pub struct Asked {
    pub prompt: Prompt,
    pub max_tokens: u32,
    pub stream: bool,
    pub user: String,
}

/// A request being served: its ticket on the engine and its record.
pub struct Serving {
    pub fleet: Arc<Fleet>,
    pub pod: Arc<Pod>,
    pub ticket: Ticket,
    pub record: Record,
    /// The prompt's KV came from a prefill pod (the record's cached tokens
    /// are what this pod held before the transfer).
    pub handed_off: bool,
    /// The engine holds its blocks when it finishes, for the next turn's
    /// prefill to pull ([`Fleet::keep`]); freed when it ends otherwise.
    pub hold: bool,
    kept: bool,
}

impl Drop for Serving {
    fn drop(&mut self) {
        if self.hold && !self.kept {
            self.pod.release_held(self.ticket.key);
        }
    }
}

/// An OpenAI-style error answer.
pub fn error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// The record of a request that arrives at `pod` now.
pub fn record(pod: &Pod, asked: &Asked, role: &'static str) -> Record {
    Record {
        user: asked.user.clone(),
        role,
        pod: pod.name.clone(),
        status: 200,
        arrival_s: pod.clock.now_s(),
        admitted_s: None,
        first_token_s: None,
        finish_s: None,
        prompt_tokens: asked.prompt.tokens,
        cached_tokens: 0,
        computed_tokens: 0,
        transferred_tokens: 0,
        output_tokens: 0,
        handoff: "none",
        prefill_pod: None,
        error: None,
    }
}

impl Serving {
    /// Serving `ticket` on `pod`.
    pub fn new(fleet: Arc<Fleet>, pod: Arc<Pod>, ticket: Ticket, record: Record) -> Serving {
        Serving {
            fleet,
            pod,
            ticket,
            record,
            handed_off: false,
            hold: false,
            kept: false,
        }
    }

    /// A finished request whose blocks the engine holds: kept for the next
    /// turn, and the `kv_transfer_params` its answer names them by.
    fn kv_params(&mut self) -> Option<serde_json::Value> {
        if !self.hold || self.kept || self.record.finish_s.is_none() {
            return None;
        }
        let tokens = self.record.prompt_tokens + self.record.output_tokens;
        let params = self.fleet.keep(&self.pod, self.ticket.key, tokens)?;
        self.kept = true;
        Some(params)
    }

    /// Applies one engine event to the record; true once the request ended.
    fn apply(&mut self, ev: Event) -> bool {
        let now = self.pod.clock.now_s();
        match ev {
            Event::Admitted {
                cached, computed, ..
            } => {
                self.record.admitted_s = Some(now);
                if !self.handed_off {
                    self.record.cached_tokens = cached;
                }
                self.record.computed_tokens = computed;
                false
            }
            Event::Tokens { n, first, .. } => {
                if first {
                    self.record.first_token_s = Some(now);
                }
                self.record.output_tokens += n;
                false
            }
            Event::Finished { .. } => {
                self.record.finish_s = Some(now);
                self.ticket.finished();
                true
            }
        }
    }

    /// Waits for the request to end.
    pub async fn finish(&mut self) -> bool {
        while let Some(ev) = self.ticket.events.recv().await {
            if self.apply(ev) {
                return true;
            }
        }
        false
    }

    /// Records the request and lets it go.
    pub fn done(mut self) {
        if self.record.finish_s.is_none() && self.record.error.is_none() {
            self.record.error = Some("the client went away".into());
            self.record.status = 499;
        }
        self.fleet.record(self.record.clone());
    }
}

fn completion_json(model: &str, text: &str, finish: Option<&str>) -> serde_json::Value {
    json!({
        "id": "cmpl-sim",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
    })
}

/// The answer of a request that is over: one JSON completion, `extra`
/// members added (a prefill's `kv_transfer_params`).
pub fn whole_answer(s: &Serving, extra: Option<(&str, serde_json::Value)>) -> Response {
    let r = &s.record;
    let text = "x ".repeat(r.output_tokens as usize);
    let mut body = completion_json(&s.fleet.model, &text, Some("length"));
    if let Some(obj) = body.as_object_mut() {
        obj.insert(
            "usage".into(),
            json!({
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.output_tokens,
                "total_tokens": r.prompt_tokens + r.output_tokens,
                "prompt_tokens_details": {"cached_tokens": r.cached_tokens + r.transferred_tokens},
            }),
        );
        if let Some((k, v)) = extra {
            obj.insert(k.into(), v);
        }
    }
    axum::Json(body).into_response()
}

fn sse(event: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {event}\n\n"))
}

/// Streams a request's tokens: the first as soon as it is generated, then
/// what the steps generated, a chunk per flush interval, then `[DONE]`.
pub fn stream_answer(s: Serving) -> Response {
    let flush = s.fleet.flush;
    let model = s.fleet.model.clone();
    let stream = futures_util::stream::unfold(Some((s, 0u32, None::<Instant>)), move |state| {
        let model = model.clone();
        async move {
            let (mut s, mut pending, mut first_sent) = state?;
            loop {
                let ended = match first_sent {
                    // Before the first token, wait for it however long.
                    None => match s.ticket.events.recv().await {
                        Some(ev) => (s.apply(ev), ev),
                        None => {
                            s.done();
                            return None;
                        }
                    },
                    Some(at) => {
                        match tokio::time::timeout_at(at + flush, s.ticket.events.recv()).await {
                            Ok(Some(ev)) => (s.apply(ev), ev),
                            Ok(None) => {
                                s.done();
                                return None;
                            }
                            // Flush what the interval generated.
                            Err(_) => {
                                let text = "x ".repeat(pending as usize);
                                let chunk = sse(&completion_json(&model, &text, None));
                                return Some((chunk, Some((s, 0, Some(Instant::now())))));
                            }
                        }
                    }
                };
                if let (false, Event::Tokens { n, first, .. }) = ended {
                    pending += n;
                    if first {
                        let text = "x ".repeat(pending as usize);
                        first_sent = Some(Instant::now());
                        let chunk = sse(&completion_json(&model, &text, None));
                        return Some((chunk, Some((s, 0, first_sent))));
                    }
                    continue;
                }
                if ended.0 {
                    let text = "x ".repeat(pending as usize);
                    let mut last = completion_json(&model, &text, Some("length"));
                    if let (Some(kv), Some(obj)) = (s.kv_params(), last.as_object_mut()) {
                        obj.insert("kv_transfer_params".into(), kv);
                    }
                    let mut chunk = sse(&last).to_vec();
                    chunk.extend_from_slice(b"data: [DONE]\n\n");
                    s.done();
                    return Some((Bytes::from(chunk), None));
                }
            }
        }
    });
    let body = Body::from_stream(futures_util::StreamExt::map(
        stream,
        Ok::<Bytes, std::io::Error>,
    ));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "stream"))
}

/// Runs `asked` on `pod` (the prompt handed off or computed here) and
/// answers it.
pub async fn run(
    fleet: Arc<Fleet>,
    pod: Arc<Pod>,
    asked: &Asked,
    record: Record,
    handed_off: bool,
) -> Response {
    // A decode keeps its KV for the next turn when the pods are bidirectional.
    let hold = record.role == "decode" && fleet.decoder_kv_ttl_s.is_some();
    let ticket = pod.submit(Job {
        handed_off,
        hold,
        ..Job::new(0, asked.prompt.clone(), asked.max_tokens.max(1))
    });
    let mut s = Serving::new(fleet, pod, ticket, record);
    s.handed_off = handed_off;
    s.hold = hold;
    if asked.stream {
        return stream_answer(s);
    }
    let ended = s.finish().await;
    let kv = s.kv_params().map(|kv| ("kv_transfer_params", kv));
    let answer = whole_answer(&s, kv);
    if !ended {
        s.record.error = Some("the engine dropped it".into());
    }
    s.done();
    answer
}

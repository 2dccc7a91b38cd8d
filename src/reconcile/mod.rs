//! The decode's answer as a single engine would have given it: the
//! prefill's real cached-token count in `usage`, and the prompt logprobs
//! only the prefill computed. Pure: the flow feeds it the prefill's answer
//! and the decode's body (whole, or chunk by chunk for SSE) and writes back
//! what it returns.
//!
//! Costs nothing when unused: a request whose answer needs no rewrite never
//! gets here (the flow keeps its pass-through path), and one that does has
//! only the members it owns re-rendered (see [`json`]).

mod json;
pub mod kv_params;
mod logprobs;
mod sse;
mod usage;

pub use logprobs::{PromptLogprobs, PromptPart};
pub use sse::{data_span, next_event};
pub use usage::{prefill_cached_tokens, set_cached_tokens};

use crate::api::{Api, ClientFields};
use crate::body::Members;
use crate::fleet::EngineKind;

/// What may need rewriting in one request's answer, decided from the
/// client's request before any leg leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewritePlan {
    /// The engine's decode misreports cached tokens and the client will see
    /// a usage (every non-streamed answer; streams with `include_usage`;
    /// every Responses stream).
    pub usage: bool,
    pub logprobs: Option<PromptLogprobs>,
    pub stream: bool,
    /// Take the decode's own `kv_transfer_params` out of the answer and
    /// keep them (next-turn KV reuse, [`kv_params`]).
    pub capture_kv: bool,
}

/// Decode-leg fields that make the engine ignore the hand-off.
pub const PROMPT_LOGPROB_FIELDS: [&str; 2] = ["prompt_logprobs", "echo"];

/// How a request's answer is handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerNeeds {
    /// Nothing to rewrite.
    None,
    Rewrite(RewritePlan),
    /// A single engine answers it better unsplit (and refuses what it
    /// refuses). The reason is for the log.
    Unsplit(&'static str),
}

/// Decides, from the client's request, what its answer may need.
pub fn decide(
    engine: EngineKind,
    report: &ClientFields,
    body: &[u8],
    top: &Members,
) -> AnswerNeeds {
    // Only these engines' decodes report what a PD split gets wrong.
    if !matches!(engine, EngineKind::Vllm | EngineKind::Sglang) {
        return AnswerNeeds::None;
    }
    let vllm = engine == EngineKind::Vllm;
    let set = |k: &str| top.raw_non_null(body, k).is_some_and(|v| v != b"false");
    if vllm && report.api == Api::ChatCompletions && set("echo") {
        // vLLM turns chat echo into prompt logprobs (and so skips the
        // hand-off); the echoed message is its own to write.
        return AnswerNeeds::Unsplit("chat echo");
    }
    let logprobs = if vllm && set("prompt_logprobs") {
        if report.stream {
            // vLLM refuses it ("not available when stream=True"): let it.
            return AnswerNeeds::Unsplit("prompt_logprobs with stream");
        }
        Some(PromptLogprobs::Field)
    } else if report.api == Api::Completions && set("echo") && set("logprobs") {
        match top
            .raw_non_null(body, "prompt")
            .and_then(|p| serde_json::from_slice::<String>(p).ok())
        {
            Some(prompt_text) => Some(PromptLogprobs::Echo { prompt_text }),
            // Token ids or a batch: the echoed text is the engine's.
            None => return AnswerNeeds::Unsplit("echo of a prompt that is not one string"),
        }
    } else {
        None
    };
    // A Responses stream always ends with the whole response, usage
    // included; a Messages stream always states usage.
    let usage = !report.stream
        || report.include_usage
        || matches!(report.api, Api::Responses | Api::Messages);
    if !usage && logprobs.is_none() {
        return AnswerNeeds::None;
    }
    AnswerNeeds::Rewrite(RewritePlan {
        usage,
        logprobs,
        stream: report.stream,
        capture_kv: false,
    })
}

/// What the prefill's answer says that the decode's answer lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefillReport {
    pub cached_tokens: Option<u64>,
    pub prompt: Option<PromptPart>,
}

impl PrefillReport {
    /// What the prefill's `answer` says (parsed here).
    pub fn of(plan: &RewritePlan, answer: &[u8]) -> PrefillReport {
        match Members::parse(answer) {
            Ok(top) => PrefillReport::of_parsed(plan, answer, &top),
            Err(_) => PrefillReport::default(),
        }
    }

    /// What the prefill's `answer`, already parsed as `top`, says.
    pub fn of_parsed(plan: &RewritePlan, answer: &[u8], top: &Members) -> PrefillReport {
        PrefillReport {
            cached_tokens: if plan.usage {
                usage::prefill_cached_tokens_in(answer, top)
            } else {
                None
            },
            prompt: plan
                .logprobs
                .as_ref()
                .and_then(|asked| PromptPart::of_parsed(answer, top, asked)),
        }
    }

    fn is_empty(&self) -> bool {
        self.cached_tokens.is_none() && self.prompt.is_none()
    }
}

/// The prefill's report are not known yet and this part of the answer needs
/// them: hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AwaitReport;

/// One answer's rewrite, fed the decode's body as it arrives.
#[derive(Debug, Clone)]
pub struct Rewrite {
    plan: RewritePlan,
    report: Option<PrefillReport>,
    /// SSE: the unfinished event carried from the last chunk.
    tail: Vec<u8>,
    /// Echo: choice indexes that already got the prompt.
    led: Vec<u64>,
    /// The decode's `kv_transfer_params`, once seen (`capture_kv`).
    captured: Option<kv_params::Taken>,
}

impl Rewrite {
    /// `report`: the prefill's, when it answered before the decode left.
    pub fn new(plan: RewritePlan, report: Option<PrefillReport>) -> Rewrite {
        Rewrite {
            plan,
            report,
            tail: Vec::new(),
            led: Vec::new(),
            captured: None,
        }
    }

    /// A rewrite that only takes the decode's `kv_transfer_params` out.
    pub fn capture_only(stream: bool) -> Rewrite {
        Rewrite::new(
            RewritePlan {
                usage: false,
                logprobs: None,
                stream,
                capture_kv: true,
            },
            Some(PrefillReport::default()),
        )
    }

    /// The decode's `kv_transfer_params`, if the answer carried them.
    pub fn captured(&self) -> Option<&kv_params::Taken> {
        self.captured.as_ref()
    }

    /// Whether the answer needs looking at: the report are still to come, or
    /// they hold something to put in.
    pub fn needed(&self) -> bool {
        self.plan.capture_kv || self.report.as_ref().is_none_or(|f| !f.is_empty())
    }

    /// No part of an unfinished event is held.
    pub fn holds_nothing(&self) -> bool {
        self.tail.is_empty()
    }

    pub fn has_report(&self) -> bool {
        self.report.is_some()
    }

    pub fn set_report(&mut self, report: PrefillReport) {
        self.report = Some(report);
    }

    pub fn is_stream(&self) -> bool {
        self.plan.stream
    }

    pub fn plan(&self) -> &RewritePlan {
        &self.plan
    }

    /// Rewrites one JSON object: a whole answer, or an event's data.
    fn object(&mut self, obj: &[u8], whole: bool) -> Result<Option<Vec<u8>>, AwaitReport> {
        // A scan is far cheaper than a parse, and most stream events (a
        // token's delta) hold nothing to rewrite.
        let has = |needle: &[u8]| obj.windows(needle.len()).any(|w| w == needle);
        let usage = self.plan.usage && usage::USAGE_NEEDLES.iter().any(|n| has(n));
        let choices = self.plan.logprobs.is_some() && has(b"\"choices\"");
        let Some(report) = &self.report else {
            return if usage || choices {
                Err(AwaitReport)
            } else {
                Ok(self.capture(obj, None))
            };
        };
        let mut out: Option<Vec<u8>> = None;
        if let (Some(part), true) = (&report.prompt, choices) {
            let led = &mut self.led;
            let mut first = |i: u64| {
                let f = !led.contains(&i);
                if f {
                    led.push(i);
                }
                f
            };
            out = logprobs::merge(obj, part, whole, &mut first);
        }
        if let (Some(cached), true) = (report.cached_tokens, usage) {
            let src = out.as_deref().unwrap_or(obj);
            if let Some(new) = set_cached_tokens(src, cached) {
                out = Some(new);
            }
        }
        Ok(self.capture(obj, out))
    }

    /// `obj` (or its rewrite `out`) with the decode's `kv_transfer_params`
    /// taken out, when the plan keeps them.
    fn capture(&mut self, obj: &[u8], out: Option<Vec<u8>>) -> Option<Vec<u8>> {
        const NEEDLE: &[u8] = b"\"kv_transfer_params\"";
        let src = out.as_deref().unwrap_or(obj);
        if !self.plan.capture_kv || !src.windows(NEEDLE.len()).any(|w| w == NEEDLE) {
            return out;
        }
        match kv_params::take(src) {
            Some((stripped, taken)) => {
                self.captured = Some(taken);
                Some(stripped)
            }
            None => out,
        }
    }

    /// A complete non-streamed answer.
    pub fn whole(&mut self, body: &[u8]) -> Result<Option<Vec<u8>>, AwaitReport> {
        self.object(body, true)
    }

    /// The next bytes of an SSE stream (`end`: the last of them). Returns
    /// what to send on in their place (`None`: the bytes as they are):
    /// complete events, rewritten where needed; the unfinished last event
    /// is held until it completes (or the stream ends). On `AwaitReport`
    /// nothing was consumed: call again with the same bytes (and any that
    /// followed) once the report are set.
    pub fn chunk(&mut self, chunk: &[u8], end: bool) -> Result<Option<Vec<u8>>, AwaitReport> {
        // The common case: whole events, none of them ours to touch.
        if self.tail.is_empty() && ends_an_event(chunk) && !self.may_touch(chunk) {
            return Ok(None);
        }
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut at = 0;
        while let Some(len) = buf.get(at..).and_then(next_event) {
            events.push(at..at + len);
            at += len;
        }
        if end && at < buf.len() {
            events.push(at..buf.len());
            at = buf.len();
        }
        let mut out = Vec::with_capacity(buf.len() + 64);
        for range in events {
            let event = buf.get(range).unwrap_or_default();
            let rewritten = match data_span(event) {
                Some(span) => {
                    let data = event.get(span.clone()).unwrap_or_default();
                    match self.object(data, false) {
                        Ok(r) => r.map(|new| (span, new)),
                        Err(AwaitReport) => {
                            // Only unknown report say so, and then nothing
                            // was changed: the caller holds the bytes.
                            buf.truncate(buf.len() - chunk.len());
                            self.tail = buf;
                            return Err(AwaitReport);
                        }
                    }
                }
                None => None,
            };
            match rewritten {
                Some((span, new)) => {
                    out.extend_from_slice(event.get(..span.start).unwrap_or_default());
                    out.extend_from_slice(&new);
                    out.extend_from_slice(event.get(span.end..).unwrap_or_default());
                }
                None => out.extend_from_slice(event),
            }
        }
        self.tail = buf.get(at..).unwrap_or_default().to_vec();
        Ok(Some(out))
    }

    /// Whether `bytes` hold anything this rewrite may change.
    fn may_touch(&self, bytes: &[u8]) -> bool {
        let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        (self.plan.usage && usage::USAGE_NEEDLES.iter().any(|n| has(n)))
            || (self.plan.logprobs.is_some() && has(b"\"choices\""))
            || (self.plan.capture_kv && has(b"\"kv_transfer_params\""))
    }
}

/// Whether `chunk` ends where an event does (a blank line).
fn ends_an_event(chunk: &[u8]) -> bool {
    chunk.ends_with(b"\n\n") || chunk.ends_with(b"\r\n\r\n")
}

#[cfg(test)]
mod tests;

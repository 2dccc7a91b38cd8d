//! What a split's decode answer says about its hand-off. A decode that
//! fails after the prefill answered (a 5xx, Envoy's 503 for a refused or
//! reset connection, or a 200 stream whose first event is an error, as vLLM
//! and SGLang report a KV transfer that failed) counts against the decode
//! pod and against the pair; the first success clears both streaks. The
//! verdict is applied when the stream ends, in the same shared-data update
//! that gives its load back.

use super::load::{Judgement, Release};
use super::Flow;
use crate::fleet::{Endpoint, PodId};
use crate::host::{Counter, Host, Level, PodEvent};
use crate::load::Verdict;
use std::rc::Rc;

/// What Envoy adds to the 503 of a request its circuit breaker refused
/// (unless the router filter's `suppress_envoy_headers` is set).
const OVERLOADED_HEADER: &str = "x-envoy-overloaded";

/// A split's decode, waiting for the verdict its answer gives on the
/// decode pod and the pair.
#[derive(Debug)]
pub(super) struct DecodeWatch {
    prefill: PodId,
    decode: Rc<Endpoint>,
    verdict: Option<(Verdict, String)>,
    /// A 200 stream: the verdict waits for its first event.
    first_event: bool,
}

/// Whether an SSE stream opens with an error event (vLLM, SGLang:
/// `data: {"error": ...}`; Anthropic's Messages: `event: error`).
pub(super) fn opens_with_error(head: &[u8]) -> bool {
    let head = head.trim_ascii_start();
    let data = head
        .strip_prefix(b"data:")
        .map(<[u8]>::trim_ascii_start)
        .is_some_and(|d| d.starts_with(b"{\"error\""));
    data || head.starts_with(b"event: error") || head.starts_with(b"event:error")
}

impl Flow {
    /// Whether the split's decode answered with a failure (so its prefill
    /// waits for a decode that will never pull its KV).
    pub(super) fn decode_refused(&self) -> bool {
        self.decode_watch
            .as_ref()
            .is_some_and(|w| matches!(w.verdict, Some((Verdict::Failed | Verdict::Down, _))))
    }

    /// The decode of a split went out: its answer will be judged.
    pub(super) fn watch_decode(&mut self, prefill: &Endpoint, decode: &Rc<Endpoint>) {
        self.decode_watch = Some(DecodeWatch {
            prefill: prefill.id,
            decode: Rc::clone(decode),
            verdict: None,
            first_event: false,
        });
    }

    /// Response headers: a 5xx is a failed hand-off; a 200 stream is judged
    /// by its first event, anything else worked.
    pub(super) fn judge_decode_headers<H: Host>(&mut self, host: &H) {
        let Some(v) = self.decode_watch.as_mut() else {
            return;
        };
        let status = host
            .response_header(":status")
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or(0);
        // Envoy's own circuit breaker on the decode cluster refused the
        // request (`x-envoy-overloaded: true` on its 503): it never reached
        // the pod, which is judged neither way.
        if status == 503 && host.response_header(OVERLOADED_HEADER).as_deref() == Some("true") {
            self.decode_watch = None;
            let msg =
                "decode not sent: the gateway's circuit breaker on the decode cluster is full";
            self.log(host, Level::Warn, msg);
            return;
        }
        if status >= 500 {
            let cause = format!("decode: status {status}");
            self.decode_failed(host, cause);
            return;
        }
        let stream = host
            .response_header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if stream && (200..300).contains(&status) {
            v.first_event = true;
        } else {
            v.verdict = Some((Verdict::Worked, String::new()));
        }
    }

    /// The first bytes of a 200 stream.
    pub(super) fn judge_decode_body<H: Host>(&mut self, host: &H, body_size: usize) {
        let Some(v) = self.decode_watch.as_mut() else {
            return;
        };
        if !v.first_event || body_size == 0 {
            return;
        }
        v.first_event = false;
        let head = host.response_body_head(64).unwrap_or_default();
        if opens_with_error(&head) {
            self.decode_failed(host, "decode: an error event on a 200 stream".into());
        } else {
            v.verdict = Some((Verdict::Worked, String::new()));
        }
    }

    fn decode_failed<H: Host>(&mut self, host: &H, cause: String) {
        let Some(v) = self.decode_watch.as_mut() else {
            return;
        };
        host.increment(Counter::DecodeFailed);
        host.count_pod(&v.decode.name, PodEvent::DecodeFailed);
        let msg = format!(
            "decode {} failed after the hand-off ({cause})",
            v.decode.address
        );
        v.verdict = Some((Verdict::Failed, cause));
        self.log(host, Level::Warn, &msg);
    }

    /// The stream ended: its load goes back with the decode's verdict, and a
    /// pair that failed, or that this VM knows as failing, is judged too.
    pub(super) fn release_with_verdict<H: Host>(&mut self, host: &mut H) {
        let Some(DecodeWatch {
            prefill,
            decode,
            verdict: Some((verdict, cause)),
            ..
        }) = self.decode_watch.take()
        else {
            self.release(host, Release::All, None);
            return;
        };
        let judged = Judgement {
            pod: &decode,
            verdict,
            cause: cause.clone(),
        };
        self.release(host, Release::All, Some(judged));
        let router = Rc::clone(&self.router);
        let model = self.held.model;
        if verdict == Verdict::Worked && !router.pair_failing(model, prefill, decode.id) {
            return;
        }
        let now = host.now_ms();
        match router.judge_pair(host, model, (prefill, decode.id), verdict, now) {
            Ok(true) => {
                let msg = format!(
                    "hand-offs to decode {} from this prefill keep failing: the pair is avoided for {} ms",
                    decode.address, router.config.health.cooldown_ms
                );
                self.log(host, Level::Warn, &msg);
            }
            Ok(false) => {}
            Err(e) => self.log(host, Level::Error, &format!("could not update pairs: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_events_are_told_from_tokens() {
        assert!(opens_with_error(
            b"data: {\"error\":{\"message\":\"x\",\"code\":500}}\n\n"
        ));
        assert!(opens_with_error(b"\ndata:{\"error\":{}}"));
        assert!(opens_with_error(
            b"event: error\ndata: {\"type\":\"error\"}"
        ));
        assert!(!opens_with_error(b"data: {\"id\":\"c\",\"choices\":[]}"));
        assert!(!opens_with_error(b"data: [DONE]"));
        assert!(!opens_with_error(b""));
    }
}

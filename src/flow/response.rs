//! The response side of a split request: the decode's response rewritten
//! where a single engine would have answered otherwise (see
//! [`crate::reconcile`]), and the PD timings.
//!
//! A request whose response needs nothing keeps the pass-through path: no
//! response body is read. A non-streamed response is buffered to its end and
//! rewritten once; a stream is rewritten event by event. When the prefill's
//! report are still to come (the legs ran concurrently) the response is
//! paused at the first part that needs them and released, rewritten, when
//! the prefill answers; the prefill call's own timeout bounds the wait.

use super::Flow;
use crate::fleet::Model;
use crate::host::{Action, Counter, Histogram, Host, Level};
use crate::reconcile::{PrefillReport, Rewrite};
use std::rc::Rc;

/// The response's progress through a rewrite.
#[derive(Debug, Default)]
pub(super) struct ResponseRewrite {
    pub rewrite: Option<Rewrite>,
    /// Paused for the prefill's report; `Some(true)` once the upstream ended.
    held: Option<bool>,
    /// The upstream's response reached its end.
    pub ended: bool,
}

/// The PD timings of one request (wall clock).
#[derive(Debug, Default)]
pub(super) struct Timing {
    /// The request's model, once it is known (its name labels the histograms).
    pub model: Option<Rc<Model>>,
    pub started_ms: u64,
    pub body_done_us: u64,
    pub prefill_sent_ms: u64,
    pub prefill_ms: Option<u64>,
    pub routing_us: Option<u64>,
    /// E/P/D: the router's own time was taken when the encoders left; the
    /// prefill that follows them does not take it again.
    pub routed_at_encoders: bool,
}

impl Flow {
    /// The prefill left: the router's own time is known (unless the
    /// encoders' leaving told it already).
    pub(super) fn prefill_left<H: Host>(&mut self, host: &H) {
        // One fresh reading for both: the callback's cached milliseconds
        // date from when the body was read, before the routing work.
        let now = host.now_us();
        self.timing.prefill_sent_ms = now / 1000;
        if !std::mem::take(&mut self.timing.routed_at_encoders) {
            self.routed(host, now);
        }
    }

    /// E/P/D: the encoder calls left, the router's own work before them is
    /// done; the wait for them is not the router's.
    pub(super) fn encoders_left<H: Host>(&mut self, host: &H) {
        self.routed(host, host.now_us());
        self.timing.routed_at_encoders = true;
    }

    fn routed<H: Host>(&mut self, host: &H, now_us: u64) {
        let t = &mut self.timing;
        let us = now_us.saturating_sub(t.body_done_us);
        t.routing_us = Some(us);
        if let Some(m) = &t.model {
            host.record(Histogram::RoutingDuration, &m.name, us);
        }
    }

    /// The prefill answered (whatever it said).
    pub(super) fn prefill_done<H: Host>(&mut self, host: &H) {
        let t = &mut self.timing;
        let ms = host.now_ms().saturating_sub(t.prefill_sent_ms);
        t.prefill_ms = Some(ms);
        if let Some(m) = &t.model {
            host.record(Histogram::PrefillDuration, &m.name, ms);
        }
    }

    /// The prefill's answer arrived for a rewrite that waited for it; a
    /// held response is rewritten and released.
    pub(super) fn apply_report<H: Host>(&mut self, host: &mut H, answer: &[u8]) {
        let Some(rw) = self.response.rewrite.as_mut() else {
            return;
        };
        if rw.has_report() {
            return;
        }
        rw.set_report(PrefillReport::of(rw.plan(), answer));
        let Some(ended) = self.response.held.take() else {
            // Nothing to put in and nothing half-read: the rest of the
            // response takes the pass-through path.
            if !rw.needed() && rw.holds_nothing() {
                self.response.rewrite = None;
            }
            return;
        };
        let body = match host.response_body() {
            Ok(b) => b,
            Err(e) => {
                self.log(host, Level::Warn, &format!("response left as it is: {e}"));
                self.response.rewrite = None;
                return self.resume_response(host);
            }
        };
        let out = if rw.is_stream() {
            rw.chunk(&body, ended)
        } else {
            rw.whole(&body)
        };
        match out {
            Ok(Some(new)) if new != body => self.put_response(host, body.len(), &new),
            Ok(_) => {}
            // ClientFields are set: cannot be asked for again.
            Err(_) => {}
        }
        self.resume_response(host);
    }

    fn resume_response<H: Host>(&self, host: &mut H) {
        if let Err(e) = host.resume_response() {
            self.log(host, Level::Error, &format!("{e}"));
        }
    }

    fn put_response<H: Host>(&mut self, host: &mut H, old_len: usize, new: &[u8]) {
        match host.replace_response_body(old_len, new) {
            Ok(()) => host.increment(Counter::AnswerRewritten),
            Err(e) => self.log(host, Level::Warn, &format!("response left as it is: {e}")),
        }
    }

    /// Response headers: keep the rewrite only for a response it can read
    /// (a 2xx, unencoded, of the expected type), and drop the length it may
    /// change. Records the time to the decode's first byte.
    pub(super) fn rewrite_response_headers<H: Host>(&mut self, host: &mut H) {
        // Requests of a model: split, or sent whole to one of its pods.
        if let Some(m) = &self.timing.model {
            let ms = host.now_ms().saturating_sub(self.timing.started_ms);
            host.record(Histogram::FirstByteDuration, &m.name, ms);
        }
        if self.router.config.timing_headers {
            let t = &self.timing;
            for (name, v) in [
                ("x-pd-prefill-ms", t.prefill_ms),
                ("x-pd-routing-us", t.routing_us),
            ] {
                if let Some(v) = v {
                    let _ = host.set_response_header(name, Some(&v.to_string()));
                }
            }
        }
        let Some(rw) = &self.response.rewrite else {
            return;
        };
        let ok = host
            .response_header(":status")
            .and_then(|s| s.parse::<u16>().ok())
            .is_some_and(|s| (200..300).contains(&s));
        let plain = host
            .response_header("content-encoding")
            .is_none_or(|e| e.eq_ignore_ascii_case("identity"));
        let kind = host.response_header("content-type").unwrap_or_default();
        let expected = if rw.is_stream() {
            "text/event-stream"
        } else {
            "application/json"
        };
        if !(ok && plain && kind.starts_with(expected)) {
            self.response.rewrite = None;
            return;
        }
        if let Err(e) = host.set_response_header("content-length", None) {
            self.log(host, Level::Warn, &format!("response left as it is: {e}"));
            self.response.rewrite = None;
        }
    }

    /// A response body callback.
    pub(super) fn rewrite_response_body<H: Host>(
        &mut self,
        host: &mut H,
        body_size: usize,
        end: bool,
    ) -> Action {
        self.response.ended |= end;
        let action = self.rewrite_response_chunk(host, end);
        if action == Action::Continue && body_size > 0 {
            self.body_seen();
        }
        action
    }

    fn rewrite_response_chunk<H: Host>(&mut self, host: &mut H, end: bool) -> Action {
        let Some(rw) = self.response.rewrite.as_mut() else {
            return Action::Continue;
        };
        if self.response.held.is_some() {
            self.response.held = Some(end);
            return Action::Pause;
        }
        if !rw.is_stream() && !end {
            // Whole responses are rewritten once, at their end.
            return Action::Pause;
        }
        let body = match host.response_body() {
            Ok(b) => b,
            Err(e) => {
                self.log(host, Level::Warn, &format!("response left as it is: {e}"));
                self.response.rewrite = None;
                return Action::Continue;
            }
        };
        let out = if rw.is_stream() {
            rw.chunk(&body, end)
        } else {
            rw.whole(&body)
        };
        match out {
            Ok(Some(new)) => {
                if new != body {
                    self.put_response(host, body.len(), &new);
                }
                Action::Continue
            }
            Ok(None) => Action::Continue,
            Err(_) => {
                // Nothing of this went out; released when the prefill answers.
                self.response.held = Some(end);
                Action::Pause
            }
        }
    }

    /// The prefill failed while the response waited for it: what already
    /// reached the client shows the hand-off worked, so the rest goes on
    /// as the decode wrote it.
    pub(super) fn release_unrewritten<H: Host>(&mut self, host: &mut H) {
        self.response.rewrite = None;
        if self.response.held.take().is_some() {
            self.resume_response(host);
        }
    }

    pub(super) fn is_held(&self) -> bool {
        self.response.held.is_some()
    }
}

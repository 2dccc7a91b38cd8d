//! The request's phases and every move between them. Stages return what
//! comes next ([`Next`]); only this file writes `Flow::phase`.
//!
//! ```text
//! Start ──headers──▶ Buffering ──body──▶ Queued ──room──▶ AwaitingPrefill ──answer──▶ Forwarded
//!   │                    │                 │                  │      ▲ retry                ▲
//!   │                    └─────────────────┴──────────────────┴──────┴───────────────────────┘
//!   └──(pass-through)──▶ Forwarded            any phase ──error or local answer──▶ Replied
//! ```
//!
//! An E/P/D request with media passes through `Encoding` (its encoder legs
//! in flight) on its way to `AwaitingPrefill` or `Forwarded`: wherever a
//! prefill would be sent, the encoders go first.

use super::{Attempt, Flow};
use crate::api::Api;
use crate::calls::BodyKind;
use crate::error::PdError;
use crate::fleet::Endpoint;
use crate::handoff::AbortCall;
use crate::host::{Action, Counter, Host, Level};
use crate::split::{SplitPlan, SplitRequest};
use std::rc::Rc;

/// A request waiting for room.
pub(super) struct QueuedRequest {
    pub request: SplitRequest,
    pub since_ms: u64,
}

/// A sequential prefill in flight.
pub(super) struct PendingPrefill {
    pub token: u32,
    pub plan: SplitPlan,
    pub attempt: Attempt,
}

/// An E/P/D split's encoder legs in flight; its prefill leaves when the
/// last one answers 200.
pub(super) struct PendingEncode {
    pub plan: SplitPlan,
    pub attempt: Attempt,
    /// The calls not answered yet, with their pods.
    pub calls: Vec<(u32, Rc<Endpoint>)>,
    /// What the answers in so far hand to the prefill: each one's
    /// `ec_transfer_params` (NIXL), if it carried one.
    pub params: Vec<Option<String>>,
}

/// A concurrent (SGLang) prefill still in flight after the decode left.
#[derive(Debug)]
pub(super) struct WatchedPrefill {
    pub token: u32,
    pub pod: Rc<Endpoint>,
    /// How to abort it if the stream ends first.
    pub abort: Option<Box<AbortCall>>,
}

/// What a buffered body is for.
#[derive(Debug, Clone)]
pub(super) enum Buffered {
    /// A split path.
    Split(Api),
    /// A call routed by the model it names.
    ByModel(BodyKind),
    /// A call that is not a POST but has a body: checked, then to a decode
    /// pod of any model.
    PassThrough(BodyKind),
}

pub(super) enum Phase {
    /// Before request headers.
    Start,
    /// Collecting the body.
    Buffering(Buffered),
    /// Waiting for room (admission control).
    Queued(Box<QueuedRequest>),
    /// Paused until the encoders answer (E/P/D).
    Encoding(Box<PendingEncode>),
    /// Paused until the prefill answers.
    AwaitingPrefill(Box<PendingPrefill>),
    /// The request went upstream. For concurrent engines the prefill may
    /// still be in flight; `body_seen` tells whether decode output already
    /// reached the client.
    Forwarded {
        watched: Option<WatchedPrefill>,
        body_seen: bool,
    },
    /// A local reply ended the stream.
    Replied,
}

/// What a stage did with the request, and so what the stream does next.
pub(super) enum Next {
    /// Collect the body first (the header map stays writable).
    Buffer(Buffered),
    /// Wait for room.
    Queue(Box<QueuedRequest>),
    /// Wait for the encoders' answers.
    AwaitEncode(Box<PendingEncode>),
    /// Wait for the prefill's answer.
    AwaitPrefill(Box<PendingPrefill>),
    /// Go upstream now; a concurrent prefill may still be in flight.
    Upstream(Option<WatchedPrefill>),
    /// The stage answered the client itself.
    Replied,
}

impl Flow {
    /// Enters the phase `next` leads to; whether the request goes upstream
    /// now.
    pub(super) fn enter(&mut self, next: Next) -> bool {
        let (phase, upstream) = match next {
            Next::Buffer(kind) => (Phase::Buffering(kind), false),
            Next::Queue(q) => (Phase::Queued(q), false),
            Next::AwaitEncode(e) => (Phase::Encoding(e), false),
            Next::AwaitPrefill(p) => (Phase::AwaitingPrefill(p), false),
            Next::Upstream(watched) => (
                Phase::Forwarded {
                    watched,
                    body_seen: false,
                },
                true,
            ),
            Next::Replied => (Phase::Replied, false),
        };
        self.phase = phase;
        upstream
    }

    /// A request callback's action after a stage: continue upstream, or
    /// stay paused; an error is answered.
    pub(super) fn act<H: Host>(&mut self, host: &mut H, next: Result<Next, PdError>) -> Action {
        match next.map(|next| self.enter(next)) {
            Ok(true) => Action::Continue,
            Ok(false) => Action::Pause,
            Err(e) => self.fail(host, e),
        }
    }

    /// After a stage run from a call's answer or the admission tick (the
    /// request is paused): resume it when it goes upstream; an error is
    /// answered.
    pub(super) fn resume_after<H: Host>(&mut self, host: &mut H, next: Result<Next, PdError>) {
        let resumed = match next.map(|next| self.enter(next)) {
            Ok(true) => host.resume_request().map_err(PdError::from),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = resumed {
            self.fail(host, e);
        }
    }

    /// Ends the stream with the error's reply.
    pub(super) fn fail<H: Host>(&mut self, host: &mut H, err: PdError) -> Action {
        let reply = err.reply();
        let level = if reply.status >= 500 {
            Level::Warn
        } else {
            Level::Info
        };
        self.log(
            host,
            level,
            &format!("{} {}: {err}", reply.status, self.head.path),
        );
        host.increment(Counter::LocalReply);
        host.count_reply(reply.status);
        self.trace_status(reply.status, Some(err.to_string()));
        self.release(host, super::load::Release::All, None);
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(reply.headers.iter().map(|(k, v)| (*k, v.as_str())));
        let sent = host.send_reply(reply.status, &headers, &reply.body);
        if let Err(e) = sent {
            self.log(
                host,
                Level::Error,
                &format!("could not send a local reply: {e}"),
            );
        }
        self.phase = Phase::Replied;
        Action::Pause
    }

    /// The paused request's pending prefill, when `token` is its call; the
    /// phase is then `Replied` until the stage says what comes next.
    pub(super) fn take_awaiting(&mut self, token: u32) -> Option<PendingPrefill> {
        match &self.phase {
            Phase::AwaitingPrefill(p) if p.token == token => {}
            _ => return None,
        }
        match std::mem::replace(&mut self.phase, Phase::Replied) {
            Phase::AwaitingPrefill(p) => Some(*p),
            _ => None,
        }
    }

    /// The encoding request whose call `token` is, out of the phase (now
    /// `Replied` until the stage says what comes next).
    pub(super) fn take_encoding(&mut self, token: u32) -> Option<PendingEncode> {
        match &self.phase {
            Phase::Encoding(e) if e.calls.iter().any(|(t, _)| *t == token) => {}
            _ => return None,
        }
        match std::mem::replace(&mut self.phase, Phase::Replied) {
            Phase::Encoding(e) => Some(*e),
            _ => None,
        }
    }

    /// The concurrent prefill `token` watched after its decode left, no
    /// longer watched; with whether decode output reached the client.
    pub(super) fn take_watched(&mut self, token: u32) -> Option<(WatchedPrefill, bool)> {
        let Phase::Forwarded { watched, body_seen } = &mut self.phase else {
            return None;
        };
        if watched.as_ref().is_none_or(|w| w.token != token) {
            return None;
        }
        watched.take().map(|w| (w, *body_seen))
    }

    /// Decode output reached the client.
    pub(super) fn body_seen(&mut self) {
        if let Phase::Forwarded { body_seen, .. } = &mut self.phase {
            *body_seen = true;
        }
    }

    /// The waiting request, out of the phase (now `Replied`).
    pub(super) fn take_queued_phase(&mut self) -> Option<QueuedRequest> {
        if !matches!(self.phase, Phase::Queued(_)) {
            return None;
        }
        match std::mem::replace(&mut self.phase, Phase::Replied) {
            Phase::Queued(q) => Some(*q),
            _ => None,
        }
    }

    /// The waiting request, in place.
    pub(super) fn queued_mut(&mut self) -> Option<&mut QueuedRequest> {
        match &mut self.phase {
            Phase::Queued(q) => Some(q),
            _ => None,
        }
    }

    /// The stream ended: a request still waiting leaves its queue, one
    /// awaiting its encoders or its prefill is forgotten (they run on), and a
    /// watched concurrent prefill whose response never ended, or whose
    /// decode failed, is aborted where its engine has a route for it.
    pub(super) fn end_phase<H: Host>(&mut self, host: &mut H) {
        if let Phase::Forwarded {
            watched: Some(w), ..
        } = &self.phase
        {
            if !self.response.ended || self.decode_refused() {
                if let Some(abort) = &w.abort {
                    self.abort_prefill(host, &w.pod, abort);
                }
            }
        }
        if matches!(self.phase, Phase::Queued(_)) {
            self.leave_queue(host);
        }
        // Encoder calls, like a prefill, run on: Envoy cannot cancel them.
        if matches!(self.phase, Phase::AwaitingPrefill(_) | Phase::Encoding(_)) {
            host.increment(Counter::ClientGone);
            self.phase = Phase::Replied;
        }
    }
}

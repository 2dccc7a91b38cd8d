//! Load a stream holds on its pods: taken when they are chosen, given back
//! when their part ends or when the stream does, exactly once.

use super::Flow;
use crate::fleet::{Endpoint, ModelId};
use crate::host::{Counter, Host, Level, PodEvent};
use crate::load::HeldLoad;
use crate::load::Verdict;
use std::rc::Rc;

/// Which held load to give back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    /// The prefill answered (or failed); the decode goes on.
    Prefill,
    /// The decode will not be sent where it was held (a prefill retry).
    Decode,
    /// The prefill pod no longer holds the stream's conversation (a retry
    /// moves it to another).
    Stream,
    /// The stream is done with both.
    All,
}

/// What a prefill answer said about its pod.
pub(super) struct Judgement<'a> {
    pub pod: &'a Endpoint,
    pub verdict: Verdict,
    pub cause: String,
}

impl Flow {
    /// Takes load on the chosen pods (the prefill's with the prompt tokens
    /// it computes) and counts the selections. A split's prefill pod also
    /// counts the stream as live until it ends; a retry on another prefill
    /// pod moves that count. For a request admission control just let in
    /// (`admitted`), false when another worker took the pods' last place
    /// since the look: nothing is held or counted, and the request waits
    /// again.
    pub(super) fn hold<H: Host>(
        &mut self,
        host: &mut H,
        model: ModelId,
        prefill: Option<(&Rc<Endpoint>, u64)>,
        decode: Option<&Rc<Endpoint>>,
        admitted: bool,
    ) -> bool {
        if prefill.is_some() {
            self.release(host, Release::Stream, None);
        }
        let router = Rc::clone(&self.router);
        let taken = HeldLoad {
            model,
            prefill: prefill.map(|(p, _)| p.id),
            prefill_tokens: prefill.map_or(0, |(_, tokens)| tokens),
            decode: decode.map(|d| d.id),
            streaming: prefill.map(|(p, _)| p.id),
        };
        let now = host.now_ms();
        let held = if admitted {
            router.hold_admitted(host, taken, now)
        } else {
            router.hold(host, taken, now).map(|()| true)
        };
        match held {
            Ok(false) => {
                host.increment(Counter::AdmissionRaceLost);
                return false;
            }
            Ok(true) => {
                let (prefill, prefill_tokens) = match taken.prefill {
                    Some(p) => (Some(p), taken.prefill_tokens),
                    None => (self.held.prefill, self.held.prefill_tokens),
                };
                self.held = HeldLoad {
                    model,
                    prefill,
                    prefill_tokens,
                    decode: taken.decode.or(self.held.decode),
                    streaming: taken.streaming.or(self.held.streaming),
                };
            }
            // Routing goes on without load accounting rather than failing.
            Err(e) => self.log(
                host,
                Level::Error,
                &format!("could not update pod load: {e}"),
            ),
        }
        if let Some((p, _)) = prefill {
            host.count_pod(&p.name, PodEvent::PrefillSelected);
        }
        if let Some(d) = decode {
            host.count_pod(&d.name, PodEvent::DecodeSelected);
        }
        true
    }

    /// Gives back held load, and applies what a prefill answer said about its
    /// pod, in one shared-data update.
    pub(super) fn release<H: Host>(
        &mut self,
        host: &mut H,
        which: Release,
        judged: Option<Judgement>,
    ) {
        let prefill = match which {
            Release::Prefill | Release::All => self.held.prefill.take(),
            Release::Decode | Release::Stream => None,
        };
        let decode = match which {
            Release::Decode | Release::All => self.held.decode.take(),
            Release::Prefill | Release::Stream => None,
        };
        let streaming = match which {
            Release::Stream | Release::All => self.held.streaming.take(),
            Release::Prefill | Release::Decode => None,
        };
        if prefill.is_none() && decode.is_none() && streaming.is_none() && judged.is_none() {
            return;
        }
        let released = HeldLoad {
            model: self.held.model,
            prefill,
            prefill_tokens: self.held.prefill_tokens,
            decode,
            streaming,
        };
        let router = Rc::clone(&self.router);
        let judged = judged
            .as_ref()
            .map(|j| (j.pod, j.verdict, j.cause.as_str()));
        let now = host.now_ms();
        match router.release(host, released, judged, now) {
            Ok(Some(ejection)) => {
                host.increment(Counter::Ejection);
                host.count_pod(&ejection.pod, PodEvent::Ejected);
                self.log(host, Level::Warn, &ejection.message);
            }
            Ok(None) => {}
            Err(e) => self.log(
                host,
                Level::Error,
                &format!("could not update pod load: {e}"),
            ),
        }
    }
}

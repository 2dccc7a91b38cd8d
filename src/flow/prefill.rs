//! The prefill leg: dispatching it, classifying its answer, and what follows
//! (the decode, a retry on another pod, or the client's error).

use super::ids::HostIds;
use super::load::{Judgement, Release};
use super::phase::{Next, PendingPrefill, WatchedPrefill};
use super::Flow;
use crate::error::{
    envoy_failure, upstream_message, EnvoyFailure, HostError, PdError, PrefillFailure,
};
use crate::fleet::Endpoint;
use crate::handoff::{AbortCall, Degraded};
use crate::host::{Counter, Host, Level};
use crate::load::Verdict;
use crate::split::{self, AfterPrefill, SplitPlan};
use std::rc::Rc;

/// How long an abort call may take: it answers at once or not at all.
const ABORT_TIMEOUT_MS: u64 = 2_000;

/// What a prefill answer says about its pod. `on_termination` is what a
/// connection closed before any answer earns where it was seen: nothing when
/// the request is resent for it, else a strike.
pub(super) fn verdict(outcome: &Result<(), PrefillFailure>, on_termination: Verdict) -> Verdict {
    match outcome {
        Ok(()) => Verdict::Worked,
        Err(PrefillFailure::Unreachable(_) | PrefillFailure::Reset) => Verdict::Down,
        Err(PrefillFailure::Terminated(_)) => on_termination,
        Err(PrefillFailure::Timeout | PrefillFailure::ServerError { .. }) => Verdict::Failed,
        // The gateway's own breaker refused the call: it never reached the pod.
        Err(_) => Verdict::Neutral,
    }
}

/// Failures another prefill pod may not have (SMG's list: 408, 429, 5xx).
fn retryable(f: &PrefillFailure) -> bool {
    matches!(
        f,
        PrefillFailure::Unreachable(_)
            | PrefillFailure::Terminated(_)
            | PrefillFailure::Reset
            | PrefillFailure::Timeout
            | PrefillFailure::ServerError { .. }
            | PrefillFailure::Rejected {
                status: 408 | 429,
                ..
            }
    )
}

/// Classifies a prefill answer by status before anything parses its body:
/// Envoy reports refused connections as 503 and its own timeout as 504.
pub(super) fn classify(
    status: Option<u16>,
    body: impl FnOnce() -> Result<Vec<u8>, HostError>,
) -> Result<(), PrefillFailure> {
    let message = || upstream_message(&body().unwrap_or_default());
    match status {
        None => Err(PrefillFailure::Reset),
        Some(s) if (200..300).contains(&s) => Ok(()),
        Some(504) => Err(PrefillFailure::Timeout),
        Some(503) => Err(envoy_503(message())),
        Some(s) if (400..500).contains(&s) => Err(PrefillFailure::Rejected {
            status: s,
            message: message(),
        }),
        Some(s) => Err(PrefillFailure::ServerError {
            status: s,
            message: message(),
        }),
    }
}

/// Tells Envoy's own 503s from an engine's: only a pod that cannot be
/// reached is `Unreachable`.
fn envoy_503(message: String) -> PrefillFailure {
    match envoy_failure(&message) {
        None => PrefillFailure::ServerError {
            status: 503,
            message,
        },
        Some(EnvoyFailure::Overflow) => PrefillFailure::Overflow,
        Some(EnvoyFailure::Terminated) => PrefillFailure::Terminated(message),
        Some(EnvoyFailure::Unreachable) => PrefillFailure::Unreachable(message),
    }
}

impl Flow {
    pub(super) fn dispatch_prefill<H: Host>(
        &self,
        host: &mut H,
        plan: &SplitPlan,
    ) -> Result<u32, PdError> {
        let config = &self.router.config;
        let pod = &plan.prefill_pod;
        let authority = if self.head.authority.is_empty() {
            pod.address.as_str()
        } else {
            self.head.authority.as_str()
        };
        let mut headers: Vec<(&str, &str)> = Vec::with_capacity(8 + self.head.forwarded.len());
        headers.push((":method", "POST"));
        headers.push((":path", &self.head.path));
        headers.push((":authority", authority));
        headers.push(("content-type", "application/json"));
        headers.push((&config.routing.header, &pod.address));
        if !self.head.id.is_empty() {
            headers.push(("x-request-id", &self.head.id));
        }
        let traceparent = self.trace_prefill(host, &pod.name);
        for (k, v) in &self.head.forwarded {
            if *k == "traceparent" && traceparent.is_some() {
                continue;
            }
            headers.push((k, v));
        }
        if let Some(t) = &traceparent {
            headers.push(("traceparent", t));
        }
        // The hand-off's own headers replace the client's of the same name
        // (a request id both legs must share); never the routing header.
        for (k, v) in &plan.prefill_headers {
            if *k == config.routing.header || k.starts_with(':') {
                continue;
            }
            headers.retain(|(name, _)| name != k);
            headers.push((k, v));
        }
        host.dispatch(
            &config.routing.prefill_cluster,
            &headers,
            &plan.prefill_body,
            config.prefill.timeout_ms,
        )
        .map_err(|e| {
            // A call Envoy ends before dispatch_http_call returns gets no
            // token but `InternalFailure` (an unknown cluster or bad headers
            // are `BadArgument`). Its circuit breaker does that when the
            // cluster's connection pool already exists: the refusal is
            // inline, seen in the same burst as the answered 503s.
            if e.status == "InternalFailure" {
                return PdError::Prefill(PrefillFailure::Overflow);
            }
            PdError::Prefill(PrefillFailure::Dispatch(format!(
                "cluster {:?}: {e}",
                config.routing.prefill_cluster
            )))
        })
    }

    /// Aborts a prefill on `pod` by its engine's route (`abort`): its
    /// stream ended before it answered, and it would hold its KV until the
    /// engine's timeout. Fire and forget: the answer reaches no stream.
    pub(super) fn abort_prefill<H: Host>(&self, host: &mut H, pod: &Endpoint, abort: &AbortCall) {
        let config = &self.router.config;
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", abort.path),
            (":authority", &pod.address),
            ("content-type", "application/json"),
            (&config.routing.header, &pod.address),
        ];
        if !self.head.id.is_empty() {
            headers.push(("x-request-id", &self.head.id));
        }
        let timeout = config.prefill.timeout_ms.min(ABORT_TIMEOUT_MS);
        match host.dispatch(
            &config.routing.prefill_cluster,
            &headers,
            abort.body.as_bytes(),
            timeout,
        ) {
            Ok(_) => {
                host.increment(Counter::PrefillAborted);
                self.debug(host, || {
                    format!("prefill on {} aborted: {}", pod.name, abort.path)
                });
            }
            Err(e) => {
                host.increment(Counter::PrefillAbortFailed);
                self.log(
                    host,
                    Level::Warn,
                    &format!(
                        "could not abort the prefill on {}: {e}; it runs until the engine's timeout",
                        pod.name
                    ),
                )
            }
        }
    }

    /// The prefill call answered: `status` is `None` when the connection was
    /// reset before any header.
    pub fn on_prefill_response<H: Host>(
        &mut self,
        host: &mut H,
        token: u32,
        status: Option<u16>,
        body_size: usize,
    ) {
        if let Some(pending) = self.take_encoding(token) {
            self.encoder_answered(host, pending, token, status, body_size);
        } else if let Some(pending) = self.take_awaiting(token) {
            self.sequential_answered(host, pending, status, body_size);
        } else if let Some((watched, body_seen)) = self.take_watched(token) {
            self.concurrent_answered(host, watched, body_seen, status, body_size);
        }
        // Otherwise a stale token: the stream already replied or moved on.
    }

    /// A sequential prefill answered: the decode goes, or a retry, or the
    /// error.
    fn sequential_answered<H: Host>(
        &mut self,
        host: &mut H,
        pending: PendingPrefill,
        status: Option<u16>,
        body_size: usize,
    ) {
        let pod = Rc::clone(&pending.plan.prefill_pod);
        let on_termination = if pending.attempt.resent {
            Verdict::Down
        } else {
            Verdict::Neutral
        };
        // A prefill reading another pod's KV fails when that KV is gone:
        // not this pod's fault.
        let sourced = pending.plan.request.kv_source.is_some();
        let outcome = self.prefill_answered(host, &pod, status, body_size, on_termination, sourced);
        let next = match outcome {
            // The decode leaves in this callback: a vLLM NIXL
            // prefill's KV lease (kv_lease_duration, from when the
            // engine finished) cannot run out on the router's side.
            Ok(()) => self.finish(host, pending, body_size),
            Err(f) => self.retry_or_fail(host, pending, f),
        };
        if let Err(PdError::Prefill(_)) = &next {
            host.increment(Counter::PrefillFailed);
        }
        self.resume_after(host, next);
    }

    /// A concurrent prefill answered after its decode left.
    fn concurrent_answered<H: Host>(
        &mut self,
        host: &mut H,
        w: WatchedPrefill,
        body_seen: bool,
        status: Option<u16>,
        body_size: usize,
    ) {
        // No resend: the decode already went out with this
        // prefill's room. A keep-alive race is one strike in a streak.
        let outcome =
            self.prefill_answered(host, &w.pod, status, body_size, Verdict::Failed, false);
        let Err(failure) = outcome else {
            if self.response.rewrite.is_some() {
                match host.call_response_body(body_size) {
                    Ok(answer) => self.apply_report(host, &answer),
                    Err(_) => {
                        self.release_unrewritten(host);
                    }
                }
            }
            return;
        };
        host.increment(Counter::PrefillFailed);
        if body_seen && self.is_held() {
            self.release_unrewritten(host);
        }
        if body_seen {
            // Decode output already reached the client, so the
            // hand-off worked; the prefill's late error is noise.
            let msg = format!("prefill failed after the decode produced output: {failure}");
            self.log(host, Level::Warn, &msg);
        } else {
            // Without its prefill the decode would wait out its
            // bootstrap timeout: fail now. After the response headers
            // this cuts the stream short. No retry: the decode already
            // went out with this prefill's room.
            self.fail(host, PdError::ConcurrentPrefill(failure));
        }
    }

    /// What every prefill answer leads to first, whatever follows: its time
    /// recorded, its status classified, its load given back with what it
    /// says about its pod.
    fn prefill_answered<H: Host>(
        &mut self,
        host: &mut H,
        pod: &Endpoint,
        status: Option<u16>,
        body_size: usize,
        on_termination: Verdict,
        sourced: bool,
    ) -> Result<(), PrefillFailure> {
        self.prefill_done(host);
        let outcome = classify(status, || host.call_response_body(body_size));
        if self.trace.is_some() {
            let error = outcome.as_ref().err().map(ToString::to_string);
            self.trace_prefill_answered(host.now_us(), status, error);
        }
        let judged = Judgement {
            pod,
            verdict: match verdict(&outcome, on_termination) {
                Verdict::Failed if sourced => Verdict::Neutral,
                v => v,
            },
            cause: cause(&outcome),
        };
        self.release(host, Release::Prefill, Some(judged));
        outcome
    }

    /// A prefill that was to read its prefix from the session's last
    /// decode failed: that KV may be gone (read, run out, its pod
    /// restarted), and vLLM's default `kv_load_failure_policy: fail`
    /// answers 500. Once more without it, on any pod, free of the retry
    /// budget; the handle is not sent again (its blocks serve one read).
    fn resend_unsourced<H: Host>(
        &mut self,
        host: &mut H,
        p: PendingPrefill,
        failure: PrefillFailure,
    ) -> Result<Next, PdError> {
        host.increment(Counter::KvReuseFailed);
        let msg = format!(
            "prefill {} failed reading the session's last decode KV ({failure}); resending without it",
            p.plan.prefill_pod.address
        );
        self.log(host, Level::Info, &msg);
        self.release(host, Release::Decode, None);
        let mut request = p.plan.request;
        request.kv_source = None;
        let mut attempt = p.attempt;
        attempt.full = self.full_now(host, &request);
        self.place(host, request, attempt)
            .map_err(|_| PdError::Prefill(failure))
    }

    /// A failed sequential prefill: place the request again on another pod
    /// while retries remain, else fail with the prefill's error.
    fn retry_or_fail<H: Host>(
        &mut self,
        host: &mut H,
        p: PendingPrefill,
        failure: PrefillFailure,
    ) -> Result<Next, PdError> {
        if p.plan.request.kv_source.is_some() && retryable(&failure) {
            return self.resend_unsourced(host, p, failure);
        }
        let max = self.router.config.prefill.max_retries;
        // A connection closed before any answer is most often a keep-alive
        // race (the pod closed an idle pooled connection as the call went
        // out): one resend on a new connection, free of the retry budget.
        let resend = matches!(failure, PrefillFailure::Terminated(_)) && !p.attempt.resent;
        if !retryable(&failure) || (p.attempt.number >= max && !resend) {
            return Err(PdError::Prefill(failure));
        }
        let msg = if resend {
            format!(
                "prefill {} closed the connection before answering ({failure}); resending",
                p.plan.prefill_pod.address
            )
        } else {
            format!(
                "prefill {} failed ({failure}); retrying on another pod",
                p.plan.prefill_pod.address
            )
        };
        self.log(host, Level::Info, &msg);
        host.increment(Counter::PrefillRetry);
        self.release(host, Release::Decode, None);
        let mut attempt = p.attempt;
        if resend {
            // Any pod may take it, the same included: a new call is a new
            // connection.
            attempt.resent = true;
        } else {
            attempt.failed_on.push(p.plan.prefill_pod.id);
            attempt.number += 1;
        }
        attempt.full = self.full_now(host, &p.plan.request);
        match self.place(host, p.plan.request, attempt) {
            Ok(next) => Ok(next),
            // Nowhere left to go: the prefill's own failure says more.
            Err(PdError::Unavailable(_)) | Err(PdError::NoEndpoint { .. }) => {
                Err(PdError::Prefill(failure))
            }
            Err(e) => Err(e),
        }
    }

    /// A sequential prefill succeeded: merge its answer and send the decode,
    /// or answer the client with it.
    fn finish<H: Host>(
        &mut self,
        host: &mut H,
        p: PendingPrefill,
        body_size: usize,
    ) -> Result<Next, PdError> {
        let answer = host.call_response_body(body_size)?;
        let router = Rc::clone(&self.router);
        let fleet = router.fleet();
        let mut ids = HostIds {
            router: &router,
            host: &mut *host,
        };
        match split::merge(
            &router.view(&fleet, &router.learned()),
            &mut ids,
            &p.plan,
            &answer,
        )? {
            AfterPrefill::Reply { body, content_type } => {
                host.increment(Counter::ContextAnswered);
                self.release(host, Release::All, None);
                if let Err(e) = host.send_reply(200, &[("content-type", content_type)], &body) {
                    self.log(
                        host,
                        Level::Error,
                        &format!("could not send a local reply: {e}"),
                    );
                }
                return Ok(Next::Replied);
            }
            AfterPrefill::Decode {
                body,
                headers,
                degraded,
                report,
            } => {
                if let (Some(plan), Some(report)) = (&p.plan.rewrite, report) {
                    let rw = crate::reconcile::Rewrite::new(plan.clone(), Some(*report));
                    self.response.rewrite = rw.needed().then_some(rw);
                }
                if let Some(degraded) = degraded {
                    self.report_degraded(host, &p.plan, degraded);
                }
                super::decode::set_headers(host, &headers)?;
                let decode = &p.plan.decode_pod.address;
                match body {
                    // Envoy's buffer and content-length stay as the client sent them.
                    None => host.set_request_header(&router.config.routing.header, Some(decode))?,
                    Some(body) => self.send_decode(host, &body, decode)?,
                }
            }
        }
        self.watch_decode(&p.plan.prefill_pod, &p.plan.decode_pod);
        Ok(Next::Upstream(None))
    }
}

impl Flow {
    /// Counts a hand-off that went ahead without part of it, and says so:
    /// every time for a missing hand-off (each costs a recomputed prompt),
    /// once per prefill pod for missing token ids (an engine version trait,
    /// not an event).
    fn report_degraded<H: Host>(&self, host: &H, plan: &SplitPlan, degraded: Degraded) {
        let (prefill, decode) = (&plan.prefill_pod, &plan.decode_pod);
        match degraded {
            Degraded::HandoffMissing => {
                host.increment(Counter::HandoffMissing);
                let msg = format!(
                    "prefill {} answered without hand-off data; decode {} will compute the prompt itself",
                    prefill.address, decode.address
                );
                self.log(host, Level::Warn, &msg);
            }
            Degraded::TokenIdsMissing => {
                host.increment(Counter::TokenIdsMissing);
                if self.router.first_time(prefill.id, "token ids missing") {
                    let msg = format!(
                        "context server {} answers without prompt_token_ids (an older TensorRT-LLM chat endpoint); generation servers tokenise the prompt themselves (logged once per pod)",
                        prefill.name
                    );
                    self.log(host, Level::Warn, &msg);
                }
            }
        }
    }
}

/// Why a pod might be ejected, for the log line.
fn cause(outcome: &Result<(), PrefillFailure>) -> String {
    match outcome {
        Ok(()) => String::new(),
        Err(f) => format!("prefill: {f}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy 1.40's bodies, as read through its router (see docs/errors.md).
    const OVERFLOW: &str =
        "upstream connect error or disconnect/reset before headers. reset reason: overflow";
    const TERMINATION: &str = "upstream connect error or disconnect/reset before headers. reset reason: connection termination";
    const REFUSED: &str = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";
    const REFUSED_OLD: &str = "upstream connect error or disconnect/reset before headers. reset reason: connection failure, transport failure reason: delayed connect error: 111";

    fn classified(status: u16, body: &str) -> Result<(), PrefillFailure> {
        classify(Some(status), || Ok(body.as_bytes().to_vec()))
    }

    #[test]
    fn envoys_own_503s_are_told_apart_by_their_reset_reason() {
        assert_eq!(classified(503, OVERFLOW), Err(PrefillFailure::Overflow));
        assert!(matches!(
            classified(503, TERMINATION),
            Err(PrefillFailure::Terminated(_))
        ));
        for refused in [REFUSED, REFUSED_OLD, "no healthy upstream"] {
            assert!(
                matches!(
                    classified(503, refused),
                    Err(PrefillFailure::Unreachable(_))
                ),
                "{refused}"
            );
        }
        // An engine's own 503 is a server error, whatever it says.
        assert!(matches!(
            classified(503, r#"{"error":{"message":"overflow"}}"#),
            Err(PrefillFailure::ServerError { status: 503, .. })
        ));
    }

    #[test]
    fn only_a_pod_that_cannot_be_reached_is_struck_at_once() {
        let judged = |body, on_termination| verdict(&classified(503, body), on_termination);
        assert_eq!(judged(OVERFLOW, Verdict::Down), Verdict::Neutral);
        assert_eq!(judged(TERMINATION, Verdict::Neutral), Verdict::Neutral);
        assert_eq!(judged(TERMINATION, Verdict::Down), Verdict::Down);
        assert_eq!(judged(REFUSED, Verdict::Neutral), Verdict::Down);
        assert!(
            !retryable(&PrefillFailure::Overflow),
            "the breaker is the cluster's"
        );
        assert!(retryable(&PrefillFailure::Terminated(String::new())));
    }

    #[test]
    fn the_gateways_own_limit_is_a_503_that_says_so() {
        for e in [
            PdError::Prefill(PrefillFailure::Overflow),
            PdError::ConcurrentPrefill(PrefillFailure::Overflow),
        ] {
            let reply = e.reply();
            assert_eq!(reply.status, 503);
            let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
            assert_eq!(v["error"]["code"], "gateway_overloaded");
            assert!(v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("gateway's own limit")));
            assert_eq!(reply.headers, vec![("retry-after", "1".to_owned())]);
        }
    }
}

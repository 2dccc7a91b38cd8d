//! Sending a VM's finished spans to the OpenTelemetry collector
//! (`tracing`): OTLP/HTTP JSON, up to `max_batch_spans` a call and a few
//! calls in flight, from the root context, whose calls outlive any
//! request. A call that fails loses its spans (counted): traces are worth
//! less than the memory and the calls a retry queue would take when the
//! collector is down.

use super::host::RootHost;
use crate::host::{Counter, Level};
use crate::router::Router;
use crate::trace::otlp;
use std::collections::HashMap;

/// Export calls in flight at most, per VM.
const MAX_IN_FLIGHT: usize = 4;

/// A failed export is logged at most this often.
const LOG_EVERY_MS: u64 = 60_000;

#[derive(Default)]
pub struct Exporter {
    /// Call token → the spans it carries.
    calls: HashMap<u32, u64>,
    last_failure_log_ms: Option<u64>,
}

impl Exporter {
    pub fn owns(&self, token: u32) -> bool {
        self.calls.contains_key(&token)
    }

    /// Sends what is waiting, as far as the calls in flight allow.
    pub fn send<H: RootHost>(&mut self, host: &mut H, router: &Router, now: u64) {
        let Some(t) = &router.config.tracing else {
            return;
        };
        while self.calls.len() < MAX_IN_FLIGHT && router.spans.waiting() > 0 {
            let spans = router.spans.take(t.max_batch_spans);
            let n = spans.len() as u64;
            let body = otlp::encode(&t.service_name, &spans);
            let headers = [
                (":method", "POST"),
                (":path", t.path.as_str()),
                (":authority", t.authority()),
                ("content-type", "application/json"),
            ];
            match host.post(&t.cluster, &headers, &body, t.timeout_ms) {
                Ok(token) => {
                    self.calls.insert(token, n);
                }
                Err(e) => {
                    let why = format!("could not call cluster {:?}: {}", t.cluster, e.status);
                    self.failed(host, n, &why, now);
                    return;
                }
            }
        }
    }

    /// An export call answered (`status` `None`: no answer).
    pub fn on_answer<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        token: u32,
        status: Option<u16>,
    ) {
        let Some(n) = self.calls.remove(&token) else {
            return;
        };
        let now = host.now_ms();
        match status {
            Some(s) if (200..300).contains(&s) => host.add(Counter::SpansExported, n),
            Some(s) => self.failed(host, n, &format!("the collector answered {s}"), now),
            None => self.failed(host, n, "no answer (timeout or connection failure)", now),
        }
        // A busy VM fills batches faster than its ticks come.
        self.send(host, router, now);
    }

    fn failed<H: RootHost>(&mut self, host: &H, spans: u64, why: &str, now: u64) {
        host.increment(Counter::SpanExportFailed);
        host.add(Counter::SpansDropped, spans);
        if self
            .last_failure_log_ms
            .is_none_or(|t| now.saturating_sub(t) >= LOG_EVERY_MS)
        {
            self.last_failure_log_ms = Some(now);
            host.log(
                Level::Warn,
                &format!("pd-router: could not export {spans} spans: {why}; they are dropped (span_exports_failed, spans_dropped; logged at most once a minute)"),
            );
        }
    }
}

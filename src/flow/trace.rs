//! The request's spans (`tracing`, [`crate::trace`]): one for the request,
//! and as its children the router's decision, each prefill attempt and the
//! decode's hand-off. Each leg's request carries a `traceparent` naming its
//! span, so an engine that traces nests its spans under the leg. The spans
//! are handed to the VM's buffer when the stream ends; the root exports
//! them.

use super::Flow;
use crate::fleet::Endpoint;
use crate::host::{Counter, Host};
use crate::split::{SplitPlan, SplitRequest, UnsplitReason};
use crate::trace::{AttrValue, Span, SpanKind, TraceContext};
use std::cell::RefCell;

type Attributes = Vec<(&'static str, AttrValue)>;

/// A span while it runs.
#[derive(Debug)]
struct Open {
    id: [u8; 8],
    start_us: u64,
    end_us: Option<u64>,
    attributes: Attributes,
    error: Option<String>,
}

impl Open {
    fn end(&mut self, now: u64, attributes: Attributes, error: Option<String>) {
        if self.end_us.is_some() {
            return;
        }
        self.end_us = Some(now);
        self.attributes.extend(attributes);
        self.error = error;
    }
}

/// A traced request's spans.
#[derive(Debug)]
pub(super) struct RequestTrace {
    /// The trace, and the client's span (the request span's parent) when
    /// the client sent one.
    trace_id: [u8; 16],
    parent: Option<[u8; 8]>,
    request: Open,
    decide: Option<Open>,
    prefills: Vec<Open>,
    decode: Option<Open>,
}

/// Eight random bytes that are not all zero (W3C's invalid id).
fn span_id<H: Host>(host: &mut H) -> Option<[u8; 8]> {
    let r = host.random_u64().ok()?;
    Some(r.max(1).to_be_bytes())
}

impl RequestTrace {
    fn header(&self, span: [u8; 8]) -> String {
        TraceContext {
            trace_id: self.trace_id,
            span_id: span,
            sampled: true,
        }
        .header_for(span)
    }

    fn spans(self, now: u64) -> Vec<Span> {
        let RequestTrace {
            trace_id,
            parent,
            request,
            decide,
            prefills,
            decode,
        } = self;
        let child = |o: Open, name: &'static str, kind: SpanKind| Span {
            trace_id,
            span_id: o.id,
            parent: Some(request.id),
            name,
            kind,
            start_us: o.start_us,
            end_us: o.end_us.unwrap_or(now),
            attributes: o.attributes,
            error: o.error,
        };
        let mut out = Vec::with_capacity(3 + prefills.len());
        if let Some(d) = decide {
            out.push(child(d, "pd_router.decide", SpanKind::Internal));
        }
        for p in prefills {
            out.push(child(p, "pd_router.prefill", SpanKind::Client));
        }
        if let Some(d) = decode {
            out.push(child(d, "pd_router.decode", SpanKind::Client));
        }
        out.push(Span {
            trace_id,
            span_id: request.id,
            parent,
            name: "pd_router.request",
            kind: SpanKind::Server,
            start_us: request.start_us,
            end_us: request.end_us.unwrap_or(now),
            attributes: request.attributes,
            error: request.error,
        });
        out
    }
}

impl Flow {
    /// Starts the request's trace, if tracing is on and the request is
    /// sampled: the client's `traceparent` decides, else `sample_ratio`.
    pub(super) fn trace_start<H: Host>(&mut self, host: &mut H) {
        let Some(t) = &self.router.config.tracing else {
            return;
        };
        let client = self
            .head
            .forwarded
            .iter()
            .find(|(k, _)| *k == "traceparent")
            .and_then(|(_, v)| TraceContext::parse(v));
        let (trace_id, parent) = match client {
            Some(c) if !c.sampled => return,
            Some(c) => (c.trace_id, Some(c.span_id)),
            None => {
                let ratio = t.sample_ratio;
                let Ok(draw) = host.random_u64() else { return };
                if ratio < 1.0 && (draw as f64) >= ratio * (u64::MAX as f64) {
                    return;
                }
                let (Ok(a), Ok(b)) = (host.random_u64(), host.random_u64()) else {
                    return;
                };
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&a.to_be_bytes());
                id[8..].copy_from_slice(&b.max(1).to_be_bytes());
                (id, None)
            }
        };
        let (Some(request), Some(decide)) = (span_id(host), span_id(host)) else {
            return;
        };
        let start = self.timing.started_ms.saturating_mul(1000);
        let open = |id, start_us| Open {
            id,
            start_us,
            end_us: None,
            attributes: Vec::new(),
            error: None,
        };
        let mut request = open(request, start);
        request
            .attributes
            .push(("url.path", self.head.path.clone().into()));
        if !self.head.id.is_empty() {
            request
                .attributes
                .push(("pd.request_id", self.head.id.clone().into()));
        }
        self.trace = Some(RefCell::new(RequestTrace {
            trace_id,
            parent,
            request,
            decide: Some(open(decide, self.timing.body_done_us)),
            prefills: Vec::new(),
            decode: None,
        }));
    }

    /// The router keeps the request whole on `pod`.
    pub(super) fn trace_unsplit<H: Host>(
        &self,
        host: &H,
        request: &SplitRequest,
        pod: &Endpoint,
        why: &UnsplitReason,
    ) {
        if self.trace.is_none() {
            return;
        }
        self.trace_decided(
            host.now_us(),
            vec![
                ("pd.split", false.into()),
                ("pd.reason", why.not_split().label().into()),
                ("pd.decode_pod", pod.name.clone().into()),
                ("pd.engine", request.model.engine.clone().into()),
            ],
        );
    }

    /// The router split the request; its prefill pod `computes` this many
    /// of the prompt's tokens, by the router's estimate.
    pub(super) fn trace_split<H: Host>(&self, host: &H, plan: &SplitPlan, computes: u64) {
        if self.trace.is_none() {
            return;
        }
        let prompt = plan.request.prompt.tokens;
        self.trace_decided(
            host.now_us(),
            vec![
                ("pd.split", true.into()),
                ("pd.reason", plan.reason.into()),
                ("pd.prefill_pod", plan.prefill_pod.name.clone().into()),
                ("pd.decode_pod", plan.decode_pod.name.clone().into()),
                ("pd.engine", plan.request.model.engine.clone().into()),
                ("pd.prompt_tokens", prompt.into()),
                ("pd.cached_tokens", prompt.saturating_sub(computes).into()),
            ],
        );
    }

    /// The router decided where the request goes.
    fn trace_decided(&self, now_us: u64, attributes: Attributes) {
        if let Some(t) = &self.trace {
            if let Some(d) = t.borrow_mut().decide.as_mut() {
                d.end(now_us, attributes, None);
            }
        }
    }

    /// A prefill attempt leaves now: its span starts, and the value of the
    /// `traceparent` its call carries.
    pub(super) fn trace_prefill<H: Host>(&self, host: &mut H, pod: &str) -> Option<String> {
        let t = self.trace.as_ref()?;
        let id = span_id(host)?;
        let mut t = t.borrow_mut();
        let attempt = t.prefills.len() as u64 + 1;
        t.prefills.push(Open {
            id,
            start_us: host.now_us(),
            end_us: None,
            attributes: vec![("pd.pod", pod.into()), ("pd.attempt", attempt.into())],
            error: None,
        });
        Some(t.header(id))
    }

    /// The last prefill attempt answered (`status` `None`: no answer).
    pub(super) fn trace_prefill_answered(
        &self,
        now_us: u64,
        status: Option<u16>,
        error: Option<String>,
    ) {
        if let Some(t) = &self.trace {
            if let Some(p) = t.borrow_mut().prefills.last_mut() {
                let attrs = status
                    .map(|s| vec![("http.response.status_code", u64::from(s).into())])
                    .unwrap_or_default();
                p.end(now_us, attrs, error);
            }
        }
    }

    /// The request goes upstream to its decode (or only) pod: the decode
    /// span starts, and the request carries its `traceparent`.
    pub(super) fn trace_decode<H: Host>(&self, host: &mut H, pod: &str, split: bool) {
        let Some(t) = &self.trace else { return };
        let Some(id) = span_id(host) else { return };
        let header = {
            let mut t = t.borrow_mut();
            t.decode = Some(Open {
                id,
                start_us: host.now_us(),
                end_us: None,
                attributes: vec![("pd.pod", pod.into()), ("pd.split", split.into())],
                error: None,
            });
            t.header(id)
        };
        // The legs' trace context is the router's to set; a failure costs
        // the engine's spans their parent, not the request.
        let _ = host.set_request_header("traceparent", Some(&header));
    }

    /// The response's status (from the decode, or the router's own reply
    /// with its error).
    pub(super) fn trace_status(&self, status: u16, error: Option<String>) {
        let Some(t) = &self.trace else { return };
        let mut t = t.borrow_mut();
        t.request
            .attributes
            .push(("http.response.status_code", u64::from(status).into()));
        if status >= 500 {
            t.request.error = error.clone().or_else(|| Some(format!("status {status}")));
            if let Some(d) = t.decode.as_mut() {
                d.error = Some(format!("status {status}"));
            }
        } else if error.is_some() {
            t.request.error = error.clone();
        }
        if let Some(d) = t.decide.as_mut().filter(|d| d.end_us.is_none()) {
            d.error = error;
        }
    }

    /// The stream ended: the spans go to the VM's buffer.
    pub(super) fn trace_end<H: Host>(&mut self, host: &H) {
        let Some(t) = self.trace.take() else { return };
        let now = host.now_us();
        let mut t = t.into_inner();
        if let Some(m) = &self.timing.model {
            t.request
                .attributes
                .push(("pd.model", m.name.clone().into()));
        }
        let dropped = self.router.spans.record(t.spans(now));
        if dropped > 0 {
            host.add(Counter::SpansDropped, dropped as u64);
        }
    }
}

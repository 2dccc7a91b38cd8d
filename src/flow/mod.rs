//! The per-request state machine. Each host callback is one `match` on the
//! phase, and every path ends in exactly one resume or one local reply.
//! Router-side load (outstanding prefills, pending decodes) is taken when a
//! pod is chosen and given back when its part ends, or at the end of the
//! stream whatever happened, so the shared counters return to zero.
//!
//! This file holds the stream's state and Envoy's callbacks; [`phase`]
//! holds the phases and is the only file that moves between them (the
//! stages return what comes next). Beside them:
//! [`send`] reads, places, builds and sends a buffered request, [`prefill`]
//! dispatches the prefill leg and handles its answer, [`encode`] sends an
//! E/P/D request's encoder legs before its prefill, [`decode`] points the
//! request at its decode pod, [`load`] holds and gives back load,
//! [`response`] rewrites the response where needed, [`ids`] is the host's
//! randomness as a split draws on it, [`head`] what is kept of the client's
//! headers.

mod admission;
mod by_model;
mod decode;
mod decode_outcome;
mod encode;
mod head;
mod ids;
mod load;
mod phase;
mod prefill;
mod response;
mod reuse;
mod send;
mod trace;

use crate::admission::settings::fairness_id;
use crate::admission::{FAIRNESS_HEADERS, OBJECTIVE_HEADERS};
use crate::body::BodyError;
use crate::calls::{BodyKind, Call};
use crate::config::Routing;
use crate::error::ClientError;
use crate::fleet::{Endpoint, ModelId, PodId};
use crate::host::{Action, Counter, Host, Level};
use crate::load::HeldLoad;
use crate::router::if_available::prefers_if_available;
use crate::router::Router;
use head::RequestHead;
use phase::{Buffered, Next, Phase};
use response::{ResponseRewrite, Timing};
use std::rc::Rc;

/// Response headers naming the pods of a request.
pub const PREFILL_POD_HEADER: &str = "prefill-target-pod";
pub const PREFILL_POD_IP_HEADER: &str = "prefill-target-pod-ip";
pub const DECODE_POD_HEADER: &str = "decode-target-pod";

/// The pods a request may not be placed on again, and how often it was.
#[derive(Debug, Clone, Default)]
struct Attempt {
    number: u32,
    failed_on: Vec<PodId>,
    /// Pods admission control found full: not chosen for this request.
    full: Vec<PodId>,
    /// The one resend a connection closed before any answer earns (a
    /// keep-alive race) was spent.
    resent: bool,
    /// Admission control let the request in just now: its pods must still
    /// be within their limit once it takes its place on them, or it goes
    /// back to waiting. Only the first placement: a retry was let in.
    admitted: bool,
}

/// One HTTP stream's flow.
pub struct Flow {
    router: Rc<Router>,
    /// The stream's context id (admission control resumes it by this).
    context: u32,
    phase: Phase,
    head: RequestHead,
    /// The prefill pod of a split request (name, IP), for the response.
    prefill_pod: Option<(String, String)>,
    /// The pod the request went to.
    decode_pod: Option<Rc<Endpoint>>,
    held: HeldLoad,
    response: ResponseRewrite,
    timing: Timing,
    /// A split's decode, judged by its answer.
    decode_watch: Option<decode_outcome::DecodeWatch>,
    /// How much body Envoy reported buffered last (0: none yet).
    body_bytes: usize,
    /// A split whose decode may leave a next-turn KV handle.
    reuse: Option<reuse::ReuseTurn>,
    /// The request's spans, when it is traced.
    trace: Option<std::cell::RefCell<trace::RequestTrace>>,
}

impl Flow {
    pub fn new(router: Rc<Router>) -> Flow {
        Flow::for_stream(router, 0)
    }

    /// The flow of the stream with context id `context`.
    pub fn for_stream(router: Rc<Router>, context: u32) -> Flow {
        Flow {
            router,
            context,
            phase: Phase::Start,
            head: RequestHead::default(),
            prefill_pod: None,
            decode_pod: None,
            held: HeldLoad {
                model: ModelId(0),
                prefill: None,
                prefill_tokens: 0,
                decode: None,
                streaming: None,
            },
            response: ResponseRewrite::default(),
            timing: Timing::default(),
            decode_watch: None,
            body_bytes: 0,
            reuse: None,
            trace: None,
        }
    }

    /// A debug line, formatted only when debug logging is on.
    fn debug<H: Host>(&self, host: &H, msg: impl FnOnce() -> String) {
        if host.log_enabled(Level::Debug) {
            self.log(host, Level::Debug, &msg());
        }
    }

    fn log<H: Host>(&self, host: &H, level: Level, msg: &str) {
        let id = if self.head.id.is_empty() {
            "-"
        } else {
            &self.head.id
        };
        host.log(level, &format!("[{id}] {msg}"));
    }

    pub fn on_request_headers<H: Host>(&mut self, host: &mut H, end_of_stream: bool) -> Action {
        let router = Rc::clone(&self.router);
        let config = &router.config;
        let headers = match host.request_headers() {
            Ok(h) => h,
            Err(e) => return self.fail(host, e.into()),
        };
        // Whatever happens next, the client never picks the upstream; a
        // header that cannot be stripped ends the request. Both routing
        // modes' headers go: a cluster of the other kind may be reachable
        // too. Only those present cost a host call.
        for header in [
            config.routing.header.as_str(),
            Routing::OriginalDst.default_header(),
            Routing::OverrideHost.default_header(),
        ] {
            if !headers.iter().any(|(k, _)| k == header) {
                continue;
            }
            if let Err(e) = host.set_request_header(header, None) {
                return self.fail(host, e.into());
            }
        }
        if config.routing.picker {
            // Read before any strip took effect on the local copy; the
            // client's own copies were removed before the picker ran
            // (docs/deploy.md). The prefill pod's header goes too: it is
            // the router's business, not the engine's.
            self.head.picked = head::picked(&headers);
            self.head.encoders = head::encoders(&headers);
            if let Err(e) = self.picker_headers(host, &headers) {
                return self.fail(host, e);
            }
        }
        self.head.prefer_if_available = headers
            .iter()
            .any(|(k, v)| k == "prefer" && prefers_if_available(v));
        if config.admission.is_some() {
            let objective = head::first_of(&headers, &OBJECTIVE_HEADERS);
            self.head.priority = config.objectives.priority(objective.as_deref());
            let tenant = head::first_of(&headers, &FAIRNESS_HEADERS);
            self.head.fairness = fairness_id(tenant.as_deref());
        }
        self.head.session_headers = head::session_headers(&headers, &router.fleet());
        self.head.chunked = headers.iter().any(|(k, _)| k == "transfer-encoding");
        let raw = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_slice())
        };
        let header = |name: &str| raw(name).map(|v| String::from_utf8_lossy(v).into_owned());
        self.timing.started_ms = host.now_ms();
        self.head.id = header("x-request-id").unwrap_or_default();
        self.head.path = header(":path").unwrap_or_default();
        let method = raw(":method").unwrap_or_default();

        let kind = || BodyKind::of(header("content-type").as_deref());
        let api = match Call::of(method, &self.head.path, !end_of_stream) {
            Call::Split(api) => api,
            Call::ListModels => return self.reply_models(host, None),
            Call::ShowModel(id) => return self.reply_models(host, Some(&id)),
            Call::PassThrough => return self.pass_through(host),
            Call::ByModel => return self.buffer(host, &headers, Buffered::ByModel(kind())),
            Call::PassThroughBody => {
                return self.buffer(host, &headers, Buffered::PassThrough(kind()))
            }
        };
        if method != b"POST" {
            let method = String::from_utf8_lossy(method).into_owned();
            return self.fail(host, ClientError::MethodNotAllowed(method).into());
        }
        if end_of_stream {
            return self.fail(host, BodyError::Empty.into());
        }
        if let Err(e) = self.canonical_path(host, api) {
            return self.fail(host, e.into());
        }
        self.buffer(host, &headers, Buffered::Split(api))
    }

    /// Collects the body of a request the router must read before choosing
    /// its pod, within `max_body_bytes`.
    fn buffer<H: Host>(
        &mut self,
        host: &mut H,
        headers: &[(String, Vec<u8>)],
        kind: Buffered,
    ) -> Action {
        let raw = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_slice())
        };
        let limit = self.router.config.max_body_bytes;
        let declared = raw("content-length")
            .and_then(|l| std::str::from_utf8(l).ok())
            .and_then(|l| l.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return self.fail(host, ClientError::TooLarge { limit }.into());
        }
        self.head.authority = raw(":authority")
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        self.head.forwarded = head::forwarded(headers);
        // Pausing keeps the header map writable until the decode routing header
        // is known (needs allow_on_headers_stop_iteration in the filter config).
        self.act(host, Ok(Next::Buffer(kind)))
    }

    pub fn on_request_body<H: Host>(
        &mut self,
        host: &mut H,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        match &self.phase {
            Phase::Buffering(kind) => {
                let limit = self.router.config.max_body_bytes;
                if body_size > limit {
                    return self.fail(host, ClientError::TooLarge { limit }.into());
                }
                self.body_bytes = body_size;
                if !end_of_stream {
                    // body_size is the total buffered so far; read once at the end.
                    return Action::Pause;
                }
                let kind = kind.clone();
                self.read_buffered(host, kind, body_size)
            }
            Phase::Replied | Phase::Encoding(_) | Phase::AwaitingPrefill(_) | Phase::Queued(_) => {
                Action::Pause
            }
            Phase::Start | Phase::Forwarded { .. } => Action::Continue,
        }
    }

    /// Trailers end the request: no body callback with `end_of_stream`
    /// follows them (an HTTP/2 client's trailing HEADERS, a chunked
    /// HTTP/1.1 body's trailer section). A request still buffering is read
    /// and sent here, as at the end of its body; the trailers themselves go
    /// on with the decode (or the whole request), as Envoy forwards them,
    /// and never with a prefill.
    pub fn on_request_trailers<H: Host>(&mut self, host: &mut H) -> Action {
        match &self.phase {
            Phase::Buffering(kind) => {
                let kind = kind.clone();
                // Envoy's count at the last body callback may not hold the
                // chunk it buffered after it: ask for one byte past the
                // limit instead (Envoy hands over what it holds), and none
                // when no body came.
                let ask = match self.body_bytes {
                    0 => 0,
                    _ => self.router.config.max_body_bytes.saturating_add(1),
                };
                self.read_buffered(host, kind, ask)
            }
            Phase::Replied | Phase::Encoding(_) | Phase::AwaitingPrefill(_) | Phase::Queued(_) => {
                Action::Pause
            }
            Phase::Start | Phase::Forwarded { .. } => Action::Continue,
        }
    }

    /// Reads a buffered body, at most `ask` bytes of it, once per request
    /// at its end, and sends the request on.
    fn read_buffered<H: Host>(&mut self, host: &mut H, kind: Buffered, ask: usize) -> Action {
        let sent = match kind {
            Buffered::Split(api) => self.split(host, api, ask),
            Buffered::ByModel(body) => self.route_by_model(host, &body, ask),
            Buffered::PassThrough(body) => self.pass_through_body(host, &body, ask),
        };
        self.act(host, sent)
    }

    pub fn on_response_headers<H: Host>(&mut self, host: &mut H) -> Action {
        if self.trace.is_some() {
            if let Some(s) = host.response_header(":status").and_then(|s| s.parse().ok()) {
                self.trace_status(s, None);
            }
        }
        self.rewrite_response_headers(host);
        self.judge_decode_headers(host);
        // Upstreams must not be able to forge which pods were used.
        let (name, ip) = match &self.prefill_pod {
            Some((n, ip)) => (Some(n.as_str()), Some(ip.as_str())),
            None => (None, None),
        };
        let decode = self.decode_pod.as_ref().map(|p| p.name.as_str());
        self.check_upstream(host);
        for (header, value) in [
            (PREFILL_POD_HEADER, name),
            (PREFILL_POD_IP_HEADER, ip),
            (DECODE_POD_HEADER, decode),
        ] {
            if let Err(e) = host.set_response_header(header, value) {
                self.log(host, Level::Warn, &format!("could not set {header}: {e}"));
            }
        }
        Action::Continue
    }

    /// With override_host routing, a chosen pod the cluster does not know
    /// makes Envoy fall back to the cluster's own policy without an error:
    /// the answer then came from elsewhere. Count it, and say so once per pod.
    fn check_upstream<H: Host>(&self, host: &H) {
        if self.router.config.routing.mode != Routing::OverrideHost {
            return;
        }
        let (Some(pod), Some(upstream)) = (&self.decode_pod, host.upstream_address()) else {
            return;
        };
        if upstream == pod.address {
            return;
        }
        host.increment(Counter::DecodeRerouted);
        if self.router.first_time(pod.id, "rerouted") {
            let msg = format!(
                "decode pod {} ({}) is not a member of the decode cluster: Envoy sent the request to {upstream} instead (override_host fallback); discovery and the cluster disagree (logged once per pod)",
                pod.name, pod.address
            );
            self.log(host, Level::Warn, &msg);
        }
    }

    pub fn on_response_body<H: Host>(
        &mut self,
        host: &mut H,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        self.judge_decode_body(host, body_size);
        self.rewrite_response_body(host, body_size, end_of_stream)
    }

    /// The stream is over (completed, failed, or the client went away): give
    /// back whatever load it still holds, with the decode's verdict. A
    /// prefill still in flight answers into the void: Envoy cannot cancel it,
    /// so it runs on and holds its KV until the engine's lease or abort
    /// timeout (docs/engines.md).
    pub fn on_stream_end<H: Host>(&mut self, host: &mut H) {
        self.end_phase(host);
        self.release_with_verdict(host);
        self.keep_kv_handle(host);
        self.trace_end(host);
    }
}

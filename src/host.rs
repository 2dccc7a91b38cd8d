//! What the flow needs from Envoy. The shell implements it with proxy-wasm
//! host calls; flow tests implement it with a recorder.

use crate::error::HostError;
use crate::pods::SharedStore;

/// What a callback tells Envoy to do with the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    Pause,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// Counters exported as Envoy stats (`wasmcustom.pd_router.<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Requests split into prefill and decode.
    Split,
    /// Requests on a split path, or routed by their model, sent to one pod
    /// whole, by why (`pd_reason`).
    Unsplit(NotSplit),
    /// Requests answered with a local error.
    LocalReply,
    /// Prefills that failed (any status but 2xx, reset, timeout).
    PrefillFailed,
    /// Prefill answers without hand-off data (vLLM `kv_transfer_params`,
    /// TensorRT-LLM `disaggregated_params`): the decode computes the prompt.
    HandoffMissing,
    /// TensorRT-LLM context answers without `prompt_token_ids`: the
    /// generation server tokenises the prompt itself.
    TokenIdsMissing,
    /// TensorRT-LLM context answers returned without a decode.
    ContextAnswered,
    /// Prefills sent again to another pod after a failure.
    PrefillRetry,
    /// Pods marked unhealthy (by a request or a scrape).
    Ejection,
    /// Requests Envoy sent elsewhere than the chosen decode pod
    /// (override_host routing fell back: the pod is not in the cluster).
    DecodeRerouted,
    /// Pod lists from the Kubernetes API that completed.
    DiscoveryList,
    /// Calls to the API server that failed (no answer, 401/403, garbage,
    /// ...): the last good pod set stays.
    DiscoveryFailure,
    /// Bounded watches whose events were applied.
    DiscoveryWatch,
    /// Watches that found their resourceVersion expired (410): a list
    /// follows.
    DiscoveryRelist,
    /// Decode answers rewritten (cached tokens, prompt logprobs).
    AnswerRewritten,
    /// Decodes that failed after the prefill answered (5xx, a reset or
    /// refused connection, an error event opening a 200 stream).
    DecodeFailed,
    /// Clients that left while their prefill was in flight.
    ClientGone,
    /// Prefills aborted on their pod (the engine's abort route) because
    /// their stream ended before they answered.
    PrefillAborted,
    /// Prefill aborts that could not be sent (the call was refused).
    PrefillAbortFailed,
    /// `GET /v1/models` (and `/v1/models/{id}`) answered by the gateway.
    ModelsListed,
    /// Requests that waited for room (admission control).
    AdmissionQueued,
    /// Requests of negative priority refused on a saturated model (429).
    AdmissionShed,
    /// Requests that waited `queue_ttl_ms` (429).
    AdmissionExpired,
    /// Requests refused because `max_queued` were waiting (503).
    AdmissionQueueFull,
    /// Requests let in whose pods another worker filled between the look
    /// and the taking of their place: they waited again.
    AdmissionRaceLost,
    /// Waiting requests whose client left.
    AdmissionCancelled,
    /// Executor mode: an endpoint picker's `x-kv-cache-source-host-port`
    /// that no configured connector can act on (removed, not followed).
    KvSourceIgnored,
    /// Executor mode: requests placed by the router itself because the
    /// endpoint picker's destination header was missing (the picker did
    /// not run on them, or failed open).
    EppPickMissing,
    /// Prefills sent to pull their prefix from the session's last decode
    /// (next-turn KV reuse).
    KvReuseSent,
    /// Handles found but not sent: their decode pod left the fleet, or the
    /// request does not extend the turn that made them.
    KvReuseStale,
    /// Prefills that failed with a handle and were resent without it.
    KvReuseFailed,
    /// Spans a collector accepted (tracing).
    SpansExported,
    /// Spans dropped: the VM's buffer was full, or an export call failed.
    SpansDropped,
    /// Export calls that failed (no answer, or not 2xx).
    SpanExportFailed,
    /// E/P/D encoder requests sent (one per media item).
    EncoderSent,
    /// E/P/D encoder requests that failed (the request is answered 502).
    EncoderFailed,
}

impl Counter {
    pub const ALL: [Counter; 41] = [
        Counter::Split,
        Counter::Unsplit(NotSplit::Path),
        Counter::Unsplit(NotSplit::ByModel),
        Counter::Unsplit(NotSplit::Engine),
        Counter::Unsplit(NotSplit::Response),
        Counter::Unsplit(NotSplit::Decider),
        Counter::Unsplit(NotSplit::Combined),
        Counter::LocalReply,
        Counter::PrefillFailed,
        Counter::HandoffMissing,
        Counter::TokenIdsMissing,
        Counter::ContextAnswered,
        Counter::PrefillRetry,
        Counter::Ejection,
        Counter::DecodeRerouted,
        Counter::DiscoveryList,
        Counter::DiscoveryFailure,
        Counter::DiscoveryWatch,
        Counter::DiscoveryRelist,
        Counter::AnswerRewritten,
        Counter::DecodeFailed,
        Counter::ClientGone,
        Counter::PrefillAborted,
        Counter::PrefillAbortFailed,
        Counter::ModelsListed,
        Counter::AdmissionQueued,
        Counter::AdmissionShed,
        Counter::AdmissionExpired,
        Counter::AdmissionQueueFull,
        Counter::AdmissionRaceLost,
        Counter::AdmissionCancelled,
        Counter::KvSourceIgnored,
        Counter::EppPickMissing,
        Counter::KvReuseSent,
        Counter::KvReuseStale,
        Counter::KvReuseFailed,
        Counter::SpansExported,
        Counter::SpansDropped,
        Counter::SpanExportFailed,
        Counter::EncoderSent,
        Counter::EncoderFailed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::Split => "pd_router.split",
            Counter::Unsplit(NotSplit::Path) => "pd_router.unsplit.pd_reason=.=path;.;",
            Counter::Unsplit(NotSplit::ByModel) => "pd_router.unsplit.pd_reason=.=by_model;.;",
            Counter::Unsplit(NotSplit::Engine) => "pd_router.unsplit.pd_reason=.=engine;.;",
            Counter::Unsplit(NotSplit::Response) => "pd_router.unsplit.pd_reason=.=response;.;",
            Counter::Unsplit(NotSplit::Decider) => "pd_router.unsplit.pd_reason=.=decider;.;",
            Counter::Unsplit(NotSplit::Combined) => "pd_router.unsplit.pd_reason=.=combined;.;",
            Counter::LocalReply => "pd_router.local_reply",
            Counter::PrefillFailed => "pd_router.prefill_failed",
            Counter::HandoffMissing => "pd_router.handoff_missing",
            Counter::TokenIdsMissing => "pd_router.prompt_token_ids_missing",
            Counter::ContextAnswered => "pd_router.context_answered",
            Counter::PrefillRetry => "pd_router.prefill_retries",
            Counter::Ejection => "pd_router.ejections",
            Counter::DecodeRerouted => "pd_router.decode_rerouted",
            Counter::DiscoveryList => "pd_router.discovery.lists",
            Counter::DiscoveryFailure => "pd_router.discovery.failures",
            Counter::DiscoveryWatch => "pd_router.discovery.watches",
            Counter::DiscoveryRelist => "pd_router.discovery.relists",
            Counter::AnswerRewritten => "pd_router.answers_rewritten",
            Counter::DecodeFailed => "pd_router.decode_failed",
            Counter::ClientGone => "pd_router.client_gone",
            Counter::PrefillAborted => "pd_router.prefill_aborts",
            Counter::PrefillAbortFailed => "pd_router.prefill_aborts_failed",
            Counter::EncoderSent => "pd_router.encoder_requests",
            Counter::EncoderFailed => "pd_router.encoder_failed",
            Counter::ModelsListed => "pd_router.models_listed",
            Counter::AdmissionQueued => "pd_router.admission.queued",
            Counter::AdmissionShed => "pd_router.admission.shed",
            Counter::AdmissionExpired => "pd_router.admission.expired",
            Counter::AdmissionQueueFull => "pd_router.admission.queue_full",
            Counter::AdmissionRaceLost => "pd_router.admission.race_lost",
            Counter::AdmissionCancelled => "pd_router.admission.cancelled",
            Counter::KvSourceIgnored => "pd_router.kv_source_ignored",
            Counter::EppPickMissing => "pd_router.epp_pick_missing",
            Counter::KvReuseSent => "pd_router.kv_reuse_sent",
            Counter::KvReuseStale => "pd_router.kv_reuse_stale",
            Counter::KvReuseFailed => "pd_router.kv_reuse_failed",
            Counter::SpansExported => "pd_router.spans_exported",
            Counter::SpansDropped => "pd_router.spans_dropped",
            Counter::SpanExportFailed => "pd_router.span_exports_failed",
        }
    }
}

/// Why a request went to one pod whole, as `pd_router_unsplit`'s
/// `pd_reason` label and the log say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotSplit {
    /// A path the router does not split, naming no model (`/health`,
    /// `GET`s, bodies without `model`): any decode pod.
    Path,
    /// A call the router does not split but routes by the model it names
    /// (embeddings, tokenize, audio forms).
    ByModel,
    /// The engine cannot split this request (vLLM NIXL or Mooncake with
    /// `n > 1`).
    Engine,
    /// The answer the client asked for needs the whole computation on one
    /// pod (`reconcile`: e.g. prompt logprobs an engine cannot hand over).
    Response,
    /// The model's decider kept it on its decode pod (why:
    /// `pd_router_decisions`).
    Decider,
    /// Placed on a pod serving both phases.
    Combined,
}

impl NotSplit {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            NotSplit::Path => "path",
            NotSplit::ByModel => "by_model",
            NotSplit::Engine => "engine",
            NotSplit::Response => "response",
            NotSplit::Decider => "decider",
            NotSplit::Combined => "combined",
        }
    }
}

/// Histograms per model (`wasmcustom.pd_router.<name>`, tagged with the
/// model), for where a split request's time goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Histogram {
    /// Milliseconds from the prefill call leaving to its answer.
    PrefillDuration,
    /// Milliseconds from the client's request to the decode's response headers.
    FirstByteDuration,
    /// Microseconds of the router's own work, from the end of the client's
    /// body to the prefill leaving.
    RoutingDuration,
    /// Estimated prompt tokens a decider's decode pod did not hold.
    UncachedTokens,
    /// Milliseconds a request waited for admission.
    QueueDuration,
}

impl Histogram {
    pub const ALL: [Histogram; 5] = [
        Histogram::PrefillDuration,
        Histogram::FirstByteDuration,
        Histogram::RoutingDuration,
        Histogram::UncachedTokens,
        Histogram::QueueDuration,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Histogram::PrefillDuration => "pd_router.prefill_duration",
            Histogram::FirstByteDuration => "pd_router.first_byte_duration",
            Histogram::RoutingDuration => "pd_router.routing_duration",
            Histogram::UncachedTokens => "pd_router.uncached_tokens",
            Histogram::QueueDuration => "pd_router.queue_duration",
        }
    }
}

/// Per-pod events, exported as `wasmcustom.pd_router.pod.<name>.<event>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodEvent {
    PrefillSelected,
    DecodeSelected,
    Ejected,
    /// A decode on this pod failed after its hand-off.
    DecodeFailed,
}

impl PodEvent {
    pub const ALL: [PodEvent; 4] = [
        PodEvent::PrefillSelected,
        PodEvent::DecodeSelected,
        PodEvent::Ejected,
        PodEvent::DecodeFailed,
    ];

    pub fn suffix(self) -> &'static str {
        match self {
            PodEvent::PrefillSelected => "prefill_selected",
            PodEvent::DecodeSelected => "decode_selected",
            PodEvent::Ejected => "ejected",
            PodEvent::DecodeFailed => "decode_failed",
        }
    }
}

/// Logs, stats and the clock: what both a stream and the root context (the
/// scrape loop) report through.
pub trait Telemetry {
    fn log(&self, level: Level, message: &str);
    /// Whether `level` would be logged: debug lines are not even formatted
    /// otherwise.
    fn log_enabled(&self, level: Level) -> bool;
    fn increment(&self, counter: Counter);
    /// Adds `n` to `counter`.
    fn add(&self, counter: Counter, n: u64) {
        for _ in 0..n {
            self.increment(counter);
        }
    }
    /// Counts an event of the pod named `pod`.
    fn count_pod(&self, pod: &str, event: PodEvent);
    /// Wall-clock Unix milliseconds.
    fn now_ms(&self) -> u64;
    /// Wall-clock Unix microseconds (for the router's own, sub-millisecond work).
    fn now_us(&self) -> u64 {
        self.now_ms().saturating_mul(1000)
    }
    /// Records `value` in `histogram` of the model named `model`.
    fn record(&self, _histogram: Histogram, _model: &str, _value: u64) {}
    /// Counts a local reply with `status`.
    fn count_reply(&self, _status: u16) {}
    /// Counts a decider's decision on a request of the model named `model`:
    /// `split`, or why it stayed whole (`sched::decider`).
    fn count_decision(&self, _model: &str, _reason: &'static str) {}
}

/// The host operations one HTTP stream needs. Writes return errors: the flow
/// decides what a failed write means (routing fails closed).
pub trait Host: SharedStore + Telemetry {
    /// Every request header (name, raw value), fetched in one host call
    /// rather than one per header.
    fn request_headers(&self) -> Result<Vec<(String, Vec<u8>)>, HostError>;
    /// Sets (or, with `None`, removes) a request header.
    fn set_request_header(&mut self, name: &str, value: Option<&str>) -> Result<(), HostError>;
    /// The buffered request body (`len` bytes).
    fn request_body(&self, len: usize) -> Result<Vec<u8>, HostError>;
    /// Replaces the first `len` bytes of the buffered body with `head`,
    /// leaving the rest in place (Envoy drains that front and prepends;
    /// `len` the whole body replaces it all).
    fn replace_request_front(&mut self, len: usize, head: &[u8]) -> Result<(), HostError>;
    /// Starts an HTTP call; the answer arrives via the flow's
    /// `on_prefill_response` with the returned token.
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError>;
    /// The body of the call answer being delivered.
    fn call_response_body(&self, len: usize) -> Result<Vec<u8>, HostError>;
    /// Lets a paused request go on upstream.
    fn resume_request(&mut self) -> Result<(), HostError>;
    /// Ends the stream with a local reply.
    fn send_reply(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError>;
    fn set_response_header(&mut self, name: &str, value: Option<&str>) -> Result<(), HostError>;
    /// A response header's value.
    fn response_header(&self, name: &str) -> Option<String>;
    /// The response body Envoy holds for the filter: the current chunk, or
    /// everything buffered while the filter paused the response.
    fn response_body(&self) -> Result<Vec<u8>, HostError>;
    /// Up to `max` bytes from the start of that body (a cheaper read when
    /// only its first event matters).
    fn response_body_head(&self, max: usize) -> Result<Vec<u8>, HostError> {
        let mut b = self.response_body()?;
        b.truncate(max);
        Ok(b)
    }
    /// Replaces the first `old_len` bytes of that body with `body`.
    fn replace_response_body(&mut self, old_len: usize, body: &[u8]) -> Result<(), HostError>;
    /// Lets a paused response go on to the client.
    fn resume_response(&mut self) -> Result<(), HostError>;
    /// The `IP:port` of the upstream host that answered (Envoy's
    /// `upstream.address` property), once response headers arrived.
    fn upstream_address(&self) -> Option<String>;
    fn random_u64(&mut self) -> Result<u64, String>;
}

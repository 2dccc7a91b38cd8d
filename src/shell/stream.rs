use super::abi::{self, Buffer, Headers, LogLevel};
use super::shared;
use super::stats::Stats;
use super::streams::Streams;
use crate::error::HostError;
use crate::flow::Flow;
use crate::host::{Action, Counter, Histogram, Host, Level, PodEvent, Telemetry};
use crate::pods::{CallbackReads, SetError, SharedStore};
use crate::router::Router;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action as WasmAction;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// One HTTP stream: forwards callbacks to the flow, implements [`Host`] with
/// the shell's own host calls ([`super::abi`]): a write Envoy refuses is an
/// error the flow answers, never a trap.
pub(super) struct Stream {
    core: Rc<RefCell<StreamCore>>,
    context: u32,
    streams: Rc<Streams<StreamCore>>,
}

/// A stream's flow and host, shared with the root context (which drives a
/// stream waiting for admission; see [`Streams`]).
pub(super) struct StreamCore {
    pub flow: Flow,
    pub io: StreamHost,
}

/// The host calls of one stream.
pub(super) struct StreamHost {
    stats: Rc<Stats>,
    reads: CallbackReads,
    streams: Rc<Streams<StreamCore>>,
}

impl StreamHost {
    /// A new host callback: what was read in the last one may be stale.
    pub(super) fn callback(&mut self) -> &mut StreamHost {
        self.reads.clear();
        self
    }
}

impl StreamCore {
    /// The flow and a fresh host callback, together.
    pub(super) fn parts(&mut self) -> (&mut Flow, &mut StreamHost) {
        (&mut self.flow, self.io.callback())
    }
}

impl Stream {
    pub(super) fn new(
        router: Rc<Router>,
        stats: Rc<Stats>,
        context: u32,
        streams: Rc<Streams<StreamCore>>,
    ) -> Stream {
        let core = Rc::new(RefCell::new(StreamCore {
            flow: Flow::for_stream(router, context),
            io: StreamHost {
                stats,
                reads: CallbackReads::default(),
                streams: Rc::clone(&streams),
            },
        }));
        streams.add(context, &core);
        Stream {
            core,
            context,
            streams,
        }
    }

    /// Runs a callback on the flow. The root context never runs inside a
    /// stream callback, so the core is free; were it not, the callback is
    /// answered as the flow's idle state would (`Continue`).
    fn with<T>(&self, idle: T, f: impl FnOnce(&mut Flow, &mut StreamHost) -> T) -> T {
        match self.core.try_borrow_mut() {
            Ok(mut core) => {
                let (flow, io) = core.parts();
                f(flow, io)
            }
            Err(_) => idle,
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.streams.remove(self.context);
    }
}

fn to_wasm(a: Action) -> WasmAction {
    match a {
        Action::Continue => WasmAction::Continue,
        Action::Pause => WasmAction::Pause,
    }
}

impl Context for Stream {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        // A reset before any header arrives with no headers at all.
        let status = shared::call_status(num_headers);
        self.with((), |flow, io| {
            flow.on_prefill_response(io, token, status, body_size)
        });
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> WasmAction {
        to_wasm(self.with(Action::Continue, |flow, io| {
            flow.on_request_headers(io, end_of_stream)
        }))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> WasmAction {
        to_wasm(self.with(Action::Continue, |flow, io| {
            flow.on_request_body(io, body_size, end_of_stream)
        }))
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> WasmAction {
        to_wasm(self.with(Action::Continue, |flow, io| flow.on_request_trailers(io)))
    }

    fn on_http_response_headers(
        &mut self,
        _num_headers: usize,
        _end_of_stream: bool,
    ) -> WasmAction {
        to_wasm(self.with(Action::Continue, |flow, io| flow.on_response_headers(io)))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> WasmAction {
        to_wasm(self.with(Action::Continue, |flow, io| {
            flow.on_response_body(io, body_size, end_of_stream)
        }))
    }

    // Called once at the end of every stream, however it ended (client
    // abort and local replies included): the flow gives back its load here.
    fn on_log(&mut self) {
        self.with((), |flow, io| flow.on_stream_end(io));
    }
}

impl SharedStore for StreamHost {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.reads.get(key, || shared::get(key))
    }

    fn shared_get_fresh(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.reads.refresh(key, || shared::get(key))
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        self.reads.wrote(key);
        shared::set(key, value, cas)
    }
}

pub(super) fn log_level(level: Level) -> LogLevel {
    match level {
        Level::Debug => LogLevel::Debug,
        Level::Info => LogLevel::Info,
        Level::Warn => LogLevel::Warn,
        Level::Error => LogLevel::Error,
    }
}

/// Starts an HTTP call. Through the SDK, whose dispatcher must learn the
/// call's token to deliver its answer (see [`super::abi`]).
pub(super) fn dispatch(
    cluster: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u64,
) -> Result<u32, HostError> {
    hostcalls::dispatch_http_call(
        cluster,
        headers.to_vec(),
        (!body.is_empty()).then_some(body),
        Vec::new(),
        Duration::from_millis(timeout_ms),
    )
    .map_err(|e| HostError::new("dispatch_http_call", e))
}

/// The first `len` bytes of a host buffer.
fn buffer(kind: Buffer, len: usize, call: &'static str) -> Result<Vec<u8>, HostError> {
    match abi::buffer(kind, 0, len) {
        Ok(Some(body)) => Ok(body),
        // Envoy hands over no buffer for an empty body.
        Ok(None) if len == 0 => Ok(Vec::new()),
        Ok(None) => Err(HostError::new(call, "no buffer")),
        Err(e) => Err(HostError::new(call, e)),
    }
}

impl Telemetry for StreamHost {
    fn log(&self, level: Level, message: &str) {
        let _ = abi::log(log_level(level), message);
    }

    fn log_enabled(&self, level: Level) -> bool {
        log_level(level) as u32 >= self.stats.log_level() as u32
    }

    fn increment(&self, counter: Counter) {
        self.stats.increment(counter);
    }

    fn add(&self, counter: Counter, n: u64) {
        self.stats.add(counter, n);
    }

    fn count_pod(&self, pod: &str, event: PodEvent) {
        self.stats.count_pod(pod, event);
    }

    fn now_ms(&self) -> u64 {
        self.reads.clock_ms(shared::now_us)
    }

    fn now_us(&self) -> u64 {
        let t = shared::now_us();
        self.reads.saw_us(t);
        t
    }

    fn record(&self, histogram: Histogram, model: &str, value: u64) {
        self.stats.record(histogram, model, value);
    }

    fn count_reply(&self, status: u16) {
        self.stats.count_reply(status);
    }

    fn count_decision(&self, model: &str, reason: &'static str) {
        self.stats.count_decision(model, reason);
    }
}

impl Host for StreamHost {
    fn request_headers(&self) -> Result<Vec<(String, Vec<u8>)>, HostError> {
        abi::header_pairs(Headers::Request)
            .map_err(|e| HostError::new("reading the request headers", e))
    }

    fn set_request_header(&mut self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        abi::set_header(Headers::Request, name, value)
            .map_err(|e| HostError::new("setting a request header", e))
    }

    fn request_body(&self, len: usize) -> Result<Vec<u8>, HostError> {
        buffer(Buffer::HttpRequestBody, len, "reading the request body")
    }

    fn replace_request_front(&mut self, len: usize, head: &[u8]) -> Result<(), HostError> {
        abi::set_buffer(Buffer::HttpRequestBody, 0, len, head)
            .map_err(|e| HostError::new("replacing the request body", e))
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        let token = dispatch(cluster, headers, body, timeout_ms)?;
        self.streams.dispatched(token);
        Ok(token)
    }

    fn call_response_body(&self, len: usize) -> Result<Vec<u8>, HostError> {
        buffer(
            Buffer::HttpCallResponseBody,
            len,
            "reading the prefill answer",
        )
    }

    fn resume_request(&mut self) -> Result<(), HostError> {
        abi::resume(abi::Stream::HttpRequest).map_err(|e| HostError::new("resuming the request", e))
    }

    fn send_reply(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        abi::send_reply(status, headers, body)
            .map_err(|e| HostError::new("sending a local reply", e))
    }

    fn set_response_header(&mut self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        abi::set_header(Headers::Response, name, value)
            .map_err(|e| HostError::new("setting a response header", e))
    }

    fn response_header(&self, name: &str) -> Option<String> {
        abi::header(Headers::Response, name)
            .ok()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    fn response_body(&self) -> Result<Vec<u8>, HostError> {
        // No size is known outside a body callback: ask for all of it.
        match abi::buffer(Buffer::HttpResponseBody, 0, u32::MAX as usize) {
            Ok(Some(body)) => Ok(body),
            Ok(None) => Ok(Vec::new()),
            Err(e) => Err(HostError::new("reading the response body", e)),
        }
    }

    fn response_body_head(&self, max: usize) -> Result<Vec<u8>, HostError> {
        match abi::buffer(Buffer::HttpResponseBody, 0, max) {
            Ok(b) => Ok(b.unwrap_or_default()),
            Err(e) => Err(HostError::new("reading the response body", e)),
        }
    }

    fn replace_response_body(&mut self, old_len: usize, body: &[u8]) -> Result<(), HostError> {
        abi::set_buffer(Buffer::HttpResponseBody, 0, old_len, body)
            .map_err(|e| HostError::new("replacing the response body", e))
    }

    fn resume_response(&mut self) -> Result<(), HostError> {
        abi::resume(abi::Stream::HttpResponse)
            .map_err(|e| HostError::new("resuming the response", e))
    }

    fn upstream_address(&self) -> Option<String> {
        let raw = abi::property(&["upstream", "address"]).ok()??;
        String::from_utf8(raw).ok()
    }

    fn random_u64(&mut self) -> Result<u64, String> {
        getrandom::u64().map_err(|e| e.to_string())
    }
}

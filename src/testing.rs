//! What the flow tests and the host-call bench share (the `testing`
//! feature): a fake Envoy that answers every [`Host`] call as Envoy would,
//! records its effects, and counts the calls and the bytes that cross into
//! and out of the VM.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::error::HostError;
use crate::host::{Counter, Histogram, Host, Level, PodEvent, Telemetry};
use crate::pods::{CallbackReads, MemoryStore, SetError, SharedStore};
use std::cell::{Cell, RefCell};

/// A prefill call the flow dispatched.
#[derive(Debug, Clone)]
pub struct Dispatched {
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

pub type Headers = Vec<(String, String)>;

/// Host calls by kind, and the bytes they moved.
#[derive(Debug)]
pub struct CallCounts {
    /// Room for every kind made up front, so counting allocates nothing
    /// while a flow runs.
    pub calls: Vec<(&'static str, u64)>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl Default for CallCounts {
    fn default() -> CallCounts {
        CallCounts {
            calls: Vec::with_capacity(64),
            bytes_in: 0,
            bytes_out: 0,
        }
    }
}

impl CallCounts {
    pub fn get(&self, what: &str) -> Option<u64> {
        self.calls.iter().find(|(k, _)| *k == what).map(|(_, n)| *n)
    }
}

/// Runs the host's own work (its records, its store): a bench that counts
/// the VM's allocations sets this to leave them out.
pub type HostWork = fn(&mut dyn FnMut());

fn plain(f: &mut dyn FnMut()) {
    f()
}

/// A fake Envoy for one stream.
pub struct FakeHost {
    pub request_headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub dispatched: Vec<Dispatched>,
    /// Calls dispatched (tokens are 100 + this).
    pub dispatches: u32,
    pub dispatch_error: Option<String>,
    pub call_body: Vec<u8>,
    pub resumed: usize,
    pub replies: Vec<(u16, Headers, Vec<u8>)>,
    pub response_headers: Vec<(String, Option<String>)>,
    pub counters: RefCell<Vec<Counter>>,
    pub pod_events: RefCell<Vec<(String, PodEvent)>>,
    pub logs: RefCell<Vec<String>>,
    /// Decider decisions counted, by model and reason.
    pub decisions: RefCell<Vec<(String, &'static str)>>,
    /// Returned in turn by `random_u64`; none left is an error.
    pub randoms: Vec<u64>,
    pub shared: RefCell<MemoryStore>,
    /// The shared-data keys written, in order (when effects are recorded).
    pub written: Vec<String>,
    /// Every request header write fails (a host that lost the header map).
    pub refuse_header_writes: bool,
    /// The host cannot hand over the buffered body.
    pub refuse_body: bool,
    /// Envoy's `upstream.address` once the response started.
    pub upstream: Option<String>,
    /// The decode's response headers, and the body Envoy holds for the filter.
    pub upstream_headers: Vec<(String, String)>,
    pub response: Vec<u8>,
    pub response_resumed: usize,
    /// How many bytes from the front each body replacement drained.
    pub replaced: Vec<usize>,
    /// Whether `log_enabled` says yes (debug lines are then formatted).
    pub verbose: bool,
    /// Unix microseconds of the clock's first reading, and how far each
    /// reading moves it.
    pub clock_us: Cell<u64>,
    pub clock_step_us: u64,
    /// What the shell keeps per callback (shared-data reads, the clock),
    /// when the host should read as the shipped shell does; cleared by
    /// [`FakeHost::callback`].
    pub reads: Option<CallbackReads>,
    pub counts: RefCell<CallCounts>,
    pub host_work: HostWork,
    /// Whether effects are recorded and applied (`dispatched`, `replies`,
    /// `logs`, header and body writes); a bench that times the flow turns it
    /// off, so the fake's own bookkeeping does not count as the flow's time.
    pub record: bool,
}

impl Default for FakeHost {
    fn default() -> FakeHost {
        FakeHost {
            request_headers: Vec::new(),
            body: Vec::new(),
            dispatched: Vec::new(),
            dispatches: 0,
            dispatch_error: None,
            call_body: Vec::new(),
            resumed: 0,
            replies: Vec::new(),
            response_headers: Vec::new(),
            counters: RefCell::new(Vec::new()),
            pod_events: RefCell::new(Vec::new()),
            logs: RefCell::new(Vec::new()),
            decisions: RefCell::new(Vec::new()),
            randoms: Vec::new(),
            shared: RefCell::new(MemoryStore::default()),
            refuse_header_writes: false,
            refuse_body: false,
            upstream: None,
            upstream_headers: Vec::new(),
            response: Vec::new(),
            response_resumed: 0,
            replaced: Vec::new(),
            verbose: true,
            clock_us: Cell::new(1_764_000_000_000_000),
            clock_step_us: 0,
            reads: None,
            counts: RefCell::new(CallCounts::default()),
            host_work: plain,
            record: true,
            written: Vec::new(),
        }
    }
}

impl FakeHost {
    /// A request with these headers and this body.
    pub fn new(headers: &[(&str, &str)], body: &str) -> FakeHost {
        FakeHost {
            request_headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            body: body.as_bytes().to_vec(),
            randoms: vec![0xFFFF_FFFF_FFFF_FFFF, 42],
            ..FakeHost::default()
        }
    }

    /// A new host callback: what was read in the last one may be stale.
    pub fn callback(&mut self) -> &mut FakeHost {
        if let Some(r) = self.reads.as_mut() {
            r.clear();
        }
        self
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.request_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The one local reply, its body parsed.
    pub fn reply(&self) -> (u16, serde_json::Value) {
        assert_eq!(self.replies.len(), 1, "expected exactly one reply");
        let (status, _, body) = &self.replies[0];
        (
            *status,
            serde_json::from_slice(body).expect("reply is JSON"),
        )
    }

    pub fn counted(&self, c: Counter) -> usize {
        self.counters.borrow().iter().filter(|x| **x == c).count()
    }

    /// The token of the last call dispatched.
    pub fn last_token(&self) -> u32 {
        100 + self.dispatches
    }

    fn work(&self, mut f: impl FnMut()) {
        if self.record {
            (self.host_work)(&mut f)
        }
    }

    fn count(&self, what: &'static str) {
        let mut c = self.counts.borrow_mut();
        match c.calls.iter_mut().find(|(k, _)| *k == what) {
            Some((_, n)) => *n += 1,
            None => c.calls.push((what, 1)),
        }
    }

    fn copied_in(&self, n: usize) {
        self.counts.borrow_mut().bytes_in += n as u64;
    }

    fn copied_out(&self, n: usize) {
        self.counts.borrow_mut().bytes_out += n as u64;
    }

    fn read_clock(&self) -> u64 {
        self.count("clock (reads)");
        let t = self.clock_us.get();
        self.clock_us.set(t + self.clock_step_us);
        t
    }
}

impl FakeHost {
    /// A shared-data read as the host call makes it: counted, and the value
    /// handed over as one buffer in the VM.
    fn read_shared(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.count("shared data get");
        let v = self.shared.borrow().shared_get(key);
        self.copied_in(v.0.as_ref().map_or(0, Vec::len));
        v
    }
}

impl SharedStore for FakeHost {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        match &self.reads {
            Some(r) => r.get(key, || self.read_shared(key)),
            None => self.read_shared(key),
        }
    }

    fn shared_get_fresh(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        match &self.reads {
            Some(r) => r.refresh(key, || self.read_shared(key)),
            None => self.read_shared(key),
        }
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        self.count("shared data set");
        if let Some(r) = self.reads.as_mut() {
            r.wrote(key);
        }
        if self.record {
            self.written.push(key.to_owned());
        }
        self.copied_out(value.len());
        let mut out = Ok(());
        let shared = &self.shared;
        (self.host_work)(&mut || out = shared.borrow_mut().shared_set(key, value, cas));
        out
    }
}

impl Telemetry for FakeHost {
    fn log(&self, _level: Level, message: &str) {
        self.count("log");
        self.copied_out(message.len());
        self.work(|| self.logs.borrow_mut().push(message.to_string()));
    }
    fn log_enabled(&self, _level: Level) -> bool {
        self.verbose
    }
    fn increment(&self, counter: Counter) {
        self.count("stat increment");
        self.work(|| self.counters.borrow_mut().push(counter));
    }
    fn count_pod(&self, pod: &str, event: PodEvent) {
        self.count("stat increment");
        self.work(|| self.pod_events.borrow_mut().push((pod.to_string(), event)));
    }
    fn now_ms(&self) -> u64 {
        match &self.reads {
            Some(r) => r.clock_ms(|| self.read_clock()),
            None => self.read_clock() / 1000,
        }
    }
    fn now_us(&self) -> u64 {
        let t = self.read_clock();
        if let Some(r) = &self.reads {
            r.saw_us(t);
        }
        t
    }
    fn record(&self, _h: Histogram, _model: &str, _value: u64) {
        self.count("histogram record");
    }
    fn count_reply(&self, _status: u16) {
        self.count("stat increment");
    }
    fn count_decision(&self, model: &str, reason: &'static str) {
        self.count("stat increment");
        self.work(|| self.decisions.borrow_mut().push((model.to_owned(), reason)));
    }
}

impl Host for FakeHost {
    fn request_headers(&self) -> Result<Vec<(String, Vec<u8>)>, HostError> {
        self.count("get request headers");
        let n = self.request_headers.iter().map(|(k, v)| k.len() + v.len());
        self.copied_in(n.sum());
        Ok(self.request_headers.clone())
    }
    fn set_request_header(&mut self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        self.count(if value.is_some() {
            "set request header"
        } else {
            "remove request header"
        });
        self.copied_out(name.len() + value.map_or(0, str::len));
        if self.refuse_header_writes {
            return Err(HostError::new("setting a request header", "BadArgument"));
        }
        if self.record {
            let headers = &mut self.request_headers;
            (self.host_work)(&mut || {
                headers.retain(|(k, _)| k != name);
                if let Some(v) = value {
                    headers.push((name.to_string(), v.as_bytes().to_vec()));
                }
            });
        }
        Ok(())
    }
    fn request_body(&self, len: usize) -> Result<Vec<u8>, HostError> {
        self.count("get request body");
        if self.refuse_body {
            return Err(HostError::new("reading the request body", "no buffer"));
        }
        self.copied_in(len);
        Ok(self.body[..len.min(self.body.len())].to_vec())
    }
    // What Envoy does with `proxy_set_buffer_bytes` from offset 0.
    fn replace_request_front(&mut self, len: usize, head: &[u8]) -> Result<(), HostError> {
        self.count("set request body");
        self.copied_out(head.len());
        assert!(len <= self.body.len(), "replacing past the body's end");
        if self.record {
            let (body, replaced) = (&mut self.body, &mut self.replaced);
            (self.host_work)(&mut || {
                replaced.push(len);
                body.splice(..len, head.iter().copied());
            });
        }
        Ok(())
    }
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        self.count("dispatch_http_call");
        let n: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.copied_out(body.len() + n);
        if let Some(e) = &self.dispatch_error {
            // As the shell words it: the host status's name, unquoted.
            return Err(HostError {
                call: "dispatch_http_call",
                status: e.clone(),
            });
        }
        self.dispatches += 1;
        if self.record {
            let dispatched = &mut self.dispatched;
            (self.host_work)(&mut || {
                dispatched.push(Dispatched {
                    cluster: cluster.into(),
                    headers: headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    body: body.to_vec(),
                    timeout_ms,
                })
            });
        }
        Ok(self.last_token())
    }
    fn call_response_body(&self, len: usize) -> Result<Vec<u8>, HostError> {
        self.count("get call response body");
        self.copied_in(len);
        Ok(self.call_body[..len.min(self.call_body.len())].to_vec())
    }
    fn resume_request(&mut self) -> Result<(), HostError> {
        self.count("resume request");
        self.resumed += 1;
        Ok(())
    }
    fn send_reply(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        self.count("send local reply");
        self.copied_out(body.len());
        if self.record {
            let replies = &mut self.replies;
            (self.host_work)(&mut || {
                let headers = headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                replies.push((status, headers, body.to_vec()))
            });
        }
        Ok(())
    }
    fn set_response_header(&mut self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        self.count(if value.is_some() {
            "set response header"
        } else {
            "remove response header"
        });
        self.copied_out(name.len() + value.map_or(0, str::len));
        if self.record {
            let set = &mut self.response_headers;
            (self.host_work)(&mut || set.push((name.to_string(), value.map(str::to_string))));
        }
        Ok(())
    }
    fn upstream_address(&self) -> Option<String> {
        self.count("get property");
        self.upstream.clone()
    }
    fn response_header(&self, name: &str) -> Option<String> {
        self.count("get response header");
        self.upstream_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
    fn response_body(&self) -> Result<Vec<u8>, HostError> {
        self.count("get response body");
        self.copied_in(self.response.len());
        Ok(self.response.clone())
    }
    fn replace_response_body(&mut self, old_len: usize, body: &[u8]) -> Result<(), HostError> {
        self.count("set response body");
        self.copied_out(body.len());
        assert_eq!(old_len, self.response.len(), "must replace the whole body");
        let response = &mut self.response;
        (self.host_work)(&mut || *response = body.to_vec());
        Ok(())
    }
    fn resume_response(&mut self) -> Result<(), HostError> {
        self.count("resume response");
        self.response_resumed += 1;
        Ok(())
    }
    fn random_u64(&mut self) -> Result<u64, String> {
        self.count("random");
        if self.randoms.is_empty() {
            return Err("no randomness left".into());
        }
        Ok(self.randoms.remove(0))
    }
}

//! The host calls the filter makes, straight over the proxy-wasm ABI, each
//! returning `Result` whatever status Envoy answers.
//!
//! proxy-wasm 0.2.5's `hostcalls` panic on any status they do not expect
//! (`set_map_value`, `set_buffer`, `get_map_bytes`, `resume_http_request`,
//! `send_http_response`, ...): a header write Envoy refuses would trap the VM,
//! and `FAIL_RELOAD` would restart it, failing every request in flight on
//! that worker. Here a refusal is an error the flow turns into a reply.
//!
//! Two calls still go through the SDK, and can still trap:
//! - `dispatch_http_call`: the SDK's dispatcher must record which context
//!   owns the call's token to deliver its answer (and panics on an answer
//!   whose token it never saw), and its recorder is private. Envoy answers
//!   `proxy_http_call` with Ok, BadArgument or InternalFailure, which the SDK
//!   returns as errors; only another status would trap.
//! - the SDK's own callback plumbing (`set_effective_context` before each
//!   callback), which this filter does not call.
//!
//! Buffers the host returns were allocated by the SDK's exported
//! `proxy_on_memory_allocate` (a boxed slice of exactly the size asked), so
//! they are taken back as `Vec`s of that length and capacity.
#![allow(unsafe_code)]

use crate::hostwire::{deserialize_pairs, serialize_pairs, serialize_path};
use std::fmt;
use std::ptr::{null, null_mut};

/// A status Envoy answered a host call with (the ABI's `WasmResult`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u32);

impl Status {
    pub const OK: Status = Status(0);
    pub const NOT_FOUND: Status = Status(1);
    pub const CAS_MISMATCH: Status = Status(8);
    /// What a well-formed answer that could not be read is reported as.
    pub const SERIALIZATION_FAILURE: Status = Status(3);

    fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "Ok",
            1 => "NotFound",
            2 => "BadArgument",
            3 => "SerializationFailure",
            4 => "ParseFailure",
            5 => "BadExpression",
            6 => "InvalidMemoryAccess",
            7 => "Empty",
            8 => "CasMismatch",
            9 => "ResultMismatch",
            10 => "InternalFailure",
            11 => "BrokenConnection",
            12 => "Unimplemented",
            _ => return None,
        })
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "status {}", self.0),
        }
    }
}

fn ok(status: u32) -> Result<(), Status> {
    match Status(status) {
        Status::OK => Ok(()),
        s => Err(s),
    }
}

/// The ABI's buffer and map kinds this filter reads and writes.
#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub enum Buffer {
    HttpRequestBody = 0,
    HttpResponseBody = 1,
    HttpCallResponseBody = 4,
    PluginConfiguration = 7,
}

#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub enum Headers {
    Request = 0,
    Response = 2,
    CallResponse = 6,
}

#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub enum Stream {
    HttpRequest = 0,
    HttpResponse = 1,
}

#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub enum MetricKind {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// Envoy's log levels, as the ABI numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        kind: u32,
        start: usize,
        size: usize,
        data: *const u8,
        data_size: usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(kind: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_get_header_map_value(
        kind: u32,
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        kind: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(kind: u32, key: *const u8, key_size: usize) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
}

/// Takes back a buffer the host allocated through the SDK's allocator.
///
/// # Safety
/// `data` is null or points to `size` bytes the host filled after
/// `proxy_on_memory_allocate(size)` gave them out, and nothing else owns them.
unsafe fn returned(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        None
    } else {
        Some(Vec::from_raw_parts(data, size, size))
    }
}

pub fn log(level: LogLevel, message: &str) -> Result<(), Status> {
    ok(unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) })
}

pub fn log_level() -> Result<LogLevel, Status> {
    let mut level = 0u32;
    ok(unsafe { proxy_get_log_level(&mut level) })?;
    Ok(match level {
        0 => LogLevel::Trace,
        1 => LogLevel::Debug,
        2 => LogLevel::Info,
        3 => LogLevel::Warn,
        4 => LogLevel::Error,
        _ => LogLevel::Critical,
    })
}

/// Envoy's wall clock, nanoseconds since the Unix epoch.
pub fn now_ns() -> Result<u64, Status> {
    let mut t = 0u64;
    ok(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

pub fn set_tick_period_ms(period: u32) -> Result<(), Status> {
    ok(unsafe { proxy_set_tick_period_milliseconds(period) })
}

/// Makes the host calls that follow act on context `id` (a stream of this
/// VM, from the root's tick); an error when Envoy has no such context.
pub fn set_effective_context(id: u32) -> Result<(), Status> {
    ok(unsafe { proxy_set_effective_context(id) })
}

/// Up to `max` bytes of a buffer from `start`; `None` when there is none.
pub fn buffer(kind: Buffer, start: usize, max: usize) -> Result<Option<Vec<u8>>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    match Status(unsafe { proxy_get_buffer_bytes(kind as u32, start, max, &mut data, &mut size) }) {
        Status::OK => Ok(unsafe { returned(data, size) }),
        Status::NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// Replaces `size` bytes of a buffer from `start` with `value`.
pub fn set_buffer(kind: Buffer, start: usize, size: usize, value: &[u8]) -> Result<(), Status> {
    ok(unsafe { proxy_set_buffer_bytes(kind as u32, start, size, value.as_ptr(), value.len()) })
}

/// Every pair of a header map.
pub fn header_pairs(kind: Headers) -> Result<Vec<(String, Vec<u8>)>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    ok(unsafe { proxy_get_header_map_pairs(kind as u32, &mut data, &mut size) })?;
    match unsafe { returned(data, size) } {
        None => Ok(Vec::new()),
        Some(bytes) => deserialize_pairs(&bytes).ok_or(Status::SERIALIZATION_FAILURE),
    }
}

/// One header's value; `None` when the map has no such header.
pub fn header(kind: Headers, name: &str) -> Result<Option<Vec<u8>>, Status> {
    let (mut data, mut size) = (null_mut(), 0usize);
    let status = unsafe {
        proxy_get_header_map_value(kind as u32, name.as_ptr(), name.len(), &mut data, &mut size)
    };
    match Status(status) {
        Status::OK => Ok(Some(unsafe { returned(data, size) }.unwrap_or_default())),
        Status::NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// Sets a header, or with `None` removes it.
pub fn set_header(kind: Headers, name: &str, value: Option<&str>) -> Result<(), Status> {
    ok(unsafe {
        match value {
            Some(v) => proxy_replace_header_map_value(
                kind as u32,
                name.as_ptr(),
                name.len(),
                v.as_ptr(),
                v.len(),
            ),
            None => proxy_remove_header_map_value(kind as u32, name.as_ptr(), name.len()),
        }
    })
}

/// A property (`upstream.address`); `None` when it is not set.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let path = serialize_path(path);
    let (mut data, mut size) = (null_mut(), 0usize);
    match Status(unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) }) {
        Status::OK => Ok(unsafe { returned(data, size) }),
        Status::NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// A shared-data value and its CAS; `(None, None)` when the key is unset.
pub fn shared_data(key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
    let (mut data, mut size, mut cas) = (null_mut(), 0usize, 0u32);
    let status =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match Status(status) {
        Status::OK => Ok((unsafe { returned(data, size) }, (cas != 0).then_some(cas))),
        Status::NOT_FOUND => Ok((None, None)),
        s => Err(s),
    }
}

/// Writes a shared-data value if its CAS is still `cas` (any, with `None`).
pub fn set_shared_data(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
    ok(unsafe {
        proxy_set_shared_data(
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
            cas.unwrap_or(0),
        )
    })
}

/// Lets a paused stream go on.
pub fn resume(stream: Stream) -> Result<(), Status> {
    ok(unsafe { proxy_continue_stream(stream as u32) })
}

/// Ends the stream with a local reply.
pub fn send_reply(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Result<(), Status> {
    let headers = serialize_pairs(headers);
    ok(unsafe {
        proxy_send_local_response(
            status as u32,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

pub fn define_metric(kind: MetricKind, name: &str) -> Result<u32, Status> {
    let mut id = 0u32;
    ok(unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    ok(unsafe { proxy_record_metric(id, value) })
}

pub fn increment_metric(id: u32, offset: i64) -> Result<(), Status> {
    ok(unsafe { proxy_increment_metric(id, offset) })
}

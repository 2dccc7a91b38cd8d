//! Shared data through the `hostcalls` that return `Result` (the SDK's trait
//! methods panic on unexpected statuses).

use crate::pods::{SetError, SharedStore};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{MapType, Status};
use std::time::UNIX_EPOCH;

/// Shared data of this VM's `vm_id`, as a [`SharedStore`].
pub(super) struct Shared;

pub(super) fn get(key: &str) -> (Option<Vec<u8>>, Option<u32>) {
    hostcalls::get_shared_data(key).unwrap_or((None, None))
}

pub(super) fn set(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
    match hostcalls::set_shared_data(key, Some(value), cas) {
        Ok(()) => Ok(()),
        Err(Status::CasMismatch) => Err(SetError::CasMismatch),
        Err(e) => Err(SetError::Failed(format!("{e:?}"))),
    }
}

impl SharedStore for Shared {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        get(key)
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        set(key, value, cas)
    }
}

/// The `:status` of the call answer being delivered; `None` when it came with
/// no headers at all (a reset before any header).
pub(super) fn call_status(num_headers: usize) -> Option<u16> {
    if num_headers == 0 {
        return None;
    }
    hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
}

/// Envoy's wall clock, Unix milliseconds (0 if the host has none).
pub(super) fn now_ms() -> u64 {
    now_us() / 1000
}

/// Envoy's wall clock, Unix microseconds (0 if the host has none).
pub(super) fn now_us() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

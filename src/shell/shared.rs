//! Shared data, the call answer's status and the clock, through the
//! shell's own host calls ([`super::abi`]), which never trap.

use super::abi::{self, Headers, Status};
use crate::pods::SetError;

/// A key's value and CAS; a host that cannot read it reads as unset.
pub(super) fn get(key: &str) -> (Option<Vec<u8>>, Option<u32>) {
    abi::shared_data(key).unwrap_or((None, None))
}

pub(super) fn set(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
    match abi::set_shared_data(key, value, cas) {
        Ok(()) => Ok(()),
        Err(Status::CAS_MISMATCH) => Err(SetError::CasMismatch),
        Err(e) => Err(SetError::Failed(format!("{e:?}"))),
    }
}

/// The `:status` of the call answer being delivered; `None` when it came with
/// no headers at all (a reset before any header).
pub(super) fn call_status(num_headers: usize) -> Option<u16> {
    if num_headers == 0 {
        return None;
    }
    abi::header(Headers::CallResponse, ":status")
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
    abi::now_ns().map_or(0, |ns| ns / 1000)
}

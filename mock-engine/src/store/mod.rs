//! The hand-off stores, as data: what one leg leaves for the other
//! (offered KV, SGLang rooms, side-channel entries). They sit below the
//! state that holds them and the handlers and engines that fill and empty
//! them, so none of those depends on another's module for a type.

use std::sync::{Mutex, MutexGuard, PoisonError};

pub mod aborts;
pub mod encoded;
pub mod gen_first;
pub mod offers;
pub mod rooms;
pub mod side;

/// A poisoned lock only means another handler panicked mid-update; the data
/// here stays usable, so the mock keeps serving instead of cascading panics.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

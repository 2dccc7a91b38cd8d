//! Per-pod state that outlives a request and is shared by every worker VM
//! (load and health records are in `crate::load`): the worker
//! slots' leases, scraped
//! metrics, and the shared-data keys. Rows are keyed by pod identity, so a
//! pod set that changes while Envoy runs keeps every other pod's state exact.

mod keys;
pub mod lease;
mod scraped;
pub mod slots;
mod store;

pub use keys::{Key, SharedKeys, SHARED_LAYOUT, WORKER_SLOTS_KEY};
pub use scraped::{
    decode_scraped, encode_scraped, update_scraped, PodMetrics, ScrapedTable, StoredMetrics,
};
pub use store::{cas_update, CallbackReads, Fresh, MemoryStore, SetError, SharedStore};

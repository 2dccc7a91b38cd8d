//! Per-pod state that outlives a request and is shared by every worker VM:
//! load and health (per model, one record per worker slot), the worker
//! slots' leases, the one ejection rule, scraped
//! metrics, and the shared-data keys. Rows are keyed by pod identity, so a
//! pod set that changes while Envoy runs keeps every other pod's state exact.

pub mod bootstrap;
mod health;
mod keys;
pub mod lease;
mod load;
mod pairs;
mod scraped;
pub mod slots;
mod store;

pub use health::{HealthRule, Verdict};
pub use keys::{SharedKeys, SHARED_LAYOUT, WORKER_SLOTS_KEY};
pub use load::{LoadTable, PodCounters};
pub use pairs::{update_pairs, PairCounters, PairTable};
pub use scraped::{
    decode_scraped, encode_scraped, update_scraped, PodMetrics, ScrapedTable, StoredMetrics,
};
pub use store::{cas_update, CallbackReads, MemoryStore, SetError, SharedStore};

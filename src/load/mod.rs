//! Load and health of pods: the records every worker VM keeps in shared
//! data ([`records`]: one per model and worker slot, rows keyed by pod
//! identity) and a VM's book over them ([`book`]: what a request holds and
//! gives back exactly once, the health its answers and scrapes judge by
//! the one ejection rule, [`health`], and the failing prefill/decode pairs,
//! [`pairs`]).
//! The router opens the book with its slot, lease and fleet; the flow
//! holds and releases through it (`flow/load.rs`).

pub mod book;
pub mod health;
pub mod pairs;
pub mod records;
#[cfg(test)]
mod tests;

pub use book::{Book, Ejection, HeldLoad};
pub use health::{HealthRule, Verdict};
pub use pairs::{update_pairs, PairCounters, PairTable};
pub use records::{LoadTable, PodCounters};

//! Pods discovered from the Kubernetes API: one VM at a time (a lease) lists
//! the pods through an Envoy cluster, then keeps the set current with
//! bounded watches (or lists again every `interval_ms`), publishes the pod
//! set in shared data, and every VM builds its fleet from it. Trouble with
//! the API (no answer, 401/403, garbage) keeps the last good pod set: it
//! never empties a model, and a set older than `stale_after_ms` is said.
//!
//! [`kube`] is the configuration and the requests, [`pod`] reads pods,
//! [`pool`] an InferencePool, [`adapter`] AIBrix's ModelAdapters, [`lister`] pages through one list,
//! [`watch`] applies watch events, [`schedule`] says when the next call
//! goes, [`merge`] turns pods into the fleet, [`published`] is the shared
//! record.

pub mod adapter;
pub mod kube;
pub mod lister;
pub mod merge;
pub mod pod;
pub mod pool;
pub mod published;
pub mod schedule;
pub mod watch;

pub use adapter::DiscoveredAdapter;
pub use kube::{DiscoveredPod, KubeDiscovery, PodRole};
pub use lister::{ListFailure, ListRun, Listed, Step};
pub use merge::build_fleet;
pub use watch::{WatchOutcome, Watched};

#[cfg(test)]
mod tests;

//! Pods discovered from the Kubernetes API: one VM at a time (a lease) lists
//! the pods through an Envoy cluster every `interval_ms`, publishes the pod
//! set in shared data, and every VM builds its fleet from it. Trouble with
//! the list (no answer, 401/403, garbage) keeps the last good pod set: it
//! never empties a model.
//!
//! [`kube`] reads the API's answers, [`lister`] pages through one list,
//! [`merge`] turns pods into the fleet, [`published`] is the shared record.

pub mod kube;
pub mod lister;
pub mod merge;
pub mod published;

pub use kube::{DiscoveredPod, KubeDiscovery, PodRole};
pub use lister::{ListFailure, ListRun, Listed, Step};
pub use merge::build_fleet;

#[cfg(test)]
mod tests;

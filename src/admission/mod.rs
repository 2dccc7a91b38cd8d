//! Admission control: when a model's pods are full, requests wait in
//! priority order (fair across tenants within a priority), a negative
//! priority is shed, and a request waits at most `queue_ttl_ms`.
//!
//! Pure: [`settings`] holds the configuration and the headers a request
//! names its objective and tenant with, [`room`] whether a model can take
//! a request now, [`queue`] this VM's waiting requests, and [`shared`]
//! what every VM tells the others of its queue (the highest priority
//! anywhere in the Envoy process goes first). The flow queues and resumes
//! requests (`flow/admission.rs`); [`waitlist`] is the VM's part: its queue, the other
//! VMs' reports, and the tick's pump that the shell executes.

pub mod queue;
pub mod room;
pub mod settings;
pub mod shared;
#[cfg(test)]
mod tests;
pub mod waitlist;

pub use queue::{Count, Entry, Queue, Waiting};
pub use room::{full_slots, over_limit, Room};
pub use settings::{Admission, Objectives, FAIRNESS_HEADERS, OBJECTIVE_HEADERS};
pub use waitlist::{Turn, VmView, Waitlist};

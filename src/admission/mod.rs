//! Admission control: when a model's pods are full, requests wait in
//! priority order (fair across tenants within a priority), a negative
//! priority is shed, and a request waits at most `queue_ttl_ms`.
//!
//! Pure: [`settings`] holds the configuration and the headers a request
//! names its objective and tenant with, [`room`] whether a model can take
//! a request now, [`queue`] this VM's waiting requests, and [`shared`]
//! what every VM tells the others of its queue (the highest priority
//! anywhere in the Envoy process goes first). The flow queues and resumes
//! requests (`flow/admission.rs`); the shell drives the queue from each
//! VM's tick.

pub mod queue;
pub mod room;
pub mod settings;
pub mod shared;

pub use queue::{Count, Entry, Queue, Waiting};
pub use room::{full_slots, Room};
pub use settings::{Admission, Objectives, FAIRNESS_HEADERS, OBJECTIVE_HEADERS};

/// Why a request was not admitted: the value of `x-pd-dropped-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// The model is saturated and the request's priority is negative (429).
    Shed,
    /// It waited `queue_ttl_ms` without a free pod (429).
    Expired,
    /// `max_queued` requests were already waiting (503).
    QueueFull,
}

impl Dropped {
    /// The `x-pd-dropped-reason` header value.
    pub fn reason(self) -> &'static str {
        match self {
            Dropped::Shed => "saturated",
            Dropped::Expired => "queue_ttl",
            Dropped::QueueFull => "queue_full",
        }
    }
}

/// The header naming why a request was dropped.
pub const DROPPED_REASON_HEADER: &str = "x-pd-dropped-reason";

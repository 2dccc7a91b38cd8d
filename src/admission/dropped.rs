//! Why a request was not admitted, as the client is told.

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

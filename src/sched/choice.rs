//! The scheduler's answer: a split, a combined pod, or why there is no pod.

use crate::fleet::Endpoint;
use std::rc::Rc;

/// The scheduler's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice<'m> {
    Split {
        prefill: &'m Rc<Endpoint>,
        decode: &'m Rc<Endpoint>,
        /// The fast path that decided, if any.
        reason: &'static str,
    },
    /// A pod serving both phases: no prefill call.
    Combined {
        pod: &'m Rc<Endpoint>,
        reason: &'static str,
    },
    NoPod(NoPod),
}

/// Why no pod could be chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPod {
    /// No roleset has both roles, and no combined pod is configured.
    NotConfigured,
    /// Pods exist but every candidate is unhealthy (or already failed).
    AllUnhealthy,
    /// No roleset's bucket and no combined pod fits the prompt length.
    NoBucket,
}

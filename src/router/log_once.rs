//! Log lines a VM says once: once per pod (bounded by the fleet's pods ×
//! a handful of lines; pods that leave are forgotten), and the endpoint
//! picker's missing pick once a minute.

use crate::fleet::PodId;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;

/// How often a request without the endpoint picker's pick is logged.
const PICK_MISSING_EVERY_MS: u64 = 60_000;

#[derive(Default)]
pub struct LogOnce {
    said: RefCell<HashSet<(PodId, &'static str)>>,
    pick_missing_at_ms: Cell<Option<u64>>,
}

impl LogOnce {
    /// Whether `what` about `pod` is said for the first time.
    pub fn first_time(&self, pod: PodId, what: &'static str) -> bool {
        self.said.borrow_mut().insert((pod, what))
    }

    /// Forgets what was said of pods not in `here` (the fleet changed).
    pub fn keep_pods(&self, here: &HashSet<PodId>) {
        self.said.borrow_mut().retain(|(pod, _)| here.contains(pod));
    }

    /// Whether a request without the endpoint picker's pick is to be
    /// logged at `now_ms`: the first one, then one a minute.
    pub fn pick_missing_due(&self, now_ms: u64) -> bool {
        let due = self
            .pick_missing_at_ms
            .get()
            .is_none_or(|last| now_ms.saturating_sub(last) >= PICK_MISSING_EVERY_MS);
        if due {
            self.pick_missing_at_ms.set(Some(now_ms));
        }
        due
    }

    /// How many "once per pod" lines are remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.said.borrow().len()
    }
}

//! What `admission` and `objectives` configure, and the headers a request
//! names its objective and its tenant with.

use serde::Deserialize;
use std::collections::BTreeMap;

/// The objective header: Gateway API Inference Extension's name first, then
/// llm-d's newer one (both are in use).
pub const OBJECTIVE_HEADERS: [&str; 2] = [
    "x-gateway-inference-objective",
    "x-llm-d-inference-objective",
];

/// The tenant header, in the same two spellings.
pub const FAIRNESS_HEADERS: [&str; 2] = [
    "x-gateway-inference-fairness-id",
    "x-llm-d-inference-fairness-id",
];

/// The longest fairness id kept (a longer one is cut: it only groups).
pub const MAX_FAIRNESS_ID: usize = 128;

/// `admission`: off unless `max_in_flight_per_pod` or `max_waiting_per_pod`
/// is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admission {
    /// A pod is full when the router has this many requests in flight on it
    /// (its prefills and decodes together); 0: no such limit.
    pub max_in_flight_per_pod: u32,
    /// A pod is full when its engine reports more waiting requests than
    /// this (scraped); absent: no such limit.
    pub max_waiting_per_pod: Option<u32>,
    /// The longest a request waits for room.
    pub queue_ttl_ms: u64,
    /// Waiting requests in the whole Envoy process beyond which a new one
    /// is refused (503).
    pub max_queued: u32,
    /// How often each VM looks at its queue (its tick, at most this long).
    pub tick_ms: u64,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            max_in_flight_per_pod: 0,
            max_waiting_per_pod: None,
            queue_ttl_ms: 30_000,
            max_queued: 1_000,
            tick_ms: 50,
        }
    }
}

impl Admission {
    /// Whether any limit is set.
    pub fn is_on(&self) -> bool {
        self.max_in_flight_per_pod > 0 || self.max_waiting_per_pod.is_some()
    }

    /// The `retry-after` a dropped request gets, in whole seconds: a shed
    /// or refused request may come back in a second; one that waited its
    /// TTL, after about as long again.
    pub fn retry_after_s(&self, dropped: crate::error::Dropped) -> u64 {
        match dropped {
            crate::error::Dropped::Expired => self.queue_ttl_ms.div_ceil(1000).max(1),
            _ => 1,
        }
    }
}

/// `objectives`: names (as in GIE's InferenceObjective) to priorities; a
/// higher priority goes first, a negative one is shed when the model is
/// saturated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Objectives(pub BTreeMap<String, i32>);

impl Objectives {
    /// The priority of the objective a request named: 0 when it named none
    /// or one not configured.
    pub fn priority(&self, objective: Option<&str>) -> i32 {
        objective
            .and_then(|o| self.0.get(o.trim()))
            .copied()
            .unwrap_or(0)
    }
}

/// A request's fairness id, as it groups: trimmed and cut to
/// [`MAX_FAIRNESS_ID`] bytes (at a character boundary); empty when absent.
pub fn fairness_id(value: Option<&str>) -> String {
    let v = value.unwrap_or_default().trim();
    let mut end = v.len().min(MAX_FAIRNESS_ID);
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    v.get(..end).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_absent_objectives_are_priority_zero() {
        let o = Objectives(
            [("premium".to_owned(), 10), ("batch".to_owned(), -1)]
                .into_iter()
                .collect(),
        );
        assert_eq!(o.priority(Some("premium")), 10);
        assert_eq!(o.priority(Some(" batch ")), -1);
        assert_eq!(o.priority(Some("gold")), 0);
        assert_eq!(o.priority(None), 0);
    }

    #[test]
    fn fairness_ids_are_cut_at_a_character() {
        assert_eq!(fairness_id(Some(" tenant-a ")), "tenant-a");
        assert_eq!(fairness_id(None), "");
        let long = "é".repeat(100);
        let cut = fairness_id(Some(&long));
        assert!(cut.len() <= MAX_FAIRNESS_ID && long.starts_with(&cut));
    }

    #[test]
    fn retry_after_follows_the_reason() {
        let a = Admission {
            queue_ttl_ms: 2500,
            ..Admission::default()
        };
        assert_eq!(a.retry_after_s(crate::error::Dropped::Expired), 3);
        assert_eq!(a.retry_after_s(crate::error::Dropped::Shed), 1);
        assert!(!Admission::default().is_on());
    }
}

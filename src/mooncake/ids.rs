//! What vLLM Mooncake prefill pods' bootstrap servers said: each pod's
//! engine ids (one per data-parallel rank), learned with `GET /query` by the
//! VM holding the scrape lease and shared with every VM.
//!
//! The decode names the prefill's engine, so a pod whose ids are not known
//! is not used for prefill (the same rule as vLLM's own proxy, which answers
//! 503 until every prefill is known; here only that pod waits). A restarted
//! engine may come back with a new id (`engine_id` defaults to a UUID), so
//! known ids are asked again every [`KNOWN_REFRESH_MS`], and a failed ask
//! forgets them: a stale id fails the decode, an unknown one only waits.

use crate::fleet::PodId;
use std::collections::{BTreeMap, HashMap, HashSet};

/// How often an unknown pod is asked.
pub const UNKNOWN_RETRY_MS: u64 = 1_000;
/// How often a known pod is asked again.
pub const KNOWN_REFRESH_MS: u64 = 10_000;

/// Engine ids by pod, as shared.
pub type EngineIds = HashMap<PodId, Vec<String>>;

/// The shared form: JSON `{"<pod id>": ["engine", ...]}`, written only when
/// it changes (a handful of pods, a few bytes each).
pub fn encode(ids: &EngineIds) -> Vec<u8> {
    let sorted: BTreeMap<String, &Vec<String>> =
        ids.iter().map(|(p, v)| (p.0.to_string(), v)).collect();
    serde_json::to_vec(&sorted).unwrap_or_default()
}

/// The shared form read back; anything malformed reads as nothing known.
pub fn decode(bytes: &[u8]) -> EngineIds {
    let Ok(map) = serde_json::from_slice::<BTreeMap<String, Vec<String>>>(bytes) else {
        return EngineIds::new();
    };
    map.into_iter()
        .filter_map(|(k, v)| Some((PodId(k.parse().ok()?), v)))
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// When each pod is asked (kept by the VM that asks).
#[derive(Debug, Default)]
pub struct QuerySchedule {
    asked_at: HashMap<PodId, u64>,
    in_flight: HashSet<PodId>,
}

impl QuerySchedule {
    /// The pods to ask now, given the Mooncake prefill pods and what is
    /// known; marks them in flight. Pods that left are forgotten.
    pub fn due(&mut self, pods: &[PodId], known: &EngineIds, now: u64) -> Vec<PodId> {
        self.asked_at.retain(|p, _| pods.contains(p));
        self.in_flight.retain(|p| pods.contains(p));
        let mut out = Vec::new();
        for p in pods {
            if self.in_flight.contains(p) {
                continue;
            }
            let every = if known.contains_key(p) {
                KNOWN_REFRESH_MS
            } else {
                UNKNOWN_RETRY_MS
            };
            let last = self.asked_at.get(p).copied();
            if last.is_none_or(|t| now.saturating_sub(t) >= every) {
                self.asked_at.insert(*p, now);
                self.in_flight.insert(*p);
                out.push(*p);
            }
        }
        out
    }

    /// A dispatch that never left: the pod may be asked again at once.
    pub fn not_sent(&mut self, pod: PodId) {
        self.in_flight.remove(&pod);
        self.asked_at.remove(&pod);
    }

    /// An answer (or its failure) came.
    pub fn answered(&mut self, pod: PodId) {
        self.in_flight.remove(&pod);
    }
}

/// Applies one answer: the pod's ids, or its failure (which forgets them).
/// Returns whether anything changed; pods not in `pods` are dropped.
pub fn apply(
    ids: &mut EngineIds,
    pods: &[PodId],
    pod: PodId,
    answer: Result<Vec<String>, String>,
) -> bool {
    let before = ids.len();
    ids.retain(|p, _| pods.contains(p));
    let mut changed = ids.len() != before;
    match answer {
        Ok(engines) if pods.contains(&pod) => {
            if ids.get(&pod) != Some(&engines) {
                ids.insert(pod, engines);
                changed = true;
            }
        }
        _ => changed |= ids.remove(&pod).is_some(),
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_pods_are_asked_each_second_and_known_ones_every_ten() {
        let (a, b) = (PodId(1), PodId(2));
        let mut s = QuerySchedule::default();
        let mut known = EngineIds::new();
        assert_eq!(s.due(&[a, b], &known, 0), vec![a, b]);
        assert!(s.due(&[a, b], &known, 5_000).is_empty(), "in flight");
        s.answered(a);
        s.answered(b);
        known.insert(a, vec!["e".into()]);
        assert!(s.due(&[a, b], &known, 900).is_empty());
        assert_eq!(s.due(&[a, b], &known, 1_000), vec![b]);
        s.answered(b);
        assert_eq!(s.due(&[a, b], &known, 10_000), vec![a, b]);
        s.not_sent(a);
        assert_eq!(s.due(&[a], &known, 10_001), vec![a], "not sent: again");
    }

    #[test]
    fn answers_set_ids_and_failures_forget_them() {
        let (a, b) = (PodId(1), PodId(2));
        let mut ids = EngineIds::new();
        assert!(apply(
            &mut ids,
            &[a, b],
            a,
            Ok(vec!["e_dp0".into(), "e_dp1".into()])
        ));
        assert!(
            !apply(
                &mut ids,
                &[a, b],
                a,
                Ok(vec!["e_dp0".into(), "e_dp1".into()])
            ),
            "same"
        );
        assert!(apply(&mut ids, &[a, b], b, Ok(vec!["f".into()])));
        assert!(apply(&mut ids, &[a, b], a, Err("timeout".into())));
        assert!(!ids.contains_key(&a));
        assert!(
            apply(&mut ids, &[a], a, Err("x".into())),
            "b left the fleet"
        );
        assert!(ids.is_empty());
        assert!(
            !apply(&mut ids, &[a], b, Ok(vec!["late".into()])),
            "not a pod any more"
        );
    }

    #[test]
    fn the_shared_form_round_trips_and_tolerates_garbage() {
        let mut ids = EngineIds::new();
        ids.insert(PodId(u64::MAX), vec!["e_dp0".into(), "e_dp1".into()]);
        ids.insert(PodId(7), vec!["x".into()]);
        assert_eq!(decode(&encode(&ids)), ids);
        assert!(decode(b"not json").is_empty());
        assert!(decode(br#"{"nope": ["e"], "3": []}"#).is_empty());
    }
}

//! Whether a model can take a request now: a pod is full when the router
//! has `max_in_flight_per_pod` requests on it (its prefills and decodes
//! together, counted across the Envoy process) or its engine reports more
//! than `max_waiting_per_pod` waiting; a model has room for a request when
//! a roleset that takes its prompt length has a healthy prefill pod ready
//! to hand off and a healthy decode pod that are not full, or such a
//! combined pod is not full: the same pods placement would choose from.

use super::settings::Admission;
use crate::fleet::{Model, TokenRange};
use crate::sched::PodState;

/// What a model can do with one more request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Room {
    /// Place it, leaving out the full pods (their slots).
    Free { full: Vec<usize> },
    /// Every pod that could serve it is full: it waits or is shed.
    Saturated,
    /// No pod could serve it even empty (none, or all unhealthy): placement
    /// answers why.
    Unservable,
}

/// The slots of `model`'s pods that are full.
pub fn full_slots(model: &Model, pods: &[PodState], a: &Admission) -> Vec<usize> {
    (0..model.pods.len())
        .filter(|slot| pods.get(*slot).is_some_and(|s| is_full(s, a)))
        .collect()
}

fn is_full(s: &PodState, a: &Admission) -> bool {
    let in_flight = s.outstanding_prefills.saturating_add(s.pending_decodes);
    let by_router = a.max_in_flight_per_pod > 0 && in_flight >= a.max_in_flight_per_pod;
    let by_engine = match (a.max_waiting_per_pod, s.metrics) {
        (Some(max), Some(m)) => m.waiting > f64::from(max),
        _ => false,
    };
    by_router || by_engine
}

/// Whether `in_flight` requests of the router's (prefills and decodes) are
/// more than `max_in_flight_per_pod` allows on one pod: what a request let
/// in may not push a pod to (two workers that both saw its last place
/// free).
pub fn over_limit(in_flight: u32, a: &Admission) -> bool {
    a.max_in_flight_per_pod > 0 && in_flight > a.max_in_flight_per_pod
}

/// What `model` can do with a request of `prompt_tokens` (`None`: of any
/// length) now, from its pods' states.
pub fn room(model: &Model, pods: &[PodState], a: &Admission, prompt_tokens: Option<u64>) -> Room {
    let full = full_slots(model, pods, a);
    let healthy = |slot: usize| pods.get(slot).is_none_or(|s| !s.unhealthy);
    let ready = |slot: usize| pods.get(slot).is_none_or(|s| !s.not_ready_for_prefill);
    let open = |slot: usize| healthy(slot) && !full.contains(&slot);
    let fits = |range: Option<TokenRange>| {
        prompt_tokens.is_none_or(|t| range.is_none_or(|r| r.contains(t)))
    };
    let can = |ok: &dyn Fn(usize) -> bool| {
        model
            .combined
            .iter()
            .any(|c| fits(c.prompt_tokens) && ok(c.slot))
            || model.rolesets.iter().any(|r| {
                fits(r.prompt_tokens)
                    && r.prefill.iter().any(|p| ready(p.slot) && ok(p.slot))
                    && r.decode.iter().any(|d| ok(d.slot))
            })
    };
    if can(&open) {
        Room::Free { full }
    } else if can(&healthy) {
        Room::Saturated
    } else {
        Room::Unservable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::pods::PodMetrics;

    fn model() -> Model {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[
                {"prefill":["10.0.0.1:1"],"decode":["10.0.0.2:1"]},
                {"prefill":["10.0.0.3:1"],"decode":["10.0.0.4:1"]}]}]}"#,
        )
        .expect("config");
        c.models.into_iter().next().expect("model")
    }

    fn busy(n: u32) -> PodState {
        PodState {
            outstanding_prefills: n,
            ..PodState::default()
        }
    }

    #[test]
    fn a_pod_at_its_limit_is_full_and_one_past_it_is_over() {
        let a = Admission {
            max_in_flight_per_pod: 2,
            ..Admission::default()
        };
        let at = PodState {
            outstanding_prefills: 1,
            pending_decodes: 1,
            ..PodState::default()
        };
        assert!(is_full(&at, &a) && !over_limit(2, &a));
        assert!(over_limit(3, &a));
        assert!(!over_limit(3, &Admission::default()), "0: no limit");
    }

    #[test]
    fn a_model_is_saturated_when_no_roleset_has_both_roles_free() {
        let m = model();
        let a = Admission {
            max_in_flight_per_pod: 2,
            ..Admission::default()
        };
        let idle = vec![PodState::default(); 4];
        assert_eq!(room(&m, &idle, &a, None), Room::Free { full: vec![] });
        // Roleset 0's prefill and roleset 1's decode full: neither pairs.
        let mut s = idle.clone();
        s[0] = busy(2);
        s[3] = PodState {
            pending_decodes: 2,
            ..PodState::default()
        };
        assert_eq!(room(&m, &s, &a, None), Room::Saturated);
        s[3] = busy(1);
        assert_eq!(room(&m, &s, &a, None), Room::Free { full: vec![0] });
        // Unhealthy is not full: placement says why.
        let down = vec![
            PodState {
                unhealthy: true,
                ..PodState::default()
            };
            4
        ];
        assert_eq!(room(&m, &down, &a, None), Room::Unservable);
    }

    #[test]
    fn an_engines_waiting_queue_fills_a_pod_where_it_is_scraped() {
        let m = model();
        let a = Admission {
            max_waiting_per_pod: Some(4),
            ..Admission::default()
        };
        let waiting = |w: f64| PodState {
            metrics: Some(PodMetrics {
                waiting: w,
                ..PodMetrics::default()
            }),
            ..PodState::default()
        };
        let s = vec![
            waiting(5.0),
            waiting(4.0),
            waiting(9.0),
            PodState::default(),
        ];
        assert_eq!(full_slots(&m, &s, &a), vec![0, 2]);
        assert_eq!(room(&m, &s, &a, None), Room::Saturated);
    }

    #[test]
    fn only_the_pods_that_take_the_prompt_and_can_hand_off_count() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[
                {"prefill":["10.0.0.1:1"],"decode":["10.0.0.2:1"],"prompt_tokens":{"max":1000}},
                {"prefill":["10.0.0.3:1"],"decode":["10.0.0.4:1"],"prompt_tokens":{"min":1001}}]}]}"#,
        )
        .expect("config");
        let m = c.models.into_iter().next().expect("model");
        let a = Admission {
            max_in_flight_per_pod: 1,
            ..Admission::default()
        };
        // The short bucket is full, the long one idle.
        let mut s = vec![PodState::default(); 4];
        s[0] = busy(1);
        assert_eq!(
            room(&m, &s, &a, Some(500)),
            Room::Saturated,
            "a short prompt waits"
        );
        assert_eq!(room(&m, &s, &a, Some(5_000)), Room::Free { full: vec![0] });
        assert_eq!(
            room(&m, &s, &a, None),
            Room::Free { full: vec![0] },
            "any length"
        );
        // A prefill pod that cannot hand off yet (a Mooncake engine id not
        // learned) takes nothing: placement says why.
        s[2].not_ready_for_prefill = true;
        assert_eq!(room(&m, &s, &a, Some(5_000)), Room::Unservable);
    }
}

//! Whether a model can take a request now: a pod is full when the router
//! has `max_in_flight_per_pod` requests on it (its prefills and decodes
//! together, counted across the Envoy process) or its engine reports more
//! than `max_waiting_per_pod` waiting; a model has room when a roleset has
//! a healthy prefill pod and a healthy decode pod that are not full, or a
//! combined pod is not full.

use super::Admission;
use crate::fleet::Model;
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

/// What `model` can do with a request now, from its pods' states.
pub fn room(model: &Model, pods: &[PodState], a: &Admission) -> Room {
    let full = full_slots(model, pods, a);
    let healthy = |slot: usize| pods.get(slot).is_none_or(|s| !s.unhealthy);
    let open = |slot: usize| healthy(slot) && !full.contains(&slot);
    let can = |ok: &dyn Fn(usize) -> bool| {
        model.combined.iter().any(|c| ok(c.slot))
            || model.rolesets.iter().any(|r| {
                r.prefill.iter().any(|p| ok(p.slot)) && r.decode.iter().any(|d| ok(d.slot))
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
    fn a_model_is_saturated_when_no_roleset_has_both_roles_free() {
        let m = model();
        let a = Admission {
            max_in_flight_per_pod: 2,
            ..Admission::default()
        };
        let idle = vec![PodState::default(); 4];
        assert_eq!(room(&m, &idle, &a), Room::Free { full: vec![] });
        // Roleset 0's prefill and roleset 1's decode full: neither pairs.
        let mut s = idle.clone();
        s[0] = busy(2);
        s[3] = PodState {
            pending_decodes: 2,
            ..PodState::default()
        };
        assert_eq!(room(&m, &s, &a), Room::Saturated);
        s[3] = busy(1);
        assert_eq!(room(&m, &s, &a), Room::Free { full: vec![0] });
        // Unhealthy is not full: placement says why.
        let down = vec![
            PodState {
                unhealthy: true,
                ..PodState::default()
            };
            4
        ];
        assert_eq!(room(&m, &down, &a), Room::Unservable);
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
        assert_eq!(room(&m, &s, &a), Room::Saturated);
    }
}

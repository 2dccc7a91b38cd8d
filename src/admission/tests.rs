//! The VM's side of admission: room, the queue across VMs, and the pump.

use crate::load::HeldLoad;
use crate::pods::{MemoryStore, SharedStore};
use crate::router::testkit::{adapter_fleet, router};
use crate::router::Router;

#[test]
fn a_waiting_adapter_request_whose_pods_are_full_holds_no_one_back() {
    use crate::admission::{Entry, Room};
    let json = r#"{"admission":{"max_in_flight_per_pod":1},
        "models":[{"name":"m","engine":"vllm"}]}"#;
    let r = router(json);
    adapter_fleet(&r, &[("sql", &["p1", "d1"])]);
    let mut store = MemoryStore::default();
    let fleet = r.fleet();
    let m = fleet.model("m").expect("m");
    let on = |name: &str| m.endpoints().iter().find(|e| e.name == name).map(|e| e.id);
    // The adapter's prefill pod is full; p0 and d0 are free.
    let held = HeldLoad {
        model: m.id,
        prefill: on("p1"),
        prefill_tokens: 10,
        decode: None,
        streaming: None,
    };
    r.hold(&mut store, held, 1_000).expect("hold");
    assert_eq!(r.room(&store, m, Some("sql"), None, 1_000), Room::Saturated);
    assert!(matches!(
        r.room(&store, m, None, None, 1_000),
        Room::Free { .. }
    ));
    let entry = |context: u32, adapter: Option<&str>, priority: i32| Entry {
        context,
        model: m.id,
        adapter: adapter.map(str::to_string),
        prompt_tokens: 1,
        priority,
        fairness: String::new(),
    };
    r.enqueue(entry(1, Some("sql"), 10), 1_000);
    r.enqueue(entry(2, None, 0), 1_001);
    let next = r.next_admitted(&store, 1_100, 0).map(|w| w.context);
    assert_eq!(next, Some(2), "the base request goes on p0 and d0");
    assert_eq!(r.next_admitted(&store, 1_100, 0), None);
    // A new base request need not wait behind the blocked one, and another
    // VM's requests are not held back by it either.
    assert!(!r.waits_behind(m.id, 0));
    let mut other_vm = MemoryStore::default();
    r.publish_queue(&mut other_vm, 1_100);
    let report = other_vm.shared_get(&r.keys().admission(r.worker_slot())).0;
    let report = crate::admission::shared::Report::decode(&report.expect("published"));
    let others = crate::admission::shared::Others::new(vec![report.expect("report")], 1_100);
    assert_eq!(others.top_priority(m.id), None);
    assert_eq!(others.total(), 1);
    assert_eq!(r.waiting_total(), 1);
    // p1 frees: the adapter request goes, in the place it had.
    let released = HeldLoad {
        model: m.id,
        prefill: on("p1"),
        prefill_tokens: 10,
        decode: None,
        streaming: None,
    };
    r.release(&mut store, released, None, 1_200)
        .expect("release");
    let next = r.next_admitted(&store, 1_200, 0).map(|w| w.context);
    assert_eq!(next, Some(1));
}

#[test]
fn requests_of_a_saturated_model_stay_ahead_of_other_workers_lower_ones() {
    use crate::admission::shared::{Others, Report};
    use crate::admission::Entry;
    let json = r#"{"admission":{"max_in_flight_per_pod":1},
        "models":[{"name":"m","engine":"vllm",
                   "rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#;
    let r = router(json);
    let mut store = MemoryStore::default();
    let fleet = r.fleet();
    let m = fleet.model("m").expect("m");
    let held = HeldLoad {
        model: m.id,
        prefill: None,
        prefill_tokens: 0,
        decode: m
            .endpoints()
            .iter()
            .find(|e| e.address == "10.0.0.2:8000")
            .map(|e| e.id),
        streaming: None,
    };
    r.hold(&mut store, held, 1_000).expect("hold");
    let premium = Entry {
        context: 1,
        model: m.id,
        adapter: None,
        prompt_tokens: 1,
        priority: 10,
        fairness: String::new(),
    };
    r.enqueue(premium, 1_000);
    assert_eq!(r.next_admitted(&store, 1_050, 0), None, "saturated");
    r.publish_queue(&mut store, 1_050);
    let report = store.shared_get(&r.keys().admission(r.worker_slot())).0;
    let others = Others::new(
        vec![Report::decode(&report.expect("published")).expect("report")],
        1_050,
    );
    assert_eq!(
        others.top_priority(m.id),
        Some(10),
        "another worker lets none of its standard requests in before it"
    );
}

/// The admission pump's tick, with its streams stood in for by a closure:
/// the ordering and bookkeeping the shell only executes.
mod pump {
    use super::*;
    use crate::admission::waitlist::MAX_ADMITTED_PER_TICK;
    use crate::admission::{Entry, Turn};

    const ADMISSION: &str = r#"{"admission":{"max_in_flight_per_pod":1,"queue_ttl_ms":500},
        "models":[{"name":"m","engine":"vllm",
                   "rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#;

    fn entry(r: &Router, context: u32, priority: i32) -> Entry {
        let fleet = r.fleet();
        Entry {
            context,
            model: fleet.model("m").expect("m").id,
            adapter: None,
            prompt_tokens: 1,
            priority,
            fairness: String::new(),
        }
    }

    /// Runs one tick, answering each admission from `went`; the turns asked.
    fn tick(
        r: &Router,
        store: &mut MemoryStore,
        now: u64,
        went: impl Fn(u32) -> Option<bool>,
    ) -> Vec<(u32, Turn)> {
        let mut asked = Vec::new();
        r.pump(store, now, |context, turn| {
            asked.push((context, turn));
            match turn {
                Turn::Expire => Some(true),
                Turn::Admit => went(context),
            }
        });
        asked
    }

    #[test]
    fn expired_requests_are_answered_first_then_the_highest_priority_goes() {
        let r = router(ADMISSION);
        let mut store = MemoryStore::default();
        r.enqueue(entry(&r, 1, 0), 0);
        r.enqueue(entry(&r, 2, 0), 900);
        r.enqueue(entry(&r, 3, 10), 901);
        let asked = tick(&r, &mut store, 1_000, |_| Some(true));
        assert_eq!(
            asked,
            vec![(1, Turn::Expire), (3, Turn::Admit), (2, Turn::Admit)]
        );
        assert_eq!(r.waiting_total(), 0);
    }

    #[test]
    fn a_request_whose_pods_filled_keeps_its_place_and_ends_the_tick() {
        let r = router(ADMISSION);
        let mut store = MemoryStore::default();
        r.enqueue(entry(&r, 1, 5), 0);
        r.enqueue(entry(&r, 2, 5), 1);
        let asked = tick(&r, &mut store, 100, |_| Some(false));
        assert_eq!(asked, vec![(1, Turn::Admit)], "no second look this tick");
        assert_eq!(r.waiting_total(), 2);
        // The report the other VMs read says both still wait here.
        let mut other = MemoryStore::default();
        r.publish_queue(&mut other, 100);
        let published = store.shared_get(&r.keys().admission(r.worker_slot())).0;
        assert_eq!(
            published,
            other.shared_get(&r.keys().admission(r.worker_slot())).0
        );
        let asked = tick(&r, &mut store, 200, |_| Some(true));
        assert_eq!(
            asked,
            vec![(1, Turn::Admit), (2, Turn::Admit)],
            "in its place"
        );
    }

    #[test]
    fn a_request_that_lost_its_place_to_another_vm_still_holds_lower_ones_back() {
        use crate::admission::shared::{Others, Report};
        let r = router(ADMISSION);
        let mut store = MemoryStore::default();
        let premium = entry(&r, 1, 10);
        let model = premium.model;
        r.enqueue(premium, 0);
        // The tick found room, but another VM's request took it between the
        // look and the placement: the pods are full, not this request's own.
        let asked = tick(&r, &mut store, 100, |_| Some(false));
        assert_eq!(asked, vec![(1, Turn::Admit)]);
        let report = store.shared_get(&r.keys().admission(r.worker_slot())).0;
        let report = Report::decode(&report.expect("published")).expect("report");
        assert_eq!(
            Others::new(vec![report], 100).top_priority(model),
            Some(10),
            "the other VMs still let none of their standard requests go before it"
        );
        assert!(r.waits_behind(model, 0), "nor does this VM");
    }

    #[test]
    fn a_gone_stream_is_not_put_back() {
        let r = router(ADMISSION);
        let mut store = MemoryStore::default();
        r.enqueue(entry(&r, 1, 0), 0);
        r.enqueue(entry(&r, 2, 0), 1);
        let asked = tick(&r, &mut store, 100, |c| (c == 2).then_some(true));
        assert_eq!(asked, vec![(1, Turn::Admit), (2, Turn::Admit)]);
        assert_eq!(r.waiting_total(), 0);
    }

    #[test]
    fn a_tick_lets_in_a_bounded_number() {
        let r = router(ADMISSION);
        let mut store = MemoryStore::default();
        for c in 0..300 {
            r.enqueue(entry(&r, c, 0), 100);
        }
        let asked = tick(&r, &mut store, 200, |_| Some(true));
        assert_eq!(asked.len(), MAX_ADMITTED_PER_TICK);
        assert_eq!(r.waiting_total(), 300 - MAX_ADMITTED_PER_TICK as u64);
    }

    #[test]
    fn without_admission_the_pump_asks_nothing() {
        let r = router(r#"{"models":[{"name":"m","engine":"vllm"}]}"#);
        let mut store = MemoryStore::default();
        assert!(tick(&r, &mut store, 100, |_| Some(true)).is_empty());
    }
}

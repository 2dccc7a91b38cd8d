//! The load book: load held and given back, and the health judged from
//! answers and scrapes across worker VMs.

use crate::config::Config;
use crate::load::HeldLoad;
use crate::load::Verdict;
use crate::pods::MemoryStore;
use crate::router::testkit::*;
use crate::router::Router;
use std::rc::Rc;

#[test]
fn load_held_is_given_back_and_failures_eject_after_the_streak() {
    let r = router(TWO_PREFILLS);
    let mut store = MemoryStore::default();
    let fleet = r.fleet();
    let m = &fleet.models()[0];
    let (p, d) = (&m.rolesets[0].prefill[0], &m.rolesets[0].decode[0]);
    let held = HeldLoad {
        model: m.id,
        prefill: Some(p.id),
        prefill_tokens: 3_000,
        decode: Some(d.id),
        streaming: Some(p.id),
    };
    let smaller = HeldLoad {
        prefill_tokens: 500,
        ..held
    };
    r.hold(&mut store, held, 1_000).expect("hold");
    r.hold(&mut store, smaller, 1_000).expect("hold");
    let c = r.load(&store, m.id);
    assert_eq!(c.get(p.id).outstanding_prefills, 2);
    assert_eq!(c.get(p.id).outstanding_prefill_tokens, 3_500);
    assert_eq!(c.get(d.id).pending_decodes, 2);
    assert_eq!(c.get(p.id).live_streams, 2);
    assert_eq!(
        (r.own_decodes(&store, d), r.own_prefills(&store, p)),
        (2, 2)
    );
    r.release(&mut store, held, None, 1_000).expect("release");
    assert_eq!(
        r.load(&store, m.id).get(p.id).outstanding_prefill_tokens,
        500
    );
    r.release(&mut store, smaller, None, 1_000)
        .expect("release");
    assert!(r
        .counters(&store)
        .iter()
        .all(|c| c.outstanding_prefills == 0
            && c.outstanding_prefill_tokens == 0
            && c.pending_decodes == 0
            && c.live_streams == 0));

    let failures = r.config.health.eject_after_failures;
    let none = HeldLoad {
        model: m.id,
        prefill: None,
        prefill_tokens: 0,
        decode: None,
        streaming: None,
    };
    for i in 1..=failures {
        let judged = Some((p.as_ref(), Verdict::Failed, "prefill: 500"));
        let ejected = r.release(&mut store, none, judged, 2_000).expect("judge");
        assert_eq!(ejected.is_some(), i == failures, "failure {i}");
    }
    assert!(!r.is_healthy(&store, p, 2_001));
    assert!(r.is_healthy(&store, p, 2_000 + r.config.health.cooldown_ms));
}

#[test]
fn a_failed_scrape_judges_a_pod_in_every_model_that_serves_it() {
    let r = router(
        r#"{"models":[
            {"name":"a","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:1"],"decode":["10.0.1.1:1"]}]},
            {"name":"b","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:1"],"decode":["10.0.1.2:1"]}]}]}"#,
    );
    let mut store = MemoryStore::default();
    let fleet = r.fleet();
    let shared = Rc::clone(&fleet.models()[0].rolesets[0].prefill[0]);
    let ejected = r
        .judge_everywhere(&mut store, &shared, Verdict::Down, "scrape failed", 1_000)
        .expect("judged");
    assert!(ejected.is_some_and(|e| e.message.contains("scrape failed")));
    for m in fleet.models() {
        assert!(!r.load(&store, m.id).get(shared.id).is_healthy(1_001));
    }
}

#[test]
fn workers_failures_add_up_to_an_ejection_and_each_sees_it() {
    // Two worker VMs of one Envoy, each on its leased slot.
    let mut store = MemoryStore::default();
    let key = crate::pods::WORKER_SLOTS_KEY;
    crate::pods::slots::ensure_table(&mut store, key);
    let vm = |holder: u64, store: &mut MemoryStore| {
        let slot = crate::pods::slots::lease_slot(store, key, holder, None, 0).expect("slot");
        let config = Config::parse(TWO_PREFILLS.as_bytes()).expect("config");
        Router::leased(config, slot, holder, 0).expect("router")
    };
    let (a, b) = (vm(11, &mut store), vm(22, &mut store));
    assert_ne!(a.worker_slot(), b.worker_slot());
    let fleet = a.fleet();
    let m = fleet.model("m").expect("model");
    let p = Rc::clone(m.endpoints().first().expect("a pod"));
    let none = HeldLoad {
        model: m.id,
        prefill: None,
        prefill_tokens: 0,
        decode: None,
        streaming: None,
    };
    let fail = Some((p.as_ref(), Verdict::Failed, "prefill: 500"));
    assert_eq!(a.config.health.eject_after_failures, 3);
    assert!(a
        .release(&mut store, none, fail, 1_000)
        .expect("judge")
        .is_none());
    assert!(b
        .release(&mut store, none, fail, 1_000)
        .expect("judge")
        .is_none());
    assert_eq!(
        a.load(&store, m.id).get(p.id).failures,
        2,
        "one streak each, summed"
    );
    let third = b.release(&mut store, none, fail, 1_000).expect("judge");
    assert!(
        third.is_some(),
        "the third failure across the workers ejects"
    );
    assert!(!a.is_healthy(&store, &p, 1_001), "the other worker sees it");
    // Each worker's load is its own and both are seen.
    let held = HeldLoad {
        decode: Some(p.id),
        ..none
    };
    a.hold(&mut store, held, 1_000).expect("hold");
    b.hold(&mut store, held, 1_000).expect("hold");
    assert_eq!(a.load(&store, m.id).get(p.id).pending_decodes, 2);
    b.release(&mut store, held, None, 1_000).expect("release");
    assert_eq!(b.load(&store, m.id).get(p.id).pending_decodes, 1);
}

use super::testkit::*;
use super::*;
use crate::error::PdError;
use crate::load::HeldLoad;
use crate::pods::MemoryStore;
use crate::sched::prefix::PrefixMatch;
use crate::split::Placement;

#[test]
fn a_remembered_prompt_goes_back_to_the_pod_that_holds_it() {
    let r = router(TWO_PREFILLS);
    let mut store = MemoryStore::default();
    let long = "x".repeat(4000);
    let req = request(&r, "m", &long);
    let first = place(&r, &mut store, &req, &[]).expect("placed");
    let Placement::Split {
        prefill, prefix, ..
    } = &first
    else {
        panic!("split")
    };
    assert_eq!(prefix.percent(prefill.id), 0.0, "nothing known yet");
    r.remember_prefix(&mut store, &req, prefix, prefill.id, 1_000);
    let again = place(&r, &mut store, &req, &[]).expect("placed");
    let Placement::Split { prefix, .. } = &again else {
        panic!("split")
    };
    assert_eq!(prefix.percent(prefill.id), 100.0);
    assert_eq!(prefill_of(&again), prefill.address);
}

#[test]
fn a_prefix_two_pods_served_is_known_held_by_both() {
    let r = router(TWO_PREFILLS);
    let mut store = MemoryStore::default();
    // A shared 2,000-byte system prompt, then each conversation's own text.
    let system = "s".repeat(2_000);
    let served = |tail: &str| request(&r, "m", &format!("{system}{tail}"));
    let (a, b) = (served(&"a".repeat(3_000)), served(&"b".repeat(3_000)));
    let pods: Vec<PodId> = a.model.rolesets[0].prefill.iter().map(|e| e.id).collect();
    let none = PrefixMatch::default();
    r.remember_prefix(&mut store, &a, &none, pods[0], 1_000);
    r.remember_prefix(&mut store, &b, &none, pods[1], 2_000);
    // A third conversation: both pods hold its system prompt (3 blocks of
    // 512 bytes, found to its checkpoint below: block 2 of 0, 1, 3, 7).
    let c = served(&"c".repeat(3_000));
    let Placement::Split { prefix, .. } = place(&r, &mut store, &c, &[]).expect("placed") else {
        panic!("split")
    };
    assert_eq!(prefix.depth_of(pods[0]), 2, "{:?}", prefix.by_pod);
    assert_eq!(prefix.depth_of(pods[1]), 2, "{:?}", prefix.by_pod);
    // The first conversation's next turn still finds its pod, deepest.
    let Placement::Split { prefix, .. } = place(&r, &mut store, &a, &[]).expect("placed") else {
        panic!("split")
    };
    assert_eq!(prefix.by_pod.first(), Some(&(pods[0], 9)));
}

#[test]
fn least_ttft_holds_the_tokens_a_prefill_computes_and_follows_the_prefix() {
    let r = router(
        r#"{"models":[{"name":"m","engine":"vllm","prefill_policy":"least_ttft","rolesets":[
            {"prefill":["10.0.0.1:1","10.0.0.2:1"],"decode":["10.0.1.1:1"]}]}]}"#,
    );
    let mut store = MemoryStore::default();
    // 4,000 tokens (16,000 bytes): 31 blocks of 128 tokens and a part.
    let turn = "x".repeat(16_000);
    let req = request(&r, "m", &turn);
    let Placement::Split {
        prefill, prefix, ..
    } = place(&r, &mut store, &req, &[]).expect("placed")
    else {
        panic!("split")
    };
    assert_eq!(r.uncached_tokens(&req, &prefix, prefill.id), 4_001);
    r.remember_prefix(&mut store, &req, &prefix, prefill.id, 1_000);
    // The next turn holds all of this one's blocks: the pod holds them.
    let next = request(&r, "m", &format!("{turn}{}", "y".repeat(2_000)));
    let Placement::Split {
        prefill: again,
        prefix,
        ..
    } = place(&r, &mut store, &next, &[]).expect("placed")
    else {
        panic!("split")
    };
    assert_eq!(again.id, prefill.id);
    assert_eq!(r.cached_tokens(&next, &prefix, again.id), 31 * 128);
    assert_eq!(
        r.uncached_tokens(&next, &prefix, again.id),
        4_501 - 31 * 128
    );
    // Held load counts those tokens; enough of them queued there (more than
    // 48 times the 3,968 it holds: 190,464) sends the next turn to the
    // other pod.
    let mut held = HeldLoad {
        model: next.model.id,
        prefill: Some(again.id),
        prefill_tokens: 180_000,
        decode: None,
        streaming: None,
    };
    r.hold(&mut store, held, 1_000).expect("hold");
    let stays = place(&r, &mut store, &next, &[]).expect("placed");
    assert_eq!(prefill_of(&stays), again.address);
    held.prefill_tokens = 15_000;
    r.hold(&mut store, held, 1_000).expect("hold");
    let elsewhere = place(&r, &mut store, &next, &[]).expect("placed");
    assert_ne!(prefill_of(&elsewhere), again.address);
}

#[test]
fn excluded_pods_are_never_chosen_and_nowhere_left_is_unavailable() {
    let r = router(TWO_PREFILLS);
    let mut store = MemoryStore::default();
    let req = request(&r, "m", "p");
    let fleet = r.fleet();
    let pods = &fleet.models()[0].rolesets[0].prefill;
    for _ in 0..8 {
        let p = place(&r, &mut store, &req, &[pods[0].id]).expect("placed");
        assert_eq!(prefill_of(&p), "10.0.0.2:1");
    }
    let none = place(&r, &mut store, &req, &[pods[0].id, pods[1].id]);
    assert!(matches!(none, Err(PdError::Unavailable(_))), "{none:?}");
}

#[test]
fn an_adapter_request_goes_only_to_the_pods_that_loaded_it() {
    let r = router(r#"{"models":[{"name":"m","engine":"vllm","adapters":["everywhere"]}]}"#);
    adapter_fleet(&r, &[("sql", &["p1", "d1"]), ("nowhere", &[])]);
    let mut store = MemoryStore::default();
    let names = |p: &Placement| match p {
        Placement::Split {
            prefill, decode, ..
        } => format!("{} {}", prefill.name, decode.name),
        other => format!("{other:?}"),
    };
    let mut random = |_: &mut MemoryStore| 7;
    for i in 0..8 {
        let sql = request(&r, "sql", &format!("prompt {i}"));
        let placed = place(&r, &mut store, &sql, &[]).expect("placed");
        assert_eq!(names(&placed), "p1 d1");
        let whole = r.place_unsplit(&mut store, &sql.model, Some("sql"), &mut random, 1_000);
        assert_eq!(
            whole.expect("unsplit").name,
            "d1",
            "calls routed by model too"
        );
    }
    // The base model and a configured adapter take every pod.
    let fleet = r.fleet();
    let m = fleet.model("m").expect("m");
    let on = |name: &str| m.endpoints().iter().find(|e| e.name == name).map(|e| e.id);
    let (p1, d1) = (on("p1").expect("p1"), on("d1").expect("d1"));
    for model in ["m", "everywhere"] {
        let req = request(&r, model, "x");
        let placed = place(&r, &mut store, &req, &[p1, d1]).expect("placed");
        assert_eq!(names(&placed), "p0 d0", "{model}");
    }
    // No instance left to take it: 503, as for a model without pods.
    let sql = request(&r, "sql", "x");
    let none = place(&r, &mut store, &sql, &[p1]);
    assert!(matches!(none, Err(PdError::Unavailable(_))), "{none:?}");
    let nowhere = request(&r, "nowhere", "x");
    let none = place(&r, &mut store, &nowhere, &[]);
    assert!(matches!(none, Err(PdError::Unavailable(_))), "{none:?}");
    let none = r.place_unsplit(
        &mut store,
        &nowhere.model,
        Some("nowhere"),
        &mut random,
        1_000,
    );
    assert!(matches!(none, Err(PdError::Unavailable(_))), "{none:?}");
}

#[test]
fn once_per_pod_log_lines_are_forgotten_with_their_pods() {
    use crate::discovery::{build_fleet, PodRole};
    let r = router(r#"{"models":[{"name":"m","engine":"vllm"}]}"#);
    let pod = |name: String, ip: String, role| discovered_pod(&name, &ip, role);
    // A thousand rollouts of a two-pod model, each pod re-created at a new
    // address and logged about twice.
    for gen in 0..1000u32 {
        let pods = [
            pod(
                format!("p-{gen}"),
                format!("10.0.{}.{}", gen / 250, gen % 250),
                PodRole::Prefill,
            ),
            pod(
                format!("d-{gen}"),
                format!("10.1.{}.{}", gen / 250, gen % 250),
                PodRole::Decode,
            ),
        ];
        r.set_fleet(build_fleet(&r.config.models, &pods, &[]).0);
        for e in r.fleet().pods() {
            assert!(r.first_time(e.id, "rerouted"));
            assert!(r.first_time(e.id, "token ids missing"));
            assert!(!r.first_time(e.id, "rerouted"), "once per pod");
        }
        assert!(
            r.logged_len() <= 4,
            "{} entries after rollout {gen}",
            r.logged_len()
        );
    }
    // A pod that stays keeps its entry across a change of the others.
    let stay = pod("stay".into(), "10.2.0.1".into(), PodRole::Prefill);
    let d = |n: u32| pod(format!("dd-{n}"), format!("10.2.1.{n}"), PodRole::Decode);
    r.set_fleet(build_fleet(&r.config.models, &[stay.clone(), d(1)], &[]).0);
    let id = PodId::of("stay", "10.2.0.1:8000");
    assert!(r.first_time(id, "rerouted"));
    r.set_fleet(build_fleet(&r.config.models, &[stay, d(2)], &[]).0);
    assert!(!r.first_time(id, "rerouted"), "still logged once");
}

/// Executor mode, llm-d's roles: a pod labelled `prefill-decode` (or
/// `both`, `encode-prefill-decode`) is one llm-d's prefill filter accepts,
/// so the picker's naming it as the prefill pod is carried out; an
/// unlabelled pod, which llm-d's prefill filter refuses, still is not.
#[test]
fn a_picked_prefill_labelled_for_both_phases_is_a_prefill_pod() {
    use super::picked::Picked;
    use crate::discovery::{build_fleet, PodRole};
    let r = router(r#"{"placement":"epp","models":[{"name":"m","engine":"vllm"}]}"#);
    let pod = discovered_pod;
    let pods = [
        pod("pd0", "10.0.0.1", PodRole::PrefillDecode),
        pod("n0", "10.0.0.2", PodRole::Both),
        pod("d0", "10.0.1.1", PodRole::Decode),
    ];
    r.set_fleet(build_fleet(&r.config.models, &pods, &[]).0);
    let req = request(&r, "m", "hello");
    let pick = |prefill: &str, decode: &str| Picked {
        decode: decode.parse().expect("addr"),
        prefill: Some(prefill.parse().expect("addr")),
    };
    let placed = r
        .place_picked(&req, &pick("10.0.0.1:8000", "10.0.1.1:8000"))
        .expect("a prefill-decode pod as the prefill leg");
    assert_eq!(prefill_of(&placed), "10.0.0.1:8000");
    // And as the decode, as llm-d's decode filter takes it.
    let placed = r
        .place_picked(&req, &pick("10.0.0.1:8000", "10.0.0.1:8000"))
        .expect("both legs on one prefill-decode pod");
    assert!(matches!(placed, Placement::Split { .. }), "{placed:?}");
    let refused = r.place_picked(&req, &pick("10.0.0.2:8000", "10.0.1.1:8000"));
    assert!(
        matches!(refused, Err(PdError::Unavailable(_))),
        "{refused:?}"
    );
    // pd-router's own placement keeps them combined: no prefill leg.
    assert!(!r
        .fleet()
        .model("m")
        .expect("m")
        .rolesets
        .iter()
        .any(|s| !s.prefill.is_empty()));
}

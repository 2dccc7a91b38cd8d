//! Discovery on PodList answers shaped like the API server's (the field
//! set of kubernetes/api `core/v1`, as the mock API server serialises it
//! with the official Python models).

use super::adapter::DiscoveredAdapter;
use super::kube::{DiscoveredPod, KubeDiscovery, PodRole, Skipped};
use super::lister::{ListFailure, ListRun, Step};
use super::merge::{build_fleet, UNNAMED_ROLESET};
use super::pod::read_page;
use super::published;
use crate::config::Config;
use crate::pods::MemoryStore;
use serde_json::{json, Value};

fn cfg() -> KubeDiscovery {
    serde_json::from_value(json!({"cluster": "kube_api"})).expect("defaults")
}

/// One pod as the API server lists it.
fn pod(name: &str, ip: Option<&str>, labels: Value) -> Value {
    let mut status = json!({
        "phase": "Running",
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"}
        ]
    });
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "uid": "0b7c3a52-0000-4000-8000-000000000001",
                     "resourceVersion": "12345", "labels": labels},
        "spec": {"containers": [{"name": "engine", "image": "vllm", "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}]}]},
        "status": status
    })
}

fn list(items: Vec<Value>, next: Option<&str>) -> Vec<u8> {
    let mut meta = json!({"resourceVersion": "12346"});
    if let Some(n) = next {
        meta["continue"] = json!(n);
    }
    serde_json::to_vec(
        &json!({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}),
    )
    .expect("json")
}

fn labels(model: &str, role: &str, roleset: &str) -> Value {
    let mut l = json!({"model.aibrix.ai/name": model});
    if !role.is_empty() {
        l["role-name"] = json!(role);
    }
    if !roleset.is_empty() {
        l["roleset-name"] = json!(roleset);
    }
    l
}

#[test]
fn hand_off_annotations_reach_the_fleet() {
    let mut p = pod("p0", Some("10.1.0.5"), labels("llama", "prefill", "rs-0"));
    p["metadata"]["annotations"] = json!({
        "pd-router.io/dp-size": "4",
        "pd-router.io/kv-port": "21001",
        "pd-router.io/nixl-engine-id": "prefill-0",
        "pd-router.io/nixl-side-channel-port": "5601",
        "pd-router.io/nixl-tp-size": "2"
    });
    let mut d = pod("d0", Some("10.1.0.6"), labels("llama", "decode", "rs-0"));
    d["metadata"]["annotations"] =
        json!({"pd-router.io/dp-size": "zero", "pd-router.io/kv-port": "0"});
    let page = read_page(&list(vec![p, d], None), false).expect("page");
    let (p, d) = (&page.pods[0], &page.pods[1]);
    assert_eq!((p.dp_size, p.kv_port), (4, 21001));
    let peer = p.nixl_push.as_ref().expect("push peer");
    assert_eq!(
        (
            peer.engine_id.as_str(),
            peer.side_channel_host.as_deref(),
            peer.side_channel_port,
            peer.tp_size,
            peer.pp_size
        ),
        ("prefill-0", None, 5601, 2, 1)
    );
    assert_eq!(
        (d.dp_size, d.kv_port, d.nixl_push.is_none()),
        (1, 14579, true),
        "malformed: defaults"
    );
    // Through the published form, into endpoints.
    let mut store = MemoryStore::default();
    published::publish(&mut store, "set", "gen", Some(&page.pods), None).expect("publish");
    let back = published::read(&store, "set").expect("published").pods;
    assert_eq!(back, page.pods);
    let (fleet, _) = build_fleet(&[], &back, &[]);
    let e = &fleet.models()[0].rolesets[0].prefill[0];
    assert_eq!((e.dp_size, e.kv_port), (4, 21001));
    assert_eq!(
        e.nixl_push.as_ref().map(|n| n.engine_id.as_str()),
        Some("prefill-0")
    );
}

#[test]
fn routable_pods_are_read_with_aibrix_labels_and_defaults() {
    let mut p = pod("p0", Some("10.1.0.5"), labels("llama", "prefill", "rs-0"));
    p["metadata"]["labels"]["model.aibrix.ai/engine"] = json!("sglang");
    p["metadata"]["labels"]["model.aibrix.ai/port"] = json!("30000");
    p["metadata"]["labels"]["model.aibrix.ai/kv-connector-type"] = json!("NIXL");
    p["metadata"]["annotations"] = json!({"model.aibrix.ai/sglang-bootstrap-port": "9000"});
    let d = pod("d0", Some("fd00::7"), labels("llama", "decode", "rs-0"));
    let page = read_page(&list(vec![p, d], None), false).expect("page");
    assert!(page.skipped.is_empty(), "{:?}", page.skipped);
    let (p, d) = (&page.pods[0], &page.pods[1]);
    assert_eq!(
        (
            p.name.as_str(),
            p.address.to_string(),
            p.engine.as_str(),
            p.role,
            p.roleset.as_str()
        ),
        (
            "p0",
            "10.1.0.5:30000".into(),
            "sglang",
            PodRole::Prefill,
            "rs-0"
        )
    );
    assert_eq!(
        (p.kv_connector.as_deref(), p.bootstrap_port),
        (Some("nixl"), 9000)
    );
    assert_eq!(
        d.address.to_string(),
        "[fd00::7]:8000",
        "IPv6, default port"
    );
    assert_eq!((d.engine.as_str(), d.bootstrap_port), ("vllm", 8998));
    // Every namespace: names carry their namespace.
    let page = read_page(
        &list(vec![pod("x", Some("10.0.0.1"), labels("m", "", ""))], None),
        true,
    )
    .expect("page");
    assert_eq!(page.pods[0].name, "llm/x");
    assert_eq!(page.pods[0].role, PodRole::Both, "no role: both phases");
}

#[test]
fn pods_not_ready_to_serve_are_skipped_with_the_reason() {
    let l = || labels("m", "decode", "rs");
    let mut unready = pod("unready", Some("10.0.0.1"), l());
    unready["status"]["conditions"][1]["status"] = json!("False");
    let mut pending = pod("pending", Some("10.0.0.2"), l());
    pending["status"]["phase"] = json!("Pending");
    let mut leaving = pod("leaving", Some("10.0.0.3"), l());
    leaving["metadata"]["deletionTimestamp"] = json!("2026-01-02T03:04:05Z");
    let mut worker = pod("worker", Some("10.0.0.4"), l());
    worker["metadata"]["labels"]["stormservice.orchestration.aibrix.ai/pod-group-index"] =
        json!("1");
    let mut leader = pod("leader", Some("10.0.0.5"), l());
    leader["metadata"]["labels"]["stormservice.orchestration.aibrix.ai/pod-group-index"] =
        json!("0");
    let mut bad_port = pod("bad-port", Some("10.0.0.6"), l());
    bad_port["metadata"]["labels"]["model.aibrix.ai/port"] = json!("http");
    let mut odd_role = pod("odd-role", Some("10.0.0.7"), l());
    odd_role["metadata"]["labels"]["role-name"] = json!("worker");
    let mut by_annotation = pod(
        "by-annotation",
        Some("10.0.0.8"),
        json!({"role-name": "decode"}),
    );
    by_annotation["metadata"]["annotations"] = json!({"model.aibrix.ai/name": "m"});
    let items = vec![
        unready,
        pending,
        leaving,
        worker,
        leader,
        bad_port,
        odd_role,
        pod("no-ip", None, l()),
        pod("no-model", Some("10.0.0.9"), json!({})),
        by_annotation,
    ];
    let page = read_page(&list(items, None), false).expect("page");
    let names: Vec<&str> = page.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["leader", "by-annotation"]);
    let why: Vec<(&str, Skipped)> = page
        .skipped
        .iter()
        .map(|(n, w)| (n.as_str(), w.clone()))
        .collect();
    assert_eq!(
        why,
        vec![
            ("unready", Skipped::NotReady),
            ("pending", Skipped::NotRunning),
            ("leaving", Skipped::Terminating),
            ("worker", Skipped::NotServing),
            ("bad-port", Skipped::BadPort("http".into())),
            ("odd-role", Skipped::OtherRole("worker".into())),
            ("no-ip", Skipped::NoAddress),
            ("no-model", Skipped::NoModel),
        ]
    );
    assert!(read_page(b"<html>", false).is_err());
    assert!(read_page(br#"{"kind":"PodList","items":null}"#, false)
        .expect("empty")
        .pods
        .is_empty());
}

#[test]
fn list_paths_encode_the_selector_and_page() {
    let mut c = cfg();
    assert_eq!(
        c.list_path(None),
        "/api/v1/namespaces/default/pods?labelSelector=model.aibrix.ai%2Fname&fieldSelector=status.phase%3DRunning&limit=500&resourceVersion=0"
    );
    assert_eq!(
        c.list_path(Some("eyJ2I+/=")),
        "/api/v1/namespaces/default/pods?labelSelector=model.aibrix.ai%2Fname&fieldSelector=status.phase%3DRunning&limit=500&continue=eyJ2I%2B%2F%3D",
        "a continue token carries its own resource version"
    );
    c.namespace = String::new();
    c.label_selector = Some("role-name in (prefill,decode)".into());
    c.list_from_cache = false;
    c.field_selector = String::new();
    assert_eq!(
        c.list_path(None),
        "/api/v1/pods?labelSelector=role-name%20in%20%28prefill%2Cdecode%29&limit=500"
    );
    assert_eq!(
        c.watch_path("4711"),
        "/api/v1/pods?labelSelector=role-name%20in%20%28prefill%2Cdecode%29&watch=1&allowWatchBookmarks=true&resourceVersion=4711&timeoutSeconds=2"
    );
    assert_eq!(c.call_timeout_ms(true), 4000, "the window plus timeout_ms");
    assert_eq!(c.call_timeout_ms(false), 2000);
}

#[test]
fn an_unset_selector_narrows_to_the_configured_models_that_can_be_labels() {
    let mut c = cfg();
    c.narrow_to(["qwen3-8b", "Qwen/Qwen3-8B", "llama", "qwen3-8b"]);
    assert_eq!(
        c.label_selector.as_deref(),
        Some("model.aibrix.ai/name in (llama,qwen3-8b)")
    );
    let mut c = cfg();
    c.narrow_to(["Qwen/Qwen3-8B"]);
    assert_eq!(c.label_selector.as_deref(), Some("model.aibrix.ai/name"));
    let mut c = cfg();
    c.label_selector = Some(String::new());
    c.narrow_to(["llama"]);
    assert_eq!(
        c.label_selector.as_deref(),
        Some(""),
        "set by the user: kept"
    );
    assert!(!c.list_path(None).contains("labelSelector"));
    for bad in ["", "-a", "a-", "a/b", &"x".repeat(64)] {
        assert!(!super::kube::is_label_value(bad), "{bad:?}");
    }
    assert!(super::kube::is_label_value("a.b_c-9"));
}

#[test]
fn a_list_follows_pages_and_restarts_when_its_token_expires() {
    let c = cfg();
    let (mut run, first) = ListRun::start(&c);
    assert!(first.contains("resourceVersion=0"));
    let page1 = list(
        vec![pod("b", Some("10.0.0.2"), labels("m", "decode", "rs"))],
        Some("t1"),
    );
    let Step::Fetch(next) = run.on_answer(&c, Some(200), &page1) else {
        panic!("a second page")
    };
    assert!(next.ends_with("continue=t1"));
    // Expired: start over from the first page, forgetting what was read.
    assert_eq!(
        run.on_answer(&c, Some(410), b"{}"),
        Step::Fetch(first.clone())
    );
    let _ = run.on_answer(&c, Some(200), &page1);
    let page2 = list(
        vec![pod("a", Some("10.0.0.1"), labels("m", "prefill", "rs"))],
        None,
    );
    let Step::Done(listed) = run.on_answer(&c, Some(200), &page2) else {
        panic!("done")
    };
    let names: Vec<&str> = listed.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["a", "b"], "sorted, nothing twice");
    assert_eq!(listed.pages, 2);
}

#[test]
fn failed_lists_say_what_to_fix() {
    let c = cfg();
    let fail = |status: Option<u16>, body: &str| {
        let (mut run, _) = ListRun::start(&c);
        match run.on_answer(&c, status, body.as_bytes()) {
            Step::Failed(f) => f,
            other => panic!("{other:?}"),
        }
    };
    let unauthorized = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#;
    let f = fail(Some(401), unauthorized);
    assert_eq!(f, ListFailure::Unauthorized("Unauthorized".into()));
    assert!(f.to_string().contains("token_env"));
    assert!(fail(Some(403), r#"{"message":"pods is forbidden"}"#)
        .to_string()
        .contains("rbac"));
    assert_eq!(fail(None, "").kind(), "unreachable");
    assert_eq!(
        fail(Some(504), "upstream request timeout").kind(),
        "unreachable"
    );
    assert_eq!(
        fail(
            Some(503),
            "upstream connect error or disconnect/reset before headers"
        )
        .kind(),
        "unreachable"
    );
    assert_eq!(
        fail(Some(503), r#"{"message":"etcd"}"#),
        ListFailure::Status(503, "etcd".into())
    );
    assert_eq!(fail(Some(429), "{}").kind(), "throttled");
    assert_eq!(fail(Some(200), "{not json").kind(), "unparsable answer");
    // An expired token restarts the list, but not forever.
    let (mut run, _) = ListRun::start(&c);
    let _ = run.on_answer(&c, Some(410), b"{}");
    let _ = run.on_answer(&c, Some(410), b"{}");
    assert!(matches!(
        run.on_answer(&c, Some(410), b"{}"),
        Step::Failed(ListFailure::Runaway(_))
    ));
}

fn discovered(items: Vec<Value>) -> Vec<super::DiscoveredPod> {
    let mut pods = read_page(&list(items, None), false).expect("page").pods;
    pods.sort();
    pods
}

#[test]
fn discovered_pods_join_configured_models_or_found_their_own() {
    let config = Config::parse(
        br#"{"discovery":{"kubernetes":{"cluster":"kube_api"}},
             "models":[{"name":"llama","engine":"vllm","decode_policy":"least_request",
                        "rolesets":[{"name":"static","prefill":["10.9.0.1:8000"],"decode":["10.9.0.2:8000"]}]}]}"#,
    )
    .expect("config");
    let mut sg = pod("sg-p", Some("10.2.0.1"), labels("qwen", "prefill", "a"));
    sg["metadata"]["labels"]["model.aibrix.ai/engine"] = json!("sglang");
    let mut sg_d = pod("sg-d", Some("10.2.0.2"), labels("qwen", "decode", "a"));
    sg_d["metadata"]["labels"]["model.aibrix.ai/engine"] = json!("sglang");
    let mut wrong_engine = pod(
        "llama-x",
        Some("10.1.0.9"),
        labels("llama", "decode", "rs0"),
    );
    wrong_engine["metadata"]["labels"]["model.aibrix.ai/engine"] = json!("trtllm");
    let mut mooncake = pod("llama-p1", Some("10.1.0.3"), labels("llama", "prefill", ""));
    mooncake["metadata"]["labels"]["model.aibrix.ai/kv-connector-type"] = json!("lmcache");
    let pods = discovered(vec![
        pod(
            "llama-p0",
            Some("10.1.0.1"),
            labels("llama", "prefill", "rs0"),
        ),
        pod(
            "llama-d0",
            Some("10.1.0.2"),
            labels("llama", "decode", "rs0"),
        ),
        mooncake,
        pod("llama-d1", Some("10.1.0.4"), labels("llama", "decode", "")),
        pod("llama-both", Some("10.1.0.5"), labels("llama", "", "")),
        wrong_engine,
        sg,
        sg_d,
    ]);
    let (fleet, unused) = build_fleet(&config.models, &pods, &[]);
    let llama = fleet.model("llama").expect("llama");
    assert_eq!(
        llama.decode_policy,
        crate::fleet::DecodePolicy::LeastRequest,
        "configured policy kept"
    );
    let rolesets: Vec<(&str, usize, usize)> = llama
        .rolesets
        .iter()
        .map(|r| (r.name.as_str(), r.prefill.len(), r.decode.len()))
        .collect();
    assert_eq!(
        rolesets,
        vec![("static", 1, 1), (UNNAMED_ROLESET, 1, 1), ("rs0", 1, 1)]
    );
    assert_eq!(
        llama.combined.len(),
        1,
        "a pod without a role serves both phases"
    );
    let qwen = fleet.model("qwen").expect("a model only discovery knows");
    assert_eq!(qwen.engine, "sglang");
    let why: Vec<&str> = unused.iter().map(|u| u.what.as_str()).collect();
    assert_eq!(why, vec!["pod llama-p1", "pod llama-x"], "{unused:?}");
    assert!(unused[0].why.contains("lmcache") && unused[1].why.contains("trtllm"));
    // The unsupported connector label only falls back; the pod still serves.
    assert!(llama.rolesets[1].prefill[0].kv_connector.is_none());
}

#[test]
fn publishing_writes_only_changes_and_bumps_the_generation() {
    let mut store = MemoryStore::default();
    let pods = discovered(vec![pod(
        "a",
        Some("10.0.0.1"),
        labels("m", "prefill", "rs"),
    )]);
    let mut publish = |pods: Option<&[DiscoveredPod]>, adapters: Option<&[DiscoveredAdapter]>| {
        published::publish(&mut store, "set", "gen", pods, adapters)
            .expect("publish")
            .map(|set| set.generation)
    };
    assert_eq!(publish(Some(&pods), None), Some(1));
    assert_eq!(publish(Some(&pods), None), None, "unchanged");
    let sql = [DiscoveredAdapter {
        name: "sql".into(),
        base: None,
        instances: vec!["a".into()],
    }];
    assert_eq!(publish(None, Some(&sql)), Some(2), "adapters, pods kept");
    assert_eq!(publish(Some(&pods), None), None, "adapters kept");
    assert_eq!(publish(Some(&[]), None), Some(3));
    let set = published::read(&store, "set").expect("set");
    assert_eq!((set.pods, set.adapters), (vec![], sql.to_vec()));
    let (gen, _) = crate::pods::SharedStore::shared_get(&store, "gen");
    assert_eq!(published::decode_generation(gen.as_deref()), 3);
}

#[test]
fn llm_d_roles_and_a_pools_ports_make_the_endpoints() {
    use super::kube::LabelScheme;
    use super::pod::{read_page_as, Reader};
    use super::pool::PoolView;
    let role = |r: Option<&str>| {
        let mut l = json!({"llm-d.ai/guide": "pd", "llm-d.ai/model": "qwen"});
        if let Some(r) = r {
            l["llm-d.ai/role"] = json!(r);
        }
        l
    };
    let mut ranked = pod("d1", Some("10.0.0.4"), role(Some("decode")));
    ranked["metadata"]["annotations"] = json!({"llm-d.ai/active-ports": "8001"});
    let items = vec![
        pod("p0", Some("10.0.0.1"), role(Some("prefill"))),
        pod("d0", Some("10.0.0.2"), role(Some("decode"))),
        pod("c0", Some("10.0.0.3"), role(Some("prefill-decode"))),
        pod("c1", Some("10.0.0.7"), role(Some("both"))),
        pod("c2", Some("10.0.0.8"), role(Some("encode-prefill-decode"))),
        pod("n0", Some("10.0.0.5"), role(None)),
        pod("x0", Some("10.0.0.10"), role(Some("tokenize"))),
        ranked,
    ];
    let reader = Reader {
        scheme: LabelScheme::LlmD,
        pool: Some(PoolView {
            selector: "llm-d.ai/guide=pd".into(),
            ports: vec![8000, 8001],
        }),
        ..Reader::default()
    };
    let page = read_page_as(&list(items, None), &reader).expect("page");
    let got: Vec<(String, String, PodRole)> = page
        .pods
        .iter()
        .map(|p| (p.name.clone(), p.address.to_string(), p.role))
        .collect();
    assert!(got.contains(&("p0-rank-0".into(), "10.0.0.1:8000".into(), PodRole::Prefill)));
    assert!(got.contains(&("p0-rank-1".into(), "10.0.0.1:8001".into(), PodRole::Prefill)));
    // Labelled for both phases: llm-d's prefill filter takes them too.
    for (name, ip, role) in [
        ("c0", "10.0.0.3", PodRole::PrefillDecode),
        ("c1", "10.0.0.7", PodRole::PrefillDecode),
        ("c2", "10.0.0.8", PodRole::EncodePrefillDecode),
    ] {
        let want = (format!("{name}-rank-0"), format!("{ip}:8000"), role);
        assert!(got.contains(&want), "{name}: {got:?}");
    }
    assert!(got.contains(&("n0-rank-1".into(), "10.0.0.5:8001".into(), PodRole::Both)));
    // Only the active port: the pod's own name.
    assert!(got.contains(&("d1".into(), "10.0.0.4:8001".into(), PodRole::Decode)));
    assert!(page.pods.iter().all(|p| p.model == "qwen"));
    assert_eq!(
        page.pods
            .iter()
            .find(|p| p.name == "p0-rank-1")
            .map(|p| p.object()),
        Some("p0")
    );
    assert_eq!(
        page.skipped,
        vec![("x0".to_owned(), Skipped::OtherRole("tokenize".into()))]
    );
    // The pool's model wins over the label.
    let named = Reader {
        pool_model: Some("served".into()),
        ..reader
    };
    let page = read_page_as(
        &list(
            vec![pod("p0", Some("10.0.0.1"), role(Some("prefill")))],
            None,
        ),
        &named,
    )
    .expect("page");
    assert!(page.pods.iter().all(|p| p.model == "served"));
}

fn adapter(name: &str, base: Option<&str>, instances: &[&str]) -> DiscoveredAdapter {
    DiscoveredAdapter {
        name: name.into(),
        base: base.map(str::to_owned),
        instances: instances.iter().map(|i| i.to_string()).collect(),
    }
}

#[test]
fn a_discovered_adapter_is_served_on_its_instance_pods_only() {
    let config = Config::parse(
        br#"{"models":[{"name":"llama","engine":"vllm","adapters":["sql","chat"]},
                       {"name":"idle","engine":"vllm","adapters":["qwen-lora"]}]}"#,
    )
    .expect("config");
    let pods = discovered(vec![
        pod("llama-p0", Some("10.1.0.1"), labels("llama", "prefill", "")),
        pod("llama-d0", Some("10.1.0.2"), labels("llama", "decode", "")),
        pod("llama-d1", Some("10.1.0.3"), labels("llama", "decode", "")),
        pod("qwen-0", Some("10.2.0.1"), labels("qwen", "", "")),
    ]);
    let adapters = [
        // Configured, and discovered on two pods: discovery narrows it.
        adapter("sql", None, &["llama-p0", "llama-d1", "gone-pod"]),
        adapter("qwen-lora", None, &["qwen-0"]),
        // Its pods left: kept under its base model, served nowhere.
        adapter("idle-lora", Some("idle"), &["gone-pod"]),
        adapter("stray", None, &["gone-pod"]),
        adapter("both", None, &["llama-d0", "qwen-0"]),
        adapter("qwen", None, &["qwen-0"]),
    ];
    let (fleet, unused) = build_fleet(&config.models, &pods, &adapters);
    let ids = |model: &str, names: &[&str]| -> Vec<crate::fleet::PodId> {
        let m = fleet.model(model).expect("model");
        let eps = m.endpoints();
        names
            .iter()
            .filter_map(|n| eps.iter().find(|e| e.name == *n).map(|e| e.id))
            .collect()
    };
    let llama = fleet.model("llama").expect("llama");
    assert_eq!(llama.adapters, ["sql", "chat"], "no name twice");
    let sql: Vec<bool> = ids("llama", &["llama-p0", "llama-d0", "llama-d1"])
        .into_iter()
        .map(|id| llama.serves(Some("sql"), id))
        .collect();
    assert_eq!(sql, [true, false, true]);
    let any = ids("llama", &["llama-d0"]);
    assert!(llama.serves(Some("chat"), any[0]), "configured: every pod");
    assert!(llama.serves(None, any[0]));
    let qwen = fleet.model("qwen").expect("discovered model");
    assert_eq!(qwen.adapters, ["qwen-lora"]);
    assert_eq!(
        fleet.serve("qwen-lora").expect("served").model.name,
        "qwen",
        "discovery moves a configured name to its base model"
    );
    assert!(qwen.serves(Some("qwen-lora"), ids("qwen", &["qwen-0"])[0]));
    let idle = fleet.serve("idle-lora").expect("kept");
    assert_eq!(idle.model.name, "idle");
    assert_eq!(idle.model.adapter_pods, [("idle-lora".to_owned(), vec![])]);
    let left: Vec<(&str, bool)> = unused
        .iter()
        .map(|u| (u.what.as_str(), u.why.contains("baseModel")))
        .collect();
    assert_eq!(
        left,
        [
            ("adapter stray", false),
            ("adapter both", true),
            ("adapter qwen", false)
        ]
    );
    for gone in ["stray", "both"] {
        assert!(fleet.serve(gone).is_none(), "{gone}");
    }
    assert!(fleet.serve("qwen").is_some_and(|s| s.adapter.is_none()));
    // The objects gone: configured names are served everywhere again.
    let (fleet, _) = build_fleet(&config.models, &pods, &[]);
    let llama = fleet.model("llama").expect("llama");
    assert!(llama.adapter_pods.is_empty() && llama.serves(Some("sql"), any[0]));
    let back = fleet.serve("qwen-lora").expect("configured");
    assert_eq!(back.model.name, "idle", "its configured model again");
    assert!(fleet.serve("stray").is_none());
}

#[test]
fn model_adapters_are_read_with_aibrix_labels_unless_turned_off() {
    let c = cfg();
    assert!(c.reads_adapters());
    assert_eq!(
        c.adapters_path(),
        "/apis/model.aibrix.ai/v1alpha1/namespaces/default/modeladapters?resourceVersion=0"
    );
    let every: KubeDiscovery = serde_json::from_value(json!({
        "cluster": "k", "namespace": "", "list_from_cache": false}))
    .expect("cfg");
    assert_eq!(
        every.adapters_path(),
        "/apis/model.aibrix.ai/v1alpha1/modeladapters"
    );
    let read = |v: Value| -> bool {
        let mut v = v;
        v["cluster"] = json!("k");
        serde_json::from_value::<KubeDiscovery>(v)
            .expect("cfg")
            .reads_adapters()
    };
    assert!(!read(json!({"model_adapters": false})));
    assert!(!read(json!({"labels": "llm-d"})));
    assert!(read(json!({"labels": "llm-d", "model_adapters": true})));
}

#[test]
fn llm_d_encoders_and_self_encoding_prefills_join_an_epd_model() {
    use super::kube::LabelScheme;
    use super::pod::{read_page_as, Reader};
    // llm-d-router `pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go`:
    // `encode` pods encode; `encode-prefill` pods are prefills that encode
    // their own media.
    let role = |r: &str| json!({"llm-d.ai/model": "qwen", "llm-d.ai/role": r});
    let items = vec![
        pod("e0", Some("10.0.0.6"), role("encode")),
        pod("ep0", Some("10.0.0.9"), role("encode-prefill")),
        pod("p0", Some("10.0.0.1"), role("prefill")),
        pod("d0", Some("10.0.0.2"), role("decode")),
        pod("epd0", Some("10.0.0.8"), role("encode-prefill-decode")),
    ];
    let reader = Reader {
        scheme: LabelScheme::LlmD,
        ..Reader::default()
    };
    let page = read_page_as(&list(items, None), &reader).expect("page");
    assert!(page.skipped.is_empty(), "{:?}", page.skipped);
    let role_of = |n: &str| page.pods.iter().find(|p| p.name == n).map(|p| p.role);
    assert_eq!(role_of("e0"), Some(PodRole::Encode));
    assert_eq!(role_of("ep0"), Some(PodRole::EncodePrefill));
    let config = Config::parse(
        br#"{"discovery":{"kubernetes":{"cluster":"kube_api","labels":"llm-d"}},
             "models":[{"name":"qwen","engine":"vllm","ec_connector":"nixl"}]}"#,
    )
    .expect("config");
    let (fleet, unused) = build_fleet(&config.models, &page.pods, &[]);
    assert!(unused.is_empty());
    let qwen = fleet.model("qwen").expect("qwen");
    let rs = &qwen.rolesets[0];
    let names = |l: &[std::rc::Rc<crate::fleet::Endpoint>]| -> Vec<(String, bool)> {
        l.iter().map(|e| (e.name.clone(), e.encodes)).collect()
    };
    assert_eq!(names(&rs.encode), vec![("e0".to_owned(), false)]);
    let mut prefill = names(&rs.prefill);
    prefill.sort();
    assert_eq!(
        prefill,
        vec![("ep0".to_owned(), true), ("p0".to_owned(), false)]
    );
    assert_eq!(qwen.ec_connector, Some(crate::fleet::EcConnector::Nixl));
    // Both phases and its own media: combined, a prefill a picker may name.
    let whole = &qwen.combined[0];
    assert!(whole.name == "epd0" && whole.encodes && whole.prefill_when_picked);
}

//! The root side against a fake host: several VMs share one store, as
//! Envoy's worker VMs share data of one `vm_id`.

use super::*;
use crate::error::HostError;
use crate::fleet::Fleet;
use crate::host::{Counter, Level, PodEvent, Telemetry};
use crate::pods::{MemoryStore, SetError, SharedStore};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::HashSet;

#[derive(Debug, Clone)]
struct Call {
    token: u32,
    cluster: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Call {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// One VM's root host; `store` is shared with the other VMs of a test.
struct FakeRoot {
    store: Rc<RefCell<MemoryStore>>,
    now: u64,
    calls: Vec<Call>,
    next_token: Rc<RefCell<u32>>,
    answer: Vec<u8>,
    logs: RefCell<Vec<(Level, String)>>,
    counters: RefCell<Vec<Counter>>,
    discovered: RefCell<Option<u64>>,
    published: RefCell<Option<u64>>,
    applied: RefCell<Option<u64>>,
    age: RefCell<Option<u64>>,
}

impl FakeRoot {
    fn new(store: &Rc<RefCell<MemoryStore>>, tokens: &Rc<RefCell<u32>>) -> FakeRoot {
        FakeRoot {
            store: Rc::clone(store),
            now: 10_000,
            calls: Vec::new(),
            next_token: Rc::clone(tokens),
            answer: Vec::new(),
            logs: RefCell::new(Vec::new()),
            counters: RefCell::new(Vec::new()),
            discovered: RefCell::new(None),
            published: RefCell::new(None),
            applied: RefCell::new(None),
            age: RefCell::new(None),
        }
    }

    fn counted(&self, c: Counter) -> usize {
        self.counters.borrow().iter().filter(|x| **x == c).count()
    }

    fn logged(&self, needle: &str) -> bool {
        self.logs.borrow().iter().any(|(_, l)| l.contains(needle))
    }

    fn take_calls(&mut self) -> Vec<Call> {
        std::mem::take(&mut self.calls)
    }
}

impl SharedStore for FakeRoot {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.store.borrow().shared_get(key)
    }
    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        self.store.borrow_mut().shared_set(key, value, cas)
    }
}

impl Telemetry for FakeRoot {
    fn log(&self, level: Level, message: &str) {
        self.logs.borrow_mut().push((level, message.to_owned()));
    }
    fn log_enabled(&self, _level: Level) -> bool {
        true
    }
    fn increment(&self, counter: Counter) {
        self.counters.borrow_mut().push(counter);
    }
    fn count_pod(&self, _pod: &str, _event: PodEvent) {}
    fn now_ms(&self) -> u64 {
        self.now
    }
}

impl RootHost for FakeRoot {
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        self.post(cluster, headers, &[], timeout_ms)
    }
    fn post(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        _timeout_ms: u64,
    ) -> Result<u32, HostError> {
        let mut next = self.next_token.borrow_mut();
        *next += 1;
        self.calls.push(Call {
            token: *next,
            cluster: cluster.to_owned(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_vec(),
        });
        Ok(*next)
    }
    fn call_answer_body(&self, len: usize, max: usize) -> Vec<u8> {
        self.answer[..len.min(max).min(self.answer.len())].to_vec()
    }
    fn record_discovered(&self, pods: u64, generation: u64) {
        *self.discovered.borrow_mut() = Some(pods);
        *self.applied.borrow_mut() = Some(generation);
    }
    fn record_published(&self, generation: u64) {
        *self.published.borrow_mut() = Some(generation);
    }
    fn record_discovery_age(&self, age_ms: u64) {
        *self.age.borrow_mut() = Some(age_ms);
    }
    fn know_fleet(&self, _fleet: &Fleet) {}
    fn record_pod(&self, _pod: &str, _outstanding: u32, _pending: u32, _healthy: bool) {}
    fn zero_departed(&self, _live: &HashSet<&str>) {}
}

/// `vms` VMs of one Envoy configured with `json`.
fn vms(json: &str, vms: u64) -> Vec<(Root, FakeRoot)> {
    let store = Rc::new(RefCell::new(MemoryStore::default()));
    let tokens = Rc::new(RefCell::new(0));
    (1..=vms)
        .map(|vm| {
            let mut host = FakeRoot::new(&store, &tokens);
            let env = |_: &str| None;
            let c = configure(Some(json.as_bytes()), &env, &mut host, vm, 0).expect("configured");
            (Root::new(Rc::new(c.router), vm, c.kube_token), host)
        })
        .collect()
}

fn answer(root: &mut Root, host: &mut FakeRoot, call: &Call, status: Option<u16>, body: &[u8]) {
    host.answer = body.to_vec();
    root.on_call_answer(host, call.token, status, body.len());
}

#[test]
fn configure_errors_say_what_to_fix() {
    let mut store = MemoryStore::default();
    let none = |_: &str| None;
    let err = |raw: Option<&[u8]>, env: &dyn Fn(&str) -> Option<String>| {
        configure(raw, env, &mut MemoryStore::default(), 1, 0)
            .err()
            .expect("refused")
            .to_string()
    };
    assert_eq!(
        err(None, &none),
        "pd-router configuration: missing; the filter needs a JSON configuration with at least \"models\""
    );
    assert!(err(Some(b"not json"), &none).starts_with("pd-router configuration: "));
    let ok = br#"{"models":[{"name":"m","engine":"lmdeploy","rolesets":[]}]}"#;
    let bad_id = |v: &str| {
        if v == "PD_ROUTER_TRT_MACHINE_ID" {
            Some("2000".to_owned())
        } else {
            None
        }
    };
    assert!(err(Some(ok), &bad_id)
        .starts_with("pd-router configuration: trt_machine_id_env: $PD_ROUTER_TRT_MACHINE_ID: "));

    let env = |v: &str| match v {
        "PD_ROUTER_TRT_AUTH_KEY" => Some("secret".to_owned()),
        "PD_ROUTER_TRT_MACHINE_ID" => Some("7".to_owned()),
        _ => None,
    };
    let c = configure(Some(ok), &env, &mut store, 1, 0).expect("valid");
    assert_eq!(c.router.config.trt.machine_id, 7);
    assert!(c
        .notes
        .iter()
        .any(|n| n.contains("signed with the key in $PD_ROUTER_TRT_AUTH_KEY")));
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("\"lmdeploy\", which has no handler")));
    // Each VM claims its own worker slot.
    let second = configure(Some(ok), &env, &mut store, 2, 0).expect("valid");
    assert_ne!(c.router.worker_slot(), second.router.worker_slot());
}

const TWO_PODS: &str = r#"{"scrape_interval_ms":1000,"models":[{"name":"m","engine":"vllm",
    "rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#;

const METRICS: &[u8] = b"vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n";

#[test]
fn one_vm_scrapes_under_the_lease_and_another_takes_over_when_it_lapses() {
    let mut vms = vms(TWO_PODS, 2);
    let [(a, ha), (b, hb)] = &mut vms[..] else {
        panic!("two vms")
    };
    a.on_tick(ha);
    b.on_tick(hb);
    let scrapes = ha.take_calls();
    assert_eq!(scrapes.len(), 2, "the lease holder scrapes every pod");
    assert!(hb.take_calls().is_empty(), "the other VM does not");
    assert!(scrapes.iter().all(|c| c.header(":path") == "/metrics"));
    for call in &scrapes {
        answer(a, ha, call, Some(200), METRICS);
    }
    let key = a.router.keys().scraped();
    let table = crate::pods::decode_scraped(hb.shared_get(&key).0.as_deref());
    assert_eq!(table.len(), 2, "what one VM scraped every VM reads");

    // The holder goes quiet: once its lease lapses, the other VM scrapes.
    hb.now += 1_000;
    b.on_tick(hb);
    assert!(hb.take_calls().is_empty(), "the lease still holds");
    hb.now += 3_000;
    b.on_tick(hb);
    assert_eq!(hb.take_calls().len(), 2);
}

#[test]
fn a_scrape_envoy_itself_refused_judges_no_pod() {
    let mut vms = vms(TWO_PODS, 1);
    let (root, host) = &mut vms[0];
    root.on_tick(host);
    let scrapes = host.take_calls();
    // Envoy 1.40's bodies: the prefill cluster's breaker (which scrapes
    // share by default), and a pooled connection closed as the scrape left.
    let overflow =
        b"upstream connect error or disconnect/reset before headers. reset reason: overflow";
    let closed = b"upstream connect error or disconnect/reset before headers. reset reason: connection termination";
    answer(root, host, &scrapes[0], Some(503), overflow);
    answer(root, host, &scrapes[1], Some(503), closed);
    assert_eq!(host.counted(Counter::Ejection), 0);
    let now = host.now;
    assert!(root
        .router
        .pod_counters(&*host)
        .iter()
        .all(|(_, c)| c.is_healthy(now)));
    // A refused connection still ejects.
    host.now += 2_000;
    root.on_tick(host);
    let scrapes = host.take_calls();
    let refused = b"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";
    answer(root, host, &scrapes[0], Some(503), refused);
    assert_eq!(host.counted(Counter::Ejection), 1);
}

#[test]
fn a_failed_scrape_ejects_its_pod() {
    let mut vms = vms(TWO_PODS, 1);
    let (root, host) = &mut vms[0];
    root.on_tick(host);
    let scrapes = host.take_calls();
    answer(root, host, &scrapes[0], Some(503), b"");
    answer(root, host, &scrapes[1], None, b"");
    assert_eq!(host.counted(Counter::Ejection), 2);
    assert!(host.logged("scrape failed (status 503)") && host.logged("scrape failed (no answer)"));
    let now = host.now;
    assert!(root
        .router
        .pod_counters(&*host)
        .iter()
        .all(|(_, c)| !c.is_healthy(now)));
}

fn pod(name: &str, ip: &str, role: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": "7",
                     "labels": {"model.aibrix.ai/name": "m", "role-name": role, "roleset-name": "rs0"}},
        "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn pod_list(items: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({"kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "8"}, "items": items}))
    .expect("json")
}

const DISCOVERED: &str = r#"{"scrape_interval_ms":0,
    "discovery":{"kubernetes":{"cluster":"kube_api","interval_ms":1000,"model_adapters":false}},
    "models":[{"name":"m","engine":"vllm"}]}"#;

#[test]
fn discovery_publishes_a_list_and_keeps_the_last_good_set_when_lists_fail() {
    let mut vms = vms(DISCOVERED, 2);
    let [(a, ha), (b, hb)] = &mut vms[..] else {
        panic!("two vms")
    };
    a.on_tick(ha);
    let list = ha.take_calls();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].cluster, "kube_api");
    assert!(list[0]
        .header(":path")
        .starts_with("/api/v1/namespaces/default/pods?"));
    let pods = pod_list(vec![
        pod("p0", "10.1.0.1", "prefill"),
        pod("d0", "10.1.0.2", "decode"),
    ]);
    answer(a, ha, &list[0], Some(200), &pods);
    assert_eq!(ha.counted(Counter::DiscoveryList), 1);
    assert_eq!(*ha.published.borrow(), Some(1));

    // Every VM applies the published set at its next tick.
    assert_eq!(*hb.applied.borrow(), None);
    b.on_tick(hb);
    assert_eq!(*hb.applied.borrow(), Some(1));
    assert!(hb.take_calls().is_empty(), "only the lease holder lists");
    assert_eq!(b.router.fleet().pods().len(), 2);
    assert_eq!(*hb.discovered.borrow(), Some(2));

    // The API server fails: the pods stay, the failure is counted and said once.
    for status in [Some(500), None] {
        ha.now += 1_000;
        a.on_tick(ha);
        let list = ha.take_calls();
        assert_eq!(list.len(), 1);
        answer(a, ha, &list[0], status, b"{}");
    }
    assert_eq!(ha.counted(Counter::DiscoveryFailure), 2);
    assert!(ha.logged("keeping the last good pod set"));
    hb.now += 2_000;
    b.on_tick(hb);
    assert_eq!(a.router.fleet().pods().len(), 2);
    assert_eq!(b.router.fleet().pods().len(), 2);
}

const WATCHED: &str = r#"{"scrape_interval_ms":0,
    "discovery":{"kubernetes":{"cluster":"kube_api","interval_ms":1000,"stale_after_ms":5000,
                               "model_adapters":false}},
    "models":[{"name":"m","engine":"vllm"}]}"#;

fn watch_events(events: &[(&str, Value)]) -> Vec<u8> {
    events
        .iter()
        .flat_map(|(kind, object)| {
            let mut line =
                serde_json::to_vec(&json!({"type": kind, "object": object})).expect("json");
            line.push(b'\n');
            line
        })
        .collect()
}

/// Ticks until the lister calls (the jitter delays it), at most 40 s.
fn next_call(root: &mut Root, host: &mut FakeRoot) -> Call {
    for _ in 0..400 {
        root.on_tick(host);
        if let Some(call) = host.take_calls().pop() {
            return call;
        }
        host.now += 100;
    }
    panic!("no call to the API server: {:?}", host.logs.borrow())
}

#[test]
fn one_list_then_watches_and_a_relist_when_the_watch_expires() {
    let mut vms = vms(WATCHED, 2);
    let [(a, ha), (b, hb)] = &mut vms[..] else {
        panic!("two vms")
    };
    let list = next_call(a, ha);
    assert!(list
        .header(":path")
        .contains("labelSelector=model.aibrix.ai%2Fname%20in%20%28m%29"));
    assert!(list
        .header(":path")
        .contains("fieldSelector=status.phase%3DRunning"));
    answer(
        a,
        ha,
        &list,
        Some(200),
        &pod_list(vec![pod("p0", "10.1.0.1", "prefill")]),
    );

    // A watch from the list's resourceVersion, not another list.
    let watch = next_call(a, ha);
    let path = watch.header(":path");
    assert!(
        path.contains("watch=1") && path.contains("resourceVersion=8"),
        "{path}"
    );
    assert!(path.contains("allowWatchBookmarks=true") && path.contains("timeoutSeconds=2"));
    let body = watch_events(&[("ADDED", pod("d0", "10.1.0.2", "decode"))]);
    answer(a, ha, &watch, Some(200), &body);
    assert_eq!(ha.counted(Counter::DiscoveryWatch), 1);
    b.on_tick(hb);
    assert_eq!(
        b.router.fleet().pods().len(),
        2,
        "every VM applies the watched set"
    );

    // The next watch goes on from the event's resourceVersion ("7").
    let watch = next_call(a, ha);
    assert!(watch.header(":path").contains("resourceVersion=7"));
    let expired = watch_events(&[(
        "ERROR",
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": "too old resource version: 7 (9)", "reason": "Expired", "code": 410}),
    )]);
    answer(a, ha, &watch, Some(200), &expired);
    assert_eq!(ha.counted(Counter::DiscoveryRelist), 1);
    assert!(ha.logged("listing again"));
    let relist = next_call(a, ha);
    assert!(!relist.header(":path").contains("watch=1"), "a fresh list");
    assert_eq!(b.router.fleet().pods().len(), 2, "the set stays meanwhile");
}

#[test]
fn a_set_not_confirmed_for_stale_after_ms_is_said_and_its_age_published() {
    let mut vms = vms(WATCHED, 1);
    let [(a, ha)] = &mut vms[..] else {
        panic!("one vm")
    };
    let list = next_call(a, ha);
    answer(
        a,
        ha,
        &list,
        Some(200),
        &pod_list(vec![pod("p0", "10.1.0.1", "prefill")]),
    );
    let synced_at = ha.now;
    // The API server goes away: every call fails, with growing waits.
    while ha.now < synced_at + 8_000 {
        let call = next_call(a, ha);
        answer(a, ha, &call, None, b"");
    }
    a.on_tick(ha);
    let age = ha.age.borrow().expect("age published");
    assert!(age >= 8_000, "{age}");
    assert!(
        ha.logged("s old (stale_after_ms 5000)"),
        "{:?}",
        ha.logs.borrow()
    );
    assert!(ha.counted(Counter::DiscoveryFailure) >= 3);
    // Back: a good answer makes it current, said once.
    let call = next_call(a, ha);
    answer(a, ha, &call, Some(200), b"");
    a.on_tick(ha);
    assert!(ha.age.borrow().expect("age") < 1_000);
    assert!(ha.logged("the pod set is current again"));
    assert!(ha.logged("the API server answers again"));
}

#[test]
fn a_call_cut_when_its_timeout_ends_is_said_to_have_timed_out_not_reset() {
    let mut vms = vms(WATCHED, 1);
    let [(a, ha)] = &mut vms[..] else {
        panic!("one vm")
    };
    let list = next_call(a, ha);
    let pods = pod_list(vec![pod("p0", "10.1.0.1", "prefill")]);
    answer(a, ha, &list, Some(200), &pods);
    // Envoy cuts a watch whose timeout ends mid-answer with a reset and
    // no status, not with the 504 it gives one cut before its headers.
    let watch = next_call(a, ha);
    ha.now += 700_000;
    answer(a, ha, &watch, None, b"");
    assert!(
        ha.logged("the API server did not answer: timed out"),
        "{:?}",
        ha.logs.borrow()
    );
    assert!(!ha.logged("connection reset"));
    let again = next_call(a, ha);
    assert!(
        again.header(":path").contains("watch=1"),
        "the watch goes on"
    );
    answer(a, ha, &again, Some(200), &watch_events(&[]));
    assert!(ha.logged("the API server answers again"));
    // A reset well inside the call's time is the connection's.
    let watch = next_call(a, ha);
    answer(a, ha, &watch, None, b"");
    assert!(
        ha.logged("the API server did not answer: connection reset"),
        "{:?}",
        ha.logs.borrow()
    );
}

#[test]
fn a_missing_token_is_said_at_configure() {
    let mut host = MemoryStore::default();
    let c = configure(Some(DISCOVERED.as_bytes()), &|_| None, &mut host, 1, 0).expect("valid");
    assert!(c.kube_token.is_none());
    assert!(c
        .notes
        .iter()
        .any(|n| n.contains("no token in the VM environment variable \"PD_ROUTER_KUBE_TOKEN\"")));
    let env = |v: &str| (v == "PD_ROUTER_KUBE_TOKEN").then(|| " t0k3n\n".to_owned());
    let c = configure(Some(DISCOVERED.as_bytes()), &env, &mut host, 1, 0).expect("valid");
    assert_eq!(c.kube_token.as_deref(), Some("t0k3n"));
}

#[test]
fn mooncake_engine_ids_are_learned_once_and_shared() {
    let mut vms = vms(
        r#"{"scrape_interval_ms":0,"models":[{"name":"m","engine":"vllm","kv_connector":"mooncake",
            "rolesets":[{"prefill":[{"address":"10.0.0.1:8000","bootstrap_port":8998}],"decode":["10.0.0.2:8000"]}]}]}"#,
        2,
    );
    let [(a, ha), (b, hb)] = &mut vms[..] else {
        panic!("two vms")
    };
    a.on_tick(ha);
    b.on_tick(hb);
    let asks = ha.take_calls();
    assert_eq!(asks.len(), 1);
    assert!(hb.take_calls().is_empty());
    assert_eq!(asks[0].header(":path"), "/query");
    assert_eq!(asks[0].header("x-envoy-original-dst-host"), "10.0.0.1:8998");
    answer(
        a,
        ha,
        &asks[0],
        Some(200),
        br#"{"0":{"engine_id":"engine-a","worker_addr":{}}}"#,
    );
    let learned: Vec<Vec<String>> = a.router.learned_known().into_values().collect();
    assert_eq!(learned, vec![vec!["engine-a".to_owned()]]);
    assert!(ha.logged("serves engine ids [\"engine-a\"]"));
    b.on_tick(hb);
    assert_eq!(b.router.learned_known(), a.router.learned_known());
}

#[test]
fn generation_first_context_servers_are_asked_their_server_info() {
    let mut vms = vms(
        r#"{"scrape_interval_ms":0,"models":[
            {"name":"g","engine":"trtllm","schedule_style":"generation_first",
             "rolesets":[{"prefill":["10.0.0.5:8000"],"decode":["10.0.0.6:8000"]}]},
            {"name":"c","engine":"trtllm",
             "rolesets":[{"prefill":["10.0.0.7:8000"],"decode":["10.0.0.6:8000"]}]}]}"#,
        1,
    );
    let [(a, ha)] = &mut vms[..] else {
        panic!("one vm")
    };
    a.on_tick(ha);
    // Only the generation-first model's context server is asked.
    let asks = ha.take_calls();
    assert_eq!(asks.len(), 1);
    assert_eq!(asks[0].header(":path"), "/server_info");
    assert_eq!(asks[0].header("x-envoy-original-dst-host"), "10.0.0.5:8000");
    answer(
        a,
        ha,
        &asks[0],
        Some(200),
        br#"{"disaggregated_params":{"ctx_dp_rank":0}}"#,
    );
    assert!(
        a.router.learned_known().is_empty(),
        "no endpoint: not ready"
    );
    assert!(ha.logged("GET /server_info failed"));
}

fn finished_span(n: u8) -> crate::trace::Span {
    crate::trace::Span {
        trace_id: [n; 16],
        span_id: [n; 8],
        parent: None,
        name: "pd_router.request",
        kind: crate::trace::SpanKind::Server,
        start_us: 1,
        end_us: 2,
        attributes: Vec::new(),
        error: None,
    }
}

#[test]
fn spans_are_exported_in_batches_and_a_failed_call_drops_and_counts_them() {
    let mut vms = vms(
        r#"{"scrape_interval_ms":0,"tracing":{"cluster":"otel","authority":"collector:4318","max_batch_spans":2},
            "models":[{"name":"m","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#,
        1,
    );
    let [(a, ha)] = &mut vms[..] else {
        panic!("one vm")
    };
    assert_eq!(
        a.router.spans.record((1..=5).map(finished_span).collect()),
        0
    );
    a.on_tick(ha);
    let calls = ha.take_calls();
    assert_eq!(calls.len(), 3, "5 spans in batches of 2");
    let c = &calls[0];
    assert_eq!(c.cluster, "otel");
    assert_eq!(c.header(":method"), "POST");
    assert_eq!(c.header(":path"), "/v1/traces");
    assert_eq!(c.header(":authority"), "collector:4318");
    assert_eq!(c.header("content-type"), "application/json");
    let body: Value = serde_json::from_slice(&c.body).expect("OTLP JSON");
    let spans = &body["resourceSpans"][0]["scopeSpans"][0]["spans"];
    assert_eq!(spans.as_array().map(Vec::len), Some(2));
    answer(a, ha, &calls[0], Some(200), b"{}");
    answer(a, ha, &calls[1], Some(503), b"");
    answer(a, ha, &calls[2], None, b"");
    assert_eq!(ha.counted(Counter::SpansExported), 2);
    assert_eq!(ha.counted(Counter::SpansDropped), 3);
    assert_eq!(ha.counted(Counter::SpanExportFailed), 2);
    assert!(ha.logged("could not export 2 spans: the collector answered 503"));
    a.on_tick(ha);
    assert!(ha.take_calls().is_empty(), "nothing left to send");
}

const POOLED: &str = r#"{"scrape_interval_ms":0,
    "discovery":{"kubernetes":{"cluster":"kube_api","interval_ms":1000,"labels":"llm-d",
                               "inference_pool":{"name":"qwen-pool","model":"m"}}},
    "models":[{"name":"m","engine":"vllm"}]}"#;

fn pool_answer(selector: Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "qwen-pool", "namespace": "default"},
        "spec": {"selector": {"matchLabels": selector}, "targetPorts": [{"number": 8000}]}}),
    )
    .expect("json")
}

fn llmd_pod(name: &str, ip: &str, role: &str) -> Value {
    let mut p = pod(name, ip, role);
    p["metadata"]["labels"] = json!({"app": "a", "llm-d.ai/role": role});
    p
}

#[test]
fn an_inference_pool_is_read_first_and_a_changed_selector_lists_again() {
    let mut vms = vms(POOLED, 1);
    let [(a, ha)] = &mut vms[..] else {
        panic!("one vm")
    };
    let get = next_call(a, ha);
    assert_eq!(
        get.header(":path"),
        "/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools/qwen-pool"
    );
    answer(a, ha, &get, Some(200), &pool_answer(json!({"app": "a"})));
    let list = next_call(a, ha);
    assert!(
        list.header(":path").contains("labelSelector=app%3Da&"),
        "{}",
        list.header(":path")
    );
    let pods = pod_list(vec![
        llmd_pod("p0", "10.1.0.1", "prefill"),
        llmd_pod("d0", "10.1.0.2", "decode"),
    ]);
    answer(a, ha, &list, Some(200), &pods);
    a.on_tick(ha);
    assert_eq!(a.router.fleet().pods().len(), 2);

    // A second later the pool is read again; it selects other pods now.
    ha.now += 1_000;
    let get = next_call(a, ha);
    assert!(get.header(":path").contains("inferencepools"));
    answer(a, ha, &get, Some(200), &pool_answer(json!({"app": "b"})));
    let relist = next_call(a, ha);
    let path = relist.header(":path");
    assert!(
        path.contains("labelSelector=app%3Db&") && !path.contains("watch=1"),
        "{path}"
    );
    assert!(ha.logged("InferencePool qwen-pool: pods app=b"));
    answer(a, ha, &relist, Some(200), &pods);

    // The pool is gone: the set stays, the failure is counted and said.
    ha.now += 1_000;
    let get = loop {
        let c = next_call(a, ha);
        if c.header(":path").contains("inferencepools") {
            break c;
        }
        answer(a, ha, &c, Some(200), b"");
    };
    answer(
        a,
        ha,
        &get,
        Some(404),
        br#"{"kind":"Status","code":404,"reason":"NotFound"}"#,
    );
    assert!(ha.counted(Counter::DiscoveryFailure) >= 1);
    assert!(ha.logged("does not exist"), "{:?}", ha.logs.borrow());
    a.on_tick(ha);
    assert_eq!(a.router.fleet().pods().len(), 2, "the last good set stays");
}

fn adapter_list(items: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "model.aibrix.ai/v1alpha1",
        "kind": "ModelAdapterList", "metadata": {"resourceVersion": "9"}, "items": items}))
    .expect("json")
}

/// Ticks (answering watches with nothing new) until the lister lists
/// ModelAdapters.
fn adapters_call(root: &mut Root, host: &mut FakeRoot) -> Call {
    loop {
        let c = next_call(root, host);
        if c.header(":path").contains("modeladapters") {
            return c;
        }
        answer(root, host, &c, Some(200), b"");
    }
}

#[test]
fn model_adapters_are_listed_after_the_pods_and_name_their_pods() {
    let config = r#"{"scrape_interval_ms":0,
        "discovery":{"kubernetes":{"cluster":"kube_api","interval_ms":1000}},
        "models":[{"name":"m","engine":"vllm"}]}"#;
    let mut vms = vms(config, 2);
    let [(a, ha), (b, hb)] = &mut vms[..] else {
        panic!("two vms")
    };
    let list = next_call(a, ha);
    assert!(list
        .header(":path")
        .starts_with("/api/v1/namespaces/default/pods?"));
    let pods = pod_list(vec![
        pod("p0", "10.1.0.1", "prefill"),
        pod("d0", "10.1.0.2", "decode"),
        pod("d1", "10.1.0.3", "decode"),
    ]);
    answer(a, ha, &list, Some(200), &pods);
    let get = next_call(a, ha);
    assert_eq!(
        get.header(":path"),
        "/apis/model.aibrix.ai/v1alpha1/namespaces/default/modeladapters?resourceVersion=0",
        "right after the first pod list"
    );
    let sql = adapter_list(json!([{"apiVersion": "model.aibrix.ai/v1alpha1",
        "kind": "ModelAdapter", "metadata": {"name": "sql", "namespace": "default"},
        "spec": {"baseModel": "m"}, "status": {"instances": ["p0", "d1"]}}]));
    answer(a, ha, &get, Some(200), &sql);
    b.on_tick(hb);
    let fleet = b.router.fleet();
    let served = fleet.serve("sql").expect("sql");
    let on: Vec<&str> = served
        .model
        .endpoints()
        .into_iter()
        .filter(|e| served.model.serves(served.adapter, e.id))
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(on, ["p0", "d1"]);

    // Refused: counted and said once, the adapter stays; the pods go on.
    for _ in 0..2 {
        let get = adapters_call(a, ha);
        answer(a, ha, &get, Some(403), br#"{"kind":"Status","code":403}"#);
    }
    assert_eq!(ha.counted(Counter::DiscoveryFailure), 2);
    let said = |h: &FakeRoot, what: &str| {
        h.logs
            .borrow()
            .iter()
            .filter(|(_, l)| l.contains(what))
            .count()
    };
    assert_eq!(said(ha, "modeladapters.model.aibrix.ai"), 1);
    assert!(ha.counted(Counter::DiscoveryWatch) >= 1);
    b.on_tick(hb);
    assert!(b.router.fleet().serve("sql").is_some());

    // The object deleted: the adapter goes.
    let get = adapters_call(a, ha);
    answer(a, ha, &get, Some(200), &adapter_list(json!([])));
    assert!(ha.logged("ModelAdapters are read"));
    b.on_tick(hb);
    assert!(b.router.fleet().serve("sql").is_none());

    // No such resource (AIBrix not installed): none, and asked rarely.
    let get = adapters_call(a, ha);
    answer(a, ha, &get, Some(404), br#"{"kind":"Status","code":404}"#);
    assert!(ha.logged("no ModelAdapter resource"));
    assert_eq!(ha.counted(Counter::DiscoveryFailure), 2, "not a failure");
    let at = ha.now;
    let _ = adapters_call(a, ha);
    assert!(ha.now >= at + 30_000, "{}", ha.now - at);
}

#[test]
fn reloads_never_put_two_live_vms_on_one_slot() {
    // One VM lives through many reloads of the others (an Envoy whose
    // listener configuration keeps changing): a slot counter handed the
    // 17th VM the long-lived one's slot; leases hand out only free slots.
    let ok = br#"{"models":[{"name":"m","engine":"vllm","rolesets":[]}]}"#;
    let store = Rc::new(RefCell::new(MemoryStore::default()));
    let tokens = Rc::new(RefCell::new(0));
    let start = |vm: u64, now: u64| {
        let mut host = FakeRoot::new(&store, &tokens);
        host.now = now;
        let c = configure(Some(ok), &|_| None, &mut host, vm, now).expect("valid");
        let root = Root::new(Rc::new(c.router), vm, None);
        (root, host)
    };
    let mut now = 10_000;
    let mut elder = start(1, now);
    let mut workers: Vec<(Root, FakeRoot)> = (2..=4).map(|vm| start(vm, now)).collect();
    for round in 0..40u64 {
        // The new generation starts while the old one drains, then the old
        // one stops (it no longer ticks); its leases lapse 10 s later.
        now += 4_000;
        let next: Vec<(Root, FakeRoot)> = (0..3).map(|i| start(100 + round * 3 + i, now)).collect();
        let live: Vec<u8> = std::iter::once(&elder)
            .chain(&workers)
            .chain(&next)
            .map(|(r, _)| r.router.worker_slot())
            .collect();
        let distinct: HashSet<u8> = live.iter().copied().collect();
        assert_eq!(distinct.len(), live.len(), "round {round}: {live:?}");
        workers = next;
        // Ticks renew the living VMs' leases.
        for (root, host) in std::iter::once(&mut elder).chain(workers.iter_mut()) {
            host.now = now;
            root.on_tick(host);
        }
    }
    assert!(!elder.1.logged("could not be renewed"));
}

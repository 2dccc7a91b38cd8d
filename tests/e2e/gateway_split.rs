//! What a gateway's translated configuration must do once it runs: split
//! chat requests to the prefill and decode pods discovery found, with the
//! hand-off, the API server called with the injected token. Shared by the
//! real translators' tests (Envoy Gateway's egctl, Istio's pilot).

use crate::harness::*;
use crate::kube_api::KubeApi;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// The pods a gateway's requests must reach.
pub struct Pods<'a> {
    pub prefill: &'a Mock,
    pub prefill_name: &'a str,
    pub decode: &'a Mock,
    pub decode_name: &'a str,
}

/// Sends `requests` chat requests for `model` to `url` and checks each was
/// split between the pods with the hand-off. One VM lists the pods and
/// publishes them; each other worker's VM takes them at its next tick, so
/// a request may find no pods first: it is answered 503 without reaching a
/// pod, and is sent again (within 20 s), instead of waiting a fixed time.
pub fn assert_splits(
    url: &str,
    model: &str,
    pods: &Pods,
    api: &KubeApi,
    envoy_log: &Path,
    requests: usize,
) {
    let body = json!({"model": model, "max_tokens": 4,
                      "messages": [{"role": "user", "content": "through the gateway"}]})
    .to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let answers: Vec<Answer> = (0..requests)
        .map(|_| loop {
            let a = post(url, body.clone(), &[]);
            if a.status != 503 || Instant::now() > deadline {
                break a;
            }
            std::thread::sleep(Duration::from_millis(200));
        })
        .collect();
    for a in &answers {
        assert_eq!(
            a.status,
            200,
            "{}\nEnvoy's log:\n{}",
            a.body,
            tail(envoy_log)
        );
        assert_eq!(a.header("prefill-target-pod"), Some(pods.prefill_name));
        assert_eq!(a.header("decode-target-pod"), Some(pods.decode_name));
    }
    let p = pods.prefill.requests();
    let d = pods.decode.requests();
    assert_eq!(p.len(), requests, "the prefill pod saw {p:?}");
    assert_eq!(d.len(), requests, "the decode pod saw {d:?}");
    for r in p.iter().chain(&d) {
        assert_eq!(r.path, "/v1/chat/completions");
    }
    // The hand-off: each decode carries what its prefill answered.
    for r in &d {
        assert!(
            r.raw("kv_transfer_params").is_some(),
            "a decode got no hand-off: {}",
            r.body
        );
    }
    assert!(
        api.requests().iter().all(|r| r.authorized),
        "Envoy's injector adds the bearer token"
    );
}

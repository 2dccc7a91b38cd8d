//! The decider through Envoy, against enforcing vLLM mocks (one prefill, two
//! decodes that compute a prompt sent whole): short prompts and prompts a
//! decode pod holds reach no prefill pod, and the decode pod gets the
//! client's body byte for byte; a long fresh prompt is split; a model
//! without a decider splits as before.

use crate::harness::*;
use serde_json::json;

fn chat(model: &str, turns: &[String]) -> String {
    let messages: Vec<_> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": t}))
        .collect();
    json!({"model": model, "messages": messages, "max_tokens": 3}).to_string()
}

#[test]
fn only_prompts_that_pay_for_it_are_split() {
    let p0 = Mock::start("dc-p0", &["--engine", "vllm", "--role", "prefill"]);
    let decode = |n: &str| {
        Mock::start(
            n,
            &["--engine", "vllm", "--role", "decode", "--allow-recompute"],
        )
    };
    let (d0, d1) = (decode("dc-d0"), decode("dc-d1"));
    let roleset = json!([{"prefill": [p0.endpoint()], "decode": [d0.endpoint(), d1.endpoint()]}]);
    let config = json!({
        "prefill_timeout_ms": 5000,
        "models": [
            {"name": "m", "engine": "vllm", "rolesets": roleset,
             "decider": {"min_prompt_tokens": 256, "min_uncached_tokens": 256}},
            {"name": "n", "engine": "vllm", "rolesets": roleset}
        ]
    });
    let envoy = Envoy::start_with(&config, 2);
    let url = envoy.url("/v1/chat/completions");
    let decodes = |f: &dyn Fn(&Logged) -> bool| -> Vec<(String, Logged)> {
        [&d0, &d1]
            .iter()
            .flat_map(|d| d.requests().into_iter().map(|r| (d.name.clone(), r)))
            .filter(|(_, r)| f(r))
            .collect()
    };
    let prefills = || p0.requests().len();

    // A short chat: the decode pod computes it, from the client's bytes.
    let short = chat("m", &["What is the capital of France?".into()]);
    let a = post(&url, short.clone(), &[("x-request-id", "dc-short")]);
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    assert_eq!(prefills(), 0, "a short chat reaches no prefill pod");
    let got = decodes(&|r| r.header("x-request-id") == Some("dc-short"));
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].1.body, short,
        "the decode pod gets the client's body byte for byte"
    );
    assert!(a.header("prefill-target-pod").is_none());

    // A long fresh conversation is split.
    let history = "Tell me about the history of the Roman republic in detail. ".repeat(260);
    let first = chat("m", std::slice::from_ref(&history));
    let a = post(&url, first, &[("x-request-id", "dc-long")]);
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    assert_eq!(prefills(), 1, "a long fresh prompt is split");
    let served = a
        .header("decode-target-pod")
        .expect("decode pod")
        .to_owned();
    let got = decodes(&|r| r.header("x-request-id") == Some("dc-long"));
    assert!(
        got[0].1.raw("kv_transfer_params").is_some(),
        "the hand-off reached the decode"
    );

    // The same long prefix with a new last turn goes whole to the decode pod
    // that served it, which holds all of it but the new turn.
    for (i, next) in ["And the empire?", "Who was Cicero?", "Why did it fall?"]
        .iter()
        .enumerate()
    {
        let id = format!("dc-follow-{i}");
        let body = chat(
            "m",
            &[history.clone(), "It was long.".into(), (*next).into()],
        );
        let a = post(&url, body.clone(), &[("x-request-id", &id)]);
        assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
        assert_eq!(
            a.header("decode-target-pod"),
            Some(served.as_str()),
            "turn {i}"
        );
        let got = decodes(&|r| r.header("x-request-id") == Some(id.as_str()));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, served);
        assert_eq!(got[0].1.body, body, "byte for byte");
    }
    assert_eq!(prefills(), 1, "no prefill for what the decode pod holds");

    // A model without a decider splits short prompts as before.
    let a = post(
        &url,
        chat("n", &["Hi".into()]),
        &[("x-request-id", "dc-plain")],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(prefills(), 2);

    let stat = |reason: &str| {
        envoy
            .stats("pd_router.decisions")
            .iter()
            .filter(|(k, _)| k.contains(&format!("pd_reason=.={reason};.;")))
            .map(|(_, v)| v)
            .sum::<u64>()
    };
    assert_eq!((stat("short"), stat("split"), stat("cached")), (1, 1, 3));
    envoy.assert_counters_zero();
}

/// `Prefer: if-available` (RFC 7240, llm-d's conditional decode): served
/// whole by a decode pod the router knows holds part of the prompt, with
/// no prefill, even where the decider would split; otherwise 412 and no
/// pod sees the request. A model without a decider is 412, as llm-d's EPP
/// answers without a prefix scorer.
#[test]
fn prefer_if_available_is_served_only_where_the_kv_is() {
    let p0 = Mock::start("ia-p0", &["--engine", "vllm", "--role", "prefill"]);
    let decode = |n: &str| {
        Mock::start(
            n,
            &["--engine", "vllm", "--role", "decode", "--allow-recompute"],
        )
    };
    let (d0, d1) = (decode("ia-d0"), decode("ia-d1"));
    let roleset = json!([{"prefill": [p0.endpoint()], "decode": [d0.endpoint(), d1.endpoint()]}]);
    // A decider that splits anything the decode pod lacks a token of.
    let config = json!({
        "prefill_timeout_ms": 5000,
        "models": [
            {"name": "m", "engine": "vllm", "rolesets": roleset,
             "decider": {"min_prompt_tokens": 0, "min_uncached_tokens": 1}},
            {"name": "n", "engine": "vllm", "rolesets": roleset}
        ]
    });
    let envoy = Envoy::start_with(&config, 2);
    let url = envoy.url("/v1/chat/completions");
    let prefer = ("prefer", "respond-async, if-available");
    let seen = |id: &str| -> Vec<String> {
        [&p0, &d0, &d1]
            .iter()
            .filter(|m| {
                m.requests()
                    .iter()
                    .any(|r| r.header("x-request-id") == Some(id))
            })
            .map(|m| m.name.clone())
            .collect()
    };

    let history = "Tell me about the history of the Roman republic in detail. ".repeat(260);
    let a = post(
        &url,
        chat("m", std::slice::from_ref(&history)),
        &[("x-request-id", "ia-first")],
    );
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    assert_eq!(a.header("prefill-target-pod"), Some("ia-p0"), "split");
    let holder = a
        .header("decode-target-pod")
        .expect("decode pod")
        .to_owned();

    // A new turn the decider would split: the holder serves it whole.
    let next = chat(
        "m",
        &[history.clone(), "It was long.".into(), "And then?".into()],
    );
    let a = post(&url, next.clone(), &[("x-request-id", "ia-next"), prefer]);
    assert_eq!(a.status, 200, "{}\n{}", a.body, envoy.log());
    assert_eq!(a.header("decode-target-pod"), Some(holder.as_str()));
    assert_eq!(a.header("prefill-target-pod"), None);
    assert_eq!(seen("ia-next"), vec![holder.clone()], "no prefill");
    let got = [&d0, &d1]
        .iter()
        .flat_map(|d| d.requests())
        .find(|r| r.header("x-request-id") == Some("ia-next"))
        .expect("served");
    assert_eq!(got.body, next, "the client's body byte for byte");
    // Without the preference the same turn is split.
    let a = post(&url, next, &[("x-request-id", "ia-split")]);
    assert_eq!(a.header("prefill-target-pod"), Some("ia-p0"), "{}", a.body);

    // Nothing held: 412, and no pod sees it.
    let fresh = chat(
        "m",
        &["A question nobody asked before, at length. ".repeat(40)],
    );
    let a = post(&url, fresh, &[("x-request-id", "ia-fresh"), prefer]);
    assert_eq!(a.status, 412, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "kv_cache_unavailable");
    assert!(
        a.error_message().contains("Prefer: if-available"),
        "{}",
        a.body
    );
    assert!(seen("ia-fresh").is_empty());

    // No decider: the router does not track decode caches.
    let a = post(
        &url,
        chat("n", std::slice::from_ref(&history)),
        &[("x-request-id", "ia-plain"), ("Prefer", "IF-AVAILABLE")],
    );
    assert_eq!(a.status, 412, "{}", a.body);
    assert!(a.error_message().contains("`decider`"), "{}", a.body);
    assert!(seen("ia-plain").is_empty());

    let stat = |reason: &str| {
        envoy
            .stats("pd_router.decisions")
            .iter()
            .filter(|(k, _)| k.contains(&format!("pd_reason=.={reason};.;")))
            .map(|(_, v)| v)
            .sum::<u64>()
    };
    assert_eq!(stat("if_available"), 1);
    envoy.assert_counters_zero();
}

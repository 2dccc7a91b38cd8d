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

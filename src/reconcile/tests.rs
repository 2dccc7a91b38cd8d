use super::*;
use crate::api::read_fields;

fn decide_for(engine: &str, api: Api, body: &str) -> AnswerNeeds {
    let top = Members::parse(body.as_bytes()).unwrap();
    let report = read_fields(api, body.as_bytes(), &top).unwrap();
    decide(EngineKind::of(engine), &report, body.as_bytes(), &top)
}

#[test]
fn what_an_answer_needs_follows_from_the_request() {
    let chat = |extra: &str| format!(r#"{{"model":"m","messages":[]{extra}}}"#);
    let usage_only = AnswerNeeds::Rewrite(RewritePlan {
        usage: true,
        logprobs: None,
        stream: false,
        capture_kv: false,
    });
    assert_eq!(
        decide_for("vllm", Api::ChatCompletions, &chat("")),
        usage_only
    );
    assert_eq!(
        decide_for("sglang", Api::ChatCompletions, &chat("")),
        usage_only
    );
    assert_eq!(
        decide_for("trtllm", Api::ChatCompletions, &chat("")),
        AnswerNeeds::None
    );
    assert_eq!(
        decide_for("default", Api::ChatCompletions, &chat("")),
        AnswerNeeds::None
    );
    assert_eq!(
        decide_for("vllm", Api::ChatCompletions, &chat(r#","stream":true"#)),
        AnswerNeeds::None,
        "a stream without include_usage shows no usage"
    );
    assert!(matches!(
        decide_for(
            "vllm",
            Api::ChatCompletions,
            &chat(r#","stream":true,"stream_options":{"include_usage":true}"#)
        ),
        AnswerNeeds::Rewrite(RewritePlan {
            usage: true,
            stream: true,
            ..
        })
    ));
}

#[test]
fn prompt_logprobs_are_merged_where_they_can_be_and_left_whole_where_not() {
    let chat = |extra: &str| format!(r#"{{"model":"m","messages":[]{extra}}}"#);
    assert_eq!(
        decide_for("vllm", Api::ChatCompletions, &chat(r#","echo":true"#)),
        AnswerNeeds::Unsplit("chat echo")
    );
    assert!(matches!(
        decide_for(
            "vllm",
            Api::ChatCompletions,
            &chat(r#","prompt_logprobs":1"#)
        ),
        AnswerNeeds::Rewrite(RewritePlan {
            logprobs: Some(PromptLogprobs::Field),
            ..
        })
    ));
    assert_eq!(
        decide_for(
            "vllm",
            Api::ChatCompletions,
            &chat(r#","prompt_logprobs":1,"stream":true"#)
        ),
        AnswerNeeds::Unsplit("prompt_logprobs with stream")
    );
    assert!(
        matches!(
            decide_for(
                "sglang",
                Api::ChatCompletions,
                &chat(r#","prompt_logprobs":1"#)
            ),
            AnswerNeeds::Rewrite(RewritePlan { logprobs: None, .. })
        ),
        "not an SGLang field"
    );
    let cmpl = r#"{"model":"m","prompt":"Hi there","echo":true,"logprobs":2,"stream":true}"#;
    assert_eq!(
        decide_for("sglang", Api::Completions, cmpl),
        AnswerNeeds::Rewrite(RewritePlan {
            usage: false,
            logprobs: Some(PromptLogprobs::Echo {
                prompt_text: "Hi there".into()
            }),
            stream: true,
            capture_kv: false,
        })
    );
    assert_eq!(
        decide_for(
            "vllm",
            Api::Completions,
            r#"{"model":"m","prompt":[1,2],"echo":true,"logprobs":0}"#
        ),
        AnswerNeeds::Unsplit("echo of a prompt that is not one string")
    );
    assert!(
        matches!(
            decide_for(
                "vllm",
                Api::Completions,
                r#"{"model":"m","prompt":"x","echo":true,"logprobs":null}"#
            ),
            AnswerNeeds::Rewrite(RewritePlan { logprobs: None, .. })
        ),
        "echo without logprobs: the decode echoes the text itself"
    );
}

const P: &[u8] = br#"{"choices":[{"index":0,"text":"A"}],"usage":{"prompt_tokens":7,"total_tokens":8,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}}}"#;

/// What goes on in place of `bytes`.
fn sent(r: &mut Rewrite, bytes: &[u8], end: bool) -> Vec<u8> {
    r.chunk(bytes, end)
        .expect("report known")
        .unwrap_or_else(|| bytes.to_vec())
}

fn usage_plan(stream: bool) -> RewritePlan {
    RewritePlan {
        usage: true,
        logprobs: None,
        stream,
        capture_kv: false,
    }
}

#[test]
fn a_whole_answer_gets_the_prefill_count() {
    let plan = usage_plan(false);
    let report = PrefillReport::of(&plan, P);
    assert_eq!(report.cached_tokens, Some(3));
    let mut r = Rewrite::new(plan.clone(), Some(report));
    assert!(r.needed());
    let d = br#"{"choices":[{"index":0,"text":"A b c"}],"usage":{"prompt_tokens":7,"total_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":7}}}"#;
    let out = r.whole(d).unwrap().unwrap();
    assert_eq!(
        out,
        br#"{"choices":[{"index":0,"text":"A b c"}],"usage":{"prompt_tokens":7,"total_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":3}}}"#
    );
    // Nothing known: nothing to do, and the flow keeps its pass-through.
    let none = Rewrite::new(plan, Some(PrefillReport::default()));
    assert!(!none.needed());
}

#[test]
fn sse_is_rewritten_event_by_event_across_any_chunking() {
    let stream = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"A\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":7}}}\r\n\r\n",
        "data: [DONE]\n\n"
    )
    .as_bytes();
    let want =
        String::from_utf8_lossy(stream).replace("\"cached_tokens\":7", "\"cached_tokens\":3");
    for cut in 1..stream.len() {
        let mut r = Rewrite::new(
            usage_plan(true),
            Some(PrefillReport::of(&usage_plan(true), P)),
        );
        let mut out = sent(&mut r, &stream[..cut], false);
        out.extend(sent(&mut r, &stream[cut..], true));
        assert_eq!(String::from_utf8(out).unwrap(), want, "cut at {cut}");
    }
    // A stream that ends inside an event passes that event on as it is.
    let mut r = Rewrite::new(
        usage_plan(true),
        Some(PrefillReport::of(&usage_plan(true), P)),
    );
    assert_eq!(sent(&mut r, b"data: {\"a\"", true), b"data: {\"a\"");
}

#[test]
fn unknown_facts_hold_only_what_needs_them() {
    let mut r = Rewrite::new(usage_plan(true), None);
    let first = b"data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choi";
    assert_eq!(
        sent(&mut r, first, false),
        b"data: {\"choices\":[{\"delta\":{}}]}\n\n",
        "no usage in it: passes"
    );
    let usage = b"ces\":[],\"usage\":{\"prompt_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":7}}}\n\ndata: [DONE]\n\n";
    assert_eq!(r.chunk(usage, true), Err(AwaitReport));
    assert_eq!(r.chunk(usage, true), Err(AwaitReport), "nothing consumed");
    r.set_report(PrefillReport::of(&usage_plan(true), P));
    let out = sent(&mut r, usage, true);
    assert_eq!(
        out,
        b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\ndata: [DONE]\n\n"
    );
}

#[test]
fn a_responses_stream_gets_the_prefill_count_in_its_terminal_event() {
    let body = r#"{"model":"m","input":"hi","max_output_tokens":4,"stream":true}"#;
    let AnswerNeeds::Rewrite(plan) = decide_for("vllm", Api::Responses, body) else {
        panic!("a Responses stream shows usage");
    };
    let p = br#"{"id":"resp_p","object":"response","status":"incomplete","usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":3},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":9}}"#;
    let report = PrefillReport::of(&plan, p);
    assert_eq!(report.cached_tokens, Some(3));
    let ev = "event: response.incomplete\ndata: {\"response\":{\"status\":\"incomplete\",\"usage\":{\"input_tokens\":8,\"input_tokens_details\":{\"cached_tokens\":8},\"output_tokens\":4,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":12}},\"sequence_number\":11,\"type\":\"response.incomplete\"}\n\n";
    let mut r = Rewrite::new(plan, Some(report));
    let out = String::from_utf8(sent(&mut r, ev.as_bytes(), true)).unwrap();
    assert_eq!(
        out,
        ev.replace("\"cached_tokens\":8", "\"cached_tokens\":3")
    );
}

#[test]
fn a_capturing_rewrite_takes_the_decodes_params_from_a_stream_split_anywhere() {
    let stream = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}],\"kv_transfer_params\":{\"do_remote_decode\":true}}\n\n",
        "data: [DONE]\n\n"
    )
    .as_bytes();
    for cut in [1, 30, 60, stream.len() - 3] {
        let mut rw = Rewrite::capture_only(true);
        let mut out = Vec::new();
        for (part, end) in [(&stream[..cut], false), (&stream[cut..], true)] {
            let sent = rw.chunk(part, end).expect("never waits");
            out.extend(sent.unwrap_or_else(|| part.to_vec()));
        }
        let out = String::from_utf8(out).expect("utf-8");
        assert!(!out.contains("kv_transfer_params"), "{cut}: {out}");
        assert!(out.contains(r#""finish_reason":"length""#) && out.ends_with("[DONE]\n\n"));
        let taken = rw.captured().expect("captured");
        assert!(taken.finished);
        assert_eq!(taken.params, br#"{"do_remote_decode":true}"#.to_vec());
    }
}

//! A client body and a prefill answer through `build_legs` and
//! `merge_prefill_response` for every API, engine, connector and pod.
//!
//! Input: `client 0xFF answer` (0xFF never occurs in UTF-8, so in no valid
//! body). Without 0xFF the input is the answer, and two built-in client
//! bodies (streaming with usage, and not) are used.
//!
//! Checks: a forwarded decode body is a JSON object (as a `Value` whenever
//! client and answer were); a direct answer is a JSON object for
//! non-streaming clients, and well-formed SSE with JSON events for
//! streaming ones; nothing panics.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use pd_router::body::TopLevel;
use pd_router::engine::{Merged, PrefillAnswer};

const CLIENTS: [&[u8]; 2] = [
    br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"prompt":"hi","input":"hi","stream":true,"stream_options":{"include_usage":true},"max_tokens":16}"#,
    br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"prompt":[1,2,3],"input":[],"max_completion_tokens":8}"#,
];

fn run(client: &[u8], answer: &[u8]) {
    let Ok(top) = TopLevel::parse(client) else {
        return;
    };
    // The flow refuses an answer that is not a JSON object before merging.
    let Ok(answer_top) = TopLevel::parse(answer) else {
        return;
    };
    let strict_answer = common::is_value_object(answer);
    let strict = strict_answer && common::is_value_object(client);
    common::for_each_split(client, &top, |case, handler, ctx, pod, legs| {
        let what = format!(
            "{} / {:?} / {:?} / pod {}",
            case.engine, case.connector, ctx.facts.api, pod.address
        );
        let mut decode = legs.decode.clone();
        let prefill_answer = PrefillAnswer {
            body: answer,
            top: &answer_top,
        };
        match handler.merge_prefill_response(ctx, &prefill_answer, pod, &mut decode) {
            Ok(Merged::Forward | Merged::ForwardWithoutHandoff) => {
                let body = top.render(client, &decode);
                common::assert_object(&format!("decode body ({what})"), &body, strict);
            }
            Ok(Merged::Answer { body, content_type }) => {
                if ctx.facts.stream {
                    assert_eq!(content_type, "text/event-stream", "{what}");
                    common::assert_sse(&body);
                } else {
                    assert_eq!(content_type, "application/json", "{what}");
                    common::assert_object(&format!("direct answer ({what})"), &body, strict_answer);
                }
            }
            Err(_) => {}
        }
    });
}

fuzz_target!(|data: &[u8]| {
    match data.iter().position(|&b| b == 0xFF) {
        Some(i) => run(&data[..i], &data[i + 1..]),
        None => {
            for client in CLIENTS {
                run(client, data);
            }
        }
    }
});

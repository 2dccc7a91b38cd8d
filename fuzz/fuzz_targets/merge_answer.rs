//! A client body and a prefill answer through the shipped `split::read`,
//! `split::build` and `split::merge` for every API, engine, connector and
//! pod.
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
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use libfuzzer_sys::fuzz_target;
use pd_router::body::Members;
use pd_router::split::{self, AfterPrefill};

const CLIENTS: [&[u8]; 2] = [
    br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"prompt":"hi","input":"hi","stream":true,"stream_options":{"include_usage":true},"max_tokens":16}"#,
    br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"prompt":[1,2,3],"input":[],"max_completion_tokens":8}"#,
];

fn run(client: &[u8], answer: &[u8]) {
    // The flow reads only object bodies; a prefill answer that is not one is
    // refused by `split::merge` itself (the target checks it does not panic).
    if Members::parse(client).is_err() {
        return;
    }
    let strict_answer = common::is_value_object(answer);
    let strict = strict_answer && common::is_value_object(client);
    common::for_each_split(client, |case, view, ids, plan| {
        let what = format!(
            "{} / {:?} / {:?} / pod {}",
            case.engine, case.connector, plan.request.fields.api, plan.prefill_pod.address
        );
        if plan.concurrent {
            return;
        }
        match split::merge(view, ids, plan, answer) {
            Ok(AfterPrefill::Decode { body, headers, .. }) => {
                for h in &headers {
                    common::assert_header(&format!("decode leg ({what})"), h);
                }
                let body = body.map_or_else(|| client.to_vec(), |b| b.assemble(client));
                common::assert_object(&format!("decode body ({what})"), &body, strict);
            }
            Ok(AfterPrefill::Reply { body, content_type }) => {
                if plan.request.fields.stream {
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

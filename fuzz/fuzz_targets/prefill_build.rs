//! A client body through the shipped `split::read` and `split::build` for
//! every API, engine, connector and prefill pod.
//!
//! Checks: both legs are JSON objects (as `serde_json::Value`s whenever the
//! client body was one); the prefill leg carries the common constraints
//! (one token, no streaming, no stream options or minimums; the token
//! limits inside `sampling_params` for the generate API); an E/P/D model's
//! encoder requests are objects with one message of one part, one token,
//! not streamed; nothing panics.
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
use pd_router::split::DecodeLeg;

fuzz_target!(|data: &[u8]| {
    // Only bodies the router reads as objects get this far in the flow.
    if Members::parse(data).is_err() {
        return;
    }
    let strict = common::is_value_object(data);
    common::for_each_split(data, |case, _view, _ids, plan| {
        let what = format!(
            "{} / {:?} / {:?} / pod {}",
            case.engine, case.connector, plan.request.fields.api, plan.prefill_pod.address
        );
        let prefill = &plan.prefill_body;
        common::assert_object(&format!("prefill leg ({what})"), prefill, strict);
        for h in &plan.prefill_headers {
            common::assert_header(&format!("prefill leg ({what})"), h);
        }
        match &plan.decode {
            DecodeLeg::Ready { body, headers } => {
                let body = body.assemble(&plan.request.body);
                common::assert_object(&format!("decode leg ({what})"), &body, strict);
                for h in headers {
                    common::assert_header(&format!("decode leg ({what})"), h);
                }
            }
            DecodeLeg::AfterPrefill(edits) => {
                for h in &edits.headers {
                    common::assert_header(&format!("decode leg ({what})"), h);
                }
            }
        }

        let p = Members::parse(prefill).expect("checked above");
        let api = plan.request.fields.api;
        let max_key = api.max_tokens_key();
        let (limits, within) = match api.limits_member() {
            Some(member) => (p.raw(prefill, member).expect("limits member"), member),
            None => (&prefill[..], "the body"),
        };
        let lp = Members::parse(limits).expect("limits are an object");
        assert_eq!(
            lp.raw(limits, max_key),
            Some(&b"1"[..]),
            "{max_key} in {within} ({what})"
        );
        assert!(
            !lp.contains("min_tokens"),
            "min_tokens in {within} ({what})"
        );
        assert_eq!(
            p.raw(prefill, "stream"),
            Some(&b"false"[..]),
            "stream ({what})"
        );
        for k in ["stream_options", "min_tokens", "min_completion_tokens"] {
            assert!(!p.contains(k), "{k} left on the prefill leg ({what})");
        }

        let legs = pd_router::split::encoder_legs(plan, common::hash(data), |_| Some(0.0));
        for leg in legs.into_iter().flatten() {
            let body = &leg.body;
            common::assert_object(&format!("encoder leg ({what})"), body, strict);
            let e = Members::parse(body).expect("checked above");
            assert_eq!(
                e.raw(body, "stream"),
                Some(&b"false"[..]),
                "encoder stream ({what})"
            );
            let one = e
                .raw(body, "max_tokens")
                .or(e.raw(body, "max_completion_tokens"));
            assert_eq!(one, Some(&b"1"[..]), "encoder token limit ({what})");
            let messages: serde_json::Value =
                serde_json::from_slice(e.raw(body, "messages").expect("messages"))
                    .expect("messages are JSON");
            let parts = messages[0]["content"].as_array().map(Vec::len);
            assert_eq!(parts, Some(1), "one part per encoder request ({what})");
        }
    });
});

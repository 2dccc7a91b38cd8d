//! A client body through `read_facts` and `build_legs` for every API, engine,
//! connector and prefill pod; both legs rendered.
//!
//! Checks: both legs are JSON objects (as `serde_json::Value`s whenever the
//! client body was one); the prefill leg carries the common constraints
//! (one token, no streaming, no stream options or minimums); nothing panics.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use pd_router::body::TopLevel;

fuzz_target!(|data: &[u8]| {
    let Ok(top) = TopLevel::parse(data) else {
        return;
    };
    let strict = common::is_value_object(data);
    common::for_each_split(data, &top, |case, _handler, ctx, pod, legs| {
        let what = format!(
            "{} / {:?} / {:?} / pod {}",
            case.engine, case.connector, ctx.facts.api, pod.address
        );
        let prefill = top.render(data, &legs.prefill);
        common::assert_object(&format!("prefill leg ({what})"), &prefill, strict);
        let decode = top.render(data, &legs.decode);
        common::assert_object(&format!("decode leg ({what})"), &decode, strict);

        let p = TopLevel::parse(&prefill).expect("checked above");
        let max_key = ctx.facts.api.max_tokens_key();
        assert_eq!(
            p.raw(&prefill, max_key),
            Some(&b"1"[..]),
            "{max_key} ({what})"
        );
        assert_eq!(
            p.raw(&prefill, "stream"),
            Some(&b"false"[..]),
            "stream ({what})"
        );
        for k in ["stream_options", "min_tokens", "min_completion_tokens"] {
            assert!(!p.contains(k), "{k} left on the prefill leg ({what})");
        }
    });
});

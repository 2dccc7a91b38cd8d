//! The decode answer's SSE rewriter (`reconcile::Rewrite::chunk`) on arbitrary
//! streams cut into arbitrary chunks.
//!
//! Checks: nothing panics; the output does not depend on where the network
//! cut the stream; with nothing to put in, every byte comes out as it went
//! in; with a cached-token count to put in, the events are the same events
//! in the same order, and an event that changed differs only in its
//! `usage.*_details.cached_tokens` (compared as parsed JSON).
#![no_main]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use libfuzzer_sys::fuzz_target;
use pd_router::reconcile::{data_span, next_event, PrefillReport, Rewrite, RewritePlan};
use serde_json::Value;

fn run(stream: &[u8], cuts: &[usize], fields: PrefillReport) -> Vec<u8> {
    let plan = RewritePlan {
        usage: true,
        logprobs: None,
        stream: true,
        capture_kv: false,
    };
    let mut r = Rewrite::new(plan, Some(fields));
    let mut out = Vec::new();
    let mut at = 0;
    for &c in cuts {
        let part = &stream[at..c];
        out.extend(
            r.chunk(part, false)
                .expect("fields are known")
                .unwrap_or_else(|| part.to_vec()),
        );
        at = c;
    }
    let rest = &stream[at..];
    out.extend(
        r.chunk(rest, true)
            .expect("fields are known")
            .unwrap_or_else(|| rest.to_vec()),
    );
    out
}

fn events(s: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(n) = next_event(&s[at..]) {
        out.push(&s[at..at + n]);
        at += n;
    }
    if at < s.len() {
        out.push(&s[at..]);
    }
    out
}

/// Sets every `cached_tokens` of `usage` details (and of `response.usage`)
/// the way the rewriter should: bounded by the prompt count.
fn expected(mut v: Value, cached: u64) -> Value {
    fn fix(usage: &mut Value, cached: u64) {
        for (details, prompt) in [
            ("prompt_tokens_details", "prompt_tokens"),
            ("input_tokens_details", "input_tokens"),
        ] {
            let bound = usage
                .get(prompt)
                .and_then(Value::as_u64)
                .map_or(cached, |p| cached.min(p));
            if let Some(d) = usage.get_mut(details).and_then(Value::as_object_mut) {
                if d.get("cached_tokens").is_some_and(Value::is_u64) {
                    d.insert("cached_tokens".into(), bound.into());
                    return;
                }
            }
        }
    }
    if let Some(u) = v.get_mut("usage").filter(|u| u.is_object()) {
        fix(u, cached);
    } else if let Some(u) = v
        .get_mut("response")
        .and_then(|r| r.get_mut("usage"))
        .filter(|u| u.is_object())
    {
        fix(u, cached);
    }
    v
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (head, stream) = data.split_at(2);
    let cached = head[0] as u64;
    let step = (head[1] as usize % 13) + 1;
    let cuts: Vec<usize> = (step..stream.len()).step_by(step).collect();

    let nothing = PrefillReport::default();
    assert_eq!(
        run(stream, &cuts, nothing.clone()),
        stream,
        "nothing to put in: bytes unchanged"
    );

    let fields = PrefillReport {
        cached_tokens: Some(cached),
        prompt: None,
    };
    let whole = run(stream, &[], fields.clone());
    assert_eq!(
        run(stream, &cuts, fields),
        whole,
        "independent of the chunking"
    );

    let (before, after) = (events(stream), events(&whole));
    assert_eq!(before.len(), after.len(), "the same events");
    for (b, a) in before.iter().zip(&after) {
        if b == a {
            continue;
        }
        let (sb, sa) = (
            data_span(b).expect("changed: had data"),
            data_span(a).expect("has data"),
        );
        assert_eq!(&b[..sb.start], &a[..sa.start], "bytes before the data");
        assert_eq!(&b[sb.end..], &a[sa.end..], "bytes after the data");
        // The router reads numbers serde_json's Value refuses (above f64's
        // range); such events are compared as far as Value can.
        let (Ok(vb), Ok(va)) = (
            serde_json::from_slice::<Value>(&b[sb]),
            serde_json::from_slice::<Value>(&a[sa]),
        ) else {
            continue;
        };
        assert_eq!(va, expected(vb, cached), "only cached_tokens changed");
    }
});

//! `Members::parse` + `render` on arbitrary bytes.
//!
//! Input: a JSON body, optionally followed by a 0x00 byte and control bytes
//! that choose the edits (0x00 never occurs in valid JSON). Without control
//! bytes the edits are derived from the body's hash, so plain JSON seeds
//! exercise edits too.
//!
//! Checks: `Members` agrees with an independent member walk; the rendered
//! body is a JSON object (as a `serde_json::Value` whenever the input was
//! one); its members are exactly the expected ones, in order, untouched
//! members byte for byte; nothing panics.
#![no_main]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use pd_router::body::{push_json_str, Edit, Edits, Members};
use std::borrow::Cow;

/// Keys worth adding: router-written ones, empty, and ones needing escapes.
const NEW_KEYS: &[&str] = &[
    "stream",
    "max_tokens",
    "kv_transfer_params",
    "bootstrap_room",
    "",
    "a\"b\\c",
    "tab\there\n",
    "\u{1}\u{1f}",
    "é\u{2028}😀",
    "</script>",
];

/// Valid JSON values, trimmed (the member walk reads values without
/// surrounding whitespace).
const VALUES: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "1",
    "-1.5e3",
    "18446744073709551615",
    "\"\"",
    "\"a\\\"b\\\\c\\u00e9\"",
    "\"é😀\"",
    "[]",
    "{}",
    "[1,{\"a\":[null,true]},\"x\"]",
    "{\"do_remote_decode\":true,\"remote_block_ids\":null}",
    "{ \"spaced\" : [ 1 , 2 ] }",
];

type Model = Vec<(String, Option<String>)>;

fn put(model: &mut Model, key: String, op: Option<String>) {
    match model.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = op,
        None => model.push((key, op)),
    }
}

fn derive_edits(
    u: &mut Unstructured,
    existing: &[(String, &serde_json::value::RawValue)],
    edits: &mut Edits,
    model: &mut Model,
) -> Result<()> {
    let n = u.int_in_range(0..=6u8)?;
    for _ in 0..n {
        let key = match u.int_in_range(0..=3u8)? {
            0 | 1 if !existing.is_empty() => u.choose(existing)?.0.clone(),
            0..=2 => (*u.choose(NEW_KEYS)?).to_owned(),
            _ => u.arbitrary::<String>()?,
        };
        if u.ratio(1, 3)? {
            edits.remove(key.clone());
            put(model, key, None);
            continue;
        }
        let value = match u.int_in_range(0..=4u8)? {
            0 | 1 => (*u.choose(VALUES)?).to_owned(),
            2 if !existing.is_empty() => u.choose(existing)?.1.get().to_owned(),
            3 => u.arbitrary::<u64>()?.to_string(),
            _ => {
                let mut v = Vec::new();
                push_json_str(&mut v, &u.arbitrary::<String>()?);
                String::from_utf8(v).expect("push_json_str keeps UTF-8")
            }
        };
        // Go through each setter the engines use; `stored` is the JSON text
        // the member must end up with.
        let stored = match value.as_str() {
            "true" | "false" => {
                edits.set_bool(key.clone(), value == "true");
                value
            }
            v if v.parse::<u64>().is_ok_and(|n| n.to_string() == v) => {
                edits.set_u64(key.clone(), v.parse().unwrap());
                value
            }
            // A string serde_json can decode (an existing member's may hold
            // a lone surrogate escape, which the router's parse lets through).
            v if v.starts_with('"') && serde_json::from_str::<String>(v).is_ok() => {
                let s: String = serde_json::from_str(v).unwrap();
                edits.set_str(key.clone(), &s);
                let mut out = Vec::new();
                push_json_str(&mut out, &s);
                let out = String::from_utf8(out).expect("push_json_str keeps UTF-8");
                let back: String = serde_json::from_str(&out).unwrap_or_else(|e| {
                    panic!("push_json_str({s:?}) = {out} is not a string: {e}")
                });
                assert_eq!(back, s, "push_json_str round trip");
                out
            }
            _ => {
                edits.set_raw(key.clone(), value.clone());
                value
            }
        };
        put(model, key, Some(stored));
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let (body, control) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Cow::Borrowed(&data[i + 1..])),
        None => (data, Cow::Owned(common::bytes_from(common::hash(data), 48))),
    };
    let Ok(top) = Members::parse(body) else {
        return;
    };
    let input = common::members(body).unwrap_or_else(|e| {
        panic!("Members parsed a body that is not a JSON object to serde_json: {e}")
    });
    assert!(
        top.keys().eq(input.iter().map(|(k, _)| k.as_str())),
        "Members keys differ from the member walk"
    );
    for (k, _) in &input {
        let first = input.iter().find(|(k2, _)| k2 == k).unwrap().1;
        assert_eq!(top.raw(body, k), Some(first.get().as_bytes()), "raw({k:?})");
        assert!(top.contains(k));
    }
    let strict = common::is_value_object(body);

    let mut edits = Edits::new();
    let mut model = Model::new();
    let _ = derive_edits(
        &mut Unstructured::new(&control),
        &input,
        &mut edits,
        &mut model,
    );
    for (k, op) in &model {
        let want = op
            .clone()
            .map(|v| Edit::Set(v.into()))
            .unwrap_or(Edit::Remove);
        assert_eq!(edits.get(k), Some(&want), "Edits::get({k:?})");
    }

    let out = top
        .render(body, &edits)
        .expect("rendered against its own source");
    common::assert_object("rendered body", &out, strict);
    if edits.is_empty() {
        assert_eq!(out, body, "no edits must give the body back");
    }

    let lookup = |k: &str| model.iter().find(|(m, _)| m == k).map(|(_, op)| op);
    let mut expected: Vec<(&str, &str)> = Vec::new();
    for (k, v) in &input {
        match lookup(k) {
            None => expected.push((k, v.get())),
            Some(Some(new)) => expected.push((k, new)),
            Some(None) => {}
        }
    }
    for (k, op) in &model {
        if let Some(v) = op {
            if !input.iter().any(|(ik, _)| ik == k) {
                expected.push((k, v));
            }
        }
    }
    let same_members = |what: &str, out: &[u8], expected: &[(&str, &str)]| {
        let got = common::members(out).unwrap_or_else(|e| panic!("{what} is not an object: {e}"));
        let got: Vec<(&str, &str)> = got.iter().map(|(k, v)| (k.as_str(), v.get())).collect();
        assert_eq!(
            got,
            expected,
            "{what} members differ from the edits' intent\n  body:   {}\n  edits:  {edits:?}\n  output: {}",
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(out)
        );
    };
    same_members("rendered", &out, &expected);

    // The decode leg's front layout (new members first, the rest of the
    // body kept in Envoy's buffer), forced for every body: the same members
    // with the same values, the new ones moved to the front.
    let spliced = top
        .splice_with(body, &edits, &[], 0)
        .expect("spliced against its own source");
    let front = spliced.assemble(body);
    assert_eq!(spliced.len(), front.len(), "LegBody::len");
    common::assert_object("spliced body", &front, strict);
    let added = expected.len()
        - expected
            .iter()
            .filter(|(k, _)| input.iter().any(|(ik, _)| ik == k))
            .count();
    let mut expected_front = expected[expected.len() - added..].to_vec();
    expected_front.extend_from_slice(&expected[..expected.len() - added]);
    same_members("spliced", &front, &expected_front);
});

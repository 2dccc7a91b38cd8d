use super::*;
use serde::de;
use serde_json::value::RawValue;

/// The fast scan and serde_json's walk agree, or the scan stands aside.
#[test]
fn integer_arrays_are_scanned_exactly_as_serde_json_reads_them() {
    for (body, ok) in [
        (
            r#"{"ids": [1, 2,3 ,-0, 18446744073709551616], "a": "x"}"#,
            true,
        ),
        (r#"{"ids":[]}"#, true),
        (r#"{"ids":[ ]}"#, true),
        (r#"{"ids":[1.5,2]}"#, true),
        (r#"{"ids":[1e3]}"#, true),
        (r#"{"ids":[01]}"#, false),
        (r#"{"ids":[1,]}"#, false),
        (r#"{"ids":[,1]}"#, false),
        (r#"{"ids":[-]}"#, false),
        (r#"{"ids":[1 2]}"#, false),
        (r#"{"ids":[1],}"#, false),
        (r#"{"ids":[1]} x"#, false),
        (r#"{}"#, true),
        (r#"{"a":1,"a":[2]}"#, true),
    ] {
        let parsed = Members::parse(body.as_bytes());
        let serde = serde_json::from_str::<de::IgnoredAny>(body).is_ok();
        assert_eq!(parsed.is_ok(), ok, "{body}");
        assert_eq!(serde, ok, "serde_json on {body}");
        if let Ok(top) = parsed {
            let ids = top
                .raw(body.as_bytes(), "ids")
                .map(|v| String::from_utf8_lossy(v).into_owned());
            let want = serde_json::from_str::<std::collections::BTreeMap<String, &RawValue>>(body)
                .ok()
                .and_then(|m| m.get("ids").map(|v| v.get().to_owned()));
            if !body.contains(r#""a":1,"a""#) {
                assert_eq!(ids, want, "{body}");
            }
        }
    }
    assert_eq!(scan::int_array_end(b"[1, 2] ", 0), Some(6));
    assert_eq!(
        scan::int_array_end(b"[1.0]", 0),
        None,
        "a fraction: serde_json reads it"
    );
}

fn render(src: &str, f: impl FnOnce(&mut Edits)) -> String {
    let top = Members::parse(src.as_bytes()).expect("parse");
    let mut e = Edits::new();
    f(&mut e);
    String::from_utf8(top.render(src.as_bytes(), &e).expect("same source")).expect("utf8")
}

#[test]
fn untouched_members_keep_their_bytes_and_order() {
    let src = r#"{ "model" : "m",  "messages":[ {"role":"user" ,"content":"hi"} ],"stream":true , "seed": 18446744073709551615 }"#;
    let out = render(src, |e| {
        e.set_bool("stream", false);
        e.set_u64("max_tokens", 1);
    });
    assert_eq!(
        out,
        r#"{ "model" : "m",  "messages":[ {"role":"user" ,"content":"hi"} ],"stream":false , "seed": 18446744073709551615,"max_tokens":1 }"#
    );
}

#[test]
fn removes_first_middle_last_and_all() {
    let src = r#"{"a":1, "b":2, "c":3}"#;
    assert_eq!(render(src, |e| e.remove("a")), r#"{"b":2, "c":3}"#);
    assert_eq!(render(src, |e| e.remove("b")), r#"{"a":1, "c":3}"#);
    assert_eq!(render(src, |e| e.remove("c")), r#"{"a":1, "b":2}"#);
    assert_eq!(
        render(src, |e| {
            e.remove("a");
            e.remove("b");
        }),
        r#"{"c":3}"#
    );
    assert_eq!(
        render(src, |e| {
            e.remove("a");
            e.remove("b");
            e.remove("c");
        }),
        r#"{}"#
    );
    assert_eq!(
        render(src, |e| {
            e.remove("a");
            e.remove("c");
            e.set_u64("d", 4);
        }),
        r#"{"b":2,"d":4}"#
    );
    assert_eq!(
        render(src, |e| {
            for k in ["a", "b", "c"] {
                e.remove(k);
            }
            e.set_u64("d", 4);
            e.set_u64("f", 5);
        }),
        r#"{"d":4,"f":5}"#
    );
}

#[test]
fn rendering_against_other_bytes_is_an_error() {
    let top = Members::parse(br#"{"a":1}"#).expect("parse");
    let mut e = Edits::new();
    e.set_u64("b", 2);
    assert_eq!(top.render(br#"{"a":12}"#, &e), Err(SourceMismatch));
    assert_eq!(
        top.render(br#"{"a":1}"#, &e).as_deref(),
        Ok(&br#"{"a":1,"b":2}"#[..])
    );
}

#[test]
fn copied_values_come_from_the_second_source_or_fail() {
    let src = br#"{"a":1,"ids":null}"#;
    let answer = br#"{"prompt_token_ids":[5,6,7]}"#;
    let at = Members::parse(answer)
        .expect("answer")
        .span("prompt_token_ids")
        .expect("span");
    let top = Members::parse(src).expect("parse");
    let mut e = Edits::new();
    e.copy_from("ids", answer, at.clone());
    e.copy_from("more", answer, at);
    assert_eq!(
        top.render_with(src, &e, answer).as_deref(),
        Ok(&br#"{"a":1,"ids":[5,6,7],"more":[5,6,7]}"#[..])
    );
    // Without the answer, or with a shorter one, nothing is guessed.
    assert_eq!(top.render(src, &e), Err(SourceMismatch));
    assert_eq!(top.render_with(src, &e, b"{}"), Err(SourceMismatch));
    let longer = br#"{"prompt_token_ids":[5,6,7],"x":1}"#;
    assert_eq!(
        top.render_with(src, &e, longer),
        Err(SourceMismatch),
        "a span is only good for the source it was taken from"
    );
}

/// `src` spliced with the front layout forced (`front_min` 0), assembled.
fn front(src: &str, f: impl FnOnce(&mut Edits)) -> (String, LegBody) {
    let top = Members::parse(src.as_bytes()).expect("parse");
    let mut e = Edits::new();
    f(&mut e);
    let s = top
        .splice_with(src.as_bytes(), &e, &[], 0)
        .expect("same source");
    let out = String::from_utf8(s.assemble(src.as_bytes())).expect("utf8");
    assert_eq!(s.len(), out.len());
    (out, s)
}

#[test]
fn the_front_layout_puts_new_members_first_and_keeps_the_rest_in_place() {
    let src = r#"{"model":"m", "messages":[{"role":"user","content":"long"}],"stream":true}"#;
    let (out, s) = front(src, |e| {
        e.set_raw("bootstrap_host", r#""10.0.0.1""#);
        e.set_u64("bootstrap_room", 7);
    });
    assert_eq!(
        out,
        r#"{"bootstrap_host":"10.0.0.1","bootstrap_room":7,"model":"m", "messages":[{"role":"user","content":"long"}],"stream":true}"#
    );
    // Only `{` is replaced: the client's bytes stay in Envoy's buffer.
    assert_eq!((s.replaced, s.kept), (1, src.len() - 1));
    // An edit in place takes the front up to its end, no further.
    let (out, s) = front(src, |e| {
        e.set_str("model", "n");
        e.set_u64("x", 1);
    });
    assert_eq!(
        out,
        r#"{"x":1,"model":"n", "messages":[{"role":"user","content":"long"}],"stream":true}"#
    );
    assert_eq!(s.replaced, r#"{"model":"m""#.len());
}

#[test]
fn the_front_layout_handles_removals_and_empty_objects() {
    let src = r#"{"a":1, "b":2, "c":3}"#;
    for (edit, want) in [
        (&["-a", "+d"][..], r#"{"d":4,"b":2, "c":3}"#),
        (&["-b", "+d"][..], r#"{"d":4,"a":1, "c":3}"#),
        (&["-a", "-b", "-c", "+d"][..], r#"{"d":4}"#),
        (&["-a", "-b", "-c"][..], r#"{}"#),
    ] {
        let (out, _) = front(src, |e| {
            for op in edit {
                match op.split_at(1) {
                    ("-", k) => e.remove(k.to_string()),
                    (_, k) => e.set_u64(k.to_string(), 4),
                }
            }
        });
        assert_eq!(out, want, "{edit:?}");
        serde_json::from_str::<serde_json::Value>(&out).expect("valid JSON");
    }
    assert_eq!(front("{}", |e| e.set_u64("x", 1)).0, r#"{"x":1}"#);
    assert_eq!(front(" { } ", |e| e.set_u64("x", 1)).0, r#" { "x":1} "#);
}

#[test]
fn short_tails_keep_the_append_layout_and_no_edits_replace_nothing() {
    let src = r#"{"model":"m","prompt":"p"}"#;
    let top = Members::parse(src.as_bytes()).expect("parse");
    let mut e = Edits::new();
    e.set_u64("x", 1);
    let s = top
        .splice_with(src.as_bytes(), &e, &[], src.len())
        .expect("same source");
    assert_eq!(
        s,
        LegBody::whole(br#"{"model":"m","prompt":"p","x":1}"#.to_vec(), src.len())
    );
    let none = top
        .splice_with(src.as_bytes(), &Edits::new(), &[], 0)
        .expect("same source");
    assert_eq!((none.head.len(), none.replaced), (0, 0));
    assert_eq!(none.assemble(src.as_bytes()), src.as_bytes());
    assert_eq!(
        top.splice_with(br#"{"model":"mm"}"#, &e, &[], 0),
        Err(SourceMismatch)
    );
}

#[test]
fn appends_to_empty_object() {
    assert_eq!(render("{}", |e| e.set_u64("x", 1)), r#"{"x":1}"#);
    assert_eq!(render(" { \n } ", |e| e.set_u64("x", 1)), " { \n \"x\":1} ");
}

#[test]
fn every_result_is_valid_json() {
    let src = r#"{"max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"min_tokens":2,"prompt":"p"}"#;
    let out = render(src, |e| {
        e.set_u64("max_tokens", 1);
        e.set_bool("stream", false);
        e.remove("stream_options");
        e.remove("min_tokens");
        e.remove("min_completion_tokens");
    });
    assert_eq!(out, r#"{"max_tokens":1,"stream":false,"prompt":"p"}"#);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid");
    assert_eq!(v["prompt"], "p");
}

#[test]
fn escaped_keys_are_matched_by_their_decoded_name() {
    let src = r#"{"str\u0065am":true,"x":1}"#;
    let top = Members::parse(src.as_bytes()).expect("parse");
    assert_eq!(top.raw(src.as_bytes(), "stream"), Some(&b"true"[..]));
    assert_eq!(render(src, |e| e.remove("stream")), r#"{"x":1}"#);
}

#[test]
fn rejects_what_is_not_an_object() {
    assert_eq!(Members::parse(b"").unwrap_err(), BodyError::Empty);
    assert_eq!(Members::parse(b"  ").unwrap_err(), BodyError::Empty);
    assert_eq!(Members::parse(b"[1]").unwrap_err(), BodyError::NotObject);
    assert_eq!(Members::parse(b"\"s\"").unwrap_err(), BodyError::NotObject);
    assert_eq!(Members::parse(b"\xff{}").unwrap_err(), BodyError::NotUtf8);
    assert!(matches!(
        Members::parse(b"{\"a\":}"),
        Err(BodyError::Invalid(_))
    ));
    assert!(matches!(
        Members::parse(b"{\"a\":1"),
        Err(BodyError::Invalid(_))
    ));
    assert!(matches!(
        Members::parse(b"{} {}"),
        Err(BodyError::Invalid(_))
    ));
    assert!(matches!(
        Members::parse(b"nope"),
        Err(BodyError::Invalid(_))
    ));
}

#[test]
fn hostile_nesting_neither_crashes_nor_recurses() {
    // serde_json skips raw values iteratively, so depth costs no stack.
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let top = Members::parse(deep.as_bytes()).expect("deep but valid");
    assert_eq!(
        top.raw(deep.as_bytes(), "a").map(<[u8]>::len),
        Some(200_000)
    );
    let broken = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(99_999));
    assert!(matches!(
        Members::parse(broken.as_bytes()),
        Err(BodyError::Invalid(_))
    ));
}

#[test]
fn finds_duplicates_of_named_keys_only() {
    let src = br#"{"a":1,"b":2,"a":3,"c":1,"c":2}"#;
    let top = Members::parse(src).expect("parse");
    assert_eq!(top.first_duplicate(&["b", "c"]), Some("c"));
    assert_eq!(top.first_duplicate(&["b"]), None);
}

#[test]
fn json_strings_are_escaped() {
    let mut v = Vec::new();
    push_json_str(&mut v, "a\"b\\c\n\u{1}é");
    assert_eq!(String::from_utf8(v).unwrap(), r#""a\"b\\c\n\u0001é""#);
}

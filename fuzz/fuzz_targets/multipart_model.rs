//! The multipart `model` reader (`multipart::boundary`, `multipart::field`)
//! on arbitrary content types and bodies, and on well-formed forms built
//! from the input.
//!
//! Checks: nothing panics; a value found lies inside the body and is at
//! most 1 KiB; in a well-formed form whose parts hold no delimiter, the
//! `model` field is found, exactly, wherever it sits among the parts, and
//! a file part called `model` is never taken for it.
#![no_main]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use libfuzzer_sys::fuzz_target;
use pd_router::multipart::{boundary, field};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, rest) = data.split_at(data.len().min(80) / 2);
    // Arbitrary input.
    if let Ok(ct) = std::str::from_utf8(head) {
        if let Some(b) = boundary(ct) {
            assert!(!b.is_empty() && b.len() <= 70);
            if let Some(v) = field(rest, b, "model") {
                let (start, end) = (rest.as_ptr() as usize, rest.as_ptr() as usize + rest.len());
                assert!(v.as_ptr() as usize >= start && v.as_ptr() as usize + v.len() <= end);
                assert!(v.len() <= 1024);
            }
        }
    }
    // A well-formed form: boundary, a model value and other parts from the
    // input, the model part at a position the input picks.
    let b: String = head
        .iter()
        .map(|c| char::from(b'a' + c % 26))
        .take(20)
        .collect();
    if b.is_empty() {
        return;
    }
    let delimiter = format!("\r\n--{b}");
    let pieces: Vec<&[u8]> = rest.split(|c| *c == 0xFF).collect();
    let model: Vec<u8> = pieces[0].iter().copied().take(200).collect();
    // A value is well formed when, framed as in a body, the first
    // delimiter is the one after it (form writers pick such boundaries).
    let framed_ok = |v: &[u8]| {
        let framed = [b"\r\n", v, delimiter.as_bytes()].concat();
        let first = framed
            .windows(delimiter.len())
            .position(|w| w == delimiter.as_bytes());
        first == Some(v.len() + 2)
    };
    if !framed_ok(&model) {
        return;
    }
    let mut body = Vec::new();
    let at = usize::from(data[0]) % pieces.len();
    for (i, p) in pieces.iter().enumerate().skip(1) {
        if !framed_ok(p) {
            return;
        }
        if i == at {
            push_part(&mut body, &b, "name=\"model\"", &model);
        }
        // A file called `model` must not be taken for the field.
        push_part(
            &mut body,
            &b,
            &format!("name=\"model\"; filename=\"f{i}\""),
            p,
        );
    }
    if at == 0 {
        push_part(&mut body, &b, "name=\"model\"", &model);
    }
    body.extend_from_slice(format!("--{b}--\r\n").as_bytes());
    if model.len() <= 1024 {
        assert_eq!(field(&body, &b, "model"), Some(&model[..]), "{body:?}");
    }
});

fn push_part(body: &mut Vec<u8>, b: &str, disposition: &str, value: &[u8]) {
    body.extend_from_slice(
        format!("--{b}\r\nContent-Disposition: form-data; {disposition}\r\n\r\n").as_bytes(),
    );
    body.extend_from_slice(value);
    body.extend_from_slice(b"\r\n");
}

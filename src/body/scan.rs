//! The top level's members found by a scan that reads values itself:
//! TensorRT-LLM's context answers carry the prompt's token ids (131 000 of
//! them for a 512 KB prompt, or one 700 KB base64 string), and a prompt is
//! one long string inside `messages`, `prompt` or `input`. serde_json's
//! skip reads four bytes at a time inside wasm and then checks the whole
//! value's UTF-8 again; this scan reads strings and integer arrays a block
//! at a time ([`super::blocks`]), checks UTF-8 only for values that hold
//! non-ASCII, and allocates nothing. Keys still go through serde_json.
//!
//! The scan accepts exactly what serde_json accepts or stands aside (`None`);
//! `Members::parse` then asks serde_json whether it is valid, and why not.

use super::blocks::{canonical_prefix, next_special};
use super::key::Key;
use serde_json::value::RawValue;
use std::ops::Range;

pub(crate) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| is_ws(*c)) {
        i += 1;
    }
    i
}

/// One value at `at` by serde_json; where it ends.
fn value_end<'de, T: serde::Deserialize<'de>>(b: &'de [u8], at: usize) -> Option<(T, usize)> {
    let rest = b.get(at..)?;
    let mut stream = serde_json::Deserializer::from_slice(rest).into_iter::<T>();
    let v = stream.next()?.ok()?;
    Some((v, at + stream.byte_offset()))
}

/// Where a JSON array of integers (no fractions or exponents) starting at
/// `at` ends; `None` when it is anything else.
pub(crate) fn int_array_end(b: &[u8], at: usize) -> Option<usize> {
    if b.get(at) != Some(&b'[') {
        return None;
    }
    let i = skip_ws(b, at + 1);
    if b.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    // Whitespace may follow the comma the canonical run stopped after.
    ints_from(b, skip_ws(b, canonical_prefix(b, i)))
}

/// Integers from a number's start at `i` to the closing `]`, byte by byte
/// (whitespace, minus signs and all).
fn ints_from(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while b.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            _ => return None,
        }
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b']') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The members of the object starting at `open`, or `None` to let
/// serde_json decide (anything unusual, every error).
pub(crate) fn members(b: &[u8], open: usize) -> Option<Vec<(Key<'_>, Range<usize>)>> {
    let mut out = Vec::with_capacity(16);
    let mut i = skip_ws(b, open + 1);
    if b.get(i) == Some(&b'}') {
        return (skip_ws(b, i + 1) == b.len()).then_some(out);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (key, end) = value_end::<Key>(b, i)?;
        i = skip_ws(b, end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let fast = match b.get(i) {
            Some(b'[') => int_array_end(b, i).or_else(|| skip_value(b, i)),
            Some(_) => skip_value(b, i),
            None => None,
        };
        let end = match fast {
            Some(end) => end,
            None => value_end::<&RawValue>(b, i)?.1,
        };
        out.push((key, i..end));
        i = skip_ws(b, end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    (skip_ws(b, i + 1) == b.len()).then_some(out)
}

/// Where the string starting at the quote at `at` ends (just after its
/// closing quote), escapes checked as serde_json's skip checks them (any
/// `\u` with four hex digits: a lone surrogate is the reader's business).
/// Sets `non_ascii` when the string holds bytes from 0x80, whose UTF-8 the
/// caller checks.
fn string_end(b: &[u8], at: usize, non_ascii: &mut bool) -> Option<usize> {
    let mut i = at + 1;
    loop {
        i = if *non_ascii {
            next_special::<false>(b, i)
        } else {
            next_special::<true>(b, i)
        };
        match *b.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => match *b.get(i + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                b'u' if b.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) => i += 6,
                _ => return None,
            },
            0x80.. => *non_ascii = true,
            _ => return None,
        }
    }
}

/// Where the number starting at `at` ends, by JSON's grammar (what
/// serde_json's skip accepts: no leading zeros, digits after `.` and `e`).
fn number_end(b: &[u8], at: usize) -> Option<usize> {
    let digits_from = |i: usize| {
        i + b
            .get(i..)
            .map_or(0, |r| r.iter().take_while(|c| c.is_ascii_digit()).count())
    };
    let mut i = at + usize::from(b.get(at) == Some(&b'-'));
    match *b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits_from(i + 1),
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        let end = digits_from(i + 1);
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1 + usize::from(matches!(b.get(i + 1), Some(b'+' | b'-')));
        let end = digits_from(i);
        if end == i {
            return None;
        }
        i = end;
    }
    Some(i)
}

/// Open arrays and objects, one bit each (set: an object), as deep as
/// this scan goes; deeper values are serde_json's, whose skip keeps its
/// own stack.
struct Nesting {
    bits: u128,
    depth: u32,
}

impl Nesting {
    fn push(&mut self, object: bool) -> Option<()> {
        if self.depth == u128::BITS {
            return None;
        }
        self.bits = (self.bits << 1) | u128::from(object);
        self.depth += 1;
        Some(())
    }

    /// Whether the innermost open value is an object, or `None` at the top.
    fn top(&self) -> Option<bool> {
        (self.depth > 0).then_some(self.bits & 1 == 1)
    }

    fn pop(&mut self) {
        self.bits >>= 1;
        self.depth = self.depth.saturating_sub(1);
    }
}

/// An object's key and its colon, from `at`; where its value starts.
fn key_end(b: &[u8], at: usize, non_ascii: &mut bool) -> Option<usize> {
    let at = skip_ws(b, at);
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let i = skip_ws(b, string_end(b, at, non_ascii)?);
    (b.get(i) == Some(&b':')).then_some(i + 1)
}

/// Where the value starting at `at` ends, read by this scan: strings a
/// block at a time ([`next_special`]), everything else byte by byte with
/// no allocation. `None` for anything serde_json's skip would not accept
/// and for nesting deeper than 128 (serde_json then decides); every
/// `Some` is where serde_json's skip ends too, and its text is UTF-8.
pub(crate) fn skip_value(b: &[u8], at: usize) -> Option<usize> {
    let mut open = Nesting { bits: 0, depth: 0 };
    let mut non_ascii = false;
    let mut i = at;
    'value: loop {
        i = skip_ws(b, i);
        match *b.get(i)? {
            b'"' => i = string_end(b, i, &mut non_ascii)?,
            b'-' | b'0'..=b'9' => i = number_end(b, i)?,
            c @ (b't' | b'f' | b'n') => {
                let word: &[u8] = match c {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                if !b.get(i..)?.starts_with(word) {
                    return None;
                }
                i += word.len();
            }
            c @ (b'[' | b'{') => {
                let object = c == b'{';
                open.push(object)?;
                i = skip_ws(b, i + 1);
                if b.get(i) == Some(if object { &b'}' } else { &b']' }) {
                    open.pop();
                    i += 1;
                } else {
                    if object {
                        i = key_end(b, i, &mut non_ascii)?;
                    }
                    continue 'value;
                }
            }
            _ => return None,
        }
        // After a value: close what it ends, or go on after a comma.
        while let Some(object) = open.top() {
            i = skip_ws(b, i);
            match *b.get(i)? {
                b',' => {
                    i += 1;
                    if object {
                        i = key_end(b, i, &mut non_ascii)?;
                    }
                    continue 'value;
                }
                b']' if !object => open.pop(),
                b'}' if object => open.pop(),
                _ => return None,
            }
            i += 1;
        }
        let utf8 = !non_ascii || std::str::from_utf8(b.get(at..i)?).is_ok();
        return utf8.then_some(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `array` (text that may or may not be one) read by the scan, with
    /// bytes after it: an array of integers exactly when serde_json says
    /// so, ending where the text does.
    fn agrees_with_serde_json(mut array: Vec<u8>, what: &str) {
        let serde = serde_json::from_slice::<Vec<i128>>(&array).is_ok();
        array.extend_from_slice(b",9");
        let scanned = int_array_end(&array, 0);
        let shown = String::from_utf8_lossy(&array).into_owned();
        assert_eq!(scanned.is_some(), serde, "{what}{shown}");
        if let Some(end) = scanned {
            assert_eq!(end, array.len() - 2, "{what}{shown}");
        }
    }

    /// Arrays made of a canonical run of every length up to a word, then
    /// every window of up to 6 bytes of digits, commas, zeros, spaces and
    /// minus signs, then an optional tail: so every pattern sits at every
    /// offset from the word boundary. The scan and serde_json agree on
    /// whether each is an array of integers, and the scan on where it ends.
    #[test]
    fn the_word_scan_agrees_with_serde_json() {
        let alphabet = [b'1', b'0', b',', b' ', b'-'];
        let mut cases = 0;
        for lead in 0..=9 {
            for len in 0..=6u32 {
                for mut code in 0..5u64.pow(len) {
                    let mut text = b"[".to_vec();
                    text.extend_from_slice(&b"11,1,111,2"[..lead]);
                    for _ in 0..len {
                        text.push(alphabet[(code % 5) as usize]);
                        code /= 5;
                    }
                    for tail in [&b"]"[..], b",7]", b"5,66,777,8888]"] {
                        let mut t = text.clone();
                        t.extend_from_slice(tail);
                        agrees_with_serde_json(t, "");
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 500_000, "{cases}");
    }

    /// Strings of every window of up to 4 bytes (5 after two leads) from
    /// quotes, backslashes, escape letters, hex digits, control
    /// characters, DEL, non-ASCII (valid and invalid UTF-8) and plain
    /// letters, after every lead up to past a SIMD block: the scan accepts
    /// exactly what serde_json's skip accepts, and ends where it does.
    #[test]
    fn the_string_scan_agrees_with_serde_json() {
        let alphabet: [&[u8]; 9] = [
            b"a",
            b"\"",
            b"\\",
            b"u",
            b"F",
            b"\n",
            b"\x7f",
            "é".as_bytes(),
            b"\xff",
        ];
        let mut cases = 0;
        let mut accepted = 0;
        for lead in 0..=17 {
            for len in 0..=5u32 {
                if len == 5 && lead != 0 && lead != 11 {
                    continue;
                }
                for mut code in 0..9u64.pow(len) {
                    let mut t = b"\"".to_vec();
                    t.extend_from_slice(&b"abcdefghijklmnopq"[..lead]);
                    for _ in 0..len {
                        t.extend_from_slice(alphabet[(code % 9) as usize]);
                        code /= 9;
                    }
                    for tail in [&b"\""[..], b"0\"", b"0123456789abcdef\""] {
                        let mut t = t.clone();
                        t.extend_from_slice(tail);
                        let serde = value_end::<&RawValue>(&t, 0).map(|v| v.1);
                        let shown = String::from_utf8_lossy(&t).into_owned();
                        let scanned = skip_value(&t, 0);
                        assert_eq!(scanned, serde, "{shown}");
                        accepted += usize::from(scanned.is_some());
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 600_000, "{cases}");
        assert!(accepted > cases / 10, "{accepted} of {cases}");
        assert_eq!(skip_value(b"\"abc", 0), None, "unterminated");
        assert_eq!(skip_value(b"\"\\u12\"", 0), None, "short \\u");
    }

    /// A small deterministic generator (xorshift) of JSON-ish objects:
    /// nested values, tricky numbers and literals, strings with escapes
    /// and non-ASCII, random whitespace, and one in two mangled by a byte
    /// edit. Whatever the scan reads agrees with serde_json's walk, member
    /// for member; and valid bodies are the scan's (not serde_json's).
    #[test]
    fn the_value_scan_agrees_with_serde_json() {
        struct Gen(u64);
        impl Gen {
            fn next(&mut self) -> u64 {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0
            }
            fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
                from[(self.next() % from.len() as u64) as usize]
            }
            /// One in sixteen from `bad`.
            fn some_bad<'a>(&mut self, good: &[&'a str], bad: &[&'a str]) -> &'a str {
                if self.next().is_multiple_of(16) {
                    self.pick(bad)
                } else {
                    self.pick(good)
                }
            }
            fn ws(&mut self, out: &mut String) {
                out.push_str(self.pick(&["", "", "", " ", "\n\t", "\r "]));
            }
            fn value(&mut self, out: &mut String, depth: u32) {
                let kind = self.next() % if depth > 4 { 3 } else { 5 };
                match kind {
                    0 => out.push_str(self.some_bad(
                        &[
                            "0", "-0", "12", "1.5", "-3e7", "2E+1", "4e-0", "true", "false", "null",
                        ],
                        &[
                            "01", "1.", "-", "1e", ".5", "+1", "1.2.3", "tru", "nul", "nan",
                        ],
                    )),
                    1 | 2 => {
                        out.push('"');
                        for _ in 0..self.next() % 40 {
                            out.push_str(self.some_bad(
                                &[
                                    "a",
                                    "The quick brown fox ",
                                    "\\n",
                                    "\\\"",
                                    "\\\\",
                                    "\\/",
                                    "\\u00e9",
                                    "\\uD83D\\uDE00",
                                    "\\ud800",
                                    "é",
                                    "日本語",
                                    "😀",
                                    "\u{7f}",
                                    "'",
                                ],
                                &["\\x", "\\u12G4", "\t"],
                            ));
                        }
                        out.push('"');
                    }
                    3 => {
                        out.push('[');
                        for n in 0..self.next() % 4 {
                            if n > 0 {
                                out.push(',');
                            }
                            self.ws(out);
                            self.value(out, depth + 1);
                            self.ws(out);
                        }
                        out.push(']');
                    }
                    _ => {
                        out.push('{');
                        for n in 0..self.next() % 4 {
                            if n > 0 {
                                out.push(',');
                            }
                            self.ws(out);
                            out.push_str(
                                self.some_bad(&["\"k\"", "\"\"", "\"é\\n\""], &["k", "1"]),
                            );
                            self.ws(out);
                            out.push(':');
                            self.ws(out);
                            self.value(out, depth + 1);
                        }
                        out.push('}');
                    }
                }
            }
        }
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        let (mut fast, mut valid) = (0, 0);
        for _ in 0..60_000 {
            let mut text = String::from("{\"a\":");
            g.value(&mut text, 0);
            text.push_str(",\"b\":");
            g.value(&mut text, 0);
            text.push('}');
            let mut bytes = text.into_bytes();
            if g.next().is_multiple_of(2) {
                let at = (g.next() % bytes.len() as u64) as usize;
                let byte = [
                    b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', 0x1f, 0xc3, b'0',
                ];
                let byte = byte[(g.next() % byte.len() as u64) as usize];
                match g.next() % 3 {
                    0 => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    _ => {
                        bytes.remove(at);
                    }
                }
            }
            let walked = super::super::Members::walk(&bytes, Some(0)).ok();
            let walked: Option<Vec<Range<usize>>> =
                walked.map(|m| m.into_iter().map(|(_, r)| r).collect());
            // As `Members::parse` calls it: on an object.
            let scanned: Option<Vec<Range<usize>>> = (bytes[0] == b'{')
                .then(|| members(&bytes, 0))
                .flatten()
                .map(|m| m.into_iter().map(|(_, r)| r).collect());
            let shown = String::from_utf8_lossy(&bytes).into_owned();
            if let Some(spans) = &scanned {
                assert_eq!(Some(spans), walked.as_ref(), "{shown}");
                fast += 1;
            }
            if walked.is_some() {
                valid += 1;
                assert!(scanned.is_some(), "valid, yet not the scan's: {shown}");
            }
        }
        assert!(
            valid > 8_000 && fast == valid,
            "{fast} scanned, {valid} valid"
        );
    }

    #[test]
    fn nesting_deeper_than_the_scan_goes_is_serde_jsons() {
        for depth in [127, 128, 129, 1000] {
            let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let serde = value_end::<&RawValue>(text.as_bytes(), 0).map(|v| v.1);
            assert_eq!(serde, Some(text.len()), "{depth}");
            let want = (depth <= 128).then_some(text.len());
            assert_eq!(skip_value(text.as_bytes(), 0), want, "{depth}");
        }
    }

    /// A fault at every number of an array long enough for several groups
    /// of blocks (so at every offset of a group): the scan and serde_json
    /// agree on whether it is an array of integers, and where it ends.
    #[test]
    fn faults_anywhere_in_long_arrays_agree_with_serde_json() {
        let ids: Vec<String> = (0..90u64)
            .map(|i| (i * 7919 % 100_000).to_string())
            .collect();
        let mut cases = 0;
        for at in 0..ids.len() {
            for fault in ["0{}", "{},", "{} ", "-{}", "{}.5", "{}e1", " {}", "{}x"] {
                let mut t = b"[".to_vec();
                for (i, id) in ids.iter().enumerate() {
                    if i > 0 {
                        t.push(b',');
                    }
                    let n = if i == at {
                        fault.replace("{}", id)
                    } else {
                        id.clone()
                    };
                    t.extend_from_slice(n.as_bytes());
                }
                t.push(b']');
                agrees_with_serde_json(t, &format!("{fault} at {at}: "));
                cases += 1;
            }
        }
        assert_eq!(cases, 90 * 8);
    }

    #[test]
    fn long_canonical_arrays_are_read_by_blocks() {
        let ids: Vec<String> = (0..1000).map(|i| (i * 37 % 150_001).to_string()).collect();
        let text = format!("[{}]", ids.join(","));
        let b = text.as_bytes();
        assert_eq!(int_array_end(b, 0), Some(b.len()));
        // All but the tail (the last group with `]`) without the byte loop.
        assert!(canonical_prefix(b, 1) > b.len() - 2 * super::super::blocks::INT_GROUP);
        for bad in ["[1,01]", "[1,,2]", "[1,2,]"] {
            let long = format!("[{},{}", ids.join(","), &bad[1..]);
            assert_eq!(int_array_end(long.as_bytes(), 0), None, "{bad}");
        }
    }
}

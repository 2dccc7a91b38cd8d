//! The top level's members found by a scan that reads arrays of integers
//! and plain strings itself: TensorRT-LLM's context answers carry the
//! prompt's token ids (131 000 of them for a 512 KB prompt, or one 700 KB
//! base64 string), and serde_json's generic value walk costs about 4 ns a
//! byte on the array and 0.2 on the string inside wasm; a completions
//! `prompt` is one long string too. Keys and every other value still go
//! through serde_json, which validates their UTF-8 as it reads them; what
//! the scan reads itself is ASCII by construction. So a body the scan
//! accepts needs no separate UTF-8 pass.
//!
//! The scan accepts exactly what serde_json accepts or stands aside (`None`);
//! `TopLevel::parse` then asks serde_json for the verdict and its message.

use super::{is_ws, Key};
use serde_json::value::RawValue;
use std::ops::Range;

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
pub(super) fn int_array_end(b: &[u8], at: usize) -> Option<usize> {
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

const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const HIGH: u64 = 0x8080_8080_8080_8080;

fn splat(byte: u8) -> u64 {
    u64::from(byte) * 0x0101_0101_0101_0101
}

/// The high bit of each byte of `x` that is zero. Exact per byte: the sum
/// of two 7-bit halves never carries into the next byte.
fn zero_bytes(x: u64) -> u64 {
    !(((x & LOW7) + LOW7) | x) & HIGH
}

/// The high bit of each byte of `w` that is an ASCII digit.
fn digit_bytes(w: u64) -> u64 {
    let x = w ^ splat(b'0');
    // x < 10 exactly for digits: low 7 bits below 10, and no high bit.
    !(((x & LOW7) + splat(0x80 - 10)) | x) & HIGH
}

/// Where a JSON string of ASCII 0x20–0x7F without escapes, starting at
/// `at`, ends (just after its closing quote), eight bytes at a time;
/// `None` for any other string (escapes, non-ASCII: serde_json reads those,
/// from the string's start).
pub(super) fn plain_string_end(b: &[u8], at: usize) -> Option<usize> {
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let start = at + 1;
    let rest = b.get(start..)?;
    let mut words = rest.chunks_exact(8);
    for (n, chunk) in words.by_ref().enumerate() {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        // Borrows may flag bytes after the first special one, never before
        // it, and only the first is read.
        let quote = w ^ splat(b'"');
        let backslash = w ^ splat(b'\\');
        let special = (quote.wrapping_sub(splat(1)) & !quote)
            | (backslash.wrapping_sub(splat(1)) & !backslash)
            | w.wrapping_sub(splat(0x20))
            | w;
        let special = special & HIGH;
        if special != 0 {
            let i = n * 8 + special.trailing_zeros() as usize / 8;
            return (rest.get(i) == Some(&b'"')).then_some(start + i + 1);
        }
    }
    let tail_at = rest.len() - words.remainder().len();
    for (i, c) in words.remainder().iter().enumerate() {
        match c {
            b'"' => return Some(start + tail_at + i + 1),
            0x20..=0x7f if *c != b'\\' => {}
            _ => return None,
        }
    }
    None
}

/// Where the canonical run of integers that starts at `start` (a number's
/// start, just after `[` or a comma) stops being canonical: digits and
/// single commas only, no leading zeros, eight bytes at a time. Every byte
/// before the returned position is a valid part of the array, and the
/// position is `start` or just after a comma, so [`ints_from`] can go on
/// from there with no state.
///
/// Masks hold the high bit of each byte; the word is little-endian, so
/// "the previous byte" is a shift left by 8, with the last byte of the
/// previous word carried in.
fn canonical_prefix(b: &[u8], start: usize) -> usize {
    let mut resume = start;
    // What the byte before `start` was: a separator, so `start` begins a
    // number (a comma there would make `,,`, and a zero then a digit `01`).
    let (mut prev_comma, mut prev_zero, mut prev_start) = (true, false, false);
    let Some(rest) = b.get(start..) else {
        return start;
    };
    for (n, chunk) in rest.chunks_exact(8).enumerate() {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let comma = zero_bytes(w ^ splat(b','));
        let digit = digit_bytes(w);
        if comma | digit != HIGH {
            break;
        }
        let zero = zero_bytes(w ^ splat(b'0'));
        let carry = |prev: bool| if prev { 0x80 } else { 0 };
        // A byte that starts a number: the one after a comma.
        let starts = (comma << 8) | carry(prev_comma);
        let double_comma = comma & starts;
        let leading_zero =
            digit & ((zero << 8) | carry(prev_zero)) & ((starts << 8) | carry(prev_start));
        if double_comma | leading_zero != 0 {
            break;
        }
        if comma != 0 {
            // Just after the word's last comma.
            let last = (63 - comma.leading_zeros() as usize) / 8;
            resume = start + n * 8 + last + 1;
        }
        prev_comma = comma >> 63 != 0;
        prev_zero = zero >> 63 != 0;
        prev_start = starts >> 63 != 0;
    }
    resume
}

/// The members of the object starting at `open`, or `None` to let
/// serde_json decide (anything unusual, every error).
pub(super) fn members(b: &[u8], open: usize) -> Option<Vec<(Key<'_>, Range<usize>)>> {
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
            Some(b'[') => int_array_end(b, i),
            Some(b'"') => plain_string_end(b, i),
            _ => None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_masks_are_exact_for_every_byte() {
        for v in 0..=255u8 {
            let w = u64::from_le_bytes([v, b'5', v, 0, 0xff, v, b',', v]);
            let lanes = |m: u64| m.to_le_bytes().map(|x| x == 0x80);
            let want = |f: fn(u8) -> bool| w.to_le_bytes().map(f);
            assert_eq!(lanes(digit_bytes(w)), want(|x| x.is_ascii_digit()), "{v}");
            assert_eq!(
                lanes(zero_bytes(w ^ splat(b','))),
                want(|x| x == b','),
                "{v}"
            );
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
                        let serde = serde_json::from_slice::<Vec<i128>>(&t).is_ok();
                        t.extend_from_slice(b",9");
                        let scanned = int_array_end(&t, 0);
                        let shown = String::from_utf8_lossy(&t).into_owned();
                        assert_eq!(scanned.is_some(), serde, "{shown}");
                        if let Some(end) = scanned {
                            assert_eq!(end, t.len() - 2, "{shown}");
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 500_000, "{cases}");
    }

    /// Strings of every window of up to 5 bytes from quotes, backslashes,
    /// control characters, DEL, non-ASCII (valid and invalid UTF-8) and
    /// plain letters, after every lead up to a word: the scan accepts
    /// exactly the plain ones serde_json accepts, and ends where it does.
    #[test]
    fn the_string_scan_agrees_with_serde_json() {
        let alphabet: [&[u8]; 8] = [
            b"a",
            b"\"",
            b"\\",
            b"\n",
            b"\x1f",
            b"\x7f",
            "é".as_bytes(),
            b"\xff",
        ];
        let mut cases = 0;
        for lead in 0..=9 {
            for len in 0..=5u32 {
                for mut code in 0..8u64.pow(len) {
                    let mut t = b"\"".to_vec();
                    t.extend_from_slice(&b"abcdefghi"[..lead]);
                    for _ in 0..len {
                        t.extend_from_slice(alphabet[(code % 8) as usize]);
                        code /= 8;
                    }
                    for tail in [&b"\""[..], b"xyz\"", b"0123456789\""] {
                        let mut t = t.clone();
                        t.extend_from_slice(tail);
                        let serde = value_end::<&RawValue>(&t, 0).map(|v| v.1);
                        let shown = String::from_utf8_lossy(&t).into_owned();
                        match plain_string_end(&t, 0) {
                            Some(end) => assert_eq!(Some(end), serde, "{shown}"),
                            None => {
                                let plain = t[1..serde.unwrap_or(t.len()) - 1]
                                    .iter()
                                    .all(|c| (0x20..=0x7f).contains(c) && *c != b'\\');
                                assert!(serde.is_none() || !plain, "{shown}");
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 500_000, "{cases}");
        assert_eq!(plain_string_end(b"\"abc", 0), None, "unterminated");
    }

    #[test]
    fn long_canonical_arrays_are_read_by_words() {
        let ids: Vec<String> = (0..1000).map(|i| (i * 37 % 150_001).to_string()).collect();
        let text = format!("[{}]", ids.join(","));
        let b = text.as_bytes();
        assert_eq!(int_array_end(b, 0), Some(b.len()));
        // All but the tail (the last word with `]`) without the byte loop.
        assert!(canonical_prefix(b, 1) > b.len() - 16);
        for bad in ["[1,01]", "[1,,2]", "[1,2,]"] {
            let long = format!("[{},{}", ids.join(","), &bad[1..]);
            assert_eq!(int_array_end(long.as_bytes(), 0), None, "{bad}");
        }
    }
}

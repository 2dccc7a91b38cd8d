//! Top-level editing of a JSON object without touching the bytes the router
//! does not own.
//!
//! Engines cache KV by prompt tokens, and the tokens come from the exact text of
//! `messages`, `tools` and `prompt`. Re-serialising a body reorders keys, changes
//! whitespace and rounds integers above 2^53, all of which break prefix-cache hits
//! or corrupt ids. So a body is parsed once into the byte spans of its top-level
//! members, and a new body is produced by splicing: kept members are copied
//! verbatim, edited members get a new value in place, new members are appended
//! (or, for a decode body whose long tail no edit touches, put in front, so
//! Envoy keeps that tail in its own buffer: [`TopLevel::splice_with`]).

use crate::inline_str::InlineStr;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

/// Why a body could not be read as a JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// The bytes are not UTF-8 (JSON text must be).
    NotUtf8,
    /// The body is empty or only whitespace.
    Empty,
    /// Valid or not, the top level is not an object.
    NotObject,
    /// The JSON is malformed; the text is serde_json's, with line and column.
    Invalid(String),
}

impl BodyError {
    /// The message, about `subject` ("request body", "the answer", ...).
    pub fn describe(&self, subject: &str) -> String {
        match self {
            BodyError::NotUtf8 => format!("{subject} is not valid UTF-8"),
            BodyError::Empty => format!("{subject} is empty; expected a JSON object"),
            BodyError::NotObject => format!("{subject} must be a JSON object"),
            BodyError::Invalid(e) => format!("{subject} is not valid JSON: {e}"),
        }
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe("request body"))
    }
}

/// One top-level member: where its key and value sit in the source.
#[derive(Debug, Clone)]
struct Member {
    /// Member names are short: kept inline, not allocated.
    key: InlineStr<32>,
    /// Just after the previous member's value (or after `{`): removing a
    /// non-first member deletes from here, taking its leading comma with it.
    lead_start: usize,
    key_start: usize,
    value: Range<usize>,
}

/// The top-level members of a JSON object, as spans into the source bytes.
///
/// It owns no part of the body, so a flow can keep it beside the body while a
/// prefill is in flight and render the decode body later without parsing twice.
#[derive(Debug, Clone)]
pub struct TopLevel {
    members: Vec<Member>,
    /// Index of the closing `}`.
    close: usize,
    /// Length of the parsed source: spans are only valid for that source.
    src_len: usize,
}

struct Key<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Vec<(Key<'de>, &'de RawValue)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(16));
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let value: &'de RawValue = map.next_value()?;
            out.push((key, value));
        }
        Ok(out)
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

mod blocks;
mod scan;

impl TopLevel {
    /// serde_json's walk of the top level, and its verdict on what the
    /// scan would not take.
    fn walk(src: &[u8], first: Option<usize>) -> Result<Vec<(Key<'_>, Range<usize>)>, BodyError> {
        let text = std::str::from_utf8(src).map_err(|_| BodyError::NotUtf8)?;
        let first = first.ok_or(BodyError::Empty)?;
        if src.get(first) != Some(&b'{') {
            // Tell a valid non-object apart from garbage: both are 400, but the
            // message should say which.
            return Err(match serde_json::from_str::<de::IgnoredAny>(text) {
                Ok(_) => BodyError::NotObject,
                Err(e) => BodyError::Invalid(e.to_string()),
            });
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let raw = de
            .deserialize_map(MembersVisitor)
            .map_err(|e| BodyError::Invalid(e.to_string()))?;
        de.end().map_err(|e| BodyError::Invalid(e.to_string()))?;
        let base = text.as_ptr() as usize;
        Ok(raw
            .into_iter()
            .map(|(key, value)| {
                let start = value.get().as_ptr() as usize - base;
                (key, start..start + value.get().len())
            })
            .collect())
    }

    /// Parses `src` as a JSON object, validating all of it (nesting is limited by
    /// serde_json's recursion limit, so hostile depth is an error, not a crash).
    pub fn parse(src: &[u8]) -> Result<TopLevel, BodyError> {
        let first = src.iter().position(|b| !is_ws(*b));
        // The fast scan handles bodies it fully understands (checking their
        // UTF-8 as it goes); anything else, and every error for serde_json's
        // message, takes serde_json's walk.
        let scanned = first
            .filter(|f| src.get(*f) == Some(&b'{'))
            .and_then(|f| scan::members(src, f));
        let spans = match scanned {
            Some(spans) => spans,
            None => Self::walk(src, first)?,
        };
        let first = first.ok_or(BodyError::Empty)?;
        let close = src
            .iter()
            .rposition(|b| !is_ws(*b))
            .ok_or(BodyError::Empty)?;

        let mut members = Vec::with_capacity(spans.len());
        let mut lead_start = first + 1;
        for (key, value) in spans {
            let (start, end) = (value.start, value.end);
            // The key is the first string after the previous value's end; the
            // text was validated above, so only whitespace and a comma precede it.
            let key_start = lead_start
                + src
                    .get(lead_start..start)
                    .and_then(|gap| gap.iter().position(|b| *b == b'"'))
                    .unwrap_or(0);
            members.push(Member {
                key: InlineStr::from(key.0.as_ref()),
                lead_start,
                key_start,
                value: start..end,
            });
            lead_start = end;
        }
        Ok(TopLevel {
            members,
            close,
            src_len: src.len(),
        })
    }

    /// The raw text of the first member named `key`.
    pub fn raw<'s>(&self, src: &'s [u8], key: &str) -> Option<&'s [u8]> {
        src.get(self.span(key)?)
    }

    /// Where the value of the first member named `key` sits in the source.
    pub fn span(&self, key: &str) -> Option<Range<usize>> {
        self.members
            .iter()
            .find(|m| m.key == key)
            .map(|m| m.value.clone())
    }

    /// The raw text of `key`, treating an explicit `null` as absent (OpenAI
    /// clients send `"stream": null` to mean "not set").
    pub fn raw_non_null<'s>(&self, src: &'s [u8], key: &str) -> Option<&'s [u8]> {
        src.get(self.span_non_null(src, key)?)
    }

    /// [`TopLevel::span`], treating an explicit `null` as absent.
    pub fn span_non_null(&self, src: &[u8], key: &str) -> Option<Range<usize>> {
        self.span(key)
            .filter(|s| src.get(s.clone()) != Some(b"null"))
    }

    /// Whether a member named `key` exists (even if `null`).
    pub fn contains(&self, key: &str) -> bool {
        self.members.iter().any(|m| m.key == key)
    }

    /// The first of `keys` that appears more than once. JSON parsers disagree on
    /// which duplicate wins, so a duplicated key the router reads or writes would
    /// let the router and the engine see different requests.
    pub fn first_duplicate<'k>(&self, keys: &[&'k str]) -> Option<&'k str> {
        keys.iter()
            .copied()
            .find(|k| self.members.iter().filter(|m| m.key == *k).count() > 1)
    }

    /// Member names in order (for diagnostics and tests).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.key.as_str())
    }

    /// Produces `src` with `edits` applied. Members not named in `edits` are
    /// copied byte for byte; the order of keys is kept; set keys that were absent
    /// are appended in the order they were first set.
    ///
    /// `src` must be the bytes this was parsed from: spans laid on another
    /// source would splice at meaningless offsets, so that is an error, never
    /// a silently wrong body.
    pub fn render(&self, src: &[u8], edits: &Edits) -> Result<Vec<u8>, SourceMismatch> {
        self.render_with(src, edits, &[])
    }

    /// [`TopLevel::render`], with [`Op::Copy`] values taken from `other`
    /// (the prefill's answer): copied once, straight into the new body.
    pub fn render_with(
        &self,
        src: &[u8],
        edits: &Edits,
        other: &[u8],
    ) -> Result<Vec<u8>, SourceMismatch> {
        if src.len() != self.src_len {
            return Err(SourceMismatch);
        }
        if edits.is_empty() {
            return Ok(src.to_vec());
        }
        let plan = self.splices(edits, other, Layout::Append)?;
        plan.apply(src, src.len())
    }

    /// The new body as Envoy can take it: when what `edits` change ends at
    /// least `front_min` bytes before the body does, new members go first
    /// (just after `{`) instead of last, and only the front up to the last
    /// change is rendered: Envoy drains that front of its buffered copy and
    /// prepends the new one, and the rest of the client's bytes (a long
    /// prompt) never cross into the VM and back. Otherwise the whole body,
    /// as [`TopLevel::render_with`] has it. Either way the same members with
    /// the same values, and no key twice: a member is only added when the
    /// body has none of that name.
    pub fn splice_with(
        &self,
        src: &[u8],
        edits: &Edits,
        other: &[u8],
        front_min: usize,
    ) -> Result<Spliced, SourceMismatch> {
        if src.len() != self.src_len {
            return Err(SourceMismatch);
        }
        if edits.is_empty() {
            // Nothing to change: nothing replaced, no copy.
            return Ok(Spliced {
                head: Vec::new(),
                replaced: 0,
                kept: src.len(),
            });
        }
        // Every change ends after `{`, so a body no longer than `front_min`
        // never keeps enough: short bodies (most) skip the front layout's
        // splices rather than building them to throw away.
        if src.len() > front_min {
            let front = self.splices(edits, other, Layout::Front)?;
            if src.len() - front.end >= front_min {
                return Ok(Spliced {
                    head: front.apply(src, front.end)?,
                    replaced: front.end,
                    kept: src.len() - front.end,
                });
            }
        }
        let whole = self.render_with(src, edits, other)?;
        Ok(Spliced {
            head: whole,
            replaced: src.len(),
            kept: 0,
        })
    }

    /// Where each edit changes the source, in order.
    fn splices<'a>(
        &self,
        edits: &'a Edits,
        other: &'a [u8],
        layout: Layout,
    ) -> Result<Splices<'a>, SourceMismatch> {
        let value = |op| op_value(op, other);
        let mut extra = 0;
        for (k, op) in &edits.ops {
            extra += k.len() + value(op)?.len() + 4;
        }
        let mut splices: Vec<(Range<usize>, &'a [u8])> = Vec::with_capacity(edits.ops.len() + 1);

        let kept: Vec<bool> = self
            .members
            .iter()
            .map(|m| !matches!(edits.get(&m.key), Some(Op::Remove)))
            .collect();
        let first_kept = kept.iter().position(|k| *k);

        for (i, m) in self.members.iter().enumerate() {
            match edits.get(&m.key) {
                Some(op @ (Op::Set(_) | Op::Copy { .. })) => {
                    splices.push((m.value.clone(), value(op)?));
                }
                Some(Op::Remove) => {
                    if matches!(first_kept, Some(fk) if fk < i) {
                        splices.push((m.lead_start..m.value.end, b""));
                    }
                }
                None => {}
            }
        }
        // Removed members before the first kept one take the separator that
        // follows them instead of the one before them.
        let first = self.members.first();
        match (first, first_kept) {
            (Some(head), Some(fk)) if fk > 0 => {
                if let Some(kept) = self.members.get(fk) {
                    splices.push((head.key_start..kept.key_start, b""));
                }
            }
            (Some(head), None) => {
                if let Some(last) = self.members.last() {
                    splices.push((head.key_start..last.value.end, b""));
                }
            }
            _ => {}
        }

        // New members, each with the comma that joins it to its neighbour:
        // before it when appended after kept members, after it when put in
        // front of them.
        let mut added = Vec::new();
        let mut any = layout == Layout::Append && first_kept.is_some();
        for (key, op) in &edits.ops {
            if !matches!(op, Op::Remove) && !self.contains(key) {
                if any {
                    added.push(b',');
                }
                push_json_str(&mut added, key);
                added.push(b':');
                added.extend_from_slice(value(op)?);
                any = true;
            }
        }
        if layout == Layout::Front && any && first_kept.is_some() {
            added.push(b',');
        }
        let add_at = match layout {
            Layout::Append => self.members.last().map(|m| m.value.end),
            Layout::Front => self.members.first().map(|m| m.lead_start),
        }
        .unwrap_or(self.close);
        let end = splices
            .iter()
            .map(|(r, _)| r.end)
            .max()
            .unwrap_or(0)
            .max(add_at);
        splices.sort_by_key(|(r, _)| (r.start, r.end));
        Ok(Splices {
            splices,
            added,
            add_at,
            end,
            extra,
        })
    }
}

/// Where new members go in a rendered body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// After the last member: the body reads as the client's plus the edits.
    Append,
    /// Just after `{`: everything past the last edited member is untouched.
    Front,
}

/// The changes [`TopLevel::splices`] found.
struct Splices<'a> {
    /// Sorted by position; they never overlap (each member is named once).
    splices: Vec<(Range<usize>, &'a [u8])>,
    /// The new members, put in at `add_at`.
    added: Vec<u8>,
    add_at: usize,
    /// Where the last change ends: the source is untouched from here on.
    end: usize,
    /// An upper bound on how much the edits lengthen the source.
    extra: usize,
}

impl Splices<'_> {
    /// `src[..upto]` with the changes applied (`upto` at or past `end`).
    fn apply(&self, src: &[u8], upto: usize) -> Result<Vec<u8>, SourceMismatch> {
        let src = src.get(..upto).ok_or(SourceMismatch)?;
        let mut out = Vec::with_capacity(src.len() + self.extra);
        let mut cursor = 0;
        let mut added =
            (!self.added.is_empty()).then_some((self.add_at..self.add_at, &self.added[..]));
        let mut rest = self.splices.iter().cloned().peekable();
        loop {
            // The insertion goes before any change starting where it does.
            let next = match (&added, rest.peek()) {
                (Some(a), Some(s)) if (a.0.start, a.0.end) <= (s.0.start, s.0.end) => added.take(),
                (Some(_), None) => added.take(),
                _ => rest.next(),
            };
            let Some((range, text)) = next else { break };
            // A cursor past a start would only skip bytes, never repeat them.
            let kept = src
                .get(cursor..range.start.max(cursor))
                .ok_or(SourceMismatch)?;
            out.extend_from_slice(kept);
            out.extend_from_slice(text);
            cursor = range.end.max(cursor);
        }
        out.extend_from_slice(src.get(cursor..).ok_or(SourceMismatch)?);
        Ok(out)
    }
}

/// A new body in the form Envoy takes it (`proxy_set_buffer_bytes` from
/// offset 0 drains that many bytes and prepends what it is given): `head`
/// in place of the old body's first `replaced` bytes, the `kept` bytes
/// after them left where they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spliced {
    pub head: Vec<u8>,
    pub replaced: usize,
    pub kept: usize,
}

impl Spliced {
    /// A whole new body in place of an old one of `old_len` bytes.
    pub fn whole(body: Vec<u8>, old_len: usize) -> Spliced {
        Spliced {
            head: body,
            replaced: old_len,
            kept: 0,
        }
    }

    /// The new body's length.
    pub fn len(&self) -> usize {
        self.head.len() + self.kept
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The new body, given the old one (what Envoy's buffer ends up
    /// holding; for tests and fixtures, the flow never assembles it).
    pub fn assemble(&self, old: &[u8]) -> Vec<u8> {
        let mut out = self.head.clone();
        out.extend_from_slice(old.get(self.replaced..).unwrap_or_default());
        out
    }
}

/// The bytes an edit puts in place of a value.
fn op_value<'a>(op: &'a Op, other: &'a [u8]) -> Result<&'a [u8], SourceMismatch> {
    match op {
        Op::Set(v) => Ok(v.as_bytes()),
        Op::Copy { span, source_len } if *source_len == other.len() => {
            other.get(span.clone()).ok_or(SourceMismatch)
        }
        Op::Copy { .. } => Err(SourceMismatch),
        Op::Remove => Ok(b""),
    }
}

/// [`TopLevel::render`] was given bytes other than those it parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceMismatch;

impl fmt::Display for SourceMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object was rendered against bytes it was not parsed from")
    }
}

/// What to do with one top-level key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Replace (or append) with this raw JSON text.
    Set(Cow<'static, str>),
    /// Replace (or append) with the raw JSON text at this span of the
    /// second source given to [`TopLevel::render_with`]: large values (the
    /// prompt's token ids) move from the answer to the body in one copy.
    Copy {
        span: Range<usize>,
        /// The length of the source the span was taken from: rendering
        /// against another is an error, as for the body itself.
        source_len: usize,
    },
    Remove,
}

/// Top-level edits for one leg, applied by [`TopLevel::render`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    /// Keys and values are mostly literals: borrowed, not allocated.
    ops: Vec<(Cow<'static, str>, Op)>,
}

impl Edits {
    pub fn new() -> Edits {
        Edits::default()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Sets `key` to raw JSON `value`; the caller guarantees it is valid JSON.
    pub fn set_raw(
        &mut self,
        key: impl Into<Cow<'static, str>>,
        value: impl Into<Cow<'static, str>>,
    ) {
        self.put(key, Op::Set(value.into()));
    }

    /// Sets `key` to the raw JSON at `span` of `source`, which
    /// [`TopLevel::render_with`] must then be given beside the body.
    pub fn copy_from(
        &mut self,
        key: impl Into<Cow<'static, str>>,
        source: &[u8],
        span: Range<usize>,
    ) {
        let source_len = source.len();
        self.put(key, Op::Copy { span, source_len });
    }

    /// [`Edits::set_raw`] of raw JSON bytes the caller parsed (so UTF-8).
    pub fn set_raw_bytes(&mut self, key: impl Into<Cow<'static, str>>, value: &[u8]) {
        self.set_raw(key, String::from_utf8_lossy(value).into_owned());
    }

    pub fn set_str(&mut self, key: impl Into<Cow<'static, str>>, value: &str) {
        let mut v = Vec::with_capacity(value.len() + 2);
        push_json_str(&mut v, value);
        // push_json_str only emits valid UTF-8 from valid UTF-8 input: the
        // buffer becomes the value, not copied.
        let v = String::from_utf8(v)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        self.set_raw(key, v);
    }

    pub fn set_u64(&mut self, key: impl Into<Cow<'static, str>>, value: u64) {
        self.set_raw(key, value.to_string());
    }

    pub fn set_bool(&mut self, key: impl Into<Cow<'static, str>>, value: bool) {
        self.set_raw(key, if value { "true" } else { "false" });
    }

    pub fn remove(&mut self, key: impl Into<Cow<'static, str>>) {
        self.put(key, Op::Remove);
    }

    pub fn get(&self, key: &str) -> Option<&Op> {
        self.ops.iter().find(|(k, _)| k == key).map(|(_, op)| op)
    }

    fn put(&mut self, key: impl Into<Cow<'static, str>>, op: Op) {
        let key = key.into();
        match self.ops.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = op,
            None => self.ops.push((key, op)),
        }
    }
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len() + 2);
    push_json_str(&mut out, s);
    // Escaping keeps valid UTF-8 valid.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends `s` as a JSON string literal.
pub fn push_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let parsed = TopLevel::parse(body.as_bytes());
            let serde = serde_json::from_str::<de::IgnoredAny>(body).is_ok();
            assert_eq!(parsed.is_ok(), ok, "{body}");
            assert_eq!(serde, ok, "serde_json on {body}");
            if let Ok(top) = parsed {
                let ids = top
                    .raw(body.as_bytes(), "ids")
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                let want =
                    serde_json::from_str::<std::collections::BTreeMap<String, &RawValue>>(body)
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
        let top = TopLevel::parse(src.as_bytes()).expect("parse");
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
        let top = TopLevel::parse(br#"{"a":1}"#).expect("parse");
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
        let at = TopLevel::parse(answer)
            .expect("answer")
            .span("prompt_token_ids")
            .expect("span");
        let top = TopLevel::parse(src).expect("parse");
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
    fn front(src: &str, f: impl FnOnce(&mut Edits)) -> (String, Spliced) {
        let top = TopLevel::parse(src.as_bytes()).expect("parse");
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
        let top = TopLevel::parse(src.as_bytes()).expect("parse");
        let mut e = Edits::new();
        e.set_u64("x", 1);
        let s = top
            .splice_with(src.as_bytes(), &e, &[], src.len())
            .expect("same source");
        assert_eq!(
            s,
            Spliced::whole(br#"{"model":"m","prompt":"p","x":1}"#.to_vec(), src.len())
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
        let top = TopLevel::parse(src.as_bytes()).expect("parse");
        assert_eq!(top.raw(src.as_bytes(), "stream"), Some(&b"true"[..]));
        assert_eq!(render(src, |e| e.remove("stream")), r#"{"x":1}"#);
    }

    #[test]
    fn rejects_what_is_not_an_object() {
        assert_eq!(TopLevel::parse(b"").unwrap_err(), BodyError::Empty);
        assert_eq!(TopLevel::parse(b"  ").unwrap_err(), BodyError::Empty);
        assert_eq!(TopLevel::parse(b"[1]").unwrap_err(), BodyError::NotObject);
        assert_eq!(TopLevel::parse(b"\"s\"").unwrap_err(), BodyError::NotObject);
        assert_eq!(TopLevel::parse(b"\xff{}").unwrap_err(), BodyError::NotUtf8);
        assert!(matches!(
            TopLevel::parse(b"{\"a\":}"),
            Err(BodyError::Invalid(_))
        ));
        assert!(matches!(
            TopLevel::parse(b"{\"a\":1"),
            Err(BodyError::Invalid(_))
        ));
        assert!(matches!(
            TopLevel::parse(b"{} {}"),
            Err(BodyError::Invalid(_))
        ));
        assert!(matches!(
            TopLevel::parse(b"nope"),
            Err(BodyError::Invalid(_))
        ));
    }

    #[test]
    fn hostile_nesting_neither_crashes_nor_recurses() {
        // serde_json skips raw values iteratively, so depth costs no stack.
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        let top = TopLevel::parse(deep.as_bytes()).expect("deep but valid");
        assert_eq!(
            top.raw(deep.as_bytes(), "a").map(<[u8]>::len),
            Some(200_000)
        );
        let broken = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(99_999));
        assert!(matches!(
            TopLevel::parse(broken.as_bytes()),
            Err(BodyError::Invalid(_))
        ));
    }

    #[test]
    fn finds_duplicates_of_named_keys_only() {
        let src = br#"{"a":1,"b":2,"a":3,"c":1,"c":2}"#;
        let top = TopLevel::parse(src).expect("parse");
        assert_eq!(top.first_duplicate(&["b", "c"]), Some("c"));
        assert_eq!(top.first_duplicate(&["b"]), None);
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut v = Vec::new();
        push_json_str(&mut v, "a\"b\\c\n\u{1}é");
        assert_eq!(String::from_utf8(v).unwrap(), r#""a\"b\\c\n\u0001é""#);
    }
}

//! The top-level members of a JSON object, as spans into the source bytes:
//! found by the fast scan, or by serde_json's walk when the scan stands
//! aside.

use super::error::BodyError;
use super::key::Key;
use super::scan::{self, is_ws};
use crate::inline_str::InlineStr;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;
use std::ops::Range;

/// One top-level member: where its key and value sit in the source.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// Member names are short: kept inline, not allocated.
    pub(crate) key: InlineStr<32>,
    /// Just after the previous member's value (or after `{`): removing a
    /// non-first member deletes from here, taking its leading comma with it.
    pub(crate) lead_start: usize,
    pub(crate) key_start: usize,
    pub(crate) value: Range<usize>,
}

/// The top-level members of a JSON object, as spans into the source bytes.
///
/// It owns no part of the body, so a flow can keep it beside the body while a
/// prefill is in flight and render the decode body later without parsing twice.
#[derive(Debug, Clone)]
pub struct Members {
    pub(crate) members: Vec<Member>,
    /// Index of the closing `}`.
    pub(crate) close: usize,
    /// Length of the parsed source: spans are only valid for that source.
    pub(crate) src_len: usize,
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

impl Members {
    /// serde_json's walk of the top level, and what it finds of the
    /// scan would not take.
    pub(crate) fn walk(
        src: &[u8],
        first: Option<usize>,
    ) -> Result<Vec<(Key<'_>, Range<usize>)>, BodyError> {
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
    pub fn parse(src: &[u8]) -> Result<Members, BodyError> {
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
        Ok(Members {
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

    /// [`Members::span`], treating an explicit `null` as absent.
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
}

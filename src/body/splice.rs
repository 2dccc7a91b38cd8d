//! Producing a leg's body from the client's: members spliced, never
//! re-serialised, in the plain layout or with new members in front.

use super::edits::{push_json_str, Edit, Edits};
use super::members::Members;
use std::fmt;
use std::ops::Range;

impl Members {
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

    /// [`Members::render`], with [`Edit::Copy`] values taken from `other`
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
    /// as [`Members::render_with`] has it. Either way the same members with
    /// the same values, and no key twice: a member is only added when the
    /// body has none of that name.
    pub fn splice_with(
        &self,
        src: &[u8],
        edits: &Edits,
        other: &[u8],
        front_min: usize,
    ) -> Result<LegBody, SourceMismatch> {
        if src.len() != self.src_len {
            return Err(SourceMismatch);
        }
        if edits.is_empty() {
            // Nothing to change: nothing replaced, no copy.
            return Ok(LegBody {
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
                return Ok(LegBody {
                    head: front.apply(src, front.end)?,
                    replaced: front.end,
                    kept: src.len() - front.end,
                });
            }
        }
        let whole = self.render_with(src, edits, other)?;
        Ok(LegBody {
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
        let value = |op| edit_value(op, other);
        let mut extra = 0;
        for (k, op) in &edits.ops {
            extra += k.len() + value(op)?.len() + 4;
        }
        let mut splices: Vec<(Range<usize>, &'a [u8])> = Vec::with_capacity(edits.ops.len() + 1);

        let kept: Vec<bool> = self
            .members
            .iter()
            .map(|m| !matches!(edits.get(&m.key), Some(Edit::Remove)))
            .collect();
        let first_kept = kept.iter().position(|k| *k);

        for (i, m) in self.members.iter().enumerate() {
            match edits.get(&m.key) {
                Some(op @ (Edit::Set(_) | Edit::Copy { .. })) => {
                    splices.push((m.value.clone(), value(op)?));
                }
                Some(Edit::Remove) => {
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

        let added = self.added_members(edits, other, layout, first_kept.is_some())?;
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

    /// The members `edits` adds, each with the comma that joins it to its
    /// neighbour: before it when appended after kept members, after it
    /// when put in front of them.
    fn added_members(
        &self,
        edits: &Edits,
        other: &[u8],
        layout: Layout,
        any_kept: bool,
    ) -> Result<Vec<u8>, SourceMismatch> {
        let mut added = Vec::new();
        let mut any = layout == Layout::Append && any_kept;
        for (key, op) in &edits.ops {
            if !matches!(op, Edit::Remove) && !self.contains(key) {
                if any {
                    added.push(b',');
                }
                push_json_str(&mut added, key);
                added.push(b':');
                added.extend_from_slice(edit_value(op, other)?);
                any = true;
            }
        }
        if layout == Layout::Front && any && any_kept {
            added.push(b',');
        }
        Ok(added)
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

/// The changes [`Members::splices`] found.
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
pub struct LegBody {
    pub head: Vec<u8>,
    pub replaced: usize,
    pub kept: usize,
}

impl LegBody {
    /// A whole new body in place of an old one of `old_len` bytes.
    pub fn whole(body: Vec<u8>, old_len: usize) -> LegBody {
        LegBody {
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
fn edit_value<'a>(op: &'a Edit, other: &'a [u8]) -> Result<&'a [u8], SourceMismatch> {
    match op {
        Edit::Set(v) => Ok(v.as_bytes()),
        Edit::Copy { span, source_len } if *source_len == other.len() => {
            other.get(span.clone()).ok_or(SourceMismatch)
        }
        Edit::Copy { .. } => Err(SourceMismatch),
        Edit::Remove => Ok(b""),
    }
}

/// [`Members::render`] was given bytes other than those it parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceMismatch;

impl fmt::Display for SourceMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object was rendered against bytes it was not parsed from")
    }
}

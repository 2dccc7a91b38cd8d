//! The edits a leg makes to the client's top-level members, and JSON string
//! literals.

use std::borrow::Cow;
use std::ops::Range;

/// What to do with one top-level key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Replace (or append) with this raw JSON text.
    Set(Cow<'static, str>),
    /// Replace (or append) with the raw JSON text at this span of the
    /// second source given to [`Members::render_with`]: large values (the
    /// prompt's token ids) move from the answer to the body in one copy.
    Copy {
        span: Range<usize>,
        /// The length of the source the span was taken from: rendering
        /// against another is an error, as for the body itself.
        source_len: usize,
    },
    Remove,
}

/// Top-level edits for one leg, applied by [`Members::render`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    /// Keys and values are mostly literals: borrowed, not allocated.
    pub(crate) ops: Vec<(Cow<'static, str>, Edit)>,
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
        self.put(key, Edit::Set(value.into()));
    }

    /// Sets `key` to the raw JSON at `span` of `source`, which
    /// [`Members::render_with`] must then be given beside the body.
    pub fn copy_from(
        &mut self,
        key: impl Into<Cow<'static, str>>,
        source: &[u8],
        span: Range<usize>,
    ) {
        let source_len = source.len();
        self.put(key, Edit::Copy { span, source_len });
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
        self.put(key, Edit::Remove);
    }

    pub fn get(&self, key: &str) -> Option<&Edit> {
        self.ops.iter().find(|(k, _)| k == key).map(|(_, op)| op)
    }

    fn put(&mut self, key: impl Into<Cow<'static, str>>, op: Edit) {
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

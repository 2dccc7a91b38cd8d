//! Editing inside an answer without re-serialising it: an object's members
//! are spliced with [`Members`], an array is split into its elements' raw
//! text. Every value the router does not own keeps its bytes (floats their
//! digits, integers their precision).

use crate::body::{Edits, Members};
use serde_json::value::RawValue;

/// Applies the edits `f` makes to the object `obj`; `None` when `obj` is not
/// an object, or `f` changed nothing (or gave up).
pub fn edit_object(
    obj: &[u8],
    f: impl FnOnce(&Members, &mut Edits) -> Option<()>,
) -> Option<Vec<u8>> {
    let top = Members::parse(obj).ok()?;
    let mut edits = Edits::new();
    f(&top, &mut edits)?;
    if edits.is_empty() {
        return None;
    }
    top.render(obj, &edits).ok()
}

/// The member `key` of an object, if it is itself an object.
pub fn object_member<'a>(top: &Members, src: &'a [u8], key: &str) -> Option<&'a [u8]> {
    top.raw_non_null(src, key)
        .filter(|v| v.first() == Some(&b'{'))
}

/// The raw text of each element of a JSON array.
pub fn array_items(raw: &[u8]) -> Option<Vec<&[u8]>> {
    let items: Vec<&RawValue> = serde_json::from_slice(raw).ok()?;
    Some(items.into_iter().map(|v| v.get().as_bytes()).collect())
}

/// A JSON array of raw elements.
pub fn join_array<'a>(items: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut out = Vec::with_capacity(64);
    out.push(b'[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.push(b']');
    // The elements were valid JSON text, so valid UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// Whether an object names one of `keys` twice. Clients' JSON parsers
/// disagree on which duplicate wins (most take the last, the scanner here
/// the first), so a value read from or written to such an object could be
/// another one than the client reads: the router then leaves the object
/// alone. No engine writes duplicates; fuzz/sse_rewrite found the case.
pub fn ambiguous(top: &Members, keys: &[&str]) -> bool {
    top.first_duplicate(keys).is_some()
}

/// A non-negative integer member.
pub fn u64_member(top: &Members, src: &[u8], key: &str) -> Option<u64> {
    serde_json::from_slice(top.raw_non_null(src, key)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_split_and_join_without_touching_their_elements() {
        let raw = br#"[ 1.0e-5, {"a" : 18446744073709551615}, "\u00e9", null ]"#;
        let items = array_items(raw).unwrap();
        assert_eq!(items.len(), 4);
        assert_eq!(items[0], b"1.0e-5");
        assert_eq!(
            join_array(items),
            r#"[1.0e-5,{"a" : 18446744073709551615},"\u00e9",null]"#
        );
        assert!(array_items(b"{}").is_none());
    }

    #[test]
    fn object_edits_keep_everything_else() {
        let obj = br#"{"x": 1.50, "y": {"z": 2}}"#;
        let out = edit_object(obj, |top, e| {
            e.set_u64("x", 7);
            assert_eq!(object_member(top, obj, "y"), Some(&br#"{"z": 2}"#[..]));
            Some(())
        });
        assert_eq!(out.unwrap(), br#"{"x": 7, "y": {"z": 2}}"#);
        assert_eq!(edit_object(obj, |_, _| Some(())), None, "nothing changed");
        assert_eq!(edit_object(b"[1]", |_, _| Some(())), None);
    }
}

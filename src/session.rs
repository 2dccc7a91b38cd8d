//! The session a request belongs to, for a model with session affinity
//! (`fleet::SessionAffinity`): named by a header or a body member, and
//! hashed into the key the scheduler ranks pods by.

use crate::body::Members;
use crate::fleet::{fnv1a, SessionAffinity};
use serde_json::Value;

/// A session id longer than this is hashed by its first bytes only: ids
/// are short tokens, and a client must not make the router hash a megabyte.
const MAX_ID_BYTES: usize = 256;

/// The session `s` finds in a request: the first of its headers present
/// with a value (`headers` as the flow kept them: lower-case names), else
/// the first of its body members holding a string or a number. `None`:
/// the request names no session and is placed as any other.
pub fn session_id(
    s: &SessionAffinity,
    headers: &[(String, String)],
    body: &[u8],
    top: &Members,
) -> Option<String> {
    let header = s.headers.iter().find_map(|name| {
        headers
            .iter()
            .find(|(k, v)| k == name && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned())
    });
    header.or_else(|| s.body_fields.iter().find_map(|f| member(f, body, top)))
}

/// The body member at dotted `path`, as text, when it is a non-empty
/// string or a number.
fn member(path: &str, body: &[u8], top: &Members) -> Option<String> {
    let mut names = path.split('.');
    let raw = top.raw_non_null(body, names.next()?)?;
    let rest: Vec<&str> = names.collect();
    if rest.is_empty() && raw.first() == Some(&b'"') {
        // The common case, a top-level string: no tree built.
        let s: String = serde_json::from_slice(raw).ok()?;
        return (!s.is_empty()).then_some(s);
    }
    let mut value: Value = serde_json::from_slice(raw).ok()?;
    for name in rest {
        value = value.get_mut(name)?.take();
    }
    match value {
        Value::String(s) if !s.is_empty() => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The key the scheduler ranks pods by for session `id`: the same on
/// every VM, replica and build.
pub fn session_key(id: &str) -> u64 {
    let bytes = id.as_bytes();
    fnv1a(bytes.get(..MAX_ID_BYTES).unwrap_or(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(headers: &[(&str, &str)], body: &str) -> Option<String> {
        let s = SessionAffinity::default();
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let top = Members::parse(body.as_bytes()).expect("object");
        session_id(&s, &headers, body.as_bytes(), &top)
    }

    #[test]
    fn a_header_names_the_session_before_the_body() {
        let body = r#"{"model":"m","prompt_cache_key":"from-body"}"#;
        assert_eq!(id(&[("x-session-id", "h1")], body).as_deref(), Some("h1"));
        assert_eq!(id(&[("session_id", " h2 ")], body).as_deref(), Some("h2"));
        // An empty header names nothing: the body does.
        assert_eq!(
            id(&[("x-session-id", " ")], body).as_deref(),
            Some("from-body")
        );
    }

    #[test]
    fn body_members_name_it_in_order_including_nested_ones() {
        let claude = r#"{"model":"m","metadata":{"user_id":"user_x_session_42"}}"#;
        assert_eq!(id(&[], claude).as_deref(), Some("user_x_session_42"));
        let both = r#"{"metadata":{"session_id":7,"user_id":"u"}}"#;
        assert_eq!(id(&[], both).as_deref(), Some("7"));
        for none in [
            r#"{"model":"m"}"#,
            r#"{"prompt_cache_key":""}"#,
            r#"{"prompt_cache_key":null,"metadata":{"session_id":{"a":1}}}"#,
            r#"{"metadata":"flat"}"#,
        ] {
            assert_eq!(id(&[], none), None, "{none}");
        }
    }

    #[test]
    fn keys_are_stable_and_bounded_in_what_they_read() {
        assert_eq!(session_key("abc"), fnv1a(b"abc"));
        assert_ne!(session_key("abc"), session_key("abd"));
        let long = "x".repeat(10_000);
        assert_eq!(session_key(&long), session_key(&"x".repeat(MAX_ID_BYTES)));
    }
}

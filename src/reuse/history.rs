//! The guard a handle carries: the bytes of the turn's history (chat: its
//! `messages` without the closing bracket; completions: its prompt string
//! without the closing quote), as a length and a hash. A next turn whose
//! history begins with those bytes extends that conversation; one whose
//! history was edited, cut or replaced does not.

use crate::api::Api;
use crate::body::Members;
use crate::fleet::fnv1a;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History {
    pub len: usize,
    pub hash: u64,
}

/// The history bytes of a request (`None`: the path has no history the
/// router can compare, or the body lacks it).
fn bytes<'a>(api: Api, body: &'a [u8], top: &Members) -> Option<&'a [u8]> {
    let (member, close) = match api {
        Api::ChatCompletions => ("messages", b']'),
        Api::Completions => ("prompt", b'"'),
        _ => return None,
    };
    let raw = top.raw_non_null(body, member)?;
    let open = if close == b']' { b'[' } else { b'"' };
    if raw.first() != Some(&open) || raw.last() != Some(&close) || raw.len() < 2 {
        return None;
    }
    raw.get(..raw.len() - 1)
}

impl History {
    /// The guard for a turn's request.
    pub fn of(api: Api, body: &[u8], top: &Members) -> Option<History> {
        let b = bytes(api, body, top)?;
        Some(History {
            len: b.len(),
            hash: fnv1a(b),
        })
    }

    /// Whether the request's history begins with this turn's and goes on:
    /// for chat, with at least one more message.
    pub fn extended_by(&self, api: Api, body: &[u8], top: &Members) -> bool {
        let Some(b) = bytes(api, body, top) else {
            return false;
        };
        let Some(head) = b.get(..self.len) else {
            return false;
        };
        if b.len() <= self.len || fnv1a(head) != self.hash {
            return false;
        }
        match api {
            Api::ChatCompletions => {
                b.get(self.len..)
                    .and_then(|rest| rest.iter().find(|c| !c.is_ascii_whitespace()))
                    == Some(&b',')
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(api: Api, body: &str) -> Option<History> {
        let top = Members::parse(body.as_bytes()).ok()?;
        History::of(api, body.as_bytes(), &top)
    }

    fn extends(h: History, api: Api, body: &str) -> bool {
        let top = Members::parse(body.as_bytes()).expect("object");
        h.extended_by(api, body.as_bytes(), &top)
    }

    #[test]
    fn a_next_turn_extends_the_history_and_an_edited_one_does_not() {
        let chat = Api::ChatCompletions;
        let h = guard(
            chat,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .expect("history");
        let next = r#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"and?"}],"max_tokens":9}"#;
        assert!(extends(h, chat, next));
        let edited = r#"{"model":"m","messages":[{"role":"user","content":"hey"},{"role":"assistant","content":"yo"}]}"#;
        assert!(!extends(h, chat, edited));
        let same = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        assert!(!extends(h, chat, same), "nothing new");
        let spaced = r#"{"model":"m","messages":[{"role":"user","content":"hi"} ]}"#;
        assert!(!extends(h, chat, spaced), "nothing new, only a space");
        assert!(!extends(h, Api::Completions, next), "another path");
    }

    #[test]
    fn completions_compare_the_prompt_text() {
        let c = Api::Completions;
        let h = guard(c, r#"{"prompt":"Once upon"}"#).expect("history");
        assert!(extends(h, c, r#"{"prompt":"Once upon a time"}"#));
        assert!(!extends(h, c, r#"{"prompt":"Twice upon a time"}"#));
        assert_eq!(guard(c, r#"{"prompt":[1,2]}"#), None, "token ids: no guard");
        assert_eq!(guard(Api::Responses, r#"{"input":"x"}"#), None);
    }
}

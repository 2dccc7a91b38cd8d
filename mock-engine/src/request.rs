//! A POST body seen as its top-level members, each kept as the exact bytes the
//! router sent, so checks can be byte-exact and numbers are never rounded.

use std::fmt;

use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::{Checked, Fail};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
    /// `/v1/responses` (vLLM's Responses API).
    Responses,
}

pub struct Request<'a> {
    pub api: Api,
    fields: Vec<(String, &'a RawValue)>,
}

/// Top-level members in order. Duplicate keys are rejected: real engines keep
/// the last one silently, but a duplicate here means the router appended a
/// field instead of replacing it, which is a bug worth failing a test on.
struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out: Vec<(String, &'de RawValue)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    if out.iter().any(|(seen, _)| *seen == k) {
                        return Err(A::Error::custom(format!("duplicate top-level key {k:?}")));
                    }
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Request<'a> {
    pub fn parse(api: Api, body: &'a [u8]) -> Checked<Self> {
        let fields: Fields<'a> = serde_json::from_slice(body)
            .map_err(|e| Fail::contract(format!("body is not a valid JSON object: {e}")))?;
        // A JSON null means "not given" to the real engines (pydantic
        // Optional fields), so it is treated exactly like an absent member.
        let fields = fields
            .0
            .into_iter()
            .filter(|(_, v)| v.get().trim() != "null")
            .collect();
        Ok(Request { api, fields })
    }

    pub fn raw(&self, name: &str) -> Option<&'a RawValue> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }

    pub fn has(&self, name: &str) -> bool {
        self.raw(name).is_some()
    }

    /// The member as a `Value`. Without arbitrary_precision serde_json keeps
    /// integers as u64/i64 (never f64), so ids compare exactly.
    pub fn value(&self, name: &str) -> Checked<Option<Value>> {
        self.raw(name)
            .map(|raw| {
                serde_json::from_str(raw.get())
                    .map_err(|e| Fail::contract(format!("`{name}` could not be read: {e}")))
            })
            .transpose()
    }

    /// A non-negative integer member; `None` when absent.
    pub fn u64_field(&self, name: &str) -> Checked<Option<u64>> {
        match self.value(name)? {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                Fail::contract(format!(
                    "`{name}` must be a non-negative integer, got {}",
                    short(&v)
                ))
            }),
        }
    }

    pub fn bool_field(&self, name: &str) -> Checked<Option<bool>> {
        match self.value(name)? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(Fail::contract(format!(
                "`{name}` must be a boolean, got {}",
                short(&v)
            ))),
        }
    }

    /// A string member; `None` when absent.
    pub fn str_field(&self, name: &str) -> Checked<Option<String>> {
        match self.value(name)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(Fail::contract(format!(
                "`{name}` must be a string, got {}",
                short(&v)
            ))),
        }
    }

    /// Completions: the raw `prompt`. Chat: raw `messages` then raw `tools`.
    /// Responses: raw `input`, then raw `instructions` and `tools`.
    /// Any re-serialisation by the router changes these bytes, just as it
    /// would defeat a real engine's prefix cache.
    pub fn prompt_key(&self) -> Checked<Vec<u8>> {
        match self.api {
            Api::Completions => self
                .raw("prompt")
                .map(|p| p.get().as_bytes().to_vec())
                .ok_or_else(|| Fail::contract("completions request has no `prompt`")),
            Api::Chat => {
                let messages = self
                    .raw("messages")
                    .ok_or_else(|| Fail::contract("chat request has no `messages`"))?;
                let mut key = messages.get().as_bytes().to_vec();
                if let Some(tools) = self.raw("tools") {
                    key.extend_from_slice(tools.get().as_bytes());
                }
                Ok(key)
            }
            Api::Responses => {
                let input = self
                    .raw("input")
                    .ok_or_else(|| Fail::contract("responses request has no `input`"))?;
                let mut key = input.get().as_bytes().to_vec();
                for extra in ["instructions", "tools"] {
                    if let Some(raw) = self.raw(extra) {
                        key.extend_from_slice(raw.get().as_bytes());
                    }
                }
                Ok(key)
            }
        }
    }
}

/// 64-bit FNV-1a: stable across runs and platforms, which is all the mock
/// needs for the short inputs it hashes (logprob positions).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The digest two legs compare to show they saw the same prompt. XXH3, not
/// `fnv1a`: it runs over whole prompts, and at 512 KB FNV-1a's byte loop
/// made the mocks, not the router, bind the bench's request rate.
pub fn prompt_hash(key: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(key))
}

/// Deterministic stand-in for tokenisation (TRT-LLM): 4-byte little-endian
/// words, last one zero-padded, folded into a Qwen-sized vocabulary.
pub fn token_ids(key: &[u8]) -> Vec<u64> {
    key.chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u64::from(u32::from_le_bytes(w)) % 151_936
        })
        .collect()
}

/// Rough prompt length for usage accounting (4 bytes per "token").
pub fn approx_tokens(key: &[u8]) -> u64 {
    key.len().div_ceil(4) as u64
}

/// A value shortened for error messages, so a huge prompt cannot flood logs.
pub fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 120 {
        s
    } else {
        let mut end = 117;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    }
}

/// Parses a JSON array of non-negative integers exactly.
pub fn u64_array(v: &Value) -> Option<Vec<u64>> {
    v.as_array()?.iter().map(Value::as_u64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_raw_bytes_and_big_ints() {
        let body = br#"{"prompt" : [1, 2,3], "id": 18446744073709551615}"#;
        let r = Request::parse(Api::Completions, body).expect("parses");
        assert_eq!(r.prompt_key().expect("key"), b"[1, 2,3]".to_vec());
        assert_eq!(r.u64_field("id").expect("int"), Some(u64::MAX));
    }

    #[test]
    fn chat_key_is_messages_then_tools() {
        let body = br#"{"tools":[{"a":1}],"messages":[{"role":"user","content":"hi"}]}"#;
        let r = Request::parse(Api::Chat, body).expect("parses");
        assert_eq!(
            r.prompt_key().expect("key"),
            br#"[{"role":"user","content":"hi"}][{"a":1}]"#.to_vec()
        );
    }

    #[test]
    fn responses_key_is_input_then_instructions_and_tools() {
        let body = br#"{"tools":[1],"input":"hi","instructions":"be brief"}"#;
        let r = Request::parse(Api::Responses, body).expect("parses");
        assert_eq!(
            r.prompt_key().expect("key"),
            br#""hi""be brief"[1]"#.to_vec()
        );
        let r = Request::parse(Api::Responses, br#"{"model":"m"}"#).expect("parses");
        assert!(r.prompt_key().is_err());
        let r = Request::parse(Api::Responses, br#"{"request_id":7}"#).expect("parses");
        assert!(r.str_field("request_id").is_err());
    }

    #[test]
    fn null_is_absent() {
        let r = Request::parse(Api::Completions, br#"{"stream": null}"#).expect("parses");
        assert!(!r.has("stream"));
    }

    #[test]
    fn rejects_duplicates_and_non_objects() {
        assert!(Request::parse(Api::Completions, br#"{"a":1,"a":2}"#).is_err());
        assert!(Request::parse(Api::Completions, b"[1]").is_err());
        assert!(Request::parse(Api::Completions, b"{").is_err());
    }

    #[test]
    fn token_ids_are_le_words() {
        assert_eq!(token_ids(b"abcde"), vec![0x6463_6261 % 151_936, 0x65]);
    }
}

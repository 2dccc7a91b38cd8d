//! A POST body seen as its top-level members, each kept as the exact bytes the
//! router sent, so checks can be byte-exact and numbers are never rounded.

use std::fmt;
use std::sync::Mutex;

use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::{Checked, Fail};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
    /// `/v1/responses` (vLLM's Responses API).
    Responses,
    /// `/v1/messages` (Anthropic's Messages API, served by vLLM and SGLang).
    Messages,
    /// `/inference/v1/generate` (vLLM's token-in API).
    Generate,
}

pub struct Request<'a> {
    pub api: Api,
    fields: Vec<(String, Raw<'a>)>,
    /// The top-level `prompt_token_ids`, when [`cut_ids`] read them before
    /// serde_json read the rest; taken once by [`Request::take_token_ids`].
    token_ids: Mutex<Option<Vec<u64>>>,
}

/// A member's JSON text exactly as the body holds it.
#[derive(Clone, Copy, Debug)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    pub fn get(&self) -> &'a str {
        self.0
    }
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
        if let Some(req) = cut_ids(api, body) {
            return Ok(req);
        }
        let fields: Fields<'a> = serde_json::from_slice(body)
            .map_err(|e| Fail::contract(format!("body is not a valid JSON object: {e}")))?;
        let fields = fields.0.into_iter().map(|(k, v)| (k, Raw(v.get())));
        Ok(Request::of_fields(api, fields, None))
    }

    fn of_fields(
        api: Api,
        fields: impl Iterator<Item = (String, Raw<'a>)>,
        token_ids: Option<Vec<u64>>,
    ) -> Self {
        // A JSON null means "not given" to the real engines (pydantic
        // Optional fields), so it is treated exactly like an absent member.
        let fields = fields.filter(|(_, v)| v.get().trim() != "null").collect();
        Request {
            api,
            fields,
            token_ids: Mutex::new(token_ids),
        }
    }

    pub fn raw(&self, name: &str) -> Option<Raw<'a>> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }

    /// The top-level `prompt_token_ids` if the parse already read them
    /// (a plain integer array); `None` otherwise, or once taken.
    pub fn take_token_ids(&self) -> Option<Vec<u64>> {
        // A poisoned lock only means a panicking reader: the ids are
        // read again from the member's text.
        self.token_ids.lock().ok()?.take()
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
    /// Messages: raw `system`, `messages`, `tools`. Generate: raw
    /// `token_ids`. Any re-serialisation by the router changes these bytes,
    /// just as it would defeat a real engine's prefix cache.
    pub fn prompt_key(&self) -> Checked<Vec<u8>> {
        let (what, required, before, after): (_, _, &[&str], &[&str]) = match self.api {
            Api::Completions => ("completions", "prompt", &[], &[]),
            Api::Chat => ("chat", "messages", &[], &["tools"]),
            Api::Responses => ("responses", "input", &[], &["instructions", "tools"]),
            Api::Messages => ("messages", "messages", &["system"], &["tools"]),
            Api::Generate => ("generate", "token_ids", &[], &[]),
        };
        let main = self
            .raw(required)
            .ok_or_else(|| Fail::contract(format!("{what} request has no `{required}`")))?;
        let mut key = Vec::with_capacity(main.get().len());
        let mut add = |names: &[&str]| {
            for raw in names.iter().filter_map(|n| self.raw(n)) {
                key.extend_from_slice(raw.get().as_bytes());
            }
        };
        add(before);
        add(&[required]);
        add(after);
        Ok(key)
    }

    /// The token-in API's `sampling_params` (required there, an object).
    pub fn sampling_params(&self) -> Checked<Map<String, Value>> {
        match self.value("sampling_params")? {
            Some(Value::Object(o)) => Ok(o),
            Some(v) => Err(Fail::contract(format!(
                "`sampling_params` must be an object, got {}",
                short(&v)
            ))),
            None => Err(Fail::contract("generate request has no `sampling_params`")),
        }
    }

    /// The `model` the body names, when it is a string.
    pub fn model(&self) -> Option<String> {
        self.str_field("model").ok().flatten()
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
            for (word, byte) in w.iter_mut().zip(c) {
                *word = *byte;
            }
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

const TOKEN_IDS: &[u8] = br#""prompt_token_ids":["#;

/// A TensorRT-LLM generation request whose `prompt_token_ids` is a plain
/// integer array, read without serde_json walking the array: cut out, read
/// by [`compact_ids`], the rest of the body parsed by serde_json with `[]`
/// in its place and every member's text mapped back to the body. For the
/// bench's 131 000 ids, serde_json's walk over them to find the member's
/// end was a fifth of the load core. `None` (the whole body then goes to
/// serde_json, which decides and words any error) unless the key appears
/// once, its array is compact and the rest parses with the key at the top.
fn cut_ids(api: Api, body: &[u8]) -> Option<Request<'_>> {
    let at = find(body, TOKEN_IDS)?;
    if find(body.get(at + 1..)?, TOKEN_IDS).is_some() {
        return None;
    }
    let open = at + TOKEN_IDS.len() - 1;
    let close = open + body.get(open..)?.iter().position(|b| *b == b']')?;
    let ids = compact_ids(body.get(open..=close)?)?;
    let cut = close - open - 1;
    let mut rest = Vec::with_capacity(body.len() - cut);
    rest.extend_from_slice(body.get(..=open)?);
    rest.extend_from_slice(body.get(close..)?);
    let fields: Fields<'_> = serde_json::from_slice(&rest).ok()?;
    // A position in `rest` is the same in the body up to the `[`, and `cut`
    // bytes later after it.
    let base = rest.as_ptr() as usize;
    let back = |p: usize| if p <= open { p } else { p + cut };
    let mut out = Vec::with_capacity(fields.0.len());
    let mut at_top = false;
    for (k, v) in fields.0 {
        let start = v.get().as_ptr() as usize - base;
        let (start, end) = (back(start), back(start + v.get().len()));
        if k == "prompt_token_ids" {
            at_top = start == open;
        }
        out.push((k, Raw(std::str::from_utf8(body.get(start..end)?).ok()?)));
    }
    at_top.then(|| Request::of_fields(api, out.into_iter(), Some(ids)))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// `[1,2,3]` as the router relays TensorRT-LLM's answer (no spaces, no
/// leading zeros, at most nine digits each) read by a plain loop: serde_json's
/// number parser was a fifth of the bench's load core at 512 KB. Anything
/// else is `None`, for serde_json to read or reject.
pub fn compact_ids(raw: &[u8]) -> Option<Vec<u64>> {
    let inner = raw.strip_prefix(b"[")?.strip_suffix(b"]")?;
    let mut ids = Vec::with_capacity(inner.len() / 5 + 1);
    if inner.is_empty() {
        return Some(ids);
    }
    for digits in inner.split(|b| *b == b',') {
        let leading_zero = digits.len() > 1 && digits.first() == Some(&b'0');
        if digits.is_empty() || digits.len() > 9 || leading_zero {
            return None;
        }
        let mut id = 0u64;
        for d in digits {
            if !d.is_ascii_digit() {
                return None;
            }
            id = id * 10 + u64::from(d - b'0');
        }
        ids.push(id);
    }
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_ids_read_what_serde_json_reads_or_stand_aside() {
        for ok in ["[]", "[0]", "[1,22,333]", "[151935,0,7]", "[999999999]"] {
            let want: Vec<u64> = serde_json::from_str(ok).unwrap();
            assert_eq!(compact_ids(ok.as_bytes()), Some(want), "{ok}");
        }
        for other in [
            "[1, 2]",
            "[01]",
            "[1,,2]",
            "[1,]",
            "[,1]",
            "[-1]",
            "[1.5]",
            "[1000000000]",
            "1",
            "[1",
        ] {
            assert_eq!(compact_ids(other.as_bytes()), None, "{other}");
        }
    }

    /// Every member and its text, as the parse kept them.
    fn members<'a>(r: &Request<'a>) -> Vec<(String, &'a str)> {
        r.fields.iter().map(|(k, v)| (k.clone(), v.get())).collect()
    }

    #[test]
    fn cutting_the_ids_out_reads_what_serde_json_reads() {
        let cut = [
            r#"{"model":"m","prompt_token_ids":[1,22,333],"max_tokens":4}"#,
            r#"{"prompt_token_ids":[],"x":{"a":[1,2]}}"#,
            r#"{"a":"say \"hi\" ]","prompt_token_ids":[7],"b":null}"#,
            r#" { "messages":[{"role":"user","content":"é ]"}], "prompt_token_ids":[0,5] } "#,
        ];
        for body in cut {
            let fast = cut_ids(Api::Chat, body.as_bytes()).expect(body);
            let fields: Fields<'_> = serde_json::from_str(body).expect(body);
            let slow = Request::of_fields(
                Api::Chat,
                fields.0.into_iter().map(|(k, v)| (k, Raw(v.get()))),
                None,
            );
            assert_eq!(members(&fast), members(&slow), "{body}");
            let want: Vec<u64> =
                serde_json::from_str(slow.raw("prompt_token_ids").expect("ids").get()).unwrap();
            assert_eq!(fast.take_token_ids(), Some(want), "{body}");
            assert_eq!(fast.take_token_ids(), None, "taken once: {body}");
        }
    }

    #[test]
    fn anything_else_is_left_to_serde_json() {
        let left = [
            // Not at the top, twice, not compact, not JSON around it.
            r#"{"x":{"prompt_token_ids":[1,2]}}"#,
            r#"{"prompt_token_ids":[1],"y":{"prompt_token_ids":[2]}}"#,
            r#"{"prompt_token_ids":[1, 2]}"#,
            r#"{"prompt_token_ids":[01]}"#,
            r#"{"prompt_token_ids":[1],}"#,
            r#"{"prompt_token_ids":[1]"#,
            r#"{"a":"x"prompt_token_ids":[1]}"#,
            r#"{"prompt_token_ids":[1],"prompt_token_ids":[1]}"#,
        ];
        for body in left {
            assert!(cut_ids(Api::Chat, body.as_bytes()).is_none(), "{body}");
        }
        // The whole parse still answers as serde_json does.
        assert!(Request::parse(Api::Chat, left[0].as_bytes()).is_ok());
        assert!(Request::parse(Api::Chat, left[4].as_bytes()).is_err());
        assert!(Request::parse(Api::Chat, left[7].as_bytes()).is_err());
    }

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
    fn messages_key_is_system_messages_tools_and_generate_key_the_ids() {
        let body = br#"{"tools":[1],"messages":[{"role":"user","content":"hi"}],"system":"s"}"#;
        let r = Request::parse(Api::Messages, body).expect("parses");
        assert_eq!(
            r.prompt_key().expect("key"),
            br#""s"[{"role":"user","content":"hi"}][1]"#.to_vec()
        );
        let r = Request::parse(Api::Messages, br#"{"system":"s"}"#).expect("parses");
        let e = r.prompt_key().unwrap_err();
        assert_eq!(e.message, "messages request has no `messages`");
        let r = Request::parse(Api::Generate, br#"{"token_ids":[1, 2]}"#).expect("parses");
        assert_eq!(r.prompt_key().expect("key"), b"[1, 2]".to_vec());
        assert_eq!(r.model(), None);
        let r = Request::parse(Api::Generate, br#"{"model":"m"}"#).expect("parses");
        assert_eq!(r.model().as_deref(), Some("m"));
        assert!(r.prompt_key().is_err());
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

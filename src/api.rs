//! The OpenAI-style request shapes pd-router splits, and the few fields it reads.

use crate::body::Members;
use crate::error::ClientError;
use serde_json::value::RawValue;

/// An endpoint whose requests are split into prefill and decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    ChatCompletions,
    /// The Responses API: like chat, with `input` and `max_output_tokens`.
    Responses,
    /// Anthropic's Messages API (`/v1/messages`, served by vLLM and
    /// SGLang): `system` and `messages`, a required `max_tokens`.
    Messages,
    /// vLLM's token-in API (`/inference/v1/generate`, used by llm-d):
    /// `token_ids`, the limits inside `sampling_params`.
    Generate,
}

impl Api {
    /// Every API, for tests and tables.
    pub const ALL: [Api; 5] = [
        Api::Completions,
        Api::ChatCompletions,
        Api::Responses,
        Api::Messages,
        Api::Generate,
    ];

    /// The API served at `path` (the query string is ignored), read through
    /// [`canonical_path`]: a variant of a split path (another case, a
    /// trailing or doubled slash, an escaped slash, a dot segment) is that
    /// path. Engines and proxies disagree on which variants they serve, so
    /// a variant that some engine answers must not slip past the checks of
    /// the path it stands for; the flow sends it on as the canonical path.
    pub fn from_path(path: &str) -> Option<Api> {
        let canonical = canonical_path(path);
        Api::ALL.into_iter().find(|a| a.path() == canonical)
    }

    /// The path this API is served at.
    pub fn path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::ChatCompletions => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
            Api::Generate => "/inference/v1/generate",
        }
    }

    /// The key that caps generated tokens on this API (inside
    /// `sampling_params` for [`Api::Generate`]).
    pub fn max_tokens_key(self) -> &'static str {
        match self {
            Api::Responses => "max_output_tokens",
            _ => "max_tokens",
        }
    }

    /// The object the token limits live in: the body's top level, or for
    /// [`Api::Generate`] its `sampling_params`.
    pub fn limits_member(self) -> Option<&'static str> {
        match self {
            Api::Generate => Some("sampling_params"),
            _ => None,
        }
    }

    /// vLLM reads this API's request id from the body's `request_id`, not
    /// from the `X-Request-Id` header.
    pub fn id_in_body(self) -> bool {
        matches!(self, Api::Responses | Api::Generate)
    }

    /// The members that hold the prompt, in the order the engine reads them.
    pub fn prompt_keys(self) -> &'static [&'static str] {
        match self {
            Api::ChatCompletions => &["messages", "tools"],
            Api::Completions => &["prompt"],
            Api::Responses => &["input"],
            Api::Messages => &["system", "messages", "tools"],
            Api::Generate => &["token_ids"],
        }
    }
}

/// `path` without its query or fragment, with `%XX` escapes decoded, in
/// ASCII lower case, `.` and `..` segments resolved, runs of `/` merged and
/// a trailing `/` dropped: the one spelling the router classifies by.
/// Starlette (vLLM, SGLang) redirects a trailing slash, some proxies decode
/// `%2F` or merge slashes before the engine sees the path, and the router
/// cannot know which of them stand behind it; so every variant counts as
/// the path it may become. Escapes are decoded once: a `%252F` stays
/// `%2F`, which no split path contains.
pub fn canonical_path(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let decoded = percent_decode(path).to_ascii_lowercase();
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// `%XX` escapes decoded (SDKs escape the `/` of `org/model` ids, clients
/// may escape any byte of a path); an invalid escape stays as it is, and
/// bytes that are not UTF-8 become U+FFFD.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (c, hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Keys the router reads or writes on every engine. A duplicate of any of them
/// is rejected: the router and the engine could each honour a different copy.
pub const CONTROLLED_KEYS: [&str; 16] = [
    "model",
    "system",
    "tools",
    "token_ids",
    "sampling_params",
    "stream",
    "stream_options",
    "n",
    "prompt",
    "messages",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "min_tokens",
    "min_completion_tokens",
];

/// The largest `n` accepted (OpenAI's limit). SGLang's hand-off makes one
/// bootstrap room per sequence on both legs, so an unbounded `n` would let a
/// few bytes of request grow both bodies without limit (found by fuzzing).
pub const MAX_N: u64 = 128;

/// What the router needs to know about a client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFields {
    pub api: Api,
    /// Empty only on [`Api::Generate`], where `model` is optional.
    pub model: String,
    pub stream: bool,
    pub n: u64,
    /// Completions with an array of prompts: how many.
    pub prompt_batch: Option<usize>,
    pub include_usage: bool,
}

impl ClientFields {
    /// How many sequences one request asks for, where engines track them
    /// separately (SGLang's bootstrap rooms): a prompt batch, or chat `n`.
    pub fn batch_size(&self) -> Option<usize> {
        match self.api {
            Api::Completions => self.prompt_batch,
            Api::ChatCompletions | Api::Responses if self.n > 1 => Some(self.n as usize),
            _ => None,
        }
    }
}

fn bad(field: &str, what: &str) -> ClientError {
    ClientError::BadField {
        field: field.to_owned(),
        message: what.to_owned(),
    }
}

/// Limits read inside `sampling_params` ([`Api::Generate`]).
const SAMPLING_KEYS: [&str; 3] = ["max_tokens", "min_tokens", "n"];

/// [`Api::Generate`]'s `sampling_params`, parsed, with its `n`; a limit the
/// router writes there must not be there twice or mistyped.
fn sampling_params(body: &[u8], top: &Members) -> Result<u64, ClientError> {
    let Some(raw) = top.raw_non_null(body, "sampling_params") else {
        return Ok(1);
    };
    let field = |k: &str| format!("sampling_params.{k}");
    let inner = Members::parse(raw).map_err(|_| bad("sampling_params", "must be an object"))?;
    if let Some(dup) = inner.first_duplicate(&SAMPLING_KEYS) {
        return Err(ClientError::DuplicateKey(field(dup)));
    }
    for key in ["max_tokens", "min_tokens"] {
        if let Some(v) = inner.raw_non_null(raw, key) {
            serde_json::from_slice::<u64>(v)
                .map_err(|_| bad(&field(key), "must be a non-negative integer"))?;
        }
    }
    match inner.raw_non_null(raw, "n") {
        None => Ok(1),
        Some(v) => match serde_json::from_slice::<u64>(v) {
            Ok(n) if (1..=MAX_N).contains(&n) => Ok(n),
            _ => Err(bad(
                &field("n"),
                &format!("must be an integer from 1 to {MAX_N}"),
            )),
        },
    }
}

/// Reads and type-checks the fields the router relies on. Only top-level
/// values are parsed; `messages` and `prompt` are looked at, never rebuilt.
pub fn read_fields(api: Api, body: &[u8], top: &Members) -> Result<ClientFields, ClientError> {
    if let Some(dup) = top.first_duplicate(&CONTROLLED_KEYS) {
        return Err(ClientError::DuplicateKey(dup.to_owned()));
    }
    let model = match top.raw_non_null(body, "model") {
        // vLLM's generate API serves its one model without a name; the
        // gateway picks the model when it serves only one.
        None if api == Api::Generate => String::new(),
        None => return Err(bad("model", "is required")),
        Some(raw) => match serde_json::from_slice::<String>(raw) {
            Ok(m) if !m.is_empty() => m,
            Ok(_) => return Err(bad("model", "must not be empty")),
            Err(_) => return Err(bad("model", "must be a string")),
        },
    };
    let stream = match top.raw_non_null(body, "stream") {
        None => false,
        Some(raw) => {
            serde_json::from_slice::<bool>(raw).map_err(|_| bad("stream", "must be a boolean"))?
        }
    };
    let sampled_n = match api {
        Api::Generate => Some(sampling_params(body, top)?),
        _ => None,
    };
    let n = match top.raw_non_null(body, "n") {
        None => sampled_n.unwrap_or(1),
        Some(raw) => match serde_json::from_slice::<u64>(raw) {
            Ok(n) if (1..=MAX_N).contains(&n) => n,
            _ => return Err(bad("n", &format!("must be an integer from 1 to {MAX_N}"))),
        },
    };
    for key in [
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "min_tokens",
        "min_completion_tokens",
    ] {
        if let Some(raw) = top.raw_non_null(body, key) {
            serde_json::from_slice::<u64>(raw)
                .map_err(|_| bad(key, "must be a non-negative integer"))?;
        }
    }
    let include_usage = match top.raw_non_null(body, "stream_options") {
        None => false,
        Some(raw) => {
            #[derive(serde::Deserialize)]
            struct StreamOptions {
                #[serde(default)]
                include_usage: Option<bool>,
            }
            serde_json::from_slice::<StreamOptions>(raw)
                .map_err(|_| bad("stream_options", "must be an object"))?
                .include_usage
                .unwrap_or(false)
        }
    };
    let prompt_batch = check_prompt(api, body, top)?;
    Ok(ClientFields {
        api,
        model,
        stream,
        n,
        prompt_batch,
        include_usage,
    })
}

/// The API's prompt members are there and of the right kind; for a
/// completions batch, how many prompts.
fn check_prompt(api: Api, body: &[u8], top: &Members) -> Result<Option<usize>, ClientError> {
    match api {
        Api::Completions => {
            let raw = top
                .raw_non_null(body, "prompt")
                .ok_or_else(|| bad("prompt", "is required"))?;
            return prompt_batch_size(raw);
        }
        Api::ChatCompletions => {
            let raw = top
                .raw_non_null(body, "messages")
                .ok_or_else(|| bad("messages", "is required"))?;
            if raw.first() != Some(&b'[') {
                return Err(bad("messages", "must be an array"));
            }
        }
        Api::Responses => {
            let raw = top
                .raw_non_null(body, "input")
                .ok_or_else(|| bad("input", "is required"))?;
            if !matches!(raw.first(), Some(b'[') | Some(b'"')) {
                return Err(bad("input", "must be a string or an array"));
            }
        }
        Api::Messages => {
            let raw = top
                .raw_non_null(body, "messages")
                .ok_or_else(|| bad("messages", "is required"))?;
            if raw.first() != Some(&b'[') {
                return Err(bad("messages", "must be an array"));
            }
            // The prefill leg caps it at 1; a decode leg without the
            // client's own would be refused after the prefill ran.
            if top.raw_non_null(body, "max_tokens").is_none() {
                return Err(bad("max_tokens", "is required"));
            }
        }
        Api::Generate => {
            let raw = top
                .raw_non_null(body, "token_ids")
                .ok_or_else(|| bad("token_ids", "is required"))?;
            let ids: Vec<u64> = serde_json::from_slice(raw)
                .map_err(|_| bad("token_ids", "must be an array of token ids"))?;
            if ids.is_empty() {
                return Err(bad("token_ids", "must not be empty"));
            }
        }
    }
    Ok(None)
}

/// `prompt` is a string, a list of token ids (one prompt), or a list of
/// strings or of token lists (a batch).
fn prompt_batch_size(raw: &[u8]) -> Result<Option<usize>, ClientError> {
    match raw.first() {
        Some(b'"') => Ok(None),
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_slice(raw)
                .map_err(|_| bad("prompt", "must be a string or an array"))?;
            let Some(first) = items.first() else {
                return Err(bad("prompt", "must not be empty"));
            };
            let is_batch = |v: &RawValue| matches!(v.get().as_bytes().first(), Some(b'"' | b'['));
            let is_token = |v: &RawValue| serde_json::from_str::<u64>(v.get()).is_ok();
            if is_batch(first) {
                if items.iter().all(|v| is_batch(v)) {
                    Ok(Some(items.len()))
                } else {
                    Err(bad("prompt", "mixes prompts and token ids"))
                }
            } else if items.iter().all(|v| is_token(v)) {
                Ok(None)
            } else {
                Err(bad(
                    "prompt",
                    "must be a string, an array of strings, or an array of token ids",
                ))
            }
        }
        _ => Err(bad("prompt", "must be a string or an array")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(api: Api, body: &str) -> Result<ClientFields, ClientError> {
        let top = Members::parse(body.as_bytes()).expect("json");
        read_fields(api, body.as_bytes(), &top)
    }

    #[test]
    fn variants_of_a_split_path_are_that_path() {
        for api in Api::ALL {
            let p = api.path();
            let upper = p.to_ascii_uppercase();
            let doubled = p.replacen('/', "//", 2);
            let escaped = p.replace('/', "%2F");
            let variants = [
                p.to_owned(),
                format!("{p}/"),
                format!("/{p}"),
                doubled,
                upper,
                format!("{p}%2F"),
                format!("{p}%2f?stream=1"),
                escaped,
                format!("{p}/."),
                format!("{p}/x/.."),
                format!("/x/..{p}"),
                p.replace('/', "\\"),
                format!("{p}//#frag"),
                p.replacen('v', "%76", 1),
            ];
            for v in &variants {
                assert_eq!(Api::from_path(v), Some(api), "{v}");
            }
            for other in [format!("{p}x"), format!("{p}/x"), format!("{p}%252F")] {
                assert_eq!(Api::from_path(&other), None, "{other}");
            }
        }
        assert_eq!(canonical_path("/"), "/");
        assert_eq!(canonical_path(""), "/");
        assert_eq!(canonical_path("/../.."), "/");
        assert_eq!(canonical_path("/A//b/?q=/C"), "/a/b");
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
    }

    #[test]
    fn paths_map_to_apis() {
        assert_eq!(Api::from_path("/v1/completions"), Some(Api::Completions));
        assert_eq!(
            Api::from_path("/v1/chat/completions?x=1"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(Api::from_path("/v1/responses"), Some(Api::Responses));
        assert_eq!(Api::from_path("/v1/models"), None);
        assert_eq!(Api::from_path("/v1/completions/x"), None);
    }

    #[test]
    fn reads_the_fields_it_needs() {
        let f = fields(
            Api::ChatCompletions,
            r#"{"model":"m","messages":[],"stream":true,"n":3,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(f.model, "m");
        assert!(f.stream && f.include_usage);
        assert_eq!(f.n, 3);
        assert_eq!(f.batch_size(), Some(3));
        let f = fields(
            Api::Completions,
            r#"{"model":"m","prompt":"p","stream":null,"n":null}"#,
        )
        .unwrap();
        assert!(!f.stream);
        assert_eq!(f.batch_size(), None);
    }

    #[test]
    fn prompt_shapes() {
        let batch = |p: &str| {
            fields(
                Api::Completions,
                &format!(r#"{{"model":"m","prompt":{p}}}"#),
            )
        };
        assert_eq!(batch(r#""x""#).unwrap().prompt_batch, None);
        assert_eq!(batch("[1,2,3]").unwrap().prompt_batch, None);
        assert_eq!(batch(r#"["a","b"]"#).unwrap().prompt_batch, Some(2));
        assert_eq!(batch("[[1],[2],[3]]").unwrap().prompt_batch, Some(3));
        assert!(batch("[]").is_err());
        assert!(batch(r#"["a",1]"#).is_err());
        assert!(batch("[1.5]").is_err());
        assert!(batch("7").is_err());
    }

    #[test]
    fn wrong_types_are_client_errors() {
        let cases = [
            (Api::Completions, r#"{"prompt":"p"}"#, "model"),
            (Api::Completions, r#"{"model":7,"prompt":"p"}"#, "model"),
            (Api::Completions, r#"{"model":"","prompt":"p"}"#, "model"),
            (
                Api::Completions,
                r#"{"model":"m","prompt":"p","stream":"yes"}"#,
                "stream",
            ),
            (Api::Completions, r#"{"model":"m","prompt":"p","n":0}"#, "n"),
            (
                Api::Completions,
                r#"{"model":"m","prompt":"p","n":-1}"#,
                "n",
            ),
            (
                Api::Completions,
                r#"{"model":"m","prompt":"p","max_tokens":"5"}"#,
                "max_tokens",
            ),
            (
                Api::Completions,
                r#"{"model":"m","prompt":"p","stream_options":1}"#,
                "stream_options",
            ),
            (Api::Completions, r#"{"model":"m"}"#, "prompt"),
            (
                Api::ChatCompletions,
                r#"{"model":"m","messages":"hi"}"#,
                "messages",
            ),
            (Api::ChatCompletions, r#"{"model":"m"}"#, "messages"),
            (Api::Responses, r#"{"model":"m","input":5}"#, "input"),
        ];
        for (api, body, field) in cases {
            match fields(api, body) {
                Err(ClientError::BadField { field: f, .. }) => assert_eq!(f, field, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    #[test]
    fn messages_and_generate_fields() {
        let f = fields(
            Api::Messages,
            r#"{"model":"m","system":"s","messages":[],"max_tokens":9,"stream":true}"#,
        )
        .unwrap();
        assert!(f.stream && !f.include_usage);
        assert_eq!(f.batch_size(), None);
        let f = fields(
            Api::Generate,
            r#"{"token_ids":[1,2],"sampling_params":{"n":3,"max_tokens":5}}"#,
        )
        .unwrap();
        assert_eq!((f.model.as_str(), f.n), ("", 3), "model is optional here");
        let cases = [
            (
                Api::Messages,
                r#"{"model":"m","messages":[]}"#,
                "max_tokens",
            ),
            (Api::Messages, r#"{"model":"m","max_tokens":1}"#, "messages"),
            (Api::Generate, r#"{"model":"m"}"#, "token_ids"),
            (Api::Generate, r#"{"token_ids":[]}"#, "token_ids"),
            (Api::Generate, r#"{"token_ids":["a"]}"#, "token_ids"),
            (
                Api::Generate,
                r#"{"token_ids":[1],"sampling_params":[1]}"#,
                "sampling_params",
            ),
            (
                Api::Generate,
                r#"{"token_ids":[1],"sampling_params":{"min_tokens":-1}}"#,
                "sampling_params.min_tokens",
            ),
            (
                Api::Generate,
                r#"{"token_ids":[1],"sampling_params":{"n":0}}"#,
                "sampling_params.n",
            ),
        ];
        for (api, body, field) in cases {
            match fields(api, body) {
                Err(ClientError::BadField { field: f, .. }) => assert_eq!(f, field, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        assert_eq!(
            fields(
                Api::Generate,
                r#"{"token_ids":[1],"sampling_params":{"max_tokens":1,"max_tokens":9}}"#
            ),
            Err(ClientError::DuplicateKey(
                "sampling_params.max_tokens".into()
            ))
        );
        assert_eq!(Api::from_path("/v1/messages"), Some(Api::Messages));
        assert_eq!(
            Api::from_path("/inference/v1/generate"),
            Some(Api::Generate)
        );
    }

    #[test]
    fn duplicated_controlled_keys_are_rejected() {
        let e = fields(
            Api::Completions,
            r#"{"model":"m","prompt":"p","max_tokens":1,"max_tokens":900}"#,
        )
        .unwrap_err();
        assert_eq!(e, ClientError::DuplicateKey("max_tokens".into()));
        // A duplicate the router neither reads nor writes is the engine's business.
        assert!(fields(
            Api::Completions,
            r#"{"model":"m","prompt":"p","temperature":1,"temperature":0}"#
        )
        .is_ok());
    }
}

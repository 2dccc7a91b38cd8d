//! The mock's tokeniser and "model": what the prompt and generated tokens
//! are, and the logprobs a pod reports for them. Every number is a
//! deterministic function of (position, token id), so a prefill, a decode
//! and a lone engine given the same request report the same values, and a
//! test can compare a router's merged answer with a single engine's.
//!
//! What a request asks for ([`Asked`]) is read as vLLM 0.33 or SGLang 0.5.23
//! read it: vLLM's `prompt_logprobs` (and the `echo` that turns into it),
//! completions `logprobs`, chat `logprobs`/`top_logprobs`.

use serde_json::{json, Map, Value};

use crate::config::Flavor;
use crate::error::{Checked, Fail};
use crate::request::{fnv1a, short, token_ids, Api, Request};

/// The mock's vocabulary size (Qwen's), as [`token_ids`] folds into.
pub const VOCAB: u64 = 151_936;
/// vLLM's default `max_logprobs`.
pub const MAX_LOGPROBS: u64 = 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub id: u64,
    pub text: String,
}

/// Generated token `k` of a decode: `tok0`, ` tok1`, ... (the separating
/// space belongs to the token, so the pieces concatenate to the text).
pub fn generated(k: u64) -> Token {
    Token {
        id: (100_000 + k) % VOCAB,
        text: if k == 0 {
            "tok0".to_string()
        } else {
            format!(" tok{k}")
        },
    }
}

/// The prefill's one token.
pub fn prefill_token() -> Token {
    Token {
        id: 47,
        text: "P".to_string(),
    }
}

/// The prompt as the mock tokenises it: token `i` is bytes `4i..4i+4` of
/// the prompt key (its id [`token_ids`], the count the usage reports), and
/// its text the characters of the prompt text whose source starts in those
/// bytes. The prompt text is the decoded string of a completions string
/// prompt, else the key itself (chat `messages` + `tools`, token arrays,
/// batches); the token texts concatenate to it. A token may be empty (a
/// closing quote, the middle of an escape), as byte-fallback tokens are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    pub tokens: Vec<Token>,
}

impl Prompt {
    pub fn of(req: &Request<'_>) -> Checked<Prompt> {
        let key = req.prompt_key()?;
        let string_prompt = match (req.api, req.raw("prompt")) {
            (Api::Completions, Some(raw)) => {
                let t = raw.get().trim_start();
                t.starts_with('"')
                    .then(|| decode_json_string(t, raw.get().len() - t.len()))
            }
            _ => None,
        };
        let chars = match string_prompt {
            Some(chars) => chars,
            None => String::from_utf8_lossy(&key)
                .char_indices()
                .collect::<Vec<_>>(),
        };
        Ok(Prompt::from_chars(&key, &chars))
    }

    fn from_chars(key: &[u8], chars: &[(usize, char)]) -> Prompt {
        let ids = token_ids(key);
        let mut texts = vec![String::new(); ids.len()];
        let last = ids.len().saturating_sub(1);
        for (at, c) in chars {
            if let Some(t) = texts.get_mut((at / 4).min(last)) {
                t.push(*c);
            }
        }
        let text = chars.iter().map(|(_, c)| c).collect();
        let tokens = ids
            .into_iter()
            .zip(texts)
            .map(|(id, text)| Token { id, text })
            .collect();
        Prompt { text, tokens }
    }
}

/// The characters of JSON string `s` (which starts with `"`) with the byte
/// offset, plus `base`, where each starts in `s`. A malformed escape (which
/// the body parser would have refused) becomes U+FFFD.
fn decode_json_string(s: &str, base: usize) -> Vec<(usize, char)> {
    let b = s.as_bytes();
    let hex = |at: usize| {
        s.get(at..at + 4)
            .and_then(|h| u32::from_str_radix(h, 16).ok())
    };
    let mut out = Vec::new();
    let mut i = 1;
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => break,
            b'\\' => {
                let (ch, len) = match b.get(i + 1) {
                    Some(b'n') => ('\n', 2),
                    Some(b't') => ('\t', 2),
                    Some(b'r') => ('\r', 2),
                    Some(b'b') => ('\u{8}', 2),
                    Some(b'f') => ('\u{c}', 2),
                    Some(b'u') => match hex(i + 2) {
                        Some(hi @ 0xD800..=0xDBFF) => {
                            let lo = (s.get(i + 6..i + 8) == Some("\\u"))
                                .then(|| hex(i + 8))
                                .flatten()
                                .filter(|lo| (0xDC00..=0xDFFF).contains(lo));
                            match lo {
                                Some(lo) => (
                                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                                        .unwrap_or('\u{FFFD}'),
                                    12,
                                ),
                                None => ('\u{FFFD}', 6),
                            }
                        }
                        Some(u) => (char::from_u32(u).unwrap_or('\u{FFFD}'), 6),
                        None => ('\u{FFFD}', 2),
                    },
                    Some(&other) => (char::from(other), 2),
                    None => break,
                };
                out.push((base + i, ch));
                i += len;
            }
            _ => {
                let Some(ch) = s.get(i..).and_then(|r| r.chars().next()) else {
                    break;
                };
                out.push((base + i, ch));
                i += ch.len_utf8();
            }
        }
    }
    out
}

/// One candidate of a logprob distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub id: u64,
    pub text: String,
    pub logprob: f64,
    pub rank: u64,
}

fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn mix(position: u64, id: u64) -> u64 {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&position.to_le_bytes());
    b[8..].copy_from_slice(&id.to_le_bytes());
    splitmix(fnv1a(&b))
}

/// The distribution at `position` when the token there is `token`: its
/// rank (1..=3) and the logprob of each rank, `-(base + 0.75 (r-1))` with
/// base in [0.001, 2.999], three decimals.
struct Dist {
    h: u64,
    rank: u64,
}

impl Dist {
    fn at(position: u64, token: &Token) -> Dist {
        let h = mix(position, token.id);
        Dist { h, rank: 1 + h % 3 }
    }

    fn logprob(&self, rank: u64) -> f64 {
        let milli = 1 + (self.h >> 8) % 2999 + 750 * rank.saturating_sub(1);
        -(milli as f64) / 1000.0
    }

    /// The candidate of `rank`: the token itself at its own rank, else a
    /// stand-in `<tID>`, distinct for every rank.
    fn candidate(&self, token: &Token, rank: u64) -> Candidate {
        if rank == self.rank {
            return Candidate {
                id: token.id,
                text: token.text.clone(),
                logprob: self.logprob(rank),
                rank,
            };
        }
        let mut id = ((self.h >> 24) + rank * 7919) % VOCAB;
        if id == token.id {
            id = (id + 1) % VOCAB;
        }
        Candidate {
            id,
            text: format!("<t{id}>"),
            logprob: self.logprob(rank),
            rank,
        }
    }
}

/// The logprob of `token` at `position`.
pub fn logprob(position: u64, token: &Token) -> f64 {
    let d = Dist::at(position, token);
    d.logprob(d.rank)
}

/// vLLM's dict for one position (`_make_logprob_dict`): the token itself
/// first, with its rank, then the top `k` by rank, the token not repeated:
/// `k` entries when the token is among the top `k`, else `k + 1`.
pub fn vllm_dict(position: u64, token: &Token, k: u64) -> Vec<Candidate> {
    let d = Dist::at(position, token);
    let mut out = vec![d.candidate(token, d.rank)];
    out.extend(
        (1..=k)
            .filter(|r| *r != d.rank)
            .map(|r| d.candidate(token, r)),
    );
    out
}

/// SGLang's top `k` for one position, by rank.
pub fn top_k(position: u64, token: &Token, k: u64) -> Vec<Candidate> {
    let d = Dist::at(position, token);
    (1..=k).map(|r| d.candidate(token, r)).collect()
}

/// vLLM's `prompt_logprobs`: one entry per prompt token, the first null,
/// each `{"<id>": {"logprob", "rank", "decoded_token"}}` with up to k+1
/// entries.
pub fn vllm_prompt_logprobs(prompt: &Prompt, k: u64) -> Value {
    let entries = prompt.tokens.iter().enumerate().map(|(j, t)| {
        if j == 0 {
            return Value::Null;
        }
        let dict: Map<String, Value> = vllm_dict(j as u64, t, k)
            .into_iter()
            .map(|c| {
                (
                    c.id.to_string(),
                    json!({"logprob": c.logprob, "rank": c.rank, "decoded_token": c.text}),
                )
            })
            .collect();
        Value::Object(dict)
    });
    Value::Array(entries.collect())
}

/// One token of an answer's logprobs arrays.
pub struct Step<'a> {
    pub position: u64,
    pub token: &'a Token,
    /// The first prompt token has no logprob.
    pub first: bool,
}

/// What a completions `logprobs` object is built from.
pub struct LogprobsShape {
    pub flavor: Flavor,
    /// Completions `logprobs` k (vLLM: the top_logprobs dicts keep the
    /// first k+1 entries; SGLang: the top k).
    pub k: u64,
    /// vLLM: the `prompt_logprobs` k the prompt positions were computed
    /// with (it may differ from `k`).
    pub prompt_k: u64,
    pub prompt_len: u64,
}

/// Completions `logprobs`: `{text_offset, token_logprobs, tokens,
/// top_logprobs}` over `steps`. vLLM: offsets are the cumulative code-point
/// lengths of the tokens from `initial_offset`, `top_logprobs` dicts keyed
/// by token text. SGLang: every offset is -1 ("Not supported yet").
pub fn completion_logprobs(
    shape: &LogprobsShape,
    steps: &[Step<'_>],
    initial_offset: u64,
) -> Value {
    let mut text_offset = Vec::with_capacity(steps.len());
    let mut token_logprobs = Vec::with_capacity(steps.len());
    let mut tokens = Vec::with_capacity(steps.len());
    let mut top_logprobs = Vec::with_capacity(steps.len());
    let mut offset = initial_offset;
    for s in steps {
        tokens.push(json!(s.token.text));
        match shape.flavor {
            Flavor::Sglang => text_offset.push(json!(-1)),
            _ => {
                text_offset.push(json!(offset));
                offset += s.token.text.chars().count() as u64;
            }
        }
        if s.first {
            token_logprobs.push(Value::Null);
            top_logprobs.push(Value::Null);
            continue;
        }
        token_logprobs.push(json!(logprob(s.position, s.token)));
        let top: Vec<Candidate> = match shape.flavor {
            Flavor::Sglang => top_k(s.position, s.token, shape.k),
            _ => {
                let k = if s.position < shape.prompt_len {
                    shape.prompt_k
                } else {
                    shape.k
                };
                let mut d = vllm_dict(s.position, s.token, k);
                d.truncate(usize::try_from(shape.k.saturating_add(1)).unwrap_or(usize::MAX));
                d
            }
        };
        let mut dict = Map::new();
        for c in top {
            // A dict keyed by text: a repeated text keeps its first value.
            dict.entry(c.text).or_insert(json!(c.logprob));
        }
        top_logprobs.push(Value::Object(dict));
    }
    json!({
        "text_offset": text_offset,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    })
}

/// One chat `logprobs.content` entry for a generated token: `{token,
/// logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`; vLLM's
/// `top_logprobs` are the first `k` entries of its dict (the token first),
/// SGLang's the top `k`.
pub fn chat_logprob(flavor: Flavor, position: u64, token: &Token, k: u64) -> Value {
    let entry =
        |text: &str, lp: f64| json!({"token": text, "logprob": lp, "bytes": text.as_bytes()});
    let top: Vec<Value> = match flavor {
        Flavor::Sglang => top_k(position, token, k),
        _ => {
            let mut d = vllm_dict(position, token, k);
            d.truncate(usize::try_from(k).unwrap_or(usize::MAX));
            d
        }
    }
    .iter()
    .map(|c| entry(&c.text, c.logprob))
    .collect();
    let mut e = entry(&token.text, logprob(position, token));
    if let Value::Object(m) = &mut e {
        m.insert("top_logprobs".into(), Value::Array(top));
    }
    e
}

/// What a request asks for beyond the tokens, read as its engine reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    /// vLLM's `SamplingParams.prompt_logprobs`: the request's
    /// `prompt_logprobs`, else with `echo` the completions `logprobs` or
    /// the chat `top_logprobs` (default 0). Set, vLLM skips reading the
    /// prefix cache (`skip_reading_prefix_cache`). Never on SGLang.
    pub prompt_logprobs: Option<u64>,
    /// Logprobs of the generated tokens: completions `logprobs` k, chat
    /// `top_logprobs` when `logprobs` is true.
    pub logprobs: Option<u64>,
    /// `echo: true` (completions; chat on vLLM).
    pub echo: bool,
    /// `stream_options.continuous_usage_stats` with `include_usage`.
    pub continuous_usage: bool,
    /// The pod computes the whole prompt itself, whatever its prefix cache
    /// holds: vLLM with prompt logprobs; SGLang completions echo + logprobs
    /// (`logprob_start_len` 0 caps the radix match at 0).
    pub no_prefix_cache: bool,
}

impl Asked {
    pub fn from_request(req: &Request<'_>, flavor: Flavor, stream: bool) -> Checked<Asked> {
        // The Responses, Messages and token-in APIs ask for none of these
        // here (vLLM's Messages converter sets no logprobs).
        if matches!(req.api, Api::Responses | Api::Messages | Api::Generate)
            || flavor == Flavor::Trtllm
        {
            return Ok(Asked::default());
        }
        let continuous_usage = stream && continuous_usage(req)?;
        let echo = req.bool_field("echo")?.unwrap_or(false);
        let mut asked = match (flavor, req.api) {
            (Flavor::Vllm, Api::Completions) => {
                let prompt = vllm_int(req, "prompt_logprobs", stream)?;
                let logprobs = vllm_int(req, "logprobs", false)?;
                Asked {
                    prompt_logprobs: prompt.or(if echo { logprobs } else { None }),
                    logprobs,
                    echo,
                    ..Asked::default()
                }
            }
            (Flavor::Vllm, _) => {
                let prompt = vllm_int(req, "prompt_logprobs", stream)?;
                let wants = req.bool_field("logprobs")?.unwrap_or(false);
                let top = vllm_int(req, "top_logprobs", false)?;
                if top.is_some_and(|k| k > 0) && !wants {
                    return Err(vllm_400(
                        "when using `top_logprobs`, `logprobs` must be set to true.",
                    ));
                }
                let top = top.unwrap_or(0);
                Asked {
                    prompt_logprobs: prompt.or(echo.then_some(top)),
                    logprobs: wants.then_some(top),
                    echo,
                    ..Asked::default()
                }
            }
            (_, Api::Completions) => {
                let logprobs = req.u64_field("logprobs")?;
                Asked {
                    logprobs,
                    echo,
                    no_prefix_cache: echo && logprobs.is_some(),
                    ..Asked::default()
                }
            }
            _ => {
                let wants = req.bool_field("logprobs")?.unwrap_or(false);
                let top = req.u64_field("top_logprobs")?.unwrap_or(0);
                Asked {
                    logprobs: wants.then_some(top),
                    ..Asked::default()
                }
            }
        };
        if flavor == Flavor::Vllm {
            // vLLM's `_validate_logprobs`, sample logprobs first.
            if let Some(k) = asked.logprobs.filter(|k| *k > MAX_LOGPROBS) {
                return Err(vllm_400(format!(
                    "Requested sample logprobs of {k}, which is greater than max allowed: \
                     {MAX_LOGPROBS}"
                )));
            }
            if let Some(k) = asked.prompt_logprobs.filter(|k| *k > MAX_LOGPROBS) {
                return Err(vllm_400(format!(
                    "Requested prompt logprobs of {k}, which is greater than max allowed: \
                     {MAX_LOGPROBS}"
                )));
            }
            asked.no_prefix_cache = asked.prompt_logprobs.is_some();
        }
        asked.continuous_usage = continuous_usage;
        Ok(asked)
    }

    /// vLLM: `skip_reading_prefix_cache`, so a decode ignores a KV hand-off.
    pub fn skips_prefix_cache(&self, flavor: Flavor) -> bool {
        flavor == Flavor::Vllm && self.prompt_logprobs.is_some()
    }

    /// Anything that needs the tokenised prompt.
    pub fn needs_prompt(&self) -> bool {
        self.prompt_logprobs.is_some() || self.logprobs.is_some() || self.echo
    }
}

/// vLLM's 400 for a bad logprobs request (no mock prefix).
fn vllm_400(msg: impl Into<String>) -> Fail {
    Fail::new(axum::http::StatusCode::BAD_REQUEST, "BadRequestError", msg).verbatim()
}

/// A vLLM logprobs count as its validators read it: an integer, `-1` (the
/// whole vocabulary) or >= 0; `prompt_logprobs` > 0 with `stream` is a 400.
fn vllm_int(req: &Request<'_>, field: &str, stream: bool) -> Checked<Option<u64>> {
    let Some(v) = req.value(field)? else {
        return Ok(None);
    };
    let Some(n) = v.as_i64().or_else(|| v.as_u64().map(|_| i64::MAX)) else {
        return Err(vllm_400(format!("`{field}` must be an integer.")));
    };
    if field == "prompt_logprobs" && stream && (n > 0 || n == -1) {
        return Err(vllm_400(
            "`prompt_logprobs` are not available when `stream=True`.",
        ));
    }
    match n {
        -1 => Ok(Some(VOCAB)),
        n if n < 0 => Err(vllm_400(format!(
            "`{field}` must be a positive value or -1."
        ))),
        n => Ok(Some(n as u64)),
    }
}

fn continuous_usage(req: &Request<'_>) -> Checked<bool> {
    let Some(Value::Object(o)) = req.value("stream_options")? else {
        return Ok(false);
    };
    let flag = |name: &str| match o.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(Fail::contract(format!(
            "`stream_options.{name}` must be a boolean, got {}",
            short(v)
        ))),
    };
    Ok(flag("include_usage")? && flag("continuous_usage_stats")?)
}

/// vLLM chat `echo`: the text prepended to each answer, the last message's
/// content when its role is the answer's (`assistant`, or with
/// `add_generation_prompt: false` the last message's own role, so always);
/// a list of parts joins their `text` with newlines.
pub fn chat_echo(req: &Request<'_>) -> Checked<String> {
    let add_generation_prompt = req.bool_field("add_generation_prompt")?.unwrap_or(true);
    let Some(Value::Array(messages)) = req.value("messages")? else {
        return Ok(String::new());
    };
    let Some(last) = messages.last() else {
        return Ok(String::new());
    };
    let role = last.get("role").and_then(Value::as_str);
    if add_generation_prompt && role != Some("assistant") {
        return Ok(String::new());
    }
    Ok(match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(api: Api, body: &'static str) -> Request<'static> {
        Request::parse(api, body.as_bytes()).expect("parses")
    }

    #[test]
    fn string_prompt_tokens_concatenate_to_the_text() {
        let r = req(
            Api::Completions,
            r#"{"prompt":"Il était \u00e0 Paris\n😀\ud83d\ude00"}"#,
        );
        let p = Prompt::of(&r).unwrap();
        assert_eq!(p.text, "Il était à Paris\n😀😀");
        let key = r.prompt_key().unwrap();
        assert_eq!(p.tokens.len() as u64, crate::request::approx_tokens(&key));
        assert_eq!(
            p.tokens.iter().map(|t| t.text.as_str()).collect::<String>(),
            p.text
        );
        assert_eq!(
            p.tokens.iter().map(|t| t.id).collect::<Vec<_>>(),
            token_ids(&key)
        );
        // `"Il ` is the first token, the opening quote holds no text.
        assert_eq!(p.tokens[0].text, "Il ");
    }

    #[test]
    fn other_prompts_are_their_key() {
        let r = req(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":"hé"}]}"#,
        );
        let p = Prompt::of(&r).unwrap();
        assert_eq!(p.text, r#"[{"role":"user","content":"hé"}]"#);
        assert_eq!(
            p.tokens.iter().map(|t| t.text.as_str()).collect::<String>(),
            p.text
        );
        let r = req(Api::Completions, r#"{"prompt":[1,2,3]}"#);
        assert_eq!(Prompt::of(&r).unwrap().text, "[1,2,3]");
    }

    #[test]
    fn bad_escapes_do_not_panic() {
        let chars = decode_json_string(r#""a\ud800b\u12""#, 0);
        let s: String = chars.iter().map(|(_, c)| c).collect();
        assert!(s.starts_with("a\u{FFFD}b"), "{s:?}");
    }

    #[test]
    fn distributions_are_deterministic_and_ranked() {
        let t = generated(3);
        assert_eq!(vllm_dict(9, &t, 5), vllm_dict(9, &t, 5));
        assert_eq!(logprob(9, &t), vllm_dict(9, &t, 5)[0].logprob);
        let top = top_k(9, &t, 5);
        assert_eq!(top.len(), 5);
        for w in top.windows(2) {
            assert!(w[0].logprob > w[1].logprob);
            assert_eq!(w[0].rank + 1, w[1].rank);
        }
        let ids: std::collections::HashSet<u64> = top.iter().map(|c| c.id).collect();
        assert_eq!(ids.len(), 5);
        // The token first, then the top k without it: k or k+1 entries.
        for pos in 0..50 {
            let d = vllm_dict(pos, &t, 2);
            assert_eq!(d[0].id, t.id);
            let rank = d[0].rank;
            assert_eq!(d.len(), if rank <= 2 { 2 } else { 3 });
            assert_eq!(d.iter().filter(|c| c.id == t.id).count(), 1);
        }
    }

    #[test]
    fn prompt_logprobs_shape() {
        let r = req(Api::Completions, r#"{"prompt":"Hello world"}"#);
        let p = Prompt::of(&r).unwrap();
        let v = vllm_prompt_logprobs(&p, 1);
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), p.tokens.len());
        assert_eq!(a[0], Value::Null);
        let e = a[1].as_object().unwrap();
        assert!(e.len() == 1 || e.len() == 2, "{e:?}");
        let own = &e[&p.tokens[1].id.to_string()];
        assert_eq!(own["decoded_token"], json!(p.tokens[1].text));
        assert!(own["rank"].as_u64().unwrap() >= 1);
    }

    #[test]
    fn vllm_offsets_count_code_points() {
        let toks = [
            Token {
                id: 1,
                text: "é🙂".into(),
            },
            Token {
                id: 2,
                text: "ab".into(),
            },
            Token {
                id: 3,
                text: "c".into(),
            },
        ];
        let steps: Vec<Step<'_>> = toks
            .iter()
            .enumerate()
            .map(|(i, t)| Step {
                position: i as u64,
                token: t,
                first: i == 0,
            })
            .collect();
        let shape = LogprobsShape {
            flavor: Flavor::Vllm,
            k: 1,
            prompt_k: 1,
            prompt_len: 2,
        };
        let v = completion_logprobs(&shape, &steps, 0);
        assert_eq!(v["text_offset"], json!([0, 2, 4]));
        assert_eq!(v["token_logprobs"][0], Value::Null);
        assert_eq!(v["top_logprobs"][0], Value::Null);
        assert_eq!(v["tokens"], json!(["é🙂", "ab", "c"]));
        let v = completion_logprobs(&shape, &steps[1..], 7);
        assert_eq!(v["text_offset"], json!([7, 9]));
        let shape = LogprobsShape {
            flavor: Flavor::Sglang,
            ..shape
        };
        let v = completion_logprobs(&shape, &steps, 0);
        assert_eq!(v["text_offset"], json!([-1, -1, -1]));
        assert_eq!(v["top_logprobs"][1].as_object().unwrap().len(), 1);
    }

    fn asked(api: Api, flavor: Flavor, body: &'static str) -> Result<Asked, Fail> {
        let r = req(api, body);
        let stream = r.bool_field("stream").unwrap().unwrap_or(false);
        Asked::from_request(&r, flavor, stream)
    }

    #[test]
    fn what_vllm_reads() {
        let a = asked(Api::Completions, Flavor::Vllm, r#"{"prompt_logprobs":2}"#).unwrap();
        assert_eq!(a.prompt_logprobs, Some(2));
        assert!(a.skips_prefix_cache(Flavor::Vllm) && a.no_prefix_cache);
        let a = asked(
            Api::Completions,
            Flavor::Vllm,
            r#"{"echo":true,"logprobs":0}"#,
        )
        .unwrap();
        assert_eq!((a.prompt_logprobs, a.logprobs), (Some(0), Some(0)));
        let a = asked(
            Api::Completions,
            Flavor::Vllm,
            r#"{"echo":true,"logprobs":3,"prompt_logprobs":1}"#,
        )
        .unwrap();
        assert_eq!((a.prompt_logprobs, a.logprobs), (Some(1), Some(3)));
        let a = asked(Api::Completions, Flavor::Vllm, r#"{"echo":true}"#).unwrap();
        assert_eq!(a.prompt_logprobs, None);
        assert!(!a.skips_prefix_cache(Flavor::Vllm));
        // Chat echo: prompt_logprobs = top_logprobs, whose default is 0.
        let a = asked(Api::Chat, Flavor::Vllm, r#"{"echo":true}"#).unwrap();
        assert_eq!((a.prompt_logprobs, a.logprobs), (Some(0), None));
        let a = asked(
            Api::Chat,
            Flavor::Vllm,
            r#"{"logprobs":true,"top_logprobs":2}"#,
        )
        .unwrap();
        assert_eq!((a.prompt_logprobs, a.logprobs), (None, Some(2)));
        // Streaming: prompt_logprobs 0 is allowed, more is a 400.
        assert!(asked(
            Api::Chat,
            Flavor::Vllm,
            r#"{"stream":true,"prompt_logprobs":0}"#
        )
        .is_ok());
        let a = asked(
            Api::Completions,
            Flavor::Vllm,
            r#"{"stream":true,"echo":true,"logprobs":1,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
        )
        .unwrap();
        assert!(a.continuous_usage && a.skips_prefix_cache(Flavor::Vllm));
        for (api, body, msg) in [
            (
                Api::Chat,
                r#"{"stream":true,"prompt_logprobs":1}"#,
                "`prompt_logprobs` are not available when `stream=True`.",
            ),
            (
                Api::Completions,
                r#"{"stream":true,"prompt_logprobs":-1}"#,
                "`prompt_logprobs` are not available when `stream=True`.",
            ),
            (
                Api::Completions,
                r#"{"prompt_logprobs":-2}"#,
                "`prompt_logprobs` must be a positive value or -1.",
            ),
            (
                Api::Completions,
                r#"{"prompt_logprobs":"1"}"#,
                "`prompt_logprobs` must be an integer.",
            ),
            (
                Api::Completions,
                r#"{"prompt_logprobs":21}"#,
                "Requested prompt logprobs of 21, which is greater than max allowed: 20",
            ),
            (
                Api::Completions,
                r#"{"logprobs":-1}"#,
                "Requested sample logprobs of 151936, which is greater than max allowed: 20",
            ),
            (
                Api::Chat,
                r#"{"top_logprobs":2}"#,
                "when using `top_logprobs`, `logprobs` must be set to true.",
            ),
        ] {
            let e = asked(api, Flavor::Vllm, body).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.kind, "BadRequestError");
            assert!(e.verbatim);
            assert_eq!(e.message, msg, "{body}");
        }
    }

    #[test]
    fn what_sglang_and_trtllm_read() {
        let a = asked(
            Api::Completions,
            Flavor::Sglang,
            r#"{"echo":true,"logprobs":2,"prompt_logprobs":3,"stream":true}"#,
        )
        .unwrap();
        assert_eq!(
            (a.prompt_logprobs, a.logprobs, a.echo),
            (None, Some(2), true)
        );
        assert!(a.no_prefix_cache && !a.skips_prefix_cache(Flavor::Sglang));
        let a = asked(
            Api::Chat,
            Flavor::Sglang,
            r#"{"echo":true,"logprobs":true}"#,
        )
        .unwrap();
        assert_eq!((a.logprobs, a.echo), (Some(0), false));
        let a = asked(
            Api::Completions,
            Flavor::Trtllm,
            r#"{"echo":true,"logprobs":2}"#,
        )
        .unwrap();
        assert_eq!(a, Asked::default());
    }

    #[test]
    fn chat_echo_text() {
        let echo = |b: &'static str| chat_echo(&req(Api::Chat, b)).unwrap();
        assert_eq!(
            echo(
                r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"Once"}]}"#
            ),
            "Once"
        );
        assert_eq!(echo(r#"{"messages":[{"role":"user","content":"q"}]}"#), "");
        assert_eq!(
            echo(
                r#"{"add_generation_prompt":false,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#
            ),
            "a\nb"
        );
    }
}

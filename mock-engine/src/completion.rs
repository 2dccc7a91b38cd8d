//! A chat or completions answer (`/v1/chat/completions`,
//! `/v1/completions`): `n` identical choices of the answer's tokens, as one
//! JSON body or as SSE events, with the usage, echo and logprobs asked for.

use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use crate::config::Flavor;
use crate::logprobs::{self as lp, Token};
use crate::look::Look;
use crate::request::Api;
use crate::usage::{usage, Details};

fn choice(
    api: Api,
    index: u64,
    text: &str,
    finish_reason: &str,
    logprobs: Value,
) -> Map<String, Value> {
    let mut c = Map::new();
    c.insert("index".into(), json!(index));
    match api {
        Api::Completions => {
            c.insert("text".into(), json!(text));
        }
        Api::Chat | Api::Responses | Api::Messages | Api::Generate => {
            c.insert(
                "message".into(),
                json!({"role": "assistant", "content": text}),
            );
        }
    }
    c.insert("finish_reason".into(), json!(finish_reason));
    c.insert("logprobs".into(), logprobs);
    c
}

fn object_name(api: Api, stream: bool) -> &'static str {
    match (api, stream) {
        (Api::Completions, _) => "text_completion",
        (Api::Chat, false) => "chat.completion",
        (Api::Chat, true) => "chat.completion.chunk",
        (Api::Responses, _) => "response",
        // Answered in their own shapes (anthropic.rs, token_in.rs).
        (Api::Messages, _) => "message",
        (Api::Generate, _) => "generate",
    }
}

fn head(id: &str, api: Api, stream: bool, model: &str, created: u64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("id".into(), json!(id));
    m.insert("object".into(), json!(object_name(api, stream)));
    m.insert("created".into(), json!(created));
    m.insert("model".into(), json!(model));
    m
}

/// A chat/completions answer: `n` identical choices of `pieces`, as one
/// JSON body or as SSE events.
pub struct Completion {
    pub api: Api,
    pub id: String,
    pub model: String,
    pub created: u64,
    pub n: u64,
    pub include_usage: bool,
    pub pieces: Vec<Token>,
    /// Of the last token (and so of the answer).
    pub finish_reason: &'static str,
    pub prompt_tokens: u64,
    pub details: Details,
    /// Added to every choice.
    pub choice_extra: Map<String, Value>,
    /// Added to the body, or to the last token's event.
    pub top_extra: Map<String, Value>,
    pub look: Look,
    /// Code points of text before each piece, echo included (streamed
    /// completions logprobs), computed once.
    pub starts: OnceLock<Vec<u64>>,
}

/// One step of the stream.
#[derive(Clone, Copy)]
pub enum Step {
    /// Token `k` of choice `i`.
    Token {
        k: u64,
        i: u64,
    },
    Usage,
    Done,
    End,
}

impl Completion {
    fn m(&self) -> u64 {
        self.pieces.len() as u64
    }

    fn echo(&self) -> &str {
        self.look.echo.as_deref().unwrap_or("")
    }

    fn gen_step(&self, k: u64) -> Option<lp::Step<'_>> {
        let token = self.pieces.get(usize::try_from(k).ok()?)?;
        Some(lp::Step {
            position: self.prompt_tokens + k,
            token,
            first: false,
        })
    }

    fn prompt_steps(&self) -> Vec<lp::Step<'_>> {
        if !self.look.echo_logprobs {
            return Vec::new();
        }
        let Some(p) = &self.look.prompt else {
            return Vec::new();
        };
        p.tokens
            .iter()
            .enumerate()
            .map(|(j, token)| lp::Step {
                position: j as u64,
                token,
                first: j == 0,
            })
            .collect()
    }

    fn shape(&self, k: u64) -> lp::LogprobsShape {
        lp::LogprobsShape {
            flavor: self.look.flavor(),
            k,
            prompt_k: self.look.asked.prompt_logprobs.unwrap_or(k),
            prompt_len: self.prompt_tokens,
        }
    }

    /// A choice's `logprobs` over the whole answer.
    fn logprobs(&self) -> Value {
        let Some(k) = self.look.asked.logprobs else {
            return Value::Null;
        };
        match self.api {
            Api::Completions => {
                let mut steps = self.prompt_steps();
                steps.extend((0..self.m()).filter_map(|k| self.gen_step(k)));
                lp::completion_logprobs(&self.shape(k), &steps, 0)
            }
            Api::Chat => {
                let content: Vec<Value> = (0..self.m())
                    .filter_map(|j| self.gen_step(j))
                    .map(|s| lp::chat_logprob(self.look.flavor(), s.position, s.token, k))
                    .collect();
                json!({ "content": content })
            }
            Api::Responses | Api::Messages | Api::Generate => Value::Null,
        }
    }

    /// The `logprobs` of token `k`'s event: the first also covers the
    /// echoed prompt; offsets continue from the text sent so far.
    fn chunk_logprobs(&self, k: u64) -> Value {
        let Some(top) = self.look.asked.logprobs else {
            return Value::Null;
        };
        match self.api {
            Api::Completions => {
                let mut steps = if k == 0 {
                    self.prompt_steps()
                } else {
                    Vec::new()
                };
                steps.extend(self.gen_step(k));
                let offset = if k == 0 {
                    0
                } else {
                    let starts = self.starts.get_or_init(|| {
                        let mut at = self.echo().chars().count() as u64;
                        self.pieces
                            .iter()
                            .map(|t| {
                                let start = at;
                                at += t.text.chars().count() as u64;
                                start
                            })
                            .collect()
                    });
                    usize::try_from(k)
                        .ok()
                        .and_then(|k| starts.get(k))
                        .copied()
                        .unwrap_or(0)
                };
                lp::completion_logprobs(&self.shape(top), &steps, offset)
            }
            Api::Chat => {
                let content: Vec<Value> = self
                    .gen_step(k)
                    .map(|s| lp::chat_logprob(self.look.flavor(), s.position, s.token, top))
                    .into_iter()
                    .collect();
                json!({ "content": content })
            }
            Api::Responses | Api::Messages | Api::Generate => Value::Null,
        }
    }

    /// vLLM's `prompt_logprobs` (null when not asked).
    fn prompt_logprobs(&self) -> Value {
        match (self.look.asked.prompt_logprobs, &self.look.prompt) {
            (Some(k), Some(p)) => lp::vllm_prompt_logprobs(p, k),
            _ => Value::Null,
        }
    }

    pub fn body(&self) -> Value {
        let mut text = self.echo().to_string();
        text.extend(self.pieces.iter().map(|t| t.text.as_str()));
        let vllm = self.look.flavor() == Flavor::Vllm;
        let logprobs = self.logprobs();
        let prompt_logprobs = if vllm {
            self.prompt_logprobs()
        } else {
            Value::Null
        };
        let mut body = head(&self.id, self.api, false, &self.model, self.created);
        let choices: Vec<Value> = (0..self.n)
            .map(|i| {
                let mut c = choice(self.api, i, &text, self.finish_reason, logprobs.clone());
                c.extend(self.choice_extra.clone());
                if vllm && self.api == Api::Completions {
                    c.insert("prompt_logprobs".into(), prompt_logprobs.clone());
                }
                Value::Object(c)
            })
            .collect();
        body.insert("choices".into(), Value::Array(choices));
        body.insert(
            "usage".into(),
            usage(self.prompt_tokens, self.n * self.m(), &self.details),
        );
        body.extend(self.top_extra.clone());
        if vllm && self.api == Api::Chat {
            body.insert("prompt_logprobs".into(), prompt_logprobs);
        }
        Value::Object(body)
    }

    /// The event for `step` and the step after it; None when finished.
    pub fn event(&self, step: Step) -> Option<(String, Step)> {
        let m = self.m();
        // max_tokens 0 still sends one (empty) finishing chunk per choice.
        let last_k = m.saturating_sub(1);
        match step {
            Step::Token { k, i } => {
                let mut text = if k == 0 {
                    self.echo().to_string()
                } else {
                    String::new()
                };
                if let Some(t) = self.pieces.get(usize::try_from(k).unwrap_or(usize::MAX)) {
                    text.push_str(&t.text);
                }
                let finish = if k == last_k {
                    json!(self.finish_reason)
                } else {
                    Value::Null
                };
                let mut c = Map::new();
                c.insert("index".into(), json!(i));
                match self.api {
                    Api::Completions => {
                        c.insert("text".into(), json!(text));
                    }
                    Api::Chat | Api::Responses | Api::Messages | Api::Generate => {
                        let delta = if k == 0 {
                            json!({"role": "assistant", "content": text})
                        } else {
                            json!({"content": text})
                        };
                        c.insert("delta".into(), delta);
                    }
                }
                c.insert("finish_reason".into(), finish);
                c.insert("logprobs".into(), self.chunk_logprobs(k));
                c.extend(self.choice_extra.clone());
                let mut chunk = head(&self.id, self.api, true, &self.model, self.created);
                chunk.insert("choices".into(), json!([c]));
                if self.look.asked.continuous_usage {
                    // Per-chunk usage has no details (vLLM, as of 0.33).
                    let so_far = if m == 0 { 0 } else { k + 1 };
                    chunk.insert(
                        "usage".into(),
                        usage(self.prompt_tokens, so_far, &Details::Absent),
                    );
                }
                if k == last_k && i + 1 == self.n {
                    chunk.extend(self.top_extra.clone());
                }
                let next = if i + 1 < self.n {
                    Step::Token { k, i: i + 1 }
                } else if k < last_k {
                    Step::Token { k: k + 1, i: 0 }
                } else if self.include_usage {
                    Step::Usage
                } else {
                    Step::Done
                };
                Some((data(&Value::Object(chunk)), next))
            }
            Step::Usage => {
                // vLLM serialises the final usage chunk with exclude_none.
                let details = match (&self.details, self.look.flavor()) {
                    (Details::Null, Flavor::Vllm) => Details::Absent,
                    (d, _) => d.clone(),
                };
                let mut chunk = head(&self.id, self.api, true, &self.model, self.created);
                chunk.insert("choices".into(), json!([]));
                chunk.insert(
                    "usage".into(),
                    usage(self.prompt_tokens, self.n * m, &details),
                );
                Some((data(&Value::Object(chunk)), Step::Done))
            }
            Step::Done => Some(("data: [DONE]\n\n".to_string(), Step::End)),
            Step::End => None,
        }
    }

    /// Every event at once.
    pub fn sse(&self) -> String {
        let mut body = String::new();
        let mut step = Step::Token { k: 0, i: 0 };
        while let Some((event, next)) = self.event(step) {
            body.push_str(&event);
            step = next;
        }
        body
    }
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logprobs::{Asked, Prompt};
    use crate::request::Request;
    use serde_json::Number;

    fn completion(api: Api, max_tokens: u64, n: u64, include_usage: bool) -> Completion {
        Completion {
            api,
            id: "x".into(),
            model: "m".into(),
            created: 0,
            n,
            include_usage,
            pieces: (0..max_tokens).map(lp::generated).collect(),
            finish_reason: "length",
            prompt_tokens: 3,
            details: Details::Absent,
            choice_extra: Map::new(),
            top_extra: Map::new(),
            look: Look::default(),
            starts: OnceLock::new(),
        }
    }

    fn events(c: &Completion) -> Vec<String> {
        c.sse()
            .split_inclusive("\n\n")
            .map(str::to_string)
            .collect()
    }

    fn json_events(c: &Completion) -> Vec<Value> {
        events(c)
            .iter()
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|e| !e.starts_with("[DONE]"))
            .map(|e| serde_json::from_str(e.trim()).expect("json"))
            .collect()
    }

    #[test]
    fn stream_shape() {
        let ev = events(&completion(Api::Completions, 3, 2, true));
        assert_eq!(ev.len(), 3 * 2 + 2);
        assert!(ev[0].contains(r#""text":"tok0""#));
        assert!(ev[5].contains(r#""finish_reason":"length""#));
        assert!(ev[4].contains(r#""finish_reason":"length""#));
        assert!(ev[3].contains(r#""finish_reason":null"#));
        assert!(ev[6].contains(r#""total_tokens":9"#));
        assert_eq!(ev[7], "data: [DONE]\n\n");
    }

    #[test]
    fn chat_stream_role_then_content() {
        let ev = events(&completion(Api::Chat, 2, 1, false));
        assert_eq!(ev.len(), 3);
        assert!(ev[0].contains(r#""delta":{"content":"tok0","role":"assistant"}"#));
        assert!(ev[1].contains(r#""delta":{"content":" tok1"}"#));
    }

    #[test]
    fn streamed_prefill_is_one_token_per_choice() {
        let mut c = completion(Api::Chat, 0, 2, true);
        c.pieces = vec![lp::prefill_token()];
        c.prompt_tokens = 7;
        c.top_extra
            .insert("kv_transfer_params".into(), json!({"k": 1}));
        let body = c.sse();
        let ev: Vec<&str> = body.split_inclusive("\n\n").collect();
        assert_eq!(ev.len(), 4);
        assert!(ev[0].contains(r#""delta":{"content":"P","role":"assistant"}"#));
        assert!(ev[0].contains(r#""finish_reason":"length""#));
        assert!(!ev[0].contains("kv_transfer_params"));
        assert!(ev[1].contains(r#""index":1"#));
        assert!(ev[1].contains(r#""kv_transfer_params":{"k":1}"#));
        assert!(ev[2].contains(r#""total_tokens":9"#));
        assert_eq!(ev[3], "data: [DONE]\n\n");
    }

    #[test]
    fn zero_tokens_still_finishes() {
        let ev = events(&completion(Api::Completions, 0, 1, false));
        assert_eq!(ev.len(), 2);
        assert!(ev[0].contains(r#""finish_reason":"length""#));
    }

    #[test]
    fn usage_details() {
        let mut c = completion(Api::Chat, 2, 1, true);
        assert_eq!(
            c.body()["usage"],
            json!({"prompt_tokens":3,"completion_tokens":2,"total_tokens":5})
        );
        c.details = Details::Cached(Number::from(2u64));
        let b = c.body();
        assert_eq!(
            b["usage"],
            json!({"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,
                   "prompt_tokens_details":{"cached_tokens":2}})
        );
        assert_eq!(
            b["usage"].to_string(),
            r#"{"completion_tokens":2,"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":2},"total_tokens":5}"#
        );
        let ev = json_events(&c);
        assert_eq!(
            ev.last().unwrap()["usage"]["prompt_tokens_details"]["cached_tokens"],
            2
        );
        assert_eq!(ev.last().unwrap()["choices"], json!([]));
        // Null in a body; vLLM's final usage chunk leaves it out, SGLang's
        // keeps it.
        c.details = Details::Null;
        c.look.flavor = Some(Flavor::Vllm);
        assert_eq!(c.body()["usage"]["prompt_tokens_details"], Value::Null);
        assert!(c.body()["usage"]
            .as_object()
            .unwrap()
            .contains_key("prompt_tokens_details"));
        let last = json_events(&c).pop().unwrap();
        assert!(!last["usage"]
            .as_object()
            .unwrap()
            .contains_key("prompt_tokens_details"));
        c.look.flavor = Some(Flavor::Sglang);
        let last = json_events(&c).pop().unwrap();
        assert!(last["usage"]
            .as_object()
            .unwrap()
            .contains_key("prompt_tokens_details"));
    }

    #[test]
    fn continuous_usage_has_no_details() {
        let mut c = completion(Api::Completions, 2, 2, true);
        c.details = Details::Cached(Number::from(1u64));
        c.look.asked.continuous_usage = true;
        let ev = json_events(&c);
        assert_eq!(ev.len(), 5);
        assert_eq!(
            ev[0]["usage"],
            json!({"prompt_tokens":3,"completion_tokens":1,"total_tokens":4})
        );
        assert_eq!(ev[3]["usage"]["completion_tokens"], 2);
        assert_eq!(ev[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
        assert_eq!(ev[4]["usage"]["completion_tokens"], 4);
    }

    fn echo_look(flavor: Flavor, body: &'static str) -> (Look, u64) {
        let req = Request::parse(Api::Completions, body.as_bytes()).unwrap();
        let asked = Asked::from_request(&req, flavor, false).unwrap();
        let prompt = Prompt::of(&req).unwrap();
        let n = prompt.tokens.len() as u64;
        let look = Look {
            flavor: Some(flavor),
            model: "m".into(),
            echo: Some(prompt.text.clone()),
            echo_logprobs: asked.logprobs.is_some(),
            prompt: Some(prompt),
            asked,
        };
        (look, n)
    }

    #[test]
    fn completions_echo_logprobs() {
        let (look, n) = echo_look(
            Flavor::Vllm,
            r#"{"prompt":"Bonjour à tous","echo":true,"logprobs":1}"#,
        );
        let mut c = completion(Api::Completions, 2, 1, false);
        c.prompt_tokens = n;
        c.look = look;
        let b = c.body();
        let ch = &b["choices"][0];
        assert_eq!(ch["text"], "Bonjour à toustok0 tok1");
        let lps = &ch["logprobs"];
        let tokens: Vec<&str> = lps["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(tokens.len() as u64, n + 2);
        assert_eq!(tokens.concat(), "Bonjour à toustok0 tok1");
        let offsets: Vec<u64> = lps["text_offset"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_u64().unwrap())
            .collect();
        let mut at = 0;
        for (o, t) in offsets.iter().zip(&tokens) {
            assert_eq!(*o, at);
            at += t.chars().count() as u64;
        }
        assert_eq!(lps["token_logprobs"][0], Value::Null);
        assert_eq!(lps["top_logprobs"][0], Value::Null);
        assert!(lps["token_logprobs"][1].is_f64());
        // vLLM: echo turns into prompt_logprobs = logprobs, per choice.
        assert_eq!(ch["prompt_logprobs"].as_array().unwrap().len() as u64, n);
        assert_eq!(
            ch["prompt_logprobs"],
            lp::vllm_prompt_logprobs(c.look.prompt.as_ref().unwrap(), 1)
        );
        assert_eq!(b.get("prompt_logprobs"), None);

        // Streamed: the first chunk carries the prompt and the first token.
        let ev = json_events(&c);
        assert_eq!(ev[0]["choices"][0]["text"], "Bonjour à toustok0");
        let first = &ev[0]["choices"][0]["logprobs"];
        assert_eq!(first["tokens"].as_array().unwrap().len() as u64, n + 1);
        assert_eq!(first["text_offset"][0], 0);
        let second = &ev[1]["choices"][0]["logprobs"];
        assert_eq!(second["tokens"], json!([" tok1"]));
        assert_eq!(second["text_offset"], json!([offsets[offsets.len() - 1]]));
        assert_eq!(
            second["token_logprobs"][0],
            lps["token_logprobs"][n as usize + 1]
        );
    }

    #[test]
    fn logprobs_without_echo_are_the_generated_tokens() {
        let req =
            Request::parse(Api::Completions, br#"{"prompt":"Hi there","logprobs":2}"#).unwrap();
        let asked = Asked::from_request(&req, Flavor::Vllm, false).unwrap();
        let mut c = completion(Api::Completions, 3, 1, false);
        c.look = Look {
            flavor: Some(Flavor::Vllm),
            asked,
            ..Look::default()
        };
        let b = c.body();
        let lps = &b["choices"][0]["logprobs"];
        assert_eq!(lps["tokens"], json!(["tok0", " tok1", " tok2"]));
        assert_eq!(lps["text_offset"], json!([0, 4, 9]));
        assert_eq!(
            lps["token_logprobs"][1],
            json!(lp::logprob(3 + 1, &lp::generated(1)))
        );
        assert_eq!(b["choices"][0]["prompt_logprobs"], Value::Null);
    }

    #[test]
    fn sglang_decode_echo_has_generated_logprobs_only() {
        let (mut look, n) = echo_look(
            Flavor::Sglang,
            r#"{"prompt":"abcdefgh","echo":true,"logprobs":2}"#,
        );
        look.echo_logprobs = false;
        let mut c = completion(Api::Completions, 2, 1, false);
        c.prompt_tokens = n;
        c.look = look;
        let b = c.body();
        assert_eq!(b["choices"][0]["text"], "abcdefghtok0 tok1");
        let lps = &b["choices"][0]["logprobs"];
        assert_eq!(lps["tokens"], json!(["tok0", " tok1"]));
        assert_eq!(lps["text_offset"], json!([-1, -1]));
        assert_eq!(lps["top_logprobs"][0].as_object().unwrap().len(), 2);
        assert_eq!(b["choices"][0].get("prompt_logprobs"), None);
    }

    #[test]
    fn chat_prompt_logprobs_and_logprobs() {
        let req = Request::parse(
            Api::Chat,
            br#"{"messages":[{"role":"user","content":"Hello"}],"prompt_logprobs":1,"logprobs":true,"top_logprobs":2}"#,
        )
        .unwrap();
        let asked = Asked::from_request(&req, Flavor::Vllm, false).unwrap();
        let prompt = Prompt::of(&req).unwrap();
        let mut c = completion(Api::Chat, 2, 1, false);
        c.prompt_tokens = prompt.tokens.len() as u64;
        c.look = Look {
            flavor: Some(Flavor::Vllm),
            asked,
            prompt: Some(prompt.clone()),
            ..Look::default()
        };
        let b = c.body();
        assert_eq!(b["prompt_logprobs"], lp::vllm_prompt_logprobs(&prompt, 1));
        let content = b["choices"][0]["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_eq!(content[0]["token"], "tok0");
        assert_eq!(content[0]["bytes"], json!(b"tok0".to_vec()));
        assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
        assert_eq!(content[0]["top_logprobs"][0]["token"], "tok0");
        // Not asked: null.
        let mut c = completion(Api::Chat, 1, 1, false);
        c.look.flavor = Some(Flavor::Vllm);
        assert_eq!(c.body()["prompt_logprobs"], Value::Null);
        assert!(c
            .body()
            .as_object()
            .unwrap()
            .contains_key("prompt_logprobs"));
    }
}

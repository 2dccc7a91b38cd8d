//! `/v1/messages` answers in Anthropic's Messages shape, as vLLM 0.34
//! (`entrypoints/anthropic/serving.py`) and SGLang 0.5.23
//! (`entrypoints/anthropic/serving.py`) convert their chat answer: a
//! `message` object (serialised without its null members), or with
//! `stream: true` SSE events with `event:` lines and no `[DONE]`:
//! `message_start`, `content_block_start`, one `content_block_delta` per
//! token, `content_block_stop`, `message_delta` (stop reason and usage),
//! `message_stop`. Usage follows Anthropic's arithmetic, which both engines
//! apply to the chat usage: `input_tokens` = prompt tokens - cached
//! (at least 0), `cache_read_input_tokens` = the chat answer's
//! `prompt_tokens_details.cached_tokens`, absent when it has none.

use serde_json::{json, Map, Number, Value};

use crate::config::Flavor;

/// One Messages answer: what the object and its events are built from.
pub struct Answer {
    /// vLLM: its chat id (`chatcmpl-...`); SGLang: `msg_...`.
    pub id: String,
    pub model: String,
    /// The token texts; their concatenation is the text block.
    pub pieces: Vec<String>,
    /// Cut by `max_tokens` (finish reason "length"): stop reason
    /// `max_tokens`, else `end_turn`.
    pub length_capped: bool,
    pub prompt_tokens: u64,
    /// What the chat answer reports as `prompt_tokens_details.cached_tokens`
    /// (`None`: no details, so no `cache_read_input_tokens`).
    pub cached: Option<Number>,
    /// Extra top-level members of the object (a vLLM prefill's
    /// `kv_transfer_params`); never in a stream, as in vLLM.
    pub top: Map<String, Value>,
    /// Whose converter: vLLM's `message_delta` carries the whole usage and
    /// `stop_sequence: null`, SGLang's only `output_tokens` and the reason.
    pub flavor: Flavor,
}

impl Answer {
    fn stop_reason(&self) -> &'static str {
        if self.length_capped {
            "max_tokens"
        } else {
            "end_turn"
        }
    }

    /// `{"input_tokens", "output_tokens"[, "cache_read_input_tokens"]}`.
    fn usage(&self) -> Value {
        let output = self.pieces.len() as u64;
        let mut u = Map::new();
        let cached = self.cached.as_ref().map(|n| {
            n.as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .unwrap_or(0)
        });
        let input = (i128::from(self.prompt_tokens) - cached.unwrap_or(0)).max(0);
        u.insert(
            "input_tokens".into(),
            json!(u64::try_from(input).unwrap_or(u64::MAX)),
        );
        u.insert("output_tokens".into(), json!(output));
        if let Some(n) = &self.cached {
            u.insert("cache_read_input_tokens".into(), Value::Number(n.clone()));
        }
        Value::Object(u)
    }

    /// The `message` object of a non-streamed answer. Empty output is one
    /// empty text block (both engines: strict clients read `content[0]`).
    pub fn body(&self) -> Value {
        let mut o = Map::new();
        o.insert("id".into(), json!(self.id));
        o.insert("type".into(), json!("message"));
        o.insert("role".into(), json!("assistant"));
        o.insert(
            "content".into(),
            json!([{"type": "text", "text": self.pieces.concat()}]),
        );
        o.insert("model".into(), json!(self.model));
        o.insert("stop_reason".into(), json!(self.stop_reason()));
        o.insert("usage".into(), self.usage());
        o.extend(self.top.clone());
        Value::Object(o)
    }

    /// Every SSE event of the stream, in order.
    pub fn events(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.pieces.len() + 5);
        let mut message = Map::new();
        message.insert("id".into(), json!(self.id));
        message.insert("type".into(), json!("message"));
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), json!([]));
        message.insert("model".into(), json!(self.model));
        // The first chunk's (continuous) usage: no details, no tokens yet.
        message.insert(
            "usage".into(),
            json!({"input_tokens": self.prompt_tokens, "output_tokens": 0}),
        );
        if self.flavor != Flavor::Sglang {
            // vLLM sets them explicitly, so its `exclude_unset` keeps them.
            message.insert("stop_reason".into(), Value::Null);
            message.insert("stop_sequence".into(), Value::Null);
        }
        out.push(event(
            "message_start",
            json!({"type": "message_start", "message": message}),
        ));
        if !self.pieces.is_empty() {
            out.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            ));
            for piece in &self.pieces {
                out.push(event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": piece}}),
                ));
            }
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ));
        }
        let delta = match self.flavor {
            Flavor::Sglang => json!({"type": "message_delta",
                "delta": {"stop_reason": self.stop_reason()},
                "usage": {"output_tokens": self.pieces.len()}}),
            Flavor::Vllm | Flavor::Trtllm => json!({"type": "message_delta",
                "delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                "usage": self.usage()}),
        };
        out.push(event("message_delta", delta));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        out
    }
}

fn event(kind: &str, data: Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

/// A stream that fails before its first event, as vLLM's converter reports
/// an error chunk: one `error` event, `{"type":"error","error":{..}}`.
pub fn error_event(body: &Value) -> String {
    event("error", body.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(flavor: Flavor, cached: Option<u64>) -> Answer {
        let mut top = Map::new();
        top.insert("kv_transfer_params".into(), json!({"k": 1}));
        Answer {
            id: "chatcmpl-x".into(),
            model: "m".into(),
            pieces: vec!["tok0".into(), " tok1".into()],
            length_capped: true,
            prompt_tokens: 7,
            cached: cached.map(Number::from),
            top,
            flavor,
        }
    }

    /// The `(event, data)` pairs of an SSE body; every frame is
    /// `event: <type>\ndata: <json>\n\n` with the data's `type` the event's.
    fn frames(events: &[String]) -> Vec<(String, Value)> {
        events
            .iter()
            .map(|e| {
                assert!(e.ends_with("\n\n"), "{e:?}");
                let mut lines = e.trim_end().lines();
                let kind = lines.next().unwrap().strip_prefix("event: ").unwrap();
                let data: Value =
                    serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap())
                        .unwrap();
                assert_eq!(lines.next(), None);
                assert_eq!(data["type"], kind);
                (kind.to_string(), data)
            })
            .collect()
    }

    #[test]
    fn body_shape() {
        let b = answer(Flavor::Vllm, Some(5)).body();
        assert_eq!(
            b,
            json!({"id": "chatcmpl-x", "type": "message", "role": "assistant",
                   "content": [{"type": "text", "text": "tok0 tok1"}], "model": "m",
                   "stop_reason": "max_tokens",
                   "usage": {"input_tokens": 2, "output_tokens": 2, "cache_read_input_tokens": 5},
                   "kv_transfer_params": {"k": 1}})
        );
        // No details: no cache member, all the prompt is input.
        let mut a = answer(Flavor::Vllm, None);
        a.pieces.clear();
        a.length_capped = false;
        let b = a.body();
        assert_eq!(b["usage"], json!({"input_tokens": 7, "output_tokens": 0}));
        assert_eq!(b["content"], json!([{"type": "text", "text": ""}]));
        assert_eq!(b["stop_reason"], "end_turn");
        // More cached than the prompt (a forged count): input clamps at 0;
        // a negative one adds to it, as vLLM's subtraction does.
        assert_eq!(
            answer(Flavor::Vllm, Some(9)).body()["usage"]["input_tokens"],
            0
        );
        let mut a = answer(Flavor::Vllm, None);
        a.cached = Some(Number::from(-3i64));
        assert_eq!(a.body()["usage"]["input_tokens"], 10);
    }

    #[test]
    fn vllm_stream_framing() {
        let ev = frames(&answer(Flavor::Vllm, Some(5)).events());
        let kinds: Vec<&str> = ev.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(
            ev[0].1["message"],
            json!({"id": "chatcmpl-x", "type": "message", "role": "assistant", "content": [],
                   "model": "m", "stop_reason": null, "stop_sequence": null,
                   "usage": {"input_tokens": 7, "output_tokens": 0}})
        );
        assert_eq!(
            ev[1].1,
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}})
        );
        assert_eq!(
            ev[3].1,
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": " tok1"}})
        );
        assert_eq!(ev[4].1, json!({"type": "content_block_stop", "index": 0}));
        assert_eq!(
            ev[5].1,
            json!({"type": "message_delta",
                   "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                   "usage": {"input_tokens": 2, "output_tokens": 2, "cache_read_input_tokens": 5}})
        );
        assert_eq!(ev[6].1, json!({"type": "message_stop"}));
        // Never kv_transfer_params, never [DONE].
        let all = answer(Flavor::Vllm, None).events().concat();
        assert!(!all.contains("kv_transfer_params") && !all.contains("[DONE]"));
    }

    #[test]
    fn sglang_stream_and_empty_output() {
        let ev = frames(&answer(Flavor::Sglang, Some(5)).events());
        assert!(ev[0].1["message"].get("stop_reason").is_none());
        assert_eq!(
            ev[5].1,
            json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                   "usage": {"output_tokens": 2}})
        );
        let mut a = answer(Flavor::Vllm, None);
        a.pieces.clear();
        let kinds: Vec<String> = frames(&a.events()).into_iter().map(|(k, _)| k).collect();
        assert_eq!(kinds, ["message_start", "message_delta", "message_stop"]);
    }

    #[test]
    fn error_frame() {
        let body = json!({"type": "error", "error": {"type": "api_error", "message": "x"}});
        let ev = frames(&[error_event(&body)]);
        assert_eq!(ev[0].0, "error");
        assert_eq!(ev[0].1["error"]["type"], "api_error");
    }
}

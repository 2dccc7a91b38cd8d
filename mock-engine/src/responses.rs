//! `/v1/responses` answers in vLLM's Responses shape (vLLM 0.33
//! `entrypoints/openai/responses`): a `response` object, or with
//! `stream: true` SSE events with `event:` lines. As in vLLM, an answer cut
//! by `max_output_tokens` (finish reason "length", so every prefill leg) is
//! `status: "incomplete"` with `incomplete_details.reason
//! "max_output_tokens"`, and its stream ends with `response.incomplete`;
//! one that stopped by itself is `completed` / `response.completed`. The
//! terminal event carries the full object, `kv_transfer_params` included.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// One response: what the object and its events are built from.
pub struct Answer {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// The message item's id (`msg_...`).
    pub item_id: String,
    /// The token texts; their concatenation is the output text.
    pub pieces: Vec<String>,
    /// Stopped by `max_output_tokens` ("length"): status "incomplete".
    pub length_capped: bool,
    pub max_output_tokens: Option<u64>,
    pub prompt_tokens: u64,
    /// `usage.input_tokens_details.cached_tokens`.
    pub cached_tokens: serde_json::Number,
    /// Extra top-level members (`kv_transfer_params` always: null if none).
    pub top: Map<String, Value>,
}

impl Answer {
    fn text(&self) -> String {
        self.pieces.concat()
    }

    fn status(&self) -> &'static str {
        if self.length_capped {
            "incomplete"
        } else {
            "completed"
        }
    }

    fn part(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": null})
    }

    fn item(&self) -> Value {
        let text = self.text();
        let content = if text.is_empty() {
            json!([])
        } else {
            json!([self.part(&text)])
        };
        json!({
            "id": self.item_id,
            "type": "message",
            "role": "assistant",
            "status": self.status(),
            "content": content,
        })
    }

    fn usage(&self) -> Value {
        let output = self.pieces.len() as u64;
        json!({
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + output,
        })
    }

    /// The `response` object; `done` false: the one `response.created`
    /// shows (in progress, no output, no usage).
    pub fn object(&self, done: bool) -> Value {
        let mut o = Map::new();
        o.insert("id".into(), json!(self.id));
        o.insert("object".into(), json!("response"));
        o.insert("created_at".into(), json!(self.created));
        o.insert("model".into(), json!(self.model));
        o.insert("background".into(), json!(false));
        o.insert("max_output_tokens".into(), json!(self.max_output_tokens));
        if done {
            o.insert("status".into(), json!(self.status()));
            let details = if self.length_capped {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            };
            o.insert("incomplete_details".into(), details);
            o.insert("output".into(), json!([self.item()]));
            o.insert("usage".into(), self.usage());
            o.insert("kv_transfer_params".into(), Value::Null);
            o.extend(self.top.clone());
        } else {
            o.insert("status".into(), json!("in_progress"));
            o.insert("incomplete_details".into(), Value::Null);
            o.insert("output".into(), json!([]));
            o.insert("usage".into(), Value::Null);
            o.insert("kv_transfer_params".into(), Value::Null);
        }
        Value::Object(o)
    }

    /// Every SSE event of the stream, in order.
    pub fn events(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.pieces.len() + 8);
        let mut seq = 0u64;
        let mut push = |kind: &str, mut body: Map<String, Value>| {
            body.insert("type".into(), json!(kind));
            body.insert("sequence_number".into(), json!(seq));
            seq += 1;
            out.push(format!("event: {kind}\ndata: {}\n\n", Value::Object(body)));
        };
        let obj = |v: Value| match v {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        push(
            "response.created",
            obj(json!({"response": self.object(false)})),
        );
        push(
            "response.in_progress",
            obj(json!({"response": self.object(false)})),
        );
        let text = self.text();
        if !text.is_empty() {
            let at = json!({"item_id": self.item_id, "output_index": 0, "content_index": 0});
            let with = |extra: Value| {
                let mut m = obj(at.clone());
                m.extend(obj(extra));
                m
            };
            push(
                "response.output_item.added",
                obj(json!({
                    "output_index": 0,
                    "item": {"id": self.item_id, "type": "message", "role": "assistant",
                             "content": [], "status": "in_progress"},
                })),
            );
            push(
                "response.content_part.added",
                with(
                    json!({"part": {"type": "output_text", "text": "", "annotations": [],
                                     "logprobs": []}}),
                ),
            );
            for piece in &self.pieces {
                push(
                    "response.output_text.delta",
                    with(json!({"delta": piece, "logprobs": []})),
                );
            }
            push(
                "response.output_text.done",
                with(json!({"text": text, "logprobs": []})),
            );
            push(
                "response.content_part.done",
                with(json!({"part": {"type": "output_text", "text": text, "annotations": []}})),
            );
            push(
                "response.output_item.done",
                obj(json!({"output_index": 0, "item": self.item()})),
            );
        }
        let terminal = if self.length_capped {
            "response.incomplete"
        } else {
            "response.completed"
        };
        push(terminal, obj(json!({"response": self.object(true)})));
        out
    }
}

fn sse_headers(resp: &mut Response) {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
}

/// The whole answer at once: JSON, or (`stream`) every event in one body.
pub fn at_once(answer: &Answer, stream: bool) -> Response {
    if stream {
        let mut resp = Response::new(Body::from(answer.events().concat()));
        sse_headers(&mut resp);
        return resp;
    }
    axum::Json(answer.object(true)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(pieces: &[&str], capped: bool) -> Answer {
        let mut top = Map::new();
        top.insert("kv_transfer_params".into(), json!({"k": 1}));
        Answer {
            id: "resp_x".into(),
            created: 0,
            model: "m".into(),
            item_id: "msg_1".into(),
            pieces: pieces.iter().map(|s| s.to_string()).collect(),
            length_capped: capped,
            max_output_tokens: capped.then_some(pieces.len() as u64),
            prompt_tokens: 3,
            cached_tokens: 2u64.into(),
            top,
        }
    }

    fn data(event: &str) -> Value {
        let line = event
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("data line");
        serde_json::from_str(line).expect("json")
    }

    #[test]
    fn object_shape() {
        let o = answer(&["tok0", " tok1"], false).object(true);
        assert_eq!(o["object"], "response");
        assert_eq!(o["status"], "completed");
        assert_eq!(o["incomplete_details"], Value::Null);
        assert_eq!(o["output"][0]["type"], "message");
        assert_eq!(o["output"][0]["role"], "assistant");
        assert_eq!(o["output"][0]["content"][0]["type"], "output_text");
        assert_eq!(o["output"][0]["content"][0]["text"], "tok0 tok1");
        assert_eq!(o["usage"]["input_tokens"], 3);
        assert_eq!(o["usage"]["output_tokens"], 2);
        assert_eq!(o["usage"]["total_tokens"], 5);
        assert_eq!(
            o["usage"].to_string(),
            r#"{"input_tokens":3,"input_tokens_details":{"cached_tokens":2},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5}"#
        );
        assert_eq!(o["kv_transfer_params"], json!({"k": 1}));
        let o = answer(&["P"], true).object(true);
        assert_eq!(o["status"], "incomplete");
        assert_eq!(o["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(o["output"][0]["status"], "incomplete");
    }

    #[test]
    fn stream_shape() {
        let ev = answer(&["tok0", " tok1"], true).events();
        let kinds: Vec<&str> = ev
            .iter()
            .map(|e| e.lines().next().unwrap().strip_prefix("event: ").unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.incomplete",
            ]
        );
        for (i, e) in ev.iter().enumerate() {
            assert!(e.ends_with("\n\n"));
            let d = data(e);
            assert_eq!(d["sequence_number"], i as u64);
            assert_eq!(d["type"], kinds[i]);
        }
        assert_eq!(data(&ev[0])["response"]["status"], "in_progress");
        assert_eq!(data(&ev[4])["delta"], "tok0");
        assert_eq!(data(&ev[5])["delta"], " tok1");
        let last = data(&ev[9]);
        assert_eq!(last["response"]["status"], "incomplete");
        assert_eq!(
            last["response"]["usage"]["input_tokens_details"]["cached_tokens"],
            2
        );
        assert_eq!(last["response"]["kv_transfer_params"], json!({"k": 1}));
        assert_eq!(
            last["response"]["output"][0]["content"][0]["text"],
            "tok0 tok1"
        );
        let ev = answer(&["a"], false).events();
        assert!(ev
            .last()
            .unwrap()
            .starts_with("event: response.completed\n"));
        // Nothing generated: no item events.
        let ev = answer(&[], true).events();
        assert_eq!(ev.len(), 3);
    }
}

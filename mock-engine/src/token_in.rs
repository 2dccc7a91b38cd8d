//! `/inference/v1/generate` answers in the shape of vLLM 0.34's token-in
//! API (`entrypoints/scale_out/token_in_token_out`, `output_mode`
//! "tokens"): the generated token ids per choice, no text. Non-streamed, a
//! `GenerateTokensResponse` with every member (null ones included,
//! `kv_transfer_params` too); streamed, one `data:` chunk per token and
//! choice (no `model`, no `kv_transfer_params`), a usage chunk when
//! `stream_options.include_usage`, then `data: [DONE]`.

use serde_json::{json, Map, Value};

/// One token-in answer.
pub struct Answer {
    /// `generate-tokens-{id}`: the engine's internal id, as vLLM answers it.
    pub request_id: String,
    pub model: String,
    pub created: u64,
    pub n: u64,
    /// The generated ids, the same for every choice.
    pub token_ids: Vec<u64>,
    /// Cut by `sampling_params.max_tokens`: finish reason "length".
    pub length_capped: bool,
    /// The answer's `usage`.
    pub usage: Value,
    /// The stream's final usage chunk's `usage`, if `include_usage`.
    pub stream_usage: Option<Value>,
    /// Top-level members (`kv_transfer_params`, null when none).
    pub top: Map<String, Value>,
}

impl Answer {
    fn finish_reason(&self) -> &'static str {
        if self.length_capped {
            "length"
        } else {
            "stop"
        }
    }

    fn choice(&self, index: u64, ids: &[u64], finish: Value) -> Value {
        json!({"index": index, "finish_reason": finish, "stop_reason": null,
               "token_ids": ids, "logprobs": null})
    }

    pub fn body(&self) -> Value {
        let choices: Vec<Value> = (0..self.n)
            .map(|i| self.choice(i, &self.token_ids, json!(self.finish_reason())))
            .collect();
        let mut o = Map::new();
        o.insert("request_id".into(), json!(self.request_id));
        o.insert("model".into(), json!(self.model));
        o.insert("created".into(), json!(self.created));
        o.insert("usage".into(), self.usage.clone());
        o.insert("prompt_logprobs".into(), Value::Null);
        o.insert("prompt_token_ids".into(), Value::Null);
        o.insert("kv_transfer_params".into(), Value::Null);
        o.insert("ec_transfer_params".into(), Value::Null);
        o.insert("output_mode".into(), json!("tokens"));
        o.insert("choices".into(), Value::Array(choices));
        o.extend(self.top.clone());
        Value::Object(o)
    }

    /// Every SSE event, `[DONE]` included. Nothing generated still sends
    /// one finishing chunk per choice.
    pub fn events(&self) -> Vec<String> {
        let steps = self.token_ids.len().max(1);
        let n = usize::try_from(self.n).unwrap_or(1);
        let mut out = Vec::with_capacity(steps * n + 2);
        let chunk = |usage: Value, choices: Value| {
            json!({"request_id": self.request_id, "usage": usage, "output_mode": "tokens",
                   "choices": choices})
        };
        for k in 0..steps {
            let ids: Vec<u64> = self.token_ids.get(k).copied().into_iter().collect();
            let finish = if k + 1 == steps {
                json!(self.finish_reason())
            } else {
                Value::Null
            };
            for i in 0..self.n {
                let c = chunk(Value::Null, json!([self.choice(i, &ids, finish.clone())]));
                out.push(format!("data: {c}\n\n"));
            }
        }
        if let Some(usage) = &self.stream_usage {
            out.push(format!("data: {}\n\n", chunk(usage.clone(), json!([]))));
        }
        out.push("data: [DONE]\n\n".to_string());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(n: u64, ids: &[u64], stream_usage: bool) -> Answer {
        let mut top = Map::new();
        top.insert("kv_transfer_params".into(), json!({"k": 1}));
        Answer {
            request_id: "generate-tokens-r".into(),
            model: "m".into(),
            created: 0,
            n,
            token_ids: ids.to_vec(),
            length_capped: true,
            usage: json!({"prompt_tokens": 3}),
            stream_usage: stream_usage.then(|| json!({"prompt_tokens": 3})),
            top,
        }
    }

    #[test]
    fn body_shape() {
        let b = answer(2, &[7, 8], false).body();
        assert_eq!(b["request_id"], "generate-tokens-r");
        assert_eq!(b["output_mode"], "tokens");
        assert_eq!(b["kv_transfer_params"], json!({"k": 1}));
        assert_eq!(b["ec_transfer_params"], Value::Null);
        assert_eq!(
            b["choices"],
            json!([
                {"index": 0, "finish_reason": "length", "stop_reason": null,
                 "token_ids": [7, 8], "logprobs": null},
                {"index": 1, "finish_reason": "length", "stop_reason": null,
                 "token_ids": [7, 8], "logprobs": null},
            ])
        );
        let mut a = answer(1, &[7], false);
        a.top.clear();
        assert_eq!(a.body()["kv_transfer_params"], Value::Null);
    }

    #[test]
    fn stream_shape() {
        let ev = answer(2, &[7, 8], true).events();
        assert_eq!(ev.len(), 2 * 2 + 2);
        let data: Vec<Value> = ev[..5]
            .iter()
            .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap().trim()).unwrap())
            .collect();
        assert_eq!(data[0]["choices"][0]["token_ids"], json!([7]));
        assert_eq!(data[0]["choices"][0]["finish_reason"], Value::Null);
        assert_eq!(data[1]["choices"][0]["index"], 1);
        assert_eq!(data[3]["choices"][0]["token_ids"], json!([8]));
        assert_eq!(data[3]["choices"][0]["finish_reason"], "length");
        assert!(data[..4].iter().all(|d| d["usage"].is_null()
            && d.get("kv_transfer_params").is_none()
            && d.get("model").is_none()));
        assert_eq!(data[4]["choices"], json!([]));
        assert_eq!(data[4]["usage"], json!({"prompt_tokens": 3}));
        assert_eq!(ev[5], "data: [DONE]\n\n");
        let ev = answer(1, &[], false).events();
        assert_eq!(ev.len(), 2);
        assert!(ev[0].contains(r#""token_ids":[]"#) && ev[0].contains(r#""length""#));
    }
}

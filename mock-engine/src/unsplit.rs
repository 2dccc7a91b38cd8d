//! The model-bearing calls no router splits, answered as vLLM 0.34 shapes
//! them (`entrypoints/pooling/*`, `serve/tokenize`, `speech_to_text`,
//! `anthropic` count_tokens): embeddings (float or base64), tokenize,
//! detokenize, score, rerank, pooling, classify, count_tokens and the
//! multipart audio transcription and translation. Each checks the model it
//! names against the pod's (a router that sends it to another model's pod
//! gets vLLM's 404); the numbers are plausible and deterministic (a
//! function of the input), not a model's.

use axum::http::{header, HeaderMap};
use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::config::Config;
use crate::error::{Checked, Fail};
use crate::models;
use crate::multipart;
use crate::request::{approx_tokens, short, token_ids, Api, Request};
use crate::state::Shared;

/// Embedding and pooling vectors' length without `dimensions`.
const DEFAULT_DIMENSIONS: u64 = 8;
const MAX_DIMENSIONS: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Embeddings,
    Tokenize,
    Detokenize,
    Score,
    Rerank,
    Pooling,
    Classify,
    /// `/v1/messages/count_tokens` (Anthropic's).
    CountTokens,
    Transcription,
    Translation,
}

impl Call {
    pub fn of(path: &str) -> Option<Call> {
        Some(match path {
            "/v1/embeddings" => Call::Embeddings,
            "/tokenize" => Call::Tokenize,
            "/detokenize" => Call::Detokenize,
            "/score" | "/v1/score" => Call::Score,
            "/rerank" | "/v1/rerank" | "/v2/rerank" => Call::Rerank,
            "/pooling" => Call::Pooling,
            "/classify" => Call::Classify,
            "/v1/messages/count_tokens" => Call::CountTokens,
            "/v1/audio/transcriptions" => Call::Transcription,
            "/v1/audio/translations" => Call::Translation,
            _ => return None,
        })
    }

    /// Whether the pod answers it: count_tokens where Messages are served,
    /// the others on the pods that answer as vLLM.
    pub fn served_by(self, cfg: &Config) -> bool {
        match self {
            Call::CountTokens => cfg.serves_messages(),
            _ => cfg.serves_unsplit(),
        }
    }
}

/// What every answer carries.
struct Ctx {
    /// The model the answer names (the adapter asked for, else the pod's).
    model: String,
    /// A fresh suffix for the answer's id.
    id: String,
    created: u64,
}

/// The answer to `call`, after its model check.
pub fn answer(state: &Shared, call: Call, headers: &HeaderMap, body: &[u8]) -> Checked<Value> {
    let cfg = &state.config;
    if matches!(call, Call::Transcription | Call::Translation) {
        return audio(cfg, call, headers, body);
    }
    if call == Call::CountTokens {
        let req = Request::parse(Api::Messages, body)?;
        models::check(cfg, req.model().as_deref())?;
        if req.model().is_none_or(|m| m.is_empty()) {
            return Err(Fail::contract("count_tokens request has no `model`"));
        }
        return Ok(json!({"input_tokens": approx_tokens(&req.prompt_key()?)}));
    }
    let body: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| Fail::contract(format!("body is not a valid JSON object: {e}")))?;
    let named = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.as_str()),
        Some(v) => return Err(bad(format!("`model` must be a string, got {}", short(v)))),
    };
    models::check(cfg, named)?;
    let ctx = Ctx {
        model: models::answered(cfg, named),
        id: state.next_id(),
        created: crate::state::unix_now(),
    };
    match call {
        Call::Embeddings => embeddings(&body, &ctx),
        Call::Tokenize => tokenize(&body),
        Call::Detokenize => detokenize(&body),
        Call::Score => score(&body, &ctx),
        Call::Rerank => rerank(&body, &ctx),
        Call::Pooling => pooling(&body, &ctx),
        Call::Classify => classify(&body, &ctx),
        Call::CountTokens | Call::Transcription | Call::Translation => {
            Err(Fail::internal("unreachable call"))
        }
    }
}

/// A request vLLM refuses (400), not a PD contract break.
fn bad(message: String) -> Fail {
    Fail::new(
        axum::http::StatusCode::BAD_REQUEST,
        "BadRequestError",
        message,
    )
}

/// vLLM's `UsageInfo` for a call that generates nothing.
fn usage(prompt_tokens: u64) -> Value {
    json!({"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
           "completion_tokens": 0, "prompt_tokens_details": null})
}

/// An input's token count: its token ids, else its JSON text's bytes / 4.
fn tokens_of(item: &Value) -> u64 {
    match item.as_array() {
        Some(ids) if ids.iter().all(Value::is_u64) => ids.len() as u64,
        _ => approx_tokens(item.to_string().as_bytes()),
    }
}

/// A number in [0, 1) that is a function of `seed` and `j` (24 bits, so
/// exact as an f32).
fn unit(seed: &str, j: u64) -> f32 {
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(seed.as_bytes(), j);
    (h >> 40) as f32 / (1u64 << 24) as f32
}

/// The inputs of `input` (embeddings, pooling, classify): a string, a
/// list of strings, a list of token ids (one input), or a list of lists.
fn inputs(body: &Map<String, Value>) -> Checked<Vec<Value>> {
    let input = body
        .get("input")
        .filter(|v| !v.is_null())
        .ok_or_else(|| Fail::contract("request has no `input`"))?;
    match input {
        Value::String(_) => Ok(vec![input.clone()]),
        Value::Array(a) if a.is_empty() => Err(bad("`input` is an empty list".into())),
        Value::Array(a) if a.iter().all(Value::is_u64) => Ok(vec![input.clone()]),
        Value::Array(a) => {
            let ok = |v: &Value| {
                v.is_string()
                    || v.as_array()
                        .is_some_and(|ids| ids.iter().all(Value::is_u64))
            };
            match a.iter().find(|v| !ok(v)) {
                None => Ok(a.clone()),
                Some(v) => Err(bad(format!(
                    "`input` items must be strings or token id lists, got {}",
                    short(v)
                ))),
            }
        }
        v => Err(bad(format!(
            "`input` must be a string or a list, got {}",
            short(v)
        ))),
    }
}

/// `dimensions`, if given: 1..=4096.
fn dimensions(body: &Map<String, Value>) -> Checked<u64> {
    match body.get("dimensions") {
        None | Some(Value::Null) => Ok(DEFAULT_DIMENSIONS),
        Some(v) => v
            .as_u64()
            .filter(|d| (1..=MAX_DIMENSIONS).contains(d))
            .ok_or_else(|| {
                bad(format!(
                    "`dimensions` must be an integer in 1..={MAX_DIMENSIONS}, got {}",
                    short(v)
                ))
            }),
    }
}

fn vector(item: &Value, dims: u64) -> Vec<f32> {
    let seed = item.to_string();
    (0..dims).map(|j| unit(&seed, j) * 2.0 - 1.0).collect()
}

/// `POST /v1/embeddings`. `encoding_format` "float" (default) or "base64":
/// the vector's little-endian float32 bytes, base64, which the OpenAI
/// Python SDK asks for by default and decodes.
fn embeddings(body: &Map<String, Value>, ctx: &Ctx) -> Checked<Value> {
    let items = inputs(body)?;
    let dims = dimensions(body)?;
    let base64 = match body.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(v) => {
            return Err(bad(format!(
                "`encoding_format` must be \"float\" or \"base64\", got {}",
                short(v)
            )))
        }
    };
    let data: Vec<Value> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let v = vector(item, dims);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"index": i, "object": "embedding", "embedding": embedding})
        })
        .collect();
    let tokens = items.iter().map(tokens_of).sum();
    Ok(
        json!({"id": format!("embd-mock-{}", ctx.id), "object": "list",
              "created": ctx.created, "model": ctx.model, "data": data, "usage": usage(tokens)}),
    )
}

/// `POST /tokenize`: `prompt` (completions) or `messages` (chat), the
/// mock's tokens (as the echo/logprobs tokeniser: 4 bytes of JSON each).
fn tokenize(body: &Map<String, Value>) -> Checked<Value> {
    let key = match (body.get("prompt"), body.get("messages")) {
        (Some(p), _) if !p.is_null() => p.to_string(),
        (_, Some(m)) if !m.is_null() => {
            let tools = body.get("tools").filter(|t| !t.is_null());
            format!("{m}{}", tools.map(Value::to_string).unwrap_or_default())
        }
        _ => {
            return Err(Fail::contract(
                "tokenize request has no `prompt` nor `messages`",
            ))
        }
    };
    let tokens = token_ids(key.as_bytes());
    Ok(
        json!({"count": tokens.len(), "max_model_len": models::MAX_MODEL_LEN,
              "tokens": tokens, "token_strs": null}),
    )
}

/// `POST /detokenize`: `tokens` back to a text, `<tID>` per token.
fn detokenize(body: &Map<String, Value>) -> Checked<Value> {
    let tokens = body
        .get("tokens")
        .and_then(Value::as_array)
        .filter(|t| t.iter().all(Value::is_u64))
        .ok_or_else(|| Fail::contract("detokenize request needs `tokens`, a list of token ids"))?;
    let prompt: String = tokens.iter().map(|t| format!("<t{t}>")).collect();
    Ok(json!({ "prompt": prompt }))
}

/// A scoring side as a list: a list's items, or the one value.
fn side(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a.clone(),
        v => vec![v.clone()],
    }
}

/// The score of a pair, in [0, 1).
fn pair_score(left: &Value, right: &Value) -> f32 {
    unit(&format!("{left}\u{0}{right}"), 0)
}

/// `POST /score`, `/v1/score`: the pairs of (`queries`, `documents` or
/// `items`), (`data_1`, `data_2`) or (`text_1`, `text_2`); one left side
/// scores against every right one, else they pair one to one.
fn score(body: &Map<String, Value>, ctx: &Ctx) -> Checked<Value> {
    let get = |k: &str| body.get(k).filter(|v| !v.is_null());
    let (left, right) = [
        ("queries", "documents"),
        ("queries", "items"),
        ("data_1", "data_2"),
        ("text_1", "text_2"),
    ]
    .iter()
    .find_map(|(l, r)| Some((side(get(l)?), side(get(r)?))))
    .ok_or_else(|| {
        Fail::contract("score request needs `queries` and `documents` (or `items`, `data_1`/`data_2`, `text_1`/`text_2`)")
    })?;
    if left.len() != 1 && left.len() != right.len() {
        return Err(bad(format!(
            "score sides differ in length: {} and {}",
            left.len(),
            right.len()
        )));
    }
    let data: Vec<Value> = right
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let l = left.get(i).or(left.first()).unwrap_or(&Value::Null);
            json!({"index": i, "object": "score", "score": pair_score(l, r)})
        })
        .collect();
    let tokens = left.iter().chain(&right).map(tokens_of).sum();
    Ok(
        json!({"id": format!("score-mock-{}", ctx.id), "object": "list",
              "created": ctx.created, "model": ctx.model, "data": data, "usage": usage(tokens)}),
    )
}

/// `POST /rerank`, `/v1/rerank`, `/v2/rerank`: `query` against every
/// `documents` item, best first, the first `top_n` (0: all).
fn rerank(body: &Map<String, Value>, ctx: &Ctx) -> Checked<Value> {
    let query = body
        .get("query")
        .filter(|v| !v.is_null())
        .ok_or_else(|| Fail::contract("rerank request has no `query`"))?;
    let docs = side(
        body.get("documents")
            .filter(|v| !v.is_null())
            .ok_or_else(|| Fail::contract("rerank request has no `documents`"))?,
    );
    let top_n = match body.get("top_n") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad(format!("`top_n` must be >= 0, got {}", short(v))))?,
    };
    let mut results: Vec<(usize, f32)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| (i, pair_score(query, d)))
        .collect();
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if top_n > 0 {
        results.truncate(usize::try_from(top_n).unwrap_or(usize::MAX));
    }
    let results: Vec<Value> = results
        .into_iter()
        .map(|(i, s)| {
            let text = docs.get(i).and_then(Value::as_str);
            json!({"index": i, "document": {"text": text, "multi_modal": null},
                   "relevance_score": s})
        })
        .collect();
    let tokens = tokens_of(query) * docs.len() as u64 + docs.iter().map(tokens_of).sum::<u64>();
    Ok(
        json!({"id": format!("rerank-mock-{}", ctx.id), "model": ctx.model,
              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results}),
    )
}

/// `POST /pooling`: a vector per `input`, as `data`.
fn pooling(body: &Map<String, Value>, ctx: &Ctx) -> Checked<Value> {
    let items = inputs(body)?;
    let data: Vec<Value> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            json!({"index": i, "object": "pooling", "data": vector(item, DEFAULT_DIMENSIONS)})
        })
        .collect();
    let tokens = items.iter().map(tokens_of).sum();
    Ok(
        json!({"id": format!("pool-mock-{}", ctx.id), "object": "list",
              "created": ctx.created, "model": ctx.model, "data": data, "usage": usage(tokens)}),
    )
}

/// `POST /classify`: two classes per `input` (or one for `messages`).
fn classify(body: &Map<String, Value>, ctx: &Ctx) -> Checked<Value> {
    let items = match body.get("messages").filter(|v| !v.is_null()) {
        Some(m) => vec![m.clone()],
        None => inputs(body)?,
    };
    let data: Vec<Value> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let p = unit(&item.to_string(), 0);
            let label = if p >= 0.5 { "LABEL_0" } else { "LABEL_1" };
            json!({"index": i, "label": label, "probs": [p, 1.0 - p], "num_classes": 2})
        })
        .collect();
    let tokens = items.iter().map(tokens_of).sum();
    Ok(
        json!({"id": format!("classify-mock-{}", ctx.id), "object": "list",
              "created": ctx.created, "model": ctx.model, "data": data, "usage": usage(tokens)}),
    )
}

/// `POST /v1/audio/transcriptions` and `/translations`: a multipart form
/// whose `model` field is optional (absent: the pod's model) and `file`
/// required; answers `{"text": ...}` (JSON whatever `response_format`).
fn audio(cfg: &Config, call: Call, headers: &HeaderMap, body: &[u8]) -> Checked<Value> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let boundary = multipart::boundary(content_type).ok_or_else(|| {
        bad(format!(
            "expected a multipart/form-data body with a boundary, got content-type {content_type:?}"
        ))
    })?;
    let parts = multipart::parts(body, &boundary)
        .map_err(|e| bad(format!("malformed multipart body: {e}")))?;
    let named = multipart::text_field(body, &boundary, "model")
        .map_err(|e| bad(format!("malformed multipart body: {e}")))?;
    models::check(cfg, named.as_deref())?;
    let file = parts
        .iter()
        .find(|p| p.name == "file")
        .ok_or_else(|| bad("the form has no `file` field".into()))?;
    let what = match call {
        Call::Translation => "translation",
        _ => "transcription",
    };
    Ok(
        json!({"text": format!("mock {what} of {} bytes by {}", file.body.len(),
                               models::answered(cfg, named.as_deref()))}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn ctx() -> Ctx {
        Ctx {
            model: "m".into(),
            id: "x-0".into(),
            created: 0,
        }
    }

    #[test]
    fn paths() {
        assert_eq!(Call::of("/v1/embeddings"), Some(Call::Embeddings));
        assert_eq!(Call::of("/v1/rerank"), Some(Call::Rerank));
        assert_eq!(Call::of("/score"), Some(Call::Score));
        assert_eq!(Call::of("/v1/audio/translations"), Some(Call::Translation));
        assert_eq!(Call::of("/v1/chat/completions"), None);
    }

    #[test]
    fn embeddings_float_and_base64_agree() {
        let f = embeddings(&map(json!({"input": ["a", "b"]})), &ctx()).unwrap();
        assert_eq!(f["object"], "list");
        assert_eq!(f["data"][1]["index"], 1);
        assert_eq!(f["data"][0]["object"], "embedding");
        let floats: Vec<f32> = f["data"][0]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(floats.len() as u64, DEFAULT_DIMENSIONS);
        assert!(floats.iter().all(|x| (-1.0..1.0).contains(x)));
        assert_eq!(f["usage"]["prompt_tokens"], 2);
        let b = embeddings(
            &map(json!({"input": ["a", "b"], "encoding_format": "base64", "dimensions": 4})),
            &ctx(),
        )
        .unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b["data"][0]["embedding"].as_str().unwrap())
            .unwrap();
        let decoded: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        assert_eq!(decoded, floats[..4]);
        assert!(embeddings(
            &map(json!({"input": "a", "encoding_format": "bytes"})),
            &ctx()
        )
        .is_err());
        assert!(embeddings(&map(json!({"input": []})), &ctx()).is_err());
        assert!(embeddings(&map(json!({"input": [1, "a"]})), &ctx()).is_err());
        assert!(embeddings(&map(json!({})), &ctx()).is_err());
        // A list of ids is one input.
        let t = embeddings(&map(json!({"input": [1, 2, 3]})), &ctx()).unwrap();
        assert_eq!(t["data"].as_array().unwrap().len(), 1);
        assert_eq!(t["usage"]["prompt_tokens"], 3);
    }

    #[test]
    fn tokenize_and_detokenize() {
        let t = tokenize(&map(json!({"prompt": "Hello world"}))).unwrap();
        assert_eq!(t["count"], 4);
        assert_eq!(t["tokens"].as_array().unwrap().len(), 4);
        assert_eq!(t["max_model_len"], models::MAX_MODEL_LEN);
        assert!(tokenize(&map(
            json!({"messages": [{"role": "user", "content": "x"}]})
        ))
        .is_ok());
        assert!(tokenize(&map(json!({}))).is_err());
        let d = detokenize(&map(json!({"tokens": [1, 2]}))).unwrap();
        assert_eq!(d, json!({"prompt": "<t1><t2>"}));
        assert!(detokenize(&map(json!({"tokens": "x"}))).is_err());
    }

    #[test]
    fn score_rerank_pooling_classify() {
        let s = score(
            &map(json!({"queries": "q", "documents": ["a", "b", "c"]})),
            &ctx(),
        )
        .unwrap();
        assert_eq!(s["data"].as_array().unwrap().len(), 3);
        assert_eq!(s["data"][2]["object"], "score");
        let s2 = score(
            &map(json!({"text_1": "q", "text_2": ["a", "b", "c"]})),
            &ctx(),
        )
        .unwrap();
        assert_eq!(s["data"], s2["data"]);
        assert!(score(&map(json!({"data_1": ["a", "b"], "data_2": ["c"]})), &ctx()).is_err());
        assert!(score(&map(json!({"queries": "q"})), &ctx()).is_err());
        let r = rerank(
            &map(json!({"query": "q", "documents": ["a", "b", "c"], "top_n": 2})),
            &ctx(),
        )
        .unwrap();
        let results = r["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert!(
            results[0]["relevance_score"].as_f64().unwrap()
                >= results[1]["relevance_score"].as_f64().unwrap()
        );
        let i = results[0]["index"].as_u64().unwrap() as usize;
        assert_eq!(results[0]["document"]["text"], ["a", "b", "c"][i]);
        assert_eq!(
            results[0]["relevance_score"], s["data"][i]["score"],
            "the same pair scores the same"
        );
        let p = pooling(&map(json!({"input": "x"})), &ctx()).unwrap();
        assert_eq!(p["data"][0]["object"], "pooling");
        let c = classify(&map(json!({"input": ["x", "y"]})), &ctx()).unwrap();
        assert_eq!(c["data"][1]["num_classes"], 2);
        let probs = c["data"][0]["probs"].as_array().unwrap();
        let sum: f64 = probs.iter().map(|p| p.as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-6);
    }
}

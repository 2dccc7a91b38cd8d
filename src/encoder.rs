//! The encoder leg of E/P/D (vLLM's encoder-cache connectors): a chat
//! request's media items, one encoder request per distinct item, and what
//! the encoders' answers hand to the prefill. Pure: the flow sends the calls.
//!
//! The contract is the one vLLM's own proxy
//! (`examples/disaggregated/disaggregated_encoder/disagg_epd_proxy.py`) and
//! llm-d's sidecar (`pkg/sidecar/proxy/connector_ec_common.go`,
//! `connector_ec_nixl.go`) follow: each item goes alone in a one-message
//! copy of the client's body, capped at one token, not streamed; every
//! encoder must answer 200 before the prefill leaves; with NIXL each
//! answer's `ec_transfer_params` (a map keyed by the item's hash) is merged
//! into one map on the prefill request. docs/engines.md cites the commits.

use crate::body::{Edits, Members};
use crate::error::ClientError;
use crate::fleet::EcConnector;
use serde_json::value::RawValue;
use serde_json::Value;

/// The content-part types that carry media (llm-d's `connector_ec_common.go`;
/// vLLM's proxy knows the first three).
pub const MEDIA_TYPES: [&str; 4] = ["image_url", "audio_url", "input_audio", "video_url"];

/// The body member the EC hand-off travels in, on the prefill request and
/// in each encoder's answer.
pub const EC_PARAMS: &str = "ec_transfer_params";

/// The distinct media items of a chat body's `messages`, each as the
/// client's bytes of its content part (bodies are never re-serialised:
/// docs/architecture.md), in order of first mention. A body without a
/// media type's name anywhere in its messages is not parsed: text requests
/// cost one scan.
pub fn media_items(body: &[u8], top: &Members) -> Result<Vec<String>, ClientError> {
    let Some(messages) = top.raw(body, "messages") else {
        return Ok(Vec::new());
    };
    if !MEDIA_TYPES.iter().any(|t| contains(messages, t.as_bytes())) {
        return Ok(Vec::new());
    }
    let bad = |field: String, message: &str| ClientError::BadField {
        field,
        message: message.to_owned(),
    };
    // `read_fields` checked `messages` is an array of objects.
    let parsed: Vec<Message> = serde_json::from_slice(messages).map_err(|e| {
        bad(
            "messages".into(),
            &format!("is not an array of messages: {e}"),
        )
    })?;
    let mut items: Vec<String> = Vec::new();
    for (mi, message) in parsed.iter().enumerate() {
        let Some(content) = &message.content else {
            continue;
        };
        // A string content is text alone.
        let Ok(parts) = serde_json::from_str::<Vec<&RawValue>>(content.get()) else {
            continue;
        };
        for (pi, raw) in parts.iter().enumerate() {
            let Ok(part) = serde_json::from_str::<Value>(raw.get()) else {
                continue;
            };
            let Some(kind) = part.get("type").and_then(Value::as_str) else {
                continue;
            };
            if !MEDIA_TYPES.contains(&kind) {
                continue;
            }
            let field = format!("messages[{mi}].content[{pi}]");
            check_item(&part, kind).map_err(|m| bad(field, &m))?;
            let item = raw.get().to_owned();
            if !items.contains(&item) {
                items.push(item);
            }
        }
    }
    Ok(items)
}

/// What of a message the encoder leg reads.
#[derive(serde::Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

/// A media part as the engine's parser needs it: `{"type": "image_url",
/// "image_url": {"url": "..."}}` (a bare URL string is accepted too, as
/// vLLM's chat utils do); `input_audio` with its `data` and `format`.
fn check_item(part: &Value, kind: &str) -> Result<(), String> {
    let value = part
        .get(kind)
        .ok_or_else(|| format!("is a {kind:?} part without its {kind:?} member"))?;
    let has = |key: &str| value.get(key).and_then(Value::as_str).is_some();
    let ok = match kind {
        "input_audio" => has("data") && has("format"),
        _ => value.is_string() || has("url"),
    };
    if ok {
        return Ok(());
    }
    Err(match kind {
        "input_audio" => "needs `input_audio` with string members `data` and `format`".into(),
        _ => format!("needs `{kind}` as an object with a string `url`"),
    })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The body of the encoder request for `item`: the client's, with
/// `messages` replaced by one user message holding the item alone, one
/// token at most (`max_completion_tokens` where the client used it), not
/// streamed, no `stream_options`. A `min_tokens` goes too (vLLM refuses
/// one above `max_tokens`), and the client's own `kv_transfer_params`
/// members: the encoder takes no part in the KV hand-off.
pub fn encoder_body(
    body: &[u8],
    top: &Members,
    item: &str,
) -> Result<Vec<u8>, crate::body::SourceMismatch> {
    let mut edits = Edits::new();
    edits.set_raw(
        "messages",
        format!(r#"[{{"role":"user","content":[{item}]}}]"#),
    );
    let completion = top.contains("max_completion_tokens");
    if completion {
        edits.set_u64("max_completion_tokens", 1);
    }
    if !completion || top.contains("max_tokens") {
        edits.set_u64("max_tokens", 1);
    }
    edits.set_bool("stream", false);
    for gone in ["stream_options", "min_tokens", "kv_transfer_params"] {
        if top.contains(gone) {
            edits.remove(gone);
        }
    }
    top.render(body, &edits)
}

/// The `x-request-id` of the encoder request for the `index`th item
/// (llm-d's sidecar: `<id>-enc-<index>`); none when the client's request
/// has none.
pub fn encoder_request_id(request_id: &str, index: usize) -> Option<String> {
    (!request_id.is_empty()).then(|| format!("{request_id}-enc-{index}"))
}

/// Which encoder each of `items` items goes to, given each encoder's
/// queue (`queues`, as last scraped; 0 when unknown): the least loaded,
/// counting the items this request already gave it; ties go in turn from
/// `start` (a random draw), so idle encoders share one request's items and
/// requests start on different ones.
pub fn spread(items: usize, queues: &[f64], start: u64) -> Vec<usize> {
    let n = queues.len();
    if n == 0 {
        return Vec::new();
    }
    let first = (start % n as u64) as usize;
    let mut load: Vec<f64> = queues.to_vec();
    (0..items)
        .map(|_| {
            let best = (0..n)
                .map(|k| (first + k) % n)
                .min_by(|a, b| {
                    let at = |i: &usize| load.get(*i).copied().unwrap_or(f64::INFINITY);
                    at(a).total_cmp(&at(b))
                })
                .unwrap_or(first);
            if let Some(l) = load.get_mut(best) {
                *l += 1.0;
            }
            best
        })
        .collect()
}

/// What one encoder's answer hands to the prefill: the JSON text of its
/// `ec_transfer_params` object (NIXL; an object keyed by the item's hash),
/// as the encoder wrote it; none with the shared-storage connector, or when
/// the answer carries none (llm-d's sidecar warns and goes on: the prefill
/// then encodes that item itself). An answer that is not a JSON object is
/// the encoder's fault.
pub fn answer_params(connector: EcConnector, answer: &[u8]) -> Result<Option<String>, String> {
    if connector == EcConnector::Example {
        return Ok(None);
    }
    let top = Members::parse(answer).map_err(|e| e.describe("the encoder's answer"))?;
    let params = top
        .raw_non_null(answer, EC_PARAMS)
        .filter(|v| v.first() == Some(&b'{'));
    Ok(params.map(|v| String::from_utf8_lossy(v).into_owned()))
}

/// The prefill's `ec_transfer_params`: the encoders' objects merged into
/// one, their members spliced as written (values verbatim, as vLLM's proxy
/// and llm-d's sidecar relay them); none when no member is left. The items
/// are distinct, so their hashes are too.
pub fn merge_params(objects: &[String]) -> Option<String> {
    let inner: Vec<&str> = objects
        .iter()
        .filter_map(|o| {
            let o = o.trim();
            o.strip_prefix('{')?.strip_suffix('}')
        })
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    (!inner.is_empty()).then(|| format!("{{{}}}", inner.join(",")))
}

/// The prefill body with the encoders' hand-off set.
pub fn with_params(prefill: &[u8], params: &str) -> Result<Vec<u8>, String> {
    let top = Members::parse(prefill).map_err(|e| e.to_string())?;
    let mut edits = Edits::new();
    edits.set_raw(EC_PARAMS, params.to_owned());
    top.render(prefill, &edits).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(body: &str) -> Result<Vec<String>, ClientError> {
        let top = Members::parse(body.as_bytes()).expect("parse");
        media_items(body.as_bytes(), &top)
    }

    const IMAGE: &str = r#"{"type":"image_url","image_url":{"url":"https://x/cat.png"}}"#;

    #[test]
    fn media_parts_are_found_once_each_and_text_is_not_parsed() {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"what?"}},{IMAGE},{IMAGE}]}},
               {{"role":"user","content":[{{"type":"input_audio","input_audio":{{"data":"AAAA","format":"wav"}}}}]}}]}}"#
        );
        let found = items(&body).expect("items");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("cat.png") && found[1].contains("input_audio"));
        // Text only, or media words only inside text: no items.
        assert!(items(r#"{"messages":[{"role":"user","content":"hi"}]}"#)
            .expect("text")
            .is_empty());
        assert!(items(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"image_url"}]}]}"#
        )
        .expect("text")
        .is_empty());
        assert!(items(r#"{"prompt":"image_url"}"#)
            .expect("no messages")
            .is_empty());
    }

    #[test]
    fn a_malformed_media_part_names_its_place() {
        for part in [
            r#"{"type":"image_url"}"#,
            r#"{"type":"image_url","image_url":{"uri":"x"}}"#,
            r#"{"type":"input_audio","input_audio":{"data":"AAAA"}}"#,
            r#"{"type":"video_url","video_url":7}"#,
        ] {
            let body = format!(
                r#"{{"messages":[{{"role":"user","content":"x"}},{{"role":"user","content":[{part}]}}]}}"#
            );
            match items(&body) {
                Err(ClientError::BadField { field, .. }) => {
                    assert_eq!(field, "messages[1].content[0]", "{part}")
                }
                other => panic!("{part}: {other:?}"),
            }
        }
        let url_string = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"https://x/a.png"}]}]}"#;
        assert_eq!(items(url_string).expect("a bare url").len(), 1);
    }

    #[test]
    fn an_encoder_body_holds_one_item_one_token_not_streamed() {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{IMAGE}]}}],"stream":true,"stream_options":{{"include_usage":true}},"max_completion_tokens":50,"min_tokens":5,"temperature":0}}"#
        );
        let top = Members::parse(body.as_bytes()).expect("parse");
        let out = encoder_body(body.as_bytes(), &top, IMAGE).expect("body");
        let v: Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["max_completion_tokens"], 1);
        assert!(
            v.get("max_tokens").is_none(),
            "the client used the other name"
        );
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none() && v.get("min_tokens").is_none());
        assert_eq!(v["temperature"], 0);
        assert_eq!(v["messages"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            v["messages"][0]["content"][0]["image_url"]["url"],
            "https://x/cat.png"
        );
        let plain = r#"{"model":"m","messages":[]}"#;
        let top = Members::parse(plain.as_bytes()).expect("parse");
        let out = encoder_body(plain.as_bytes(), &top, IMAGE).expect("body");
        let v: Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(encoder_request_id("r1", 2).as_deref(), Some("r1-enc-2"));
        assert_eq!(encoder_request_id("", 0), None);
    }

    #[test]
    fn items_take_the_least_loaded_encoder_and_idle_ones_in_turn() {
        assert_eq!(spread(5, &[0.0, 0.0], 7), vec![1, 0, 1, 0, 1]);
        assert_eq!(spread(2, &[0.0; 3], 3), vec![0, 1]);
        assert!(spread(2, &[], 3).is_empty());
        // A queue of 5 on the first: it gets an item only once the others
        // have as much.
        assert_eq!(spread(3, &[5.0, 0.0, 1.0], 0), vec![1, 1, 2]);
        assert_eq!(spread(1, &[2.0, 2.0, 0.5], 1), vec![2]);
    }

    #[test]
    fn nixl_answers_merge_into_one_map_verbatim_and_example_answers_are_dropped() {
        let a = br#"{"id":"x","ec_transfer_params":{"h1":{"remote_host":"10.0.0.1","mm_base_addr":18446744073709551615}}}"#;
        let b = br#"{"ec_transfer_params": { "h2":{"remote_port":5} } }"#;
        let params = |answer: &[u8]| answer_params(EcConnector::Nixl, answer).expect("json");
        let (pa, pb) = (params(a).expect("a"), params(b).expect("b"));
        assert_eq!(params(br#"{"ec_transfer_params":null}"#), None);
        assert_eq!(params(br#"{"id":"x"}"#), None);
        assert_eq!(params(br#"{"ec_transfer_params":[1]}"#), None);
        assert!(answer_params(EcConnector::Nixl, b"oops").is_err());
        assert_eq!(answer_params(EcConnector::Example, a), Ok(None));
        let merged = merge_params(&[pa, "{}".into(), pb]).expect("merged");
        assert_eq!(
            merged,
            r#"{"h1":{"remote_host":"10.0.0.1","mm_base_addr":18446744073709551615},"h2":{"remote_port":5}}"#
        );
        let v: Value = serde_json::from_str(&merged).expect("valid JSON");
        assert_eq!(v["h2"]["remote_port"], 5);
        assert_eq!(merge_params(&["{ }".into()]), None);
        let body = with_params(br#"{"model":"m","stream":false}"#, r#"{"h1":{}}"#).expect("set");
        assert_eq!(
            body,
            br#"{"model":"m","stream":false,"ec_transfer_params":{"h1":{}}}"#
        );
    }
}

//! Cached prompt tokens as a single engine would report them.
//!
//! A decode pod counts the KV it received over a hand-off as prefix-cache
//! hits, so its `cached_tokens` is close to `prompt_tokens` whatever the
//! cache held. The prefill pod's own count is the real one: vLLM reports it
//! in `usage.prompt_tokens_details.cached_tokens` (with
//! `--enable-prompt-tokens-details`) and, from 0.31 on NIXL pull and push,
//! in the answer's `kv_transfer_params.remote_prefill_cached_tokens`;
//! SGLang in `usage.prompt_tokens_details.cached_tokens` (with
//! `--enable-cache-report`). `/v1/responses` names them
//! `input_tokens_details` and `input_tokens`. Anthropic's `/v1/messages`
//! has the count flat in `usage.cache_read_input_tokens`, and there
//! `input_tokens` counts only the tokens not read from cache (vLLM's and
//! SGLang's converters: prompt minus cached), so the two are rewritten
//! together and their sum, the prompt, stays.

use super::json::{ambiguous, edit_object, object_member, u64_member};
use crate::body::Members;

/// `(details, prompt count)` member names of a usage object.
const SHAPES: [(&str, &str); 2] = [
    ("prompt_tokens_details", "prompt_tokens"),
    ("input_tokens_details", "input_tokens"),
];

/// `(cached, uncached)` member names of a usage object that holds its
/// cached count flat (Anthropic's Messages API); the prompt is their sum.
const FLAT: (&str, &str) = ("cache_read_input_tokens", "input_tokens");

/// Every member name a usage object's counts are read from or written to.
const USAGE_KEYS: [&str; 5] = [
    "prompt_tokens_details",
    "prompt_tokens",
    "input_tokens_details",
    "input_tokens",
    "cache_read_input_tokens",
];

/// Bytes a usage the rewrite may change contains: a scan for them is far
/// cheaper than a parse, and most stream events hold neither.
pub(crate) const USAGE_NEEDLES: [&[u8]; 2] = [b"cached_tokens", b"cache_read_input_tokens"];

/// Objects a stream event carries its usage in: a Responses event's
/// `response`, a Messages `message_start`'s `message`.
const CONTAINERS: [&str; 2] = ["response", "message"];

/// The cached-token count a usage object states, and its prompt length.
fn usage_counts(usage: &[u8]) -> Option<(u64, Option<u64>)> {
    let top = Members::parse(usage).ok()?;
    if ambiguous(&top, &USAGE_KEYS) {
        return None;
    }
    let nested = SHAPES.iter().find_map(|(details, prompt)| {
        let d = object_member(&top, usage, details)?;
        let dtop = Members::parse(d).ok()?;
        if ambiguous(&dtop, &["cached_tokens"]) {
            return None;
        }
        let cached = u64_member(&dtop, d, "cached_tokens")?;
        Some((cached, u64_member(&top, usage, prompt)))
    });
    nested.or_else(|| {
        let cached = u64_member(&top, usage, FLAT.0)?;
        let uncached = u64_member(&top, usage, FLAT.1);
        Some((cached, uncached.map(|u| u.saturating_add(cached))))
    })
}

/// The prefill pod's real prefix-cache hits, from its answer; bounded by
/// its prompt length (a count above it is nobody's truth).
pub fn prefill_cached_tokens(answer: &[u8]) -> Option<u64> {
    prefill_cached_tokens_in(answer, &Members::parse(answer).ok()?)
}

/// [`prefill_cached_tokens`] of an answer already parsed.
pub fn prefill_cached_tokens_in(answer: &[u8], top: &Members) -> Option<u64> {
    if ambiguous(top, &["usage", "kv_transfer_params"]) {
        return None;
    }
    let from_usage = object_member(top, answer, "usage").and_then(usage_counts);
    let prompt = from_usage.and_then(|(_, p)| p);
    let cached = from_usage.map(|(c, _)| c).or_else(|| {
        let params = object_member(top, answer, "kv_transfer_params")?;
        let ptop = Members::parse(params).ok()?;
        if ambiguous(&ptop, &["remote_prefill_cached_tokens"]) {
            return None;
        }
        u64_member(&ptop, params, "remote_prefill_cached_tokens")
    })?;
    Some(prompt.map_or(cached, |p| cached.min(p)))
}

/// Sets the cached-token count in `usage` of the answer or stream chunk
/// `obj` (or of its `response` or `message`, for a Responses or Messages
/// stream event) where the decode stated one; never adds one where it
/// stated none (a single engine without the details option reports none).
/// `None`: nothing to change.
pub fn set_cached_tokens(obj: &[u8], cached: u64) -> Option<Vec<u8>> {
    edit_object(obj, |top, edits| {
        if ambiguous(top, &["usage", "response", "message"]) {
            return None;
        }
        if let Some(usage) = object_member(top, obj, "usage") {
            edits.set_raw(
                "usage",
                String::from_utf8(set_in_usage(usage, cached)?).ok()?,
            );
            return Some(());
        }
        let (key, inner) = CONTAINERS
            .iter()
            .find_map(|k| Some((*k, object_member(top, obj, k)?)))?;
        let new = set_cached_tokens(inner, cached)?;
        edits.set_raw(key, String::from_utf8(new).ok()?);
        Some(())
    })
}

fn set_in_usage(usage: &[u8], cached: u64) -> Option<Vec<u8>> {
    edit_object(usage, |top, edits| {
        if ambiguous(top, &USAGE_KEYS) {
            return None;
        }
        let Some((details, prompt)) = SHAPES
            .iter()
            .find(|(d, _)| object_member(top, usage, d).is_some())
        else {
            let old = u64_member(top, usage, FLAT.0)?;
            let Some(uncached) = u64_member(top, usage, FLAT.1) else {
                // No prompt to keep whole: the count alone.
                if old != cached {
                    edits.set_u64(FLAT.0, cached);
                }
                return Some(());
            };
            let prompt = uncached.saturating_add(old);
            let new = cached.min(prompt);
            if new != old {
                edits.set_u64(FLAT.0, new);
                edits.set_u64(FLAT.1, prompt - new);
            }
            return Some(());
        };
        let d = object_member(top, usage, details)?;
        let bound = u64_member(top, usage, prompt).map_or(cached, |p| cached.min(p));
        let new = edit_object(d, |dtop, dedits| {
            if ambiguous(dtop, &["cached_tokens"]) {
                return None;
            }
            let old = u64_member(dtop, d, "cached_tokens")?;
            if old != bound {
                dedits.set_u64("cached_tokens", bound);
            }
            Some(())
        })?;
        edits.set_raw(*details, String::from_utf8(new).ok()?);
        Some(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_count_comes_from_usage_else_the_hand_off_bounded_by_the_prompt() {
        let usage = br#"{"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}},"kv_transfer_params":{"remote_prefill_cached_tokens":9}}"#;
        assert_eq!(prefill_cached_tokens(usage), Some(4));
        let params = br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":null},"kv_transfer_params":{"remote_prefill_cached_tokens":9}}"#;
        assert_eq!(prefill_cached_tokens(params), Some(9));
        let over = br#"{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":40}}}"#;
        assert_eq!(prefill_cached_tokens(over), Some(3));
        let responses =
            br#"{"usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":2}}}"#;
        assert_eq!(prefill_cached_tokens(responses), Some(2));
        assert_eq!(
            prefill_cached_tokens(br#"{"usage":{"prompt_tokens":3}}"#),
            None
        );
        assert_eq!(
            prefill_cached_tokens(br#"{"kv_transfer_params":{"remote_prefill_cached_tokens":-1}}"#),
            None
        );
        assert_eq!(prefill_cached_tokens(b"not json"), None);
    }

    #[test]
    fn the_decode_count_is_replaced_in_place_and_nothing_else_moves() {
        let d = br#"{"id":"x","choices":[{"text":"\u00e9","logprobs":null}],"usage":{"prompt_tokens": 12, "total_tokens":18,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens": 12}},"seed":18446744073709551615}"#;
        let out = set_cached_tokens(d, 4).expect("changed");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"id":"x","choices":[{"text":"\u00e9","logprobs":null}],"usage":{"prompt_tokens": 12, "total_tokens":18,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens": 4}},"seed":18446744073709551615}"#,
            "only the value's bytes change"
        );
        assert_eq!(set_cached_tokens(d, 12), None, "already right");
        assert_eq!(
            set_cached_tokens(d, 99),
            None,
            "bounded by the prompt: 12, already there"
        );
        let no_details = br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":null}}"#;
        assert_eq!(set_cached_tokens(no_details, 4), None, "never added");
        assert_eq!(set_cached_tokens(br#"{"usage":null}"#, 4), None);
    }

    #[test]
    fn a_responses_stream_event_is_rewritten_inside_its_response() {
        let ev = br#"{"type":"response.completed","sequence_number":9,"response":{"id":"r","output":[{"x":1.50}],"usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":8},"output_tokens":2}}}"#;
        let out = String::from_utf8(set_cached_tokens(ev, 3).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"type":"response.completed","sequence_number":9,"response":{"id":"r","output":[{"x":1.50}],"usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":3},"output_tokens":2}}}"#
        );
    }

    #[test]
    fn a_messages_usage_holds_its_count_flat_beside_the_uncached_rest() {
        // input_tokens is what was not read from cache: prompt 40, 16 cached.
        let answer = br#"{"type":"message","usage":{"input_tokens":24,"output_tokens":1,"cache_read_input_tokens":16}}"#;
        assert_eq!(prefill_cached_tokens(answer), Some(16));
        // The decode read all 40 from the hand-off.
        let decode = br#"{"type":"message","usage":{"input_tokens":0,"output_tokens":9,"cache_read_input_tokens":40}}"#;
        let out = String::from_utf8(set_cached_tokens(decode, 16).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"type":"message","usage":{"input_tokens":24,"output_tokens":9,"cache_read_input_tokens":16}}"#
        );
        let start = br#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":2,"output_tokens":0,"cache_read_input_tokens":10}}}"#;
        let out = String::from_utf8(set_cached_tokens(start, 30).unwrap()).unwrap();
        assert!(
            out.contains(r#""input_tokens":0,"output_tokens":0,"cache_read_input_tokens":12"#),
            "bounded by the prompt, 12: {out}"
        );
        let out = String::from_utf8(set_cached_tokens(start, 5).unwrap()).unwrap();
        assert!(
            out.contains(r#""input_tokens":7,"output_tokens":0,"cache_read_input_tokens":5"#),
            "{out}"
        );
        let delta = br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}"#;
        assert_eq!(set_cached_tokens(delta, 5), None, "never added");
    }

    #[test]
    fn counts_behind_a_duplicated_name_are_left_as_the_engine_wrote_them() {
        // Found by fuzz/sse_rewrite: the scanner read the first
        // `prompt_tokens` as the bound, a client's parser the last.
        let dup_prompt = br#"{"usage":{"prompt_tokens":8,"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert_eq!(set_cached_tokens(dup_prompt, 10), None);
        assert_eq!(prefill_cached_tokens(dup_prompt), None);
        let dup_cached = br#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":4,"cached_tokens":5}}}"#;
        assert_eq!(set_cached_tokens(dup_cached, 2), None);
        assert_eq!(prefill_cached_tokens(dup_cached), None);
        let dup_usage = br#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":4}},"usage":null}"#;
        assert_eq!(set_cached_tokens(dup_usage, 2), None);
        assert_eq!(prefill_cached_tokens(dup_usage), None);
        let dup_params = br#"{"kv_transfer_params":{"remote_prefill_cached_tokens":3,"remote_prefill_cached_tokens":4}}"#;
        assert_eq!(prefill_cached_tokens(dup_params), None);
        let unrelated = br#"{"usage":{"prompt_tokens":9,"x":1,"x":2,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert!(
            set_cached_tokens(unrelated, 2).is_some(),
            "other names may repeat"
        );
    }
}

//! The decode's own `kv_transfer_params` in its answer (vLLM's
//! bidirectional NIXL transfer: the handle to the decode's KV that the
//! conversation's next prefill can pull from; `crate::reuse`), taken out
//! of the answer the client sees: it names pods and blocks, the router's
//! business. vLLM puts it at the top level of a non-streamed answer and of
//! the stream chunk that carries a `finish_reason`.

use crate::body::{Edits, Members};
use serde_json::value::RawValue;

/// The params one answer object carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The `kv_transfer_params` object as the decode wrote it.
    pub params: Vec<u8>,
    /// A choice in the same object finished normally (`stop` or `length`):
    /// only then does vLLM keep the decode's blocks.
    pub finished: bool,
}

/// `obj` without its `kv_transfer_params`, and what they were; `None`
/// when it has none (or is not an object).
pub fn take(obj: &[u8]) -> Option<(Vec<u8>, Taken)> {
    let top = Members::parse(obj).ok()?;
    let raw = top.raw_non_null(obj, "kv_transfer_params")?;
    if raw.first() != Some(&b'{') {
        return None;
    }
    let params = raw.to_vec();
    let finished = top
        .raw_non_null(obj, "choices")
        .and_then(|c| serde_json::from_slice::<Vec<&RawValue>>(c).ok())
        .is_some_and(|choices| {
            choices.iter().any(|c| {
                #[derive(serde::Deserialize)]
                struct Choice<'a> {
                    #[serde(borrow)]
                    finish_reason: Option<&'a str>,
                }
                serde_json::from_str::<Choice>(c.get())
                    .is_ok_and(|c| matches!(c.finish_reason, Some("stop" | "length")))
            })
        });
    let mut strip = Edits::new();
    strip.remove("kv_transfer_params");
    let stripped = top.render(obj, &strip).ok()?;
    Some((stripped, Taken { params, finished }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_chunks_params_are_taken_out_with_its_finish() {
        let chunk = br#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"kv_transfer_params":{"do_remote_decode":true,"remote_block_ids":[[4,5]]}}"#;
        let (stripped, taken) = take(chunk).expect("params");
        assert_eq!(
            String::from_utf8_lossy(&stripped),
            r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#
        );
        assert!(taken.finished);
        assert_eq!(
            taken.params,
            br#"{"do_remote_decode":true,"remote_block_ids":[[4,5]]}"#.to_vec()
        );
    }

    #[test]
    fn an_aborted_answer_or_none_at_all_keeps_nothing() {
        let aborted = br#"{"choices":[{"finish_reason":"abort"}],"kv_transfer_params":{"x":1}}"#;
        assert!(take(aborted).is_some_and(|(_, t)| !t.finished));
        assert!(take(br#"{"choices":[],"kv_transfer_params":null}"#).is_none());
        assert!(take(b"not json").is_none());
    }
}

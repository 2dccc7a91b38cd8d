//! Prompt logprobs where a single engine would put them.
//!
//! Only the prefill pod computes the prompt: vLLM skips reading the prefix
//! cache (and so the hand-off) for a request that asks for prompt logprobs,
//! and an SGLang decode has no input logprobs. So the decode leg is sent
//! without the asking fields and the prefill's prompt part is put into the
//! decode's answer: vLLM's `prompt_logprobs` (top level for chat, per choice
//! for completions) as the prefill computed it, and for completions `echo`
//! with `logprobs` the prompt's text and token logprobs ahead of each
//! choice's own, offsets moved past the prompt (as vLLM's test proxy and
//! vllm-router merge them, but in code points, as vLLM counts offsets).

use super::json::{ambiguous, array_items, edit_object, join_array, object_member, u64_member};
use crate::body::{json_string, Members};

/// What the client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptLogprobs {
    /// vLLM's `prompt_logprobs`.
    Field,
    /// Completions `echo` with `logprobs`; the client's prompt text.
    Echo { prompt_text: String },
}

/// The prompt's part of a prefill answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptPart {
    /// Chat: the top-level `prompt_logprobs`.
    top: Option<String>,
    /// Completions: the first choice's `prompt_logprobs`.
    choice: Option<String>,
    echo: Option<EchoPart>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct EchoPart {
    text: String,
    tokens: Vec<String>,
    token_logprobs: Vec<String>,
    top_logprobs: Option<Vec<String>>,
    /// The prompt's offsets as the prefill wrote them.
    text_offset: Vec<String>,
    /// Where the first generated token starts, past the prompt; `None`
    /// when the engine gives no real offsets (SGLang writes -1).
    shift: Option<u64>,
}

fn owned(items: Vec<&[u8]>) -> Vec<String> {
    items
        .into_iter()
        .map(|i| String::from_utf8_lossy(i).into_owned())
        .collect()
}

impl PromptPart {
    /// Reads the prompt part of the prefill's answer; `None` when it has
    /// nothing of what was asked.
    pub fn of(answer: &[u8], asked: &PromptLogprobs) -> Option<PromptPart> {
        PromptPart::of_parsed(answer, &Members::parse(answer).ok()?, asked)
    }

    /// [`PromptPart::of`] an answer already parsed.
    pub fn of_parsed(answer: &[u8], top: &Members, asked: &PromptLogprobs) -> Option<PromptPart> {
        if ambiguous(top, &["choices", "prompt_logprobs", "usage"]) {
            return None;
        }
        let raw = |t: &Members, src: &[u8], k: &str| {
            t.raw_non_null(src, k)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let choice0 = top
            .raw_non_null(answer, "choices")
            .and_then(array_items)
            .and_then(|c| c.first().copied())
            .filter(|c| c.first() == Some(&b'{'));
        let ctop = choice0.and_then(|c| Members::parse(c).ok());
        if ctop
            .as_ref()
            .is_some_and(|t| ambiguous(t, &["prompt_logprobs", "logprobs"]))
        {
            return None;
        }
        let mut part = PromptPart {
            top: raw(top, answer, "prompt_logprobs"),
            choice: match (&ctop, choice0) {
                (Some(t), Some(c)) => raw(t, c, "prompt_logprobs"),
                _ => None,
            },
            echo: None,
        };
        if let (PromptLogprobs::Echo { prompt_text }, Some(t), Some(c)) = (asked, &ctop, choice0) {
            let generated = object_member(top, answer, "usage")
                .and_then(|u| u64_member(&Members::parse(u).ok()?, u, "completion_tokens"))
                .unwrap_or(1) as usize;
            part.echo = echo_part(t, c, prompt_text, part.choice.as_deref(), generated);
        }
        (part.top.is_some() || part.choice.is_some() || part.echo.is_some()).then_some(part)
    }
}

/// The members of a completions `logprobs` object an echo reads and writes.
const LOGPROBS_KEYS: [&str; 4] = ["tokens", "token_logprobs", "top_logprobs", "text_offset"];

fn echo_part(
    choice: &Members,
    src: &[u8],
    prompt_text: &str,
    prompt_logprobs: Option<&str>,
    generated: usize,
) -> Option<EchoPart> {
    let lp = object_member(choice, src, "logprobs")?;
    let lt = Members::parse(lp).ok()?;
    if ambiguous(&lt, &LOGPROBS_KEYS) {
        return None;
    }
    let items = |k: &str| lt.raw_non_null(lp, k).and_then(array_items);
    let tokens = items("tokens")?;
    // vLLM: one prompt_logprobs entry per prompt token; else all but the
    // generated ones.
    let n = prompt_logprobs
        .and_then(|p| array_items(p.as_bytes()).map(|a| a.len()))
        .unwrap_or_else(|| tokens.len().saturating_sub(generated));
    let cut = |v: Vec<&[u8]>| owned(v.into_iter().take(n).collect());
    let offsets = items("text_offset").unwrap_or_default();
    let shift = match offsets.get(n) {
        Some(o) => serde_json::from_slice::<u64>(o).ok(),
        None => Some(prompt_text.chars().count() as u64),
    };
    Some(EchoPart {
        text: prompt_text.to_owned(),
        token_logprobs: cut(items("token_logprobs")?),
        top_logprobs: items("top_logprobs").map(cut),
        tokens: cut(tokens),
        text_offset: cut(offsets),
        shift,
    })
}

/// Puts `part` into the decode's answer or stream chunk `obj`. `first`
/// tells, per choice index, whether this is the first time it is seen (so
/// the prompt leads it); `whole`: a complete answer, not a chunk.
pub fn merge(
    obj: &[u8],
    part: &PromptPart,
    whole: bool,
    first: &mut dyn FnMut(u64) -> bool,
) -> Option<Vec<u8>> {
    edit_object(obj, |top, edits| {
        if ambiguous(top, &["prompt_logprobs", "choices"]) {
            return None;
        }
        if let (Some(p), true) = (&part.top, whole) {
            if top
                .raw_non_null(obj, "prompt_logprobs")
                .map(|v| v != p.as_bytes())
                != Some(false)
            {
                edits.set_raw("prompt_logprobs", p.clone());
            }
        }
        if part.choice.is_none() && part.echo.is_none() {
            return Some(());
        }
        let choices = top.raw_non_null(obj, "choices").and_then(array_items)?;
        let mut changed = false;
        let merged: Vec<Vec<u8>> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let new = merge_choice(c, part, whole, first, i as u64);
                changed |= new.is_some();
                new.unwrap_or_else(|| c.to_vec())
            })
            .collect();
        if changed {
            edits.set_raw("choices", join_array(merged.iter().map(Vec::as_slice)));
        }
        Some(())
    })
}

fn merge_choice(
    choice: &[u8],
    part: &PromptPart,
    whole: bool,
    first: &mut dyn FnMut(u64) -> bool,
    position: u64,
) -> Option<Vec<u8>> {
    edit_object(choice, |top, edits| {
        if ambiguous(top, &["index", "prompt_logprobs", "text", "logprobs"]) {
            return None;
        }
        let index = u64_member(top, choice, "index").unwrap_or(position);
        let lead = first(index);
        if let (Some(p), true, true) = (&part.choice, whole, lead) {
            edits.set_raw("prompt_logprobs", p.clone());
        }
        let Some(echo) = &part.echo else {
            return Some(());
        };
        if lead {
            let text: String = top
                .raw_non_null(choice, "text")
                .and_then(|t| serde_json::from_slice(t).ok())
                .unwrap_or_default();
            edits.set_raw("text", json_string(&format!("{}{text}", echo.text)));
        }
        if let Some(lp) = object_member(top, choice, "logprobs") {
            if let Some(new) = merge_logprobs(lp, echo, lead) {
                edits.set_raw("logprobs", String::from_utf8(new).ok()?);
            }
        }
        Some(())
    })
}

fn merge_logprobs(lp: &[u8], echo: &EchoPart, lead: bool) -> Option<Vec<u8>> {
    edit_object(lp, |top, edits| {
        if ambiguous(top, &LOGPROBS_KEYS) {
            return None;
        }
        if lead {
            for (key, prompt) in [
                ("tokens", Some(&echo.tokens)),
                ("token_logprobs", Some(&echo.token_logprobs)),
                ("top_logprobs", echo.top_logprobs.as_ref()),
            ] {
                let own = top.raw_non_null(lp, key).and_then(array_items);
                if let (Some(prompt), Some(own)) = (prompt, own) {
                    let head = prompt.iter().map(|s| s.as_bytes());
                    edits.set_raw(key, join_array(head.chain(own)));
                }
            }
        }
        let Some(own) = top.raw_non_null(lp, "text_offset").and_then(array_items) else {
            return Some(());
        };
        // Offsets move past the prompt only when both sides give real ones.
        let shifted: Option<Vec<String>> = echo.shift.and_then(|shift| {
            own.iter()
                .map(|x| {
                    serde_json::from_slice::<u64>(x)
                        .ok()
                        .map(|o| (o + shift).to_string())
                })
                .collect()
        });
        let own: Vec<String> = match shifted {
            Some(s) => s,
            None => own
                .iter()
                .map(|x| String::from_utf8_lossy(x).into_owned())
                .collect(),
        };
        let head = if lead {
            echo.text_offset.as_slice()
        } else {
            &[]
        };
        edits.set_raw(
            "text_offset",
            join_array(head.iter().chain(own.iter()).map(|s| s.as_bytes())),
        );
        Some(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P_ECHO: &[u8] = br#"{"id":"cmpl-p","choices":[{"index":0,"text":"Hi there!","logprobs":{"text_offset":[0,2,8],"token_logprobs":[null,-0.5,-1.25],"tokens":["Hi"," there","!"],"top_logprobs":[null,{" there":-0.5},{"!":-1.25}]},"finish_reason":"length","prompt_logprobs":[null,{"11":{"logprob":-0.5,"rank":1,"decoded_token":" there"}}]}],"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1}}"#;

    fn echo() -> PromptLogprobs {
        PromptLogprobs::Echo {
            prompt_text: "Hi there".into(),
        }
    }

    #[test]
    fn echo_answers_get_the_prompt_ahead_of_each_choice() {
        let part = PromptPart::of(P_ECHO, &echo()).expect("part");
        let d = br#"{"id":"cmpl-d","choices":[{"index":0,"text":"! Ok","logprobs":{"text_offset":[0,1],"token_logprobs":[-1.25,-2.0e-5],"tokens":["!"," Ok"],"top_logprobs":[{"!":-1.25},{" Ok":-2.0e-5}]},"finish_reason":"length","prompt_logprobs":null}],"usage":{"prompt_tokens":2,"completion_tokens":2}}"#;
        let out = merge(d, &part, true, &mut |_| true).expect("merged");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"id":"cmpl-d","choices":[{"index":0,"text":"Hi there! Ok","logprobs":{"text_offset":[0,2,8,9],"token_logprobs":[null,-0.5,-1.25,-2.0e-5],"tokens":["Hi"," there","!"," Ok"],"top_logprobs":[null,{" there":-0.5},{"!":-1.25},{" Ok":-2.0e-5}]},"finish_reason":"length","prompt_logprobs":[null,{"11":{"logprob":-0.5,"rank":1,"decoded_token":" there"}}]}],"usage":{"prompt_tokens":2,"completion_tokens":2}}"#
        );
    }

    #[test]
    fn a_choice_or_answer_with_a_duplicated_name_it_reads_is_left_alone() {
        let part = PromptPart::of(P_ECHO, &echo()).expect("part");
        let dup_text = br#"{"choices":[{"index":0,"text":"! Ok","text":"!","logprobs":null}]}"#;
        assert_eq!(merge(dup_text, &part, true, &mut |_| true), None);
        let dup_tokens = br#"{"choices":[{"index":0,"logprobs":{"text_offset":[0],"tokens":["!"],"tokens":[" Ok"],"token_logprobs":[-1.25]}}]}"#;
        let out = merge(dup_tokens, &part, true, &mut |_| true).expect("text merged");
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains(r#""tokens":["!"],"tokens":[" Ok"]"#),
            "the logprobs object is kept as it was"
        );
        let dup_choices = br#"{"choices":[{"index":0,"text":"A"}],"choices":[]}"#;
        assert_eq!(merge(dup_choices, &part, true, &mut |_| true), None);
        let p =
            String::from_utf8_lossy(P_ECHO).replace(r#""choices""#, r#""choices":[],"choices""#);
        assert!(PromptPart::of(p.as_bytes(), &echo()).is_none());
    }

    #[test]
    fn stream_chunks_lead_with_the_prompt_once_per_choice_and_shift_the_rest() {
        let part = PromptPart::of(P_ECHO, &echo()).expect("part");
        let mut seen = Vec::new();
        let mut first = |i: u64| {
            let f = !seen.contains(&i);
            seen.push(i);
            f
        };
        let c1 = br#"{"choices":[{"index":0,"text":"!","logprobs":{"text_offset":[0],"token_logprobs":[-1.25],"tokens":["!"],"top_logprobs":null}}]}"#;
        let out = String::from_utf8(merge(c1, &part, false, &mut first).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"choices":[{"index":0,"text":"Hi there!","logprobs":{"text_offset":[0,2,8],"token_logprobs":[null,-0.5,-1.25],"tokens":["Hi"," there","!"],"top_logprobs":null}}]}"#
        );
        let c2 = br#"{"choices":[{"index":0,"text":" Ok","logprobs":{"text_offset":[1],"token_logprobs":[-2.0],"tokens":[" Ok"],"top_logprobs":null}}]}"#;
        let out = String::from_utf8(merge(c2, &part, false, &mut first).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"choices":[{"index":0,"text":" Ok","logprobs":{"text_offset":[9],"token_logprobs":[-2.0],"tokens":[" Ok"],"top_logprobs":null}}]}"#
        );
        assert_eq!(
            merge(br#"{"choices":[],"usage":{}}"#, &part, false, &mut first),
            None
        );
    }

    #[test]
    fn offsets_an_engine_does_not_compute_are_kept_as_it_wrote_them() {
        let p = br#"{"choices":[{"index":0,"text":"Hi there!","logprobs":{"text_offset":[-1,-1,-1],"token_logprobs":[null,-0.5,-1.25],"tokens":["Hi"," there","!"],"top_logprobs":null}}],"usage":{"completion_tokens":1}}"#;
        let part = PromptPart::of(p, &echo()).expect("part");
        let d = br#"{"choices":[{"index":0,"text":"!","logprobs":{"text_offset":[-1],"token_logprobs":[-1.25],"tokens":["!"],"top_logprobs":null}}]}"#;
        assert_eq!(
            String::from_utf8(merge(d, &part, true, &mut |_| true).unwrap()).unwrap(),
            r#"{"choices":[{"index":0,"text":"Hi there!","logprobs":{"text_offset":[-1,-1,-1],"token_logprobs":[null,-0.5,-1.25],"tokens":["Hi"," there","!"],"top_logprobs":null}}]}"#
        );
    }

    #[test]
    fn the_prompt_logprobs_field_is_copied_where_vllm_puts_it() {
        let p_chat = br#"{"choices":[{"index":0,"message":{"content":"A"}}],"prompt_logprobs":[null,{"5":{"logprob":-3.5,"rank":2,"decoded_token":"a"}}]}"#;
        let part = PromptPart::of(p_chat, &PromptLogprobs::Field).expect("part");
        let d = br#"{"choices":[{"index":0,"message":{"content":"A long"}}],"usage":{},"prompt_logprobs":null}"#;
        assert_eq!(
            String::from_utf8(merge(d, &part, true, &mut |_| true).unwrap()).unwrap(),
            r#"{"choices":[{"index":0,"message":{"content":"A long"}}],"usage":{},"prompt_logprobs":[null,{"5":{"logprob":-3.5,"rank":2,"decoded_token":"a"}}]}"#
        );
        let p_cmpl = br#"{"choices":[{"index":0,"text":"A","prompt_logprobs":[null,{"5":{"logprob":-3.5}}]}]}"#;
        let part = PromptPart::of(p_cmpl, &PromptLogprobs::Field).expect("part");
        let d = br#"{"choices":[{"index":0,"text":"A b","prompt_logprobs":null},{"index":1,"text":"C","prompt_logprobs":null}]}"#;
        assert_eq!(
            String::from_utf8(merge(d, &part, true, &mut |_| true).unwrap()).unwrap(),
            r#"{"choices":[{"index":0,"text":"A b","prompt_logprobs":[null,{"5":{"logprob":-3.5}}]},{"index":1,"text":"C","prompt_logprobs":[null,{"5":{"logprob":-3.5}}]}]}"#
        );
        assert_eq!(
            PromptPart::of(br#"{"choices":[]}"#, &PromptLogprobs::Field),
            None
        );
    }
}

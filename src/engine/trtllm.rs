use super::handler::{EngineHandler, Merged, PrefillAnswer};
use super::trt_generation_first as generation_first;
use crate::api::Api;
use crate::body::{Edits, Members};
use crate::error::EngineError;
use crate::fleet::{Connector, Endpoint, Model};
use crate::handoff::{Degraded, LearnedPods, LegEdits, Legs, PdContext};
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// TensorRT-LLM's disaggregated serving: a `context_only` request with a
/// snowflake id, then a `generation_only` request carrying the context
/// phase's `disaggregated_params` and the prompt as token ids: an array of
/// integers, or for chat with `trt_token_ids_b64` one base64 string of
/// little-endian int32s (`prompt_token_ids_b64`), which the router relays
/// without reading a single id.
///
/// `schedule_style: generation_first` (TensorRT-LLM's
/// `_send_disagg_request_gen_first`): both legs leave at once, the context
/// server waits for the generation server's request for the KV, and the
/// generation leg names the context server from what its `GET
/// /server_info` said (see [`generation_first`]).
pub struct TrtllmHandler;

const IDS: &str = "prompt_token_ids";
const IDS_B64: &str = "prompt_token_ids_b64";

impl EngineHandler for TrtllmHandler {
    fn name(&self) -> &'static str {
        "trtllm"
    }

    fn concurrent(&self) -> bool {
        false
    }

    fn concurrent_for(&self, ctx: &PdContext, _prefill: &Endpoint) -> bool {
        // A generation-first context waits for its generation leg:
        // awaiting the context answer first would deadlock.
        ctx.trt_generation_first
    }

    /// A generation-first context server takes prefills once its
    /// `/server_info` is known: the generation leg must name it.
    fn prefill_ready(
        &self,
        model: &Model,
        pod: &Endpoint,
        _connector: Connector,
        learned: &LearnedPods,
    ) -> bool {
        !model.trt_generation_first || learned.trt_server_info(pod.id).is_some()
    }

    fn should_split(&self, ctx: &PdContext, _prefill: &Endpoint) -> bool {
        // trtllm-serve has no Messages or token-in API: the generation
        // server answers such a path itself (its local prefill, or a 404).
        !matches!(ctx.fields.api, Api::Messages | Api::Generate)
    }

    fn owned_keys(&self) -> &'static [&'static str] {
        &["disaggregated_params", IDS, IDS_B64]
    }

    fn augment_prefill_request(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        match ctx.fields.api {
            Api::Responses => {
                return Err(EngineError::Unsupported(
                    "TensorRT-LLM disaggregated serving supports /v1/completions and /v1/chat/completions only".into(),
                ))
            }
            Api::Completions if ctx.fields.prompt_batch.is_some() => {
                return Err(EngineError::Unsupported(
                    "TensorRT-LLM disaggregated serving accepts a single prompt per /v1/completions request; send each prompt separately".into(),
                ))
            }
            _ => {}
        }
        // The context phase rejects max_completion_tokens next to max_tokens.
        legs.prefill.body.remove("max_completion_tokens");
        let id = ctx.disagg_request_id.ok_or_else(|| {
            EngineError::Internal(
                "no TensorRT-LLM disagg request id was drawn for this split".into(),
            )
        })?;
        if ctx.trt_generation_first {
            return generation_first::legs(ctx, pod, id, legs);
        }
        // TensorRT-LLM's context workers answer base64 ids on chat only.
        let b64 = if ctx.trt_token_ids_b64 && ctx.fields.api == Api::ChatCompletions {
            r#","return_prompt_token_ids_b64":true"#
        } else {
            ""
        };
        legs.prefill.body.set_raw(
            "disaggregated_params",
            format!(r#"{{"request_type":"context_only","disagg_request_id":{id}{b64}}}"#),
        );
        Ok(())
    }

    fn merge_prefill_response(
        &self,
        ctx: &mut PdContext,
        answer: &PrefillAnswer,
        _pod: &Endpoint,
        decode: &mut LegEdits,
    ) -> Result<Merged, EngineError> {
        let bad = |m: &str| EngineError::BadPrefillAnswer(m.to_owned());
        let first_choice = first_choice(answer)?;
        let choice_top = first_choice
            .map(|c| Members::parse(c.get().as_bytes()).map(|t| (c, t)))
            .transpose()
            .map_err(|_| bad("choices[0] is not an object"))?;

        // Finished in the context phase (stop token, or max_tokens == 1 hit
        // with nothing left): the context answer is the client's answer.
        if let Some((c, t)) = &choice_top {
            let reason = t.raw_non_null(c.get().as_bytes(), "finish_reason");
            if let Some(reason) = reason {
                let reason: String = serde_json::from_slice(reason)
                    .map_err(|_| bad("choices[0].finish_reason is not a string"))?;
                if reason != "length" && reason != "not_finished" {
                    return short_circuit(ctx, answer);
                }
            }
        }

        // AIBrix looks at the top level first; TensorRT-LLM puts them in choices[0].
        let params = answer
            .top
            .raw_non_null(answer.body, "disaggregated_params")
            .or_else(|| {
                choice_top
                    .as_ref()
                    .and_then(|(c, t)| t.raw_non_null(c.get().as_bytes(), "disaggregated_params"))
            });
        let Some(params) = params else {
            // No hand-off: the generation server serves the client's request
            // whole (TensorRT-LLM runs a request without disaggregated_params
            // as an ordinary one), as vLLM's decode recomputes without
            // kv_transfer_params.
            return Ok(Merged::Decode(Some(Degraded::HandoffMissing)));
        };
        let params_top =
            Members::parse(params).map_err(|_| bad("disaggregated_params is not an object"))?;
        let mut gen = Edits::new();
        gen.set_str("request_type", "generation_only");
        let params = params_top.render(params, &gen).map_err(internal)?;
        if let Some(key) = ctx.trt_auth_key {
            if let Some(signature) = super::trt_auth::sign(key, &params)? {
                decode.set_header(super::trt_auth::HEADER, signature);
            }
        }
        decode.body.set_raw_bytes("disaggregated_params", &params);
        relay_ids(ctx, answer, decode)
    }
}

/// The context answer's token ids into the generation request, in the form
/// the context answered them.
fn relay_ids(
    ctx: &PdContext,
    answer: &PrefillAnswer,
    decode: &mut LegEdits,
) -> Result<Merged, EngineError> {
    let bad = |m: &str| EngineError::BadPrefillAnswer(m.to_owned());
    let present = |name: &str| answer.top.span_non_null(answer.body, name);
    // The base64 form is relayed as it came, as TensorRT-LLM's orchestrator
    // does; its generation worker decodes it, and only for chat.
    if ctx.fields.api == Api::ChatCompletions {
        if let Some(b64) = present(IDS_B64) {
            // `""` would hand the generation a prompt of no tokens.
            if answer.body.get(b64.start) != Some(&b'"') || b64.len() < 3 {
                return Err(bad(
                    "prompt_token_ids_b64 in the context response is not a non-empty string",
                ));
            }
            decode.body.copy_from(IDS_B64, answer.body, b64);
            return Ok(Merged::Decode(None));
        }
    }
    // Older chat endpoints do not echo the prompt's token ids; the
    // generation server then tokenises the prompt itself (TensorRT-LLM's own
    // orchestrator forwards without them too).
    let Some(tokens) = present(IDS) else {
        return Ok(Merged::Decode(Some(Degraded::TokenIdsMissing)));
    };
    if answer.body.get(tokens.start) != Some(&b'[') {
        return Err(bad(
            "prompt_token_ids in the context response is not an array",
        ));
    }
    // Hundreds of KB for a long prompt: copied from the answer into the
    // generation request once, when it is rendered.
    match ctx.fields.api {
        Api::Completions => decode.body.copy_from("prompt", answer.body, tokens),
        _ => decode.body.copy_from(IDS, answer.body, tokens),
    }
    Ok(Merged::Decode(None))
}

fn internal(e: crate::body::SourceMismatch) -> EngineError {
    EngineError::Internal(e.to_string())
}

fn first_choice<'a>(answer: &PrefillAnswer<'a>) -> Result<Option<&'a RawValue>, EngineError> {
    let Some(raw) = answer.top.raw_non_null(answer.body, "choices") else {
        return Ok(None);
    };
    let choices: Vec<&'a RawValue> = serde_json::from_slice(raw)
        .map_err(|_| EngineError::BadPrefillAnswer("choices is not an array".into()))?;
    Ok(choices.first().copied())
}

/// The context response as the client asked for it. Streaming clients get
/// it as one SSE chunk (chat deltas, completions text), an optional usage
/// chunk, and `[DONE]`.
fn short_circuit(ctx: &PdContext, answer: &PrefillAnswer) -> Result<Merged, EngineError> {
    if !ctx.fields.stream {
        // The ids are a hand-off field, possibly large; the client did not
        // ask for them.
        let mut strip = Edits::new();
        strip.remove(IDS);
        strip.remove(IDS_B64);
        return Ok(Merged::Answer {
            body: answer.top.render(answer.body, &strip).map_err(internal)?,
            content_type: "application/json",
        });
    }
    // This path is rare and small (one finished choice), so a Value is fine;
    // serde_json keeps 64-bit integers exact.
    let v: Value = serde_json::from_slice(answer.body)
        .map_err(|e| EngineError::BadPrefillAnswer(e.to_string()))?;
    let chat = ctx.fields.api != Api::Completions;
    let choices: Vec<Value> = v
        .get("choices")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    let (key, content) = if chat {
                        ("delta", c.get("message").cloned().unwrap_or(json!({})))
                    } else {
                        ("text", c.get("text").cloned().unwrap_or(json!("")))
                    };
                    let mut out = serde_json::Map::new();
                    out.insert(key.into(), content);
                    out.insert("index".into(), c.get("index").cloned().unwrap_or(json!(0)));
                    out.insert(
                        "finish_reason".into(),
                        c.get("finish_reason").cloned().unwrap_or(Value::Null),
                    );
                    out.insert(
                        "logprobs".into(),
                        c.get("logprobs").cloned().unwrap_or(Value::Null),
                    );
                    Value::Object(out)
                })
                .collect()
        })
        .unwrap_or_default();
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let head = |extra: Value| {
        let mut chunk = json!({
            "id": v.get("id").cloned().unwrap_or(Value::Null),
            "object": object,
            "created": v.get("created").cloned().unwrap_or(Value::Null),
            "model": v.get("model").cloned().unwrap_or(Value::Null),
        });
        if let (Some(obj), Value::Object(extra)) = (chunk.as_object_mut(), extra) {
            obj.extend(extra);
        }
        chunk
    };
    let mut sse = Vec::new();
    let mut event = |chunk: &Value| {
        sse.extend_from_slice(b"data: ");
        sse.extend_from_slice(chunk.to_string().as_bytes());
        sse.extend_from_slice(b"\n\n");
    };
    event(&head(json!({ "choices": choices })));
    if ctx.fields.include_usage {
        if let Some(usage) = v.get("usage") {
            event(&head(json!({ "choices": [], "usage": usage })));
        }
    }
    sse.extend_from_slice(b"data: [DONE]\n\n");
    Ok(Merged::Answer {
        body: sse,
        content_type: "text/event-stream",
    })
}

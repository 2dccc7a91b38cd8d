//! `usage`, as each engine reports it: the token counts and the
//! `prompt_tokens_details` (cached tokens) that vLLM, SGLang and
//! TensorRT-LLM each write differently.

use serde_json::{json, Map, Number, Value};

use crate::config::{Config, Flavor};

/// `usage.prompt_tokens_details`, as the engine reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum Details {
    /// No such member (TensorRT-LLM, as before).
    Absent,
    /// `"prompt_tokens_details": null` (vLLM without
    /// `--enable-prompt-tokens-details`, SGLang without
    /// `--enable-cache-report` or with nothing cached).
    Null,
    /// `{"cached_tokens": N}`. Any JSON integer: a vLLM decode reports a
    /// relayed `remote_prefill_cached_tokens` unchecked, negative included.
    Cached(Number),
}

impl Details {
    /// What the engine reports for `count` cached tokens.
    pub fn of(cfg: &Config, count: &Number) -> Details {
        match cfg.flavor() {
            Flavor::Vllm if cfg.prompt_tokens_details => Details::Cached(count.clone()),
            Flavor::Vllm => Details::Null,
            // SGLang's `_details_if_cached`: only a count > 0.
            Flavor::Sglang if cfg.enable_cache_report && count.as_u64().is_some_and(|n| n > 0) => {
                Details::Cached(count.clone())
            }
            Flavor::Sglang => Details::Null,
            Flavor::Trtllm => Details::Absent,
        }
    }
}

pub fn usage(prompt_tokens: u64, completion_tokens: u64, details: &Details) -> Value {
    let mut u = Map::new();
    u.insert("prompt_tokens".into(), json!(prompt_tokens));
    u.insert("completion_tokens".into(), json!(completion_tokens));
    u.insert(
        "total_tokens".into(),
        json!(prompt_tokens + completion_tokens),
    );
    match details {
        Details::Absent => {}
        Details::Null => {
            u.insert("prompt_tokens_details".into(), Value::Null);
        }
        Details::Cached(n) => {
            u.insert("prompt_tokens_details".into(), json!({"cached_tokens": n}));
        }
    }
    Value::Object(u)
}

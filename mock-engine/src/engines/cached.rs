//! What a pod reports as cached prompt tokens: its own prefix-cache hits,
//! the count a vLLM prefill hands its decode, or SGLang's count from the
//! bootstrap exchange. One place, because the router's usage fix-ups are
//! tested against exactly these numbers.

use serde_json::{Number, Value};

use crate::config::Engine;
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::logprobs::Asked;
use crate::request::Request;
use crate::state::Shared;

/// The pod's own prefix-cache hits for a prompt of `prompt_tokens`:
/// `--cached-tokens`, at most the prompt; none when the request makes the
/// engine compute the whole prompt (vLLM prompt logprobs skip reading the
/// prefix cache; SGLang's `logprob_start_len` 0 caps its radix match).
pub fn own_cached(state: &Shared, asked: &Asked, prompt_tokens: u64) -> u64 {
    if asked.no_prefix_cache {
        0
    } else {
        state.config.cached_tokens.min(prompt_tokens)
    }
}

/// vLLM >= 0.31's scheduler at request finish: a prefill whose
/// `kv_transfer_params` ask the decode to pull (`do_remote_prefill`, i.e.
/// NIXL pull and push; Mooncake answers none) gets
/// `remote_prefill_cached_tokens` = its own cached count.
pub fn remote_cached_field(state: &Shared, out: &mut PrefillOut) {
    let cfg = &state.config;
    if cfg.engine != Engine::Vllm || !cfg.remote_cached_field {
        return;
    }
    if let Some(Value::Object(p)) = out.top.get_mut("kv_transfer_params") {
        if p.get("do_remote_prefill") == Some(&Value::Bool(true)) {
            p.insert(
                "remote_prefill_cached_tokens".into(),
                Value::Number(out.cached_tokens.clone()),
            );
        }
    }
}

/// vLLM's output processor (>= 0.31): a request whose
/// `kv_transfer_params` have `do_remote_prefill` true and an integer
/// `remote_prefill_cached_tokens` reports that value, unchecked.
fn remote_prefill_cached(req: &Request<'_>) -> Option<Number> {
    let Ok(Some(Value::Object(p))) = req.value("kv_transfer_params") else {
        return None;
    };
    if p.get("do_remote_prefill") != Some(&Value::Bool(true)) {
        return None;
    }
    match p.get("remote_prefill_cached_tokens") {
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.clone()),
        _ => None,
    }
}

/// What a decode reports as cached. vLLM: a relayed
/// `remote_prefill_cached_tokens` (>= 0.31), else the whole prompt when
/// the KV came over a hand-off (the transfer counts as cached: what the
/// router fixes), else its own hits. SGLang: the prefill's count from the
/// bootstrap exchange (plus the whole prompt with `--double-count-cached`).
pub fn decode_cached(state: &Shared, req: &Request<'_>, asked: &Asked, out: &DecodeOut) -> Number {
    let cfg = &state.config;
    let p = out.prompt_tokens;
    let own = own_cached(state, asked, p);
    match cfg.engine {
        Engine::Vllm => {
            if cfg.remote_cached_field {
                if let Some(n) = remote_prefill_cached(req) {
                    return n;
                }
            }
            match out.kv {
                Kv::Pulled => p.into(),
                Kv::Recomputed | Kv::None => own.into(),
            }
        }
        Engine::Sglang => match out.prefill_cached {
            Some(x) if cfg.double_count_cached => x.saturating_add(p).into(),
            Some(x) => x.into(),
            None => own.into(),
        },
        Engine::Default | Engine::Trtllm => own.into(),
    }
}

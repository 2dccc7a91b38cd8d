//! Per-engine prefill/decode contracts. Each engine module checks what the
//! router sent, performs the hand-off (side channel, bootstrap, ...) and says
//! what to add to the answer; `handle` turns that into the HTTP response.
//! The rules several engines share live in `contract.rs`, `vllm_request.rs`
//! and `cached.rs`, below every engine module, so no engine imports this
//! dispatcher.

mod bidirectional;
mod cached;
mod contract;
mod default;
mod encoder;
mod mooncake;
mod nixl_push;
mod p2p_nccl;
mod sglang;
mod trtllm;
mod vllm;
mod vllm_request;

pub use encoder::encoded_item as ec_encoded_item;
pub use mooncake::offer_key as mooncake_offer_key;
pub use nixl_push::base_request_id;
pub use sglang::server_info as sglang_server_info;
pub use trtllm::server_info as trtllm_server_info;

use axum::http::HeaderMap;
use axum::response::Response;

use crate::answer;
use crate::config::{fail_after_transfer, Connector, Engine, Fault, Flavor, Role};
use crate::error::Checked;
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::logprobs::{Asked, Prompt};
use crate::look::Look;
use crate::models;
use crate::params::GenParams;
use crate::request::{approx_tokens, u64_array, Api, Request};
use crate::state::{InFlight, Shared};
use cached::{decode_cached, own_cached, remote_cached_field};
use contract::responses_checks;
use vllm_request::{vllm_recompute, vllm_request_id};

/// `faults`: those in force for this request (only `no-kv-params`,
/// `no-token-ids`, `no-disagg-params`, `fail-after-transfer` and
/// `truncate` matter here; the dispatcher applies the others).
pub async fn handle(
    state: &Shared,
    api: Api,
    headers: &HeaderMap,
    body: &[u8],
    faults: &[Fault],
    guard: InFlight,
) -> Checked<Response> {
    let req = Request::parse(api, body)?;
    let cfg = &state.config;
    // Validated first so a request for another model, or a malformed knob,
    // never consumes a hand-off.
    models::check(cfg, req.model().as_deref())?;
    let mut params = GenParams::from_request(&req)?;
    if api == Api::Generate {
        // vLLM answers `generate-tokens-{id}`, the id as the engine reads it.
        params.request_id = vllm_request_id(&req, headers)?;
    }
    let asked = Asked::from_request(&req, cfg.flavor(), params.stream)?;
    if api == Api::Responses {
        responses_checks(&req, cfg.role == Role::Decode || cfg.lenient_prefill)?;
    }
    match cfg.role {
        Role::Prefill => {
            let mut out = prefill(state, &req, headers, &asked, faults).await?;
            out.prompt_tokens = counted(&req, out.prompt_tokens);
            out.cached_tokens = own_cached(state, &asked, out.prompt_tokens).into();
            remote_cached_field(state, &mut out);
            let look = look(state, &req, asked)?;
            let resp = answer::prefill_response(state, api, &params, look, out);
            guard.finish();
            Ok(resp)
        }
        Role::Encode => {
            let out = encoder::encode(state, &req)?;
            let look = look(state, &req, asked)?;
            let resp = answer::prefill_response(state, api, &params, look, out);
            guard.finish();
            Ok(resp)
        }
        Role::Decode => {
            let mut out = decode(state, &req, headers, &asked).await?;
            if cfg.bidirectional && cfg.connector == Connector::Nixl && out.kv == Kv::Pulled {
                out.top = bidirectional::keep(state, &req, params.max_tokens)?;
            }
            out.prompt_tokens = counted(&req, out.prompt_tokens);
            out.cached_tokens = decode_cached(state, &req, &asked, &out);
            let look = look(state, &req, asked)?;
            Ok(answer::decode_response(
                state, api, params, look, out, guard,
            ))
        }
    }
}

/// The prompt's token count: the token-in API's `token_ids`, counted;
/// elsewhere what the engine module counted (the prompt key's bytes / 4).
fn counted(req: &Request<'_>, approx: u64) -> u64 {
    if req.api != Api::Generate {
        return approx;
    }
    match req.value("token_ids") {
        Ok(Some(v)) => u64_array(&v).map_or(approx, |ids| ids.len() as u64),
        _ => approx,
    }
}

/// The prefill leg of this pod's engine and connector: its checks, its
/// side of the hand-off, and what it adds to the answer.
async fn prefill(
    state: &Shared,
    req: &Request<'_>,
    headers: &HeaderMap,
    asked: &Asked,
    faults: &[Fault],
) -> Checked<PrefillOut> {
    let cfg = &state.config;
    // A prefill whose answer a fault spoils never hands its KV over.
    let spoiled = faults.contains(&Fault::Truncate);
    let no_kv_params = faults.contains(&Fault::NoKvParams);
    if cfg.engine == Engine::Vllm {
        encoder::consume(state, req).await?;
    }
    let out = match (cfg.engine, cfg.connector) {
        (Engine::Vllm, Connector::Neuron) => vllm::neuron_prefill(req, cfg.lenient_prefill)?,
        (Engine::Vllm, Connector::Mooncake) => mooncake::prefill(state, req, headers, spoiled)?,
        (Engine::Vllm, Connector::NixlPush) => {
            nixl_push::prefill(state, req, headers, spoiled, no_kv_params)?
        }
        (Engine::Vllm, Connector::P2pNccl) => {
            p2p_nccl::prefill(state, req, headers, spoiled).await?
        }
        (Engine::Vllm, Connector::Nixl | Connector::Shfs) => {
            let out = vllm::prefill(state, req, no_kv_params)?;
            // A decode's blocks named as the prefix's source are read
            // (they serve one read; a failed read is the request's 500).
            let params = vllm_request::vllm_prefill_params(req)?;
            bidirectional::read_source(state, req, &params).await?;
            out
        }
        (Engine::Sglang, _) => {
            sglang::prefill(state, req, headers, asked, fail_after_transfer(faults)).await?
        }
        (Engine::Trtllm, _) => trtllm::prefill(state, req, faults).await?,
        (Engine::Default, _) => default::prefill(req, cfg.lenient_prefill)?,
    };
    Ok(out)
}

/// The decode leg of this pod's engine and connector: its checks and its
/// side of the hand-off (none when the request skips the prefix cache).
async fn decode(
    state: &Shared,
    req: &Request<'_>,
    headers: &HeaderMap,
    asked: &Asked,
) -> Checked<DecodeOut> {
    let cfg = &state.config;
    if cfg.engine == Engine::Vllm && asked.skips_prefix_cache(cfg.flavor()) {
        return skip_handoff(state, req, headers);
    }
    let out = match (cfg.engine, cfg.connector) {
        (Engine::Vllm, Connector::Neuron) => vllm::neuron_decode(req)?,
        (Engine::Vllm, Connector::Mooncake) => mooncake::decode(state, req).await?,
        (Engine::Vllm, Connector::NixlPush) => nixl_push::decode(state, req, headers).await?,
        (Engine::Vllm, Connector::P2pNccl) => p2p_nccl::decode(state, req, headers).await?,
        (Engine::Vllm, Connector::Nixl | Connector::Shfs) => vllm::decode(state, req).await?,
        (Engine::Sglang, _) => sglang::decode(state, req, headers).await?,
        (Engine::Trtllm, _) => trtllm::decode(state, req, headers).await?,
        (Engine::Default, _) => default::decode(req),
    };
    Ok(out)
}

/// A vLLM decode asked for prompt logprobs (`prompt_logprobs`,
/// completions `echo` + `logprobs`, chat `echo`) skips reading the prefix
/// cache, external KV included: it leaves a hand-off unused (the
/// prefill's KV is never pulled) and recomputes the whole prompt. Without
/// any hand-off it is the usual silent recompute.
fn skip_handoff(state: &Shared, req: &Request<'_>, headers: &HeaderMap) -> Checked<DecodeOut> {
    let handoff = match state.config.connector {
        Connector::Neuron => req.has("disagg_prefill_resp"),
        // The hand-off travels in the request id.
        Connector::P2pNccl => vllm_request_id(req, headers)?.is_some(),
        _ => req.has("kv_transfer_params"),
    };
    if handoff {
        return Ok(DecodeOut::new(
            Kv::Recomputed,
            approx_tokens(&req.prompt_key()?),
        ));
    }
    vllm_recompute(state, req, "no KV hand-off")
}

/// How the answer looks: the tokenised prompt, echo text and whether the
/// completions logprobs start with the prompt (not on an SGLang decode:
/// PD moves no input logprobs to it, an UNVERIFIED reading of SGLang).
fn look(state: &Shared, req: &Request<'_>, asked: Asked) -> Checked<Look> {
    let flavor = state.config.flavor();
    let prompt = if asked.needs_prompt() {
        Some(Prompt::of(req)?)
    } else {
        None
    };
    let echo = match (asked.echo, req.api) {
        (true, Api::Completions) => prompt.as_ref().map(|p| p.text.clone()),
        (true, Api::Chat) => Some(crate::logprobs::chat_echo(req)?),
        _ => None,
    };
    let sglang_decode = flavor == Flavor::Sglang && state.config.role == Role::Decode;
    let echo_logprobs =
        req.api == Api::Completions && asked.echo && asked.logprobs.is_some() && !sglang_decode;
    Ok(Look {
        flavor: Some(flavor),
        model: models::answered(&state.config, req.model().as_deref()),
        asked,
        prompt,
        echo,
        echo_logprobs,
    })
}

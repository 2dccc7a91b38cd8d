//! vLLM E/P/D (encoder disaggregation): the encoder pod, and the prefill
//! as a consumer of its output.
//!
//! The encoder takes one media item per request (what vLLM's
//! `disagg_epd_proxy.py` and llm-d's sidecar send: the item alone in one
//! user message, one token, not streamed) and keeps its output by the
//! item's hash: in the shared directory (`ECExampleConnector`, the hash as
//! file name), or in its own memory behind its side channel, answering
//! `ec_transfer_params = {hash: {remote_host, remote_port, ...}}` (NIXL).
//! A consuming prefill checks that every media item of its request was
//! encoded: the file exists, or its `ec_transfer_params` entry leads to an
//! encoder that has it. Otherwise it fails, where a real one would quietly
//! encode the item again: the router skipped an encoder.
//!
//! The item's hash stands in for vLLM's `mm_hash` (of the media's bytes;
//! the mock has only the URL or the inline data).

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Map, Value};

use super::contract::object_field;
use crate::config::EcConnector;
use crate::error::{Checked, Fail};
use crate::leg::PrefillOut;
use crate::peer::authority;
use crate::request::{prompt_hash, short, Api, Request};
use crate::state::Shared;

/// The content-part types that carry media.
const MEDIA_TYPES: [&str; 4] = ["image_url", "audio_url", "input_audio", "video_url"];
const EC: &str = "ec_transfer_params";
const PULL_TIMEOUT: Duration = Duration::from_secs(2);

/// The media parts of a chat request, in order.
fn media_parts(req: &Request<'_>) -> Checked<Vec<Value>> {
    let Some(Value::Array(messages)) = req.value("messages")? else {
        return Ok(Vec::new());
    };
    let mut parts = Vec::new();
    for m in messages {
        if let Some(Value::Array(content)) = m.get("content") {
            parts.extend(content.iter().filter(|p| is_media(p)).cloned());
        }
    }
    Ok(parts)
}

fn is_media(part: &Value) -> bool {
    part.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| MEDIA_TYPES.contains(&t))
}

/// The hash an item's output is kept by: of its URL, or of its inline
/// audio data.
fn item_hash(part: &Value) -> Checked<String> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
    let v = part.get(kind);
    let source = match kind {
        "input_audio" => v.and_then(|a| a.get("data")).and_then(Value::as_str),
        _ => v.and_then(|u| u.as_str().or_else(|| u.get("url").and_then(Value::as_str))),
    };
    let source = source
        .ok_or_else(|| Fail::contract(format!("media part without its source: {}", short(part))))?;
    Ok(format!("mm-{}", prompt_hash(source.as_bytes())))
}

/// Embedding tokens of an item: a stand-in for the image's patch count.
fn encoder_tokens(hash: &str) -> u64 {
    16 + (hash.len() as u64 % 7)
}

/// The encoder's leg: checks it got one media item, one token, not
/// streamed; keeps the output; says where it is (NIXL).
pub fn encode(state: &Shared, req: &Request<'_>) -> Checked<PrefillOut> {
    let cfg = &state.config;
    if req.api != Api::Chat {
        return Err(Fail::contract("an encoder serves chat requests only"));
    }
    let Some(Value::Array(messages)) = req.value("messages")? else {
        return Err(Fail::contract("an encoder request needs `messages`"));
    };
    let part = match messages.as_slice() {
        [one] => match one.get("content") {
            Some(Value::Array(parts)) if parts.len() == 1 && parts.iter().all(is_media) => {
                parts.first().cloned()
            }
            _ => None,
        },
        _ => None,
    }
    .ok_or_else(|| {
        Fail::contract(format!(
            "an encoder request carries exactly one message whose content is one media item, got {}",
            short(&Value::Array(messages.clone()))
        ))
    })?;
    one_token_not_streamed(req)?;
    for owned in [EC, "kv_transfer_params"] {
        if req.has(owned) {
            return Err(Fail::contract(format!(
                "an encoder request must not carry `{owned}`"
            )));
        }
    }
    let hash = item_hash(&part)?;
    let tokens = encoder_tokens(&hash);
    let mut out = PrefillOut::new(tokens);
    match cfg.ec_connector {
        Some(EcConnector::Nixl) => {
            let side = state
                .bound
                .side
                .ok_or_else(|| Fail::internal("nixl encoder has no side channel bound"))?;
            state.encoded.put(&hash, tokens);
            let host = cfg
                .advertise_host
                .clone()
                .unwrap_or_else(|| side.ip().to_string());
            out.top.insert(
                EC.into(),
                json!({ hash: {
                    "do_remote_encode": true,
                    "num_encoder_tokens": tokens,
                    "mm_base_addr": state.random_u64() & 0xffff_ffff,
                    "remote_host": host,
                    "remote_port": side.port(),
                }}),
            );
        }
        _ => {
            let dir = cfg
                .ec_storage
                .as_ref()
                .ok_or_else(|| Fail::internal("example encoder without --ec-storage"))?;
            std::fs::write(dir.join(&hash), tokens.to_string())
                .map_err(|e| Fail::internal(format!("could not write the encoder cache: {e}")))?;
            out.top.insert(EC.into(), Value::Null);
        }
    }
    Ok(out)
}

/// `max_tokens` (or `max_completion_tokens`) is 1, and the answer is not
/// streamed: the encoder's text is thrown away.
fn one_token_not_streamed(req: &Request<'_>) -> Checked<()> {
    let limits = [
        req.u64_field("max_tokens")?,
        req.u64_field("max_completion_tokens")?,
    ];
    if limits.iter().all(Option::is_none) || limits.iter().flatten().any(|n| *n != 1) {
        return Err(Fail::contract(format!(
            "an encoder request needs `max_tokens` (or `max_completion_tokens`) == 1, got {limits:?}"
        )));
    }
    if req.bool_field("stream")? == Some(true) {
        return Err(Fail::contract("an encoder request must not stream"));
    }
    for field in ["stream_options", "min_tokens"] {
        if req.has(field) {
            return Err(Fail::contract(format!(
                "an encoder request must not carry `{field}`"
            )));
        }
    }
    Ok(())
}

/// The embeddings' tokens of item `hash`, if this encoder has it (the
/// side channel's `GET /ec/{hash}`).
pub fn encoded_item(state: &Shared, hash: &str) -> Option<u64> {
    state.encoded.get(hash)
}

/// A consuming prefill: every media item of the request was encoded.
pub async fn consume(state: &Shared, req: &Request<'_>) -> Checked<()> {
    let parts = media_parts(req)?;
    let params = object_field(req, EC)?;
    let Some(connector) = state.config.ec_connector else {
        return Ok(());
    };
    let mut hashes = Vec::with_capacity(parts.len());
    for part in &parts {
        hashes.push(item_hash(part)?);
    }
    match connector {
        EcConnector::Example => {
            let Some(dir) = &state.config.ec_storage else {
                return Err(Fail::internal("example prefill without --ec-storage"));
            };
            for h in &hashes {
                if !dir.join(h).exists() {
                    return Err(not_encoded(h, "not in the shared encoder cache"));
                }
            }
        }
        EcConnector::Nixl => {
            let params = params.unwrap_or_default();
            if let Some(stray) = params.keys().find(|k| !hashes.contains(k)) {
                return Err(Fail::contract(format!(
                    "`{EC}` names item {stray:?}, which is not in this request"
                )));
            }
            for h in &hashes {
                pull(state, &params, h).await?;
            }
        }
    }
    Ok(())
}

fn not_encoded(hash: &str, why: &str) -> Fail {
    Fail::contract(format!(
        "media item {hash} was not encoded ({why}): the prefill would encode it again; \
         the router must send each media item to an encoder before the prefill"
    ))
}

/// Pulls item `hash`'s output from the encoder its entry names.
async fn pull(state: &Shared, params: &Map<String, Value>, hash: &str) -> Checked<()> {
    let entry = params
        .get(hash)
        .ok_or_else(|| not_encoded(hash, &format!("no `{EC}` entry")))?;
    let host = entry.get("remote_host").and_then(Value::as_str);
    let port = entry
        .get("remote_port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let (Some(host), Some(port)) = (host, port) else {
        return Err(Fail::contract(format!(
            "`{EC}.{hash}` needs remote_host and remote_port, got {}",
            short(entry)
        )));
    };
    let at = authority(host, port);
    let resp = state
        .peers
        .get(&at, &format!("/ec/{hash}"), PULL_TIMEOUT)
        .await
        .map_err(|e| not_encoded(hash, &format!("could not pull from {at}: {e}")))?;
    if resp.status != StatusCode::OK {
        return Err(not_encoded(
            hash,
            &format!("encoder {at} answered {}", resp.status.as_u16()),
        ));
    }
    Ok(())
}

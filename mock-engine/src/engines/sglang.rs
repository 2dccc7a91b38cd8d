//! SGLang PD disaggregation: the router sends both legs at once, each
//! carrying the prefill's bootstrap address and a room id; the decode
//! registers the room with the prefill's bootstrap server and the KV flows
//! once both sides are there.

use std::collections::HashSet;
use std::time::Duration;

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::prefill_constraints;
use crate::error::{Checked, Fail};
use crate::generate::{DecodeOut, Kv, PrefillOut};
use crate::peer::{authority, PeerError};
use crate::request::{approx_tokens, prompt_hash, short, Api, Request};
use crate::state::Shared;

/// Largest room id: SGLang keeps rooms in a signed 64-bit integer.
const MAX_ROOM: u64 = i64::MAX as u64;

struct Target {
    host: String,
    port: u16,
    room: u64,
}

/// `Some(len)` for a batched request, whose bootstrap fields must be arrays.
fn batch_size(req: &Request<'_>) -> Checked<Option<usize>> {
    match req.api {
        Api::Completions => {
            let Some(Value::Array(items)) = req.value("prompt")? else {
                return Ok(None);
            };
            let nested = items
                .iter()
                .filter(|v| matches!(v, Value::String(_) | Value::Array(_)))
                .count();
            if items.is_empty() {
                Err(Fail::contract("`prompt` is an empty array"))
            } else if nested == 0 {
                // A flat array of token ids is one prompt.
                Ok(None)
            } else if nested == items.len() {
                Ok(Some(items.len()))
            } else {
                Err(Fail::contract(
                    "`prompt` array mixes prompts (strings/arrays) with other values",
                ))
            }
        }
        Api::Chat => match req.u64_field("n")? {
            Some(n) if n > 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            _ => Ok(None),
        },
    }
}

fn host_of(v: &Value, what: &str) -> Checked<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| Fail::contract(format!("{what} must be a string, got {}", short(v))))
}

fn port_of(v: &Value, what: &str) -> Checked<u16> {
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| Fail::contract(format!("{what} must be a TCP port, got {}", short(v))))
}

fn room_of(v: &Value, what: &str) -> Checked<u64> {
    v.as_u64().filter(|r| *r <= MAX_ROOM).ok_or_else(|| {
        Fail::contract(format!(
            "{what} must be an integer in [0, 2^63-1], got {}",
            short(v)
        ))
    })
}

fn targets(req: &Request<'_>, batch: Option<usize>) -> Checked<Vec<Target>> {
    let field = |name: &str| {
        req.value(name)?
            .ok_or_else(|| Fail::contract(format!("`{name}` is missing")))
    };
    let host = field("bootstrap_host")?;
    let port = field("bootstrap_port")?;
    let room = field("bootstrap_room")?;
    let Some(size) = batch else {
        for (name, v) in [
            ("bootstrap_host", &host),
            ("bootstrap_port", &port),
            ("bootstrap_room", &room),
        ] {
            if v.is_array() {
                return Err(Fail::contract(format!(
                    "`{name}` must be a scalar for a single (non-batch) request, got an array"
                )));
            }
        }
        return Ok(vec![Target {
            host: host_of(&host, "`bootstrap_host`")?,
            port: port_of(&port, "`bootstrap_port`")?,
            room: room_of(&room, "`bootstrap_room`")?,
        }]);
    };
    let as_batch = |name: &str, v: &Value| -> Checked<Vec<Value>> {
        match v {
            Value::Array(a) if a.len() == size => Ok(a.clone()),
            Value::Array(a) => Err(Fail::contract(format!(
                "`{name}` has {} entries but the batch has {size}",
                a.len()
            ))),
            _ => Err(Fail::contract(format!(
                "`{name}` must be an array of {size} (batch request), got {}",
                short(v)
            ))),
        }
    };
    let hosts = as_batch("bootstrap_host", &host)?;
    let ports = as_batch("bootstrap_port", &port)?;
    let rooms = as_batch("bootstrap_room", &room)?;
    (0..size)
        .map(|i| {
            Ok(Target {
                host: host_of(&hosts[i], &format!("`bootstrap_host[{i}]`"))?,
                port: port_of(&ports[i], &format!("`bootstrap_port[{i}]`"))?,
                room: room_of(&rooms[i], &format!("`bootstrap_room[{i}]`"))?,
            })
        })
        .collect()
}

fn unique_rooms(targets: &[Target]) -> Checked<()> {
    let mut seen = HashSet::new();
    for t in targets {
        if !seen.insert(t.room) {
            return Err(Fail::contract(format!(
                "bootstrap_room {} appears twice in one request",
                t.room
            )));
        }
    }
    Ok(())
}

/// One prompt hash per room. In a completions batch each room carries its
/// own prompt, so a router that pairs rooms and prompts differently on the
/// two legs is caught; otherwise every room shares the whole prompt key.
fn room_hashes(req: &Request<'_>, batch: Option<usize>) -> Checked<Vec<String>> {
    let key = req.prompt_key()?;
    match (req.api, batch) {
        (Api::Completions, Some(_)) => {
            let raw = req
                .raw("prompt")
                .ok_or_else(|| Fail::contract("completions request has no `prompt`"))?;
            let items: Vec<&RawValue> = serde_json::from_str(raw.get())
                .map_err(|e| Fail::contract(format!("`prompt` could not be split: {e}")))?;
            Ok(items
                .iter()
                .map(|p| prompt_hash(p.get().as_bytes()))
                .collect())
        }
        (_, batch) => Ok(vec![prompt_hash(&key); batch.unwrap_or(1)]),
    }
}

/// `linger`: fault `fail-after-transfer` is in force; once every room is
/// transferred, wait until the decode has collected each (or the bootstrap
/// timeout) and then `linger` more, so the decode's answer has started when
/// the dispatcher turns this one into a 500.
pub async fn prefill(
    state: &Shared,
    req: &Request<'_>,
    linger: Option<Duration>,
) -> Checked<PrefillOut> {
    let batch = batch_size(req)?;
    let targets = targets(req, batch)?;
    let bootstrap = state
        .bound
        .bootstrap
        .ok_or_else(|| Fail::internal("sglang prefill has no bootstrap server bound"))?;
    let (my_host, my_port) = (bootstrap.ip().to_string(), bootstrap.port());
    for t in &targets {
        if t.host != my_host || t.port != my_port {
            return Err(Fail::contract(format!(
                "bootstrap_host/bootstrap_port {} do not point at this prefill's bootstrap \
                 server {}",
                authority(&t.host, t.port),
                authority(&my_host, my_port)
            )));
        }
    }
    unique_rooms(&targets)?;
    prefill_constraints(req, true, state.config.lenient_prefill)?;
    let hashes = room_hashes(req, batch)?;
    let key = req.prompt_key()?;

    let deadline = Instant::now() + state.config.bootstrap_timeout;
    let mut collected = Vec::with_capacity(targets.len());
    for (t, hash) in targets.iter().zip(hashes) {
        if !state.rooms.await_registered(t.room, deadline).await {
            return Err(Fail::timeout(format!(
                "bootstrap timeout: decode never registered room {}",
                t.room
            )));
        }
        collected.push(state.rooms.mark_transferred(t.room, hash));
    }
    if let Some(linger) = linger {
        let deadline = Instant::now() + state.config.bootstrap_timeout;
        for c in collected {
            // Only pacing a fault: a decode that never collects is no error.
            let _ = tokio::time::timeout_at(deadline, c).await;
        }
        tokio::time::sleep(linger).await;
    }
    Ok(PrefillOut::new(approx_tokens(&key)))
}

#[derive(Deserialize)]
struct Transferred {
    prompt_hash: String,
}

fn unreachable(at: &str, e: &PeerError) -> Fail {
    Fail::contract(format!("bootstrap server at {at} unreachable: {e}"))
}

/// Registers `t.room` with its bootstrap server.
async fn register(state: &Shared, t: &Target) -> Checked<()> {
    let at = authority(&t.host, t.port);
    let resp = state
        .peers
        .post_json(
            &at,
            "/register",
            &json!({"room": t.room}),
            Duration::from_secs(2),
        )
        .await
        .map_err(|e| unreachable(&at, &e))?;
    if resp.status != StatusCode::OK {
        return Err(Fail::contract(format!(
            "bootstrap server at {at} refused room {}: {} {}",
            t.room,
            resp.status.as_u16(),
            resp.text()
        )));
    }
    Ok(())
}

/// Waits for the prefill to transfer `t.room` and checks it prefilled the
/// same prompt.
async fn await_kv(state: &Shared, t: &Target, expected_hash: &str) -> Checked<()> {
    let at = authority(&t.host, t.port);
    let wait = state.config.bootstrap_timeout;
    let path = format!("/wait/{}?timeout_ms={}", t.room, wait.as_millis());
    let timed_out = || Fail::timeout(format!("KV transfer timed out for room {}", t.room));
    // The server answers 504 at `wait`; the client margin only covers a
    // server that stops answering altogether.
    let resp = match state
        .peers
        .get(&at, &path, wait + Duration::from_secs(2))
        .await
    {
        Ok(r) => r,
        Err(PeerError::Timeout) => return Err(timed_out()),
        Err(e) => return Err(unreachable(&at, &e)),
    };
    match resp.status {
        StatusCode::OK => {}
        StatusCode::GATEWAY_TIMEOUT => return Err(timed_out()),
        s => {
            return Err(Fail::contract(format!(
                "bootstrap server at {at} failed waiting for room {}: {} {}",
                t.room,
                s.as_u16(),
                resp.text()
            )))
        }
    }
    let got: Transferred = serde_json::from_slice(&resp.body).map_err(|e| {
        Fail::contract(format!(
            "bootstrap server at {at} sent a bad wait body: {e}"
        ))
    })?;
    if got.prompt_hash != expected_hash {
        return Err(Fail::contract(format!(
            "prompt differs from the prefilled prompt for room {} (prefill hashed {}, decode \
             hashes {expected_hash})",
            t.room, got.prompt_hash
        )));
    }
    Ok(())
}

pub async fn decode(state: &Shared, req: &Request<'_>) -> Checked<DecodeOut> {
    let batch = batch_size(req)?;
    let targets = targets(req, batch)?;
    unique_rooms(&targets)?;
    let hashes = room_hashes(req, batch)?;
    let key = req.prompt_key()?;
    // Register every room before waiting on any, so a batch's prefill can
    // proceed room by room.
    for t in &targets {
        register(state, t).await?;
    }
    let waits = targets
        .iter()
        .zip(&hashes)
        .map(|(t, h)| await_kv(state, t, h));
    for result in futures_util::future::join_all(waits).await {
        result?;
    }
    Ok(DecodeOut {
        kv: Kv::Pulled,
        prompt_tokens: approx_tokens(&key),
    })
}

//! SGLang PD disaggregation: the router sends both legs at once, each
//! carrying the prefill's bootstrap address and a room id; the decode
//! registers the room with the prefill's bootstrap server and the KV flows
//! once both sides are there.
//!
//! Data parallelism (`--dp-size` N, SGLang 0.5.23): a request may be pinned
//! to a rank (header `X-Data-Parallel-Rank`, which wins, else body
//! `routed_dp_rank`, else the deprecated `data_parallel_rank`); unpinned, a
//! prefill goes to `room % N`. The prefill's default load balancing,
//! follow_bootstrap_room, then fails a pinned request whose room does not
//! satisfy `room % N == rank`, unless it carries `disagg_prefill_dp_rank`.
//! The decode finds the prefill rank holding the KV as SGLang's
//! `_resolve_prefill_dp_rank` does: `disagg_prefill_dp_rank`, else 0 for a
//! prefill of dp size 1, else `room % N`; a wrong one misses the KV. With a
//! size of 1 (nothing declared) the rank fields must be absent.

use std::collections::HashSet;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::cached::own_cached;
use super::contract::prefill_constraints;
use crate::config::Role;
use crate::error::{Checked, Fail};
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::logprobs::Asked;
use crate::peer::{authority, PeerError, Polled};
use crate::request::{approx_tokens, prompt_hash, short, Api, Request};
use crate::state::Shared;
use crate::store::rooms::Transfer;

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
        // One prompt (Messages has no `n`); the others are not served by
        // the sglang mock.
        Api::Messages | Api::Responses | Api::Generate => Ok(None),
    }
}

/// The rank the request is pinned to, and where it came from: header
/// `X-Data-Parallel-Rank` (wins; not an integer: 400, as SGLang), else body
/// `routed_dp_rank`, else the deprecated `data_parallel_rank`.
fn routed_rank(req: &Request<'_>, headers: &HeaderMap) -> Checked<Option<(i128, &'static str)>> {
    if let Some(v) = headers.get("x-data-parallel-rank") {
        let text = String::from_utf8_lossy(v.as_bytes());
        let rank = text.trim().parse::<i128>().map_err(|_| {
            Fail::bad_request(format!(
                "Invalid X-Data-Parallel-Rank header: must be an integer, got {text:?}"
            ))
        })?;
        return Ok(Some((rank, "header `X-Data-Parallel-Rank`")));
    }
    for field in ["routed_dp_rank", "data_parallel_rank"] {
        match req.value(field)? {
            None => {}
            Some(v) => {
                let rank = v.as_i64().ok_or_else(|| {
                    Fail::contract(format!("`{field}` must be an integer, got {}", short(&v)))
                })?;
                let src = if field == "routed_dp_rank" {
                    "`routed_dp_rank`"
                } else {
                    "`data_parallel_rank` (deprecated)"
                };
                return Ok(Some((i128::from(rank), src)));
            }
        }
    }
    Ok(None)
}

/// A rank below `size`.
fn in_range(rank: i128, size: u64, what: &str) -> Checked<u64> {
    u64::try_from(rank)
        .ok()
        .filter(|r| *r < size)
        .ok_or_else(|| Fail::contract(format!("{what} {rank} is out of range for dp size {size}")))
}

/// `disagg_prefill_dp_rank`, if given.
fn prefill_rank_hint(req: &Request<'_>) -> Checked<Option<u64>> {
    req.u64_field("disagg_prefill_dp_rank")
}

fn undeclared(what: &str, whose: &str) -> Fail {
    Fail::contract(format!(
        "{what} must be absent: {whose} declared no dp size (dp_size 1), so a router must not \
         send rank fields"
    ))
}

/// The prefill's dp rank for each target (its room), with SGLang's checks.
fn prefill_ranks(
    state: &Shared,
    req: &Request<'_>,
    headers: &HeaderMap,
    targets: &[Target],
) -> Checked<Vec<u64>> {
    let n = state.config.dp_size;
    let rank = routed_rank(req, headers)?;
    let hint = prefill_rank_hint(req)?;
    if n == 1 {
        if let Some((_, src)) = rank {
            return Err(undeclared(src, "this prefill"));
        }
        if hint.is_some() {
            return Err(undeclared("`disagg_prefill_dp_rank`", "this prefill"));
        }
        return Ok(vec![0; targets.len()]);
    }
    let rank = rank.map(|(r, src)| in_range(r, n, src)).transpose()?;
    if let Some(h) = hint {
        in_range(i128::from(h), n, "`disagg_prefill_dp_rank`")?;
    }
    targets
        .iter()
        .map(|t| {
            let implied = t.room % n;
            let Some(r) = rank else {
                // Unpinned: the controller sends it to room % N.
                return Ok(implied);
            };
            if hint.is_none() && r != implied {
                return Err(Fail::contract(format!(
                    "follow_bootstrap_room conflict: dispatched to dp_rank {r} but bootstrap_room \
                     {} implies dp_rank {implied}. Set \
                     SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing.",
                    t.room
                )));
            }
            Ok(r)
        })
        .collect()
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
    hosts
        .iter()
        .zip(&ports)
        .zip(&rooms)
        .enumerate()
        .map(|(i, ((host, port), room))| {
            Ok(Target {
                host: host_of(host, &format!("`bootstrap_host[{i}]`"))?,
                port: port_of(port, &format!("`bootstrap_port[{i}]`"))?,
                room: room_of(room, &format!("`bootstrap_room[{i}]`"))?,
            })
        })
        .collect()
}

/// `GET /server_info` (and the deprecated `/get_server_info`): the server
/// args a router reads to learn the dp size, as SGLang 0.5.23 answers.
pub fn server_info(state: &Shared) -> Value {
    let cfg = &state.config;
    let (mode, port, balance) = match cfg.role {
        Role::Prefill => (
            "prefill",
            state.bound.bootstrap.map_or(8998, |b| b.port()),
            "follow_bootstrap_room",
        ),
        // The decode serves no bootstrap server: the default port.
        Role::Decode | Role::Encode => ("decode", 8998, "round_robin"),
    };
    json!({
        "dp_size": cfg.dp_size,
        "attn_dp_size": 1,
        "disaggregation_mode": mode,
        "disaggregation_bootstrap_port": port,
        "load_balance_method": balance,
        "version": "0.5.23",
    })
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
    headers: &HeaderMap,
    asked: &Asked,
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
    let ranks = prefill_ranks(state, req, headers, &targets)?;
    let hashes = room_hashes(req, batch)?;
    let key = req.prompt_key()?;
    let cached_tokens = own_cached(state, asked, approx_tokens(&key));

    let deadline = Instant::now() + state.config.bootstrap_timeout;
    let rid = req.str_field("rid")?;
    let mut collected = Vec::with_capacity(targets.len());
    for ((t, hash), dp_rank) in targets.iter().zip(hashes).zip(ranks) {
        let aborted = async {
            match &rid {
                Some(rid) => state.aborts.wait(rid).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            registered = state.rooms.await_registered(t.room, deadline) => {
                if !registered {
                    return Err(Fail::timeout(format!(
                        "bootstrap timeout: decode never registered room {}",
                        t.room
                    )));
                }
            }
            () = aborted => {
                // Nobody waits for this answer: the router aborts a prefill
                // whose stream is gone.
                return Err(Fail::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "abort",
                    format!("request {} aborted by POST /abort_request", rid.as_deref().unwrap_or("")),
                ));
            }
        }
        let transfer = Transfer {
            prompt_hash: hash,
            dp_rank,
            cached_tokens,
        };
        collected.push(state.rooms.mark_transferred(t.room, transfer));
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
    dp_rank: u64,
    /// The prefill's `cached_tokens` (SGLang's metadata buffer slot).
    #[serde(default)]
    cached_tokens: u64,
}

#[derive(Deserialize)]
struct Registered {
    dp_size: u64,
}

fn unreachable(at: &str, e: &PeerError) -> Fail {
    Fail::contract(format!("bootstrap server at {at} unreachable: {e}"))
}

/// Registers `t.room` with its bootstrap server; the prefill's dp size.
async fn register(state: &Shared, t: &Target) -> Checked<u64> {
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
    let reg: Registered = serde_json::from_slice(&resp.body).map_err(|e| {
        Fail::contract(format!(
            "bootstrap server at {at} sent a bad register body: {e}"
        ))
    })?;
    Ok(reg.dp_size.max(1))
}

/// The prefill dp rank the decode reads `room`'s KV from, as SGLang's
/// `_resolve_prefill_dp_rank`: the hint, else 0 (prefill dp size 1), else
/// `room % size` (follow_bootstrap_room, the prefill's default).
fn resolve_prefill_rank(hint: Option<u64>, prefill_dp: u64, room: u64) -> u64 {
    match hint {
        Some(h) => h,
        None if prefill_dp <= 1 => 0,
        None => room % prefill_dp,
    }
}

/// Waits for the prefill to transfer `t.room` and checks it prefilled the
/// same prompt, on the rank the decode reads from; the prefill's cached
/// token count.
async fn await_kv(
    state: &Shared,
    t: &Target,
    expected_hash: &str,
    expected_rank: u64,
) -> Checked<u64> {
    let at = authority(&t.host, t.port);
    let wait = state.config.bootstrap_timeout;
    let path = format!("/wait/{}?timeout_ms={}", t.room, wait.as_millis());
    let resp = match state.peers.long_poll(&at, &path, wait).await {
        Polled::Ready(r) => r,
        Polled::TimedOut => {
            return Err(Fail::timeout(format!(
                "KV transfer timed out for room {}",
                t.room
            )))
        }
        Polled::Failed(e) => return Err(unreachable(&at, &e)),
        Polled::Refused(r) => {
            return Err(Fail::contract(format!(
                "bootstrap server at {at} failed waiting for room {}: {} {}",
                t.room,
                r.status.as_u16(),
                r.text()
            )))
        }
    };
    let got: Transferred = serde_json::from_slice(&resp.body).map_err(|e| {
        Fail::contract(format!(
            "bootstrap server at {at} sent a bad wait body: {e}"
        ))
    })?;
    if got.dp_rank != expected_rank {
        return Err(Fail::contract(format!(
            "room {}'s KV is on prefill dp rank {}, but the decode reads it from rank \
             {expected_rank} (`disagg_prefill_dp_rank`, else room % the prefill's dp size)",
            t.room, got.dp_rank
        )));
    }
    if got.prompt_hash != expected_hash {
        return Err(Fail::contract(format!(
            "prompt differs from the prefilled prompt for room {} (prefill hashed {}, decode \
             hashes {expected_hash})",
            t.room, got.prompt_hash
        )));
    }
    Ok(got.cached_tokens)
}

pub async fn decode(state: &Shared, req: &Request<'_>, headers: &HeaderMap) -> Checked<DecodeOut> {
    let batch = batch_size(req)?;
    let targets = targets(req, batch)?;
    unique_rooms(&targets)?;
    let m = state.config.dp_size;
    match routed_rank(req, headers)? {
        Some((_, src)) if m == 1 => return Err(undeclared(src, "this decode")),
        // Unpinned, SGLang's decode balances round-robin.
        Some((r, src)) => {
            in_range(r, m, src)?;
        }
        None => {}
    }
    let hint = prefill_rank_hint(req)?;
    let hashes = room_hashes(req, batch)?;
    let key = req.prompt_key()?;
    // Register every room before waiting on any, so a batch's prefill can
    // proceed room by room.
    let mut ranks = Vec::with_capacity(targets.len());
    for t in &targets {
        let prefill_dp = register(state, t).await?;
        match hint {
            Some(_) if prefill_dp == 1 => {
                return Err(undeclared(
                    "`disagg_prefill_dp_rank`",
                    &format!("the prefill at {}", authority(&t.host, t.port)),
                ))
            }
            Some(h) => {
                in_range(i128::from(h), prefill_dp, "`disagg_prefill_dp_rank`")?;
            }
            None => {}
        }
        ranks.push(resolve_prefill_rank(hint, prefill_dp, t.room));
    }
    let waits = targets
        .iter()
        .zip(&hashes)
        .zip(ranks)
        .map(|((t, h), r)| await_kv(state, t, h, r));
    // SGLang's decode takes the prefill's cached count from the metadata
    // buffer; the mock's prefill writes one count into every room.
    let mut prefill_cached = None;
    for result in futures_util::future::join_all(waits).await {
        let cached = result?;
        prefill_cached.get_or_insert(cached);
    }
    let mut out = DecodeOut::new(Kv::Pulled, approx_tokens(&key));
    out.prefill_cached = prefill_cached;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_resolves_the_prefill_rank_as_sglang() {
        assert_eq!(resolve_prefill_rank(Some(3), 4, 5), 3);
        assert_eq!(resolve_prefill_rank(None, 1, 5), 0);
        assert_eq!(resolve_prefill_rank(None, 4, 5), 1);
        assert_eq!(resolve_prefill_rank(None, 4, 8), 0);
    }

    #[test]
    fn routed_rank_sources() {
        let parse = |b: &'static str| Request::parse(Api::Chat, b.as_bytes()).unwrap();
        let none = HeaderMap::new();
        let mut hdr = HeaderMap::new();
        hdr.insert("x-data-parallel-rank", " 2 ".parse().unwrap());
        let r = parse(r#"{"routed_dp_rank":1,"data_parallel_rank":3}"#);
        assert_eq!(routed_rank(&r, &none).unwrap().map(|x| x.0), Some(1));
        assert_eq!(routed_rank(&r, &hdr).unwrap().map(|x| x.0), Some(2));
        let r = parse(r#"{"data_parallel_rank":3}"#);
        assert_eq!(routed_rank(&r, &none).unwrap().map(|x| x.0), Some(3));
        assert!(routed_rank(&parse("{}"), &none).unwrap().is_none());
        let mut bad = HeaderMap::new();
        bad.insert("x-data-parallel-rank", "one".parse().unwrap());
        let e = routed_rank(&parse("{}"), &bad).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(routed_rank(&parse(r#"{"routed_dp_rank":"1"}"#), &none).is_err());
        assert!(in_range(-1, 2, "x").is_err());
        assert!(in_range(2, 2, "x").is_err());
        assert_eq!(in_range(1, 2, "x").unwrap(), 1);
    }
}

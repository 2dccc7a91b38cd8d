//! vLLM P2pNcclConnector (legacy: removed from vLLM by PR #44854, absent
//! from 0.33; modelled on the last versions that shipped it).
//!
//! Both legs carry one request id that names both pods' ZMQ addresses,
//! `___prefill_addr_{ip}:{port}___decode_addr_{ip}:{port}_{uuid hex}`; the
//! engine parses its internal id (`chatcmpl-…`, `cmpl-…-0`, …) with
//! `re.search`. The prefill finds the decode there and PUTs the KV to it,
//! keyed by the request id; the decode waits for the KV under its own id.
//! The decode gets the client's body unmodified (no `kv_transfer_params`).

use axum::http::{HeaderMap, StatusCode};
use serde_json::json;

use super::contract::{prefill_constraints, same_prompt};
use super::vllm_request::{request_id_source, vllm_internal_id, vllm_request_id};
use crate::error::{Checked, Fail};
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::peer::authority;
use crate::request::{approx_tokens, prompt_hash, Request};
use crate::state::Shared;

/// Python's `re.search(LITERAL + r"(.*):(\d+)" + TAIL, id)`: groups 1 and 2
/// of the leftmost match. `.` matches anything but `\n`, `(.*)` is greedy
/// (the LAST `:digits` that fits wins), `\d+` takes the whole run of digits
/// (TAIL is empty or starts with a non-digit). `\d` here is ASCII only
/// (Python's also takes other Unicode decimal digits).
fn py_search(id: &str, literal: &str, tail: &str) -> Option<(String, String)> {
    let b = id.as_bytes();
    let starts = (0..b.len()).filter(|&i| id.get(i..).is_some_and(|s| s.starts_with(literal)));
    for start in starts {
        let rest = id.get(start + literal.len()..)?;
        // `(.*)` cannot cross a newline, so neither can the ':' after it.
        let line = rest.find('\n').unwrap_or(rest.len());
        let rb = rest.as_bytes();
        for colon in (0..line).rev() {
            if rb.get(colon) != Some(&b':') {
                continue;
            }
            let digits = rb
                .get(colon + 1..)
                .map_or(0, |d| d.iter().take_while(|c| c.is_ascii_digit()).count());
            if digits == 0 {
                continue;
            }
            let after = colon + 1 + digits;
            if rest.get(after..).is_some_and(|s| s.starts_with(tail)) {
                let host = rest.get(..colon)?.to_string();
                let port = rest.get(colon + 1..after)?.to_string();
                return Some((host, port));
            }
        }
    }
    None
}

/// Where the prefill sends the KV: `___decode_addr_(.*):(\d+)`.
pub fn parse_decode_addr(id: &str) -> Option<(String, String)> {
    py_search(id, "___decode_addr_", "")
}

/// Where the decode's KV comes from: `___prefill_addr_(.*):(\d+)___`.
pub fn parse_prefill_addr(id: &str) -> Option<(String, String)> {
    py_search(id, "___prefill_addr_", "___")
}

fn needs_id(req: &Request<'_>, leg: &str) -> Fail {
    Fail::contract(format!(
        "p2p_nccl: the {leg} has no request id; both addresses travel in {} \
         (___prefill_addr_IP:PORT___decode_addr_IP:PORT_<hex>)",
        request_id_source(req.api)
    ))
}

pub async fn prefill(
    state: &Shared,
    req: &Request<'_>,
    headers: &HeaderMap,
    spoiled: bool,
) -> Checked<PrefillOut> {
    prefill_constraints(req, true, state.config.lenient_prefill)?;
    let id = vllm_request_id(req, headers)?.ok_or_else(|| needs_id(req, "prefill"))?;
    let internal = vllm_internal_id(req.api, &id);
    let (host, port) = parse_decode_addr(&internal).ok_or_else(|| {
        Fail::contract(format!(
            "request id {id:?} names no decode: vLLM's re.search(r\"___decode_addr_(.*):(\\d+)\", \
             request_id) does not match"
        ))
    })?;
    let key = req.prompt_key()?;
    let out = PrefillOut::new(approx_tokens(&key));
    if spoiled {
        return Ok(out);
    }
    let sender = state
        .bound
        .zmq
        .ok_or_else(|| Fail::internal("vllm p2p_nccl prefill has no zmq listener bound"))?;
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p != 0) else {
        return Err(Fail::kv_load(format!(
            "could not send the KV to the decode at {host}:{port} (from the request id): not a \
             TCP port"
        )));
    };
    let at = authority(&host, port);
    let body = json!({
        "request_id": internal,
        "sender": sender.to_string(),
        "prompt_hash": prompt_hash(&key),
    });
    let resp = state
        .peers
        .put_json(&at, "/p2p/kv", &body, state.config.bootstrap_timeout)
        .await
        .map_err(|e| {
            Fail::kv_load(format!(
                "could not send the KV to the decode at {at} (from the request id): {e}"
            ))
        })?;
    match resp.status {
        StatusCode::OK => Ok(out),
        StatusCode::CONFLICT => Err(Fail::contract(format!(
            "the decode at {at} refused the KV for request id {internal:?}: {}",
            resp.text()
        ))),
        s => Err(Fail::kv_load(format!(
            "the decode at {at} refused the KV for request id {internal:?}: {} {}",
            s.as_u16(),
            resp.text()
        ))),
    }
}

pub async fn decode(state: &Shared, req: &Request<'_>, headers: &HeaderMap) -> Checked<DecodeOut> {
    if req.has("kv_transfer_params") {
        return Err(Fail::contract(
            "p2p_nccl decode takes the client's body unmodified, `kv_transfer_params` must not be \
             there (the hand-off travels in the request id)",
        ));
    }
    let id = vllm_request_id(req, headers)?.ok_or_else(|| needs_id(req, "decode"))?;
    let internal = vllm_internal_id(req.api, &id);
    let (p_host, p_port) = parse_prefill_addr(&internal).ok_or_else(|| {
        Fail::contract(format!(
            "request id {id:?} names no prefill: vLLM's \
             re.search(r\"___prefill_addr_(.*):(\\d+)___\", request_id) does not match"
        ))
    })?;
    let key = req.prompt_key()?;
    let own_hash = prompt_hash(&key);
    let wait = state.config.bootstrap_timeout;
    let kv = state
        .offers
        .take(&internal, |_| false, wait)
        .await
        .ok_or_else(|| {
            Fail::timeout(format!(
                "no KV received for request id {internal:?} within {} ms (the prefill at \
                 {p_host}:{p_port} never sent it; vLLM's decode would wait forever)",
                wait.as_millis()
            ))
        })?;
    let sender = kv.sender.unwrap_or_default();
    let same = sender.rsplit_once(':').is_some_and(|(h, p)| {
        h == p_host && p.parse::<u64>().ok() == p_port.parse::<u64>().ok() && !p.is_empty()
    });
    if !same {
        return Err(Fail::contract(format!(
            "the KV for request id {internal:?} came from the prefill at {sender}, but the id \
             names ___prefill_addr_{p_host}:{p_port}"
        )));
    }
    same_prompt(&kv.prompt_hash, &own_hash)?;
    Ok(DecodeOut::new(Kv::Pulled, approx_tokens(&key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(h: &str, p: &str) -> Option<(String, String)> {
        Some((h.to_string(), p.to_string()))
    }

    #[test]
    fn parses_vllm_proxy_ids() {
        let id = "___prefill_addr_10.0.0.1:14579___decode_addr_10.0.0.2:14580_\
                  0123456789abcdef0123456789abcdef";
        assert_eq!(parse_prefill_addr(id), pair("10.0.0.1", "14579"));
        assert_eq!(parse_decode_addr(id), pair("10.0.0.2", "14580"));
    }

    #[test]
    fn parses_internal_ids_with_prefix_and_suffix() {
        // The engine parses its internal id: endpoint prefix, per-prompt
        // index and the randomisation suffix do not stop the match.
        let id = "chatcmpl-___prefill_addr_10.0.0.1:14579___decode_addr_10.0.0.2:14580_\
                  0123456789abcdef0123456789abcdef-0-1a2b3c4d";
        assert_eq!(parse_prefill_addr(id), pair("10.0.0.1", "14579"));
        assert_eq!(parse_decode_addr(id), pair("10.0.0.2", "14580"));
        let id = "cmpl-x___prefill_addr_127.0.0.1:1___decode_addr_127.0.0.1:2_ab-0";
        assert_eq!(parse_prefill_addr(id), pair("127.0.0.1", "1"));
        assert_eq!(parse_decode_addr(id), pair("127.0.0.1", "2"));
    }

    #[test]
    fn greedy_like_python() {
        // Greedy (.*): the last ":digits" that fits.
        assert_eq!(
            parse_decode_addr("___decode_addr_a:1:2_x"),
            pair("a:1", "2")
        );
        assert_eq!(
            parse_decode_addr("___decode_addr_a:1_b:22"),
            pair("a:1_b", "22")
        );
        // The prefill pattern needs "___" right after the digits.
        assert_eq!(
            parse_prefill_addr("___prefill_addr_h:1___x:2___"),
            pair("h:1___x", "2")
        );
        assert_eq!(
            parse_prefill_addr("___prefill_addr_h:1___decode_addr_d:2_ff"),
            pair("h", "1")
        );
        // Unbracketed IPv6, as vLLM writes it: still the last colon.
        assert_eq!(
            parse_decode_addr("___decode_addr_::1:14580_ab"),
            pair("::1", "14580")
        );
        // Empty host is fine for Python's (.*).
        assert_eq!(parse_decode_addr("___decode_addr_:5"), pair("", "5"));
    }

    #[test]
    fn no_match_like_python() {
        assert_eq!(parse_decode_addr(""), None);
        assert_eq!(parse_decode_addr("plain-uuid"), None);
        assert_eq!(parse_decode_addr("___decode_addr_host:_x"), None);
        assert_eq!(parse_prefill_addr("___prefill_addr_h:1__x"), None);
        // Only a prefill address: no decode to send to.
        assert_eq!(parse_decode_addr("___prefill_addr_h:1___"), None);
        // (.*) stops at a newline.
        assert_eq!(parse_decode_addr("___decode_addr_h\n:1"), None);
        // ...but a later occurrence may still match (re.search).
        assert_eq!(
            parse_decode_addr("___decode_addr_h\n___decode_addr_g:3"),
            pair("g", "3")
        );
    }
}

use super::handler::{EngineHandler, Merged, PrefillAnswer};
use crate::api::Api;
use crate::body::{json_string, push_json_str};
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{AbortCall, LegEdits, Legs, PdContext};

/// SGLang's bootstrap hand-off. Both legs name the prefill's bootstrap server
/// and a random room; the prefill blocks until the decode has registered that
/// room, so the legs must run concurrently (awaiting the prefill first
/// deadlocks until SGLang's bootstrap timeout).
///
/// Data parallelism (pods that declare `dp_size` > 1): the router picks a
/// rank per leg and says so where SGLang 0.5 reads it: the prefill gets
/// `routed_dp_rank`, the decode `routed_dp_rank` and `disagg_prefill_dp_rank`
/// (which prefill rank holds its KV). A prefill on SGLang's default
/// `follow_bootstrap_room` rule fails a request whose room does not map to
/// its rank (`room % dp_size`), so every room is chosen to map to the
/// prefill's rank.
pub struct SglangHandler;

/// Rooms are uniform in `[0, 2^63 - 1]`: SGLang stores them as signed 64-bit.
const ROOM_MASK: u64 = i64::MAX as u64;

/// A room from `random` that maps to `rank` among `dp` prefill ranks.
fn room_for(random: u64, rank: u64, dp: u64) -> u64 {
    let r = random & ROOM_MASK;
    if dp <= 1 {
        return r;
    }
    // Round down to a multiple of dp, then add the rank; stays below the mask.
    let base = r - r % dp;
    let base = if base > ROOM_MASK - dp {
        base - dp
    } else {
        base
    };
    base + rank
}

impl EngineHandler for SglangHandler {
    fn name(&self) -> &'static str {
        "sglang"
    }

    fn concurrent(&self) -> bool {
        true
    }

    fn should_split(&self, ctx: &PdContext, _prefill: &Endpoint) -> bool {
        // vLLM's token-in API; SGLang serves no such path, and its decode
        // says so better than a split would.
        ctx.fields.api != Api::Generate
    }

    fn owned_keys(&self) -> &'static [&'static str] {
        &[
            "bootstrap_host",
            "bootstrap_port",
            "bootstrap_room",
            "routed_dp_rank",
            "disagg_prefill_dp_rank",
            "data_parallel_rank",
        ]
    }

    fn augment_prefill_request(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        let no_random =
            |e: String| EngineError::Internal(format!("no randomness for bootstrap_room: {e}"));
        let p_dp = pod.dp_size.max(1) as u64;
        let d_dp = ctx.decode_pod.dp_size.max(1) as u64;
        let p_rank = if p_dp > 1 {
            ctx.ids.random_u64().map_err(no_random)? % p_dp
        } else {
            0
        };
        let d_rank = if d_dp > 1 {
            ctx.ids.random_u64().map_err(no_random)? % d_dp
        } else {
            0
        };
        let mut room = || -> Result<u64, EngineError> {
            let r = ctx.ids.random_u64().map_err(no_random)?;
            Ok(room_for(r, p_rank, p_dp))
        };
        let mut host = Vec::with_capacity(pod.ip.len() + 2);
        push_json_str(&mut host, &pod.ip);
        let host = String::from_utf8_lossy(&host).into_owned();
        let port = pod.bootstrap_port.to_string();
        let (host, port, rooms) = match ctx.fields.batch_size() {
            // A batch gets one room per sequence, and arrays of the same length.
            Some(k) => {
                let mut rooms = Vec::with_capacity(k);
                for _ in 0..k {
                    rooms.push(room()?.to_string());
                }
                (
                    format!("[{}]", vec![host; k].join(",")),
                    format!("[{}]", vec![port; k].join(",")),
                    format!("[{}]", rooms.join(",")),
                )
            }
            None => (host, port, room()?.to_string()),
        };
        for leg in [&mut legs.prefill, &mut legs.decode] {
            leg.body.set_raw("bootstrap_host", host.clone());
            leg.body.set_raw("bootstrap_port", port.clone());
            leg.body.set_raw("bootstrap_room", rooms.clone());
        }
        if p_dp > 1 {
            legs.prefill.body.set_u64("routed_dp_rank", p_rank);
            legs.decode.body.set_u64("disagg_prefill_dp_rank", p_rank);
        }
        if d_dp > 1 {
            legs.decode.body.set_u64("routed_dp_rank", d_rank);
        }
        // The prefill carries the id its abort names (a client's own `rid`
        // is kept).
        if let Some(rid) = prefill_rid(ctx) {
            if !ctx.top.contains("rid") {
                legs.prefill.body.set_raw("rid", json_string(&rid));
            }
        }
        Ok(())
    }

    fn prefill_abort(&self, ctx: &PdContext) -> Option<AbortCall> {
        let rid = prefill_rid(ctx)?;
        Some(AbortCall {
            path: "/abort_request",
            body: format!(r#"{{"rid":{}}}"#, json_string(&rid)),
        })
    }

    fn merge_prefill_response(
        &self,
        _ctx: &mut PdContext,
        _answer: &PrefillAnswer,
        _pod: &Endpoint,
        _decode: &mut LegEdits,
    ) -> Result<Merged, EngineError> {
        // The decode already went out with everything it needs.
        Ok(Merged::Decode(None))
    }
}

/// The `rid` SGLang knows the prefill by: the client's own (a string), or
/// the router's request id. None for a batch (one rid per sequence) and a
/// request without an id.
fn prefill_rid(ctx: &PdContext) -> Option<String> {
    if ctx.fields.batch_size().is_some() {
        return None;
    }
    match ctx.top.raw_non_null(ctx.body, "rid") {
        Some(raw) => serde_json::from_str::<String>(std::str::from_utf8(raw).ok()?).ok(),
        None => (!ctx.request_id.is_empty()).then(|| ctx.request_id.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::room_for;

    #[test]
    fn rooms_map_to_the_prefill_rank_and_stay_in_range() {
        for (r, rank, dp) in [
            (u64::MAX, 3, 4),
            (0, 1, 2),
            (12345, 0, 8),
            (i64::MAX as u64, 6, 7),
        ] {
            let room = room_for(r, rank, dp);
            assert_eq!(room % dp, rank, "{r} {rank} {dp}");
            assert!(room <= i64::MAX as u64);
        }
        assert_eq!(
            room_for(u64::MAX, 0, 1),
            i64::MAX as u64,
            "no DP: the room as drawn"
        );
    }
}

use super::{EngineError, EngineHandler, Legs, Merged, PdContext, PrefillAnswer};
use crate::body::{push_json_str, Edits};
use crate::fleet::Endpoint;

/// SGLang's bootstrap hand-off. Both legs name the prefill's bootstrap server
/// and a random room; the prefill blocks until the decode has registered that
/// room, so the legs must run concurrently (awaiting the prefill first
/// deadlocks until SGLang's bootstrap timeout).
pub struct SglangHandler;

/// Rooms are uniform in `[0, 2^63 - 1]`: SGLang stores them as signed 64-bit.
const ROOM_MASK: u64 = i64::MAX as u64;

impl EngineHandler for SglangHandler {
    fn name(&self) -> &'static str {
        "sglang"
    }

    fn is_async(&self) -> bool {
        true
    }

    fn owned_keys(&self) -> &'static [&'static str] {
        &["bootstrap_host", "bootstrap_port", "bootstrap_room"]
    }

    fn augment_prefill_request(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        let mut room = || {
            ctx.entropy
                .random_u64()
                .map(|r| r & ROOM_MASK)
                .map_err(|e| {
                    EngineError::Internal(format!("no randomness for bootstrap_room: {e}"))
                })
        };
        let mut host = Vec::with_capacity(pod.ip.len() + 2);
        push_json_str(&mut host, &pod.ip);
        let host = String::from_utf8_lossy(&host).into_owned();
        let port = pod.bootstrap_port.to_string();
        let (host, port, rooms) = match ctx.facts.batch_size() {
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
            leg.set_raw("bootstrap_host", host.clone());
            leg.set_raw("bootstrap_port", port.clone());
            leg.set_raw("bootstrap_room", rooms.clone());
        }
        Ok(())
    }

    fn merge_prefill_response(
        &self,
        _ctx: &mut PdContext,
        _answer: &PrefillAnswer,
        _pod: &Endpoint,
        _decode: &mut Edits,
    ) -> Result<Merged, EngineError> {
        // The decode already went out with everything it needs.
        Ok(Merged::Forward)
    }
}

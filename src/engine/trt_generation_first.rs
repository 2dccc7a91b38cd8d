//! TensorRT-LLM's generation-first order (`schedule_style:
//! generation_first`), as its disaggregated server sends it
//! (`tensorrt_llm/serve/openai_disagg_service.py`,
//! `_send_disagg_request_gen_first`; PRs 11020, 11941 and 12239):
//!
//! - the context leg: `{"request_type": "context_only",
//!   "disagg_request_id": <id>, "schedule_style": 1}`; the context server
//!   holds it until the generation server asks for its KV;
//! - the generation leg: the client's request, unchanged (there is no
//!   context answer to take token ids from), with `{"request_type":
//!   "generation_only", "ctx_request_id": <id>, "disagg_request_id": <id>,
//!   "schedule_style": 1}` updated with the context server's own
//!   `disaggregated_params` from `GET /server_info` (`ctx_info_endpoint`,
//!   `ctx_dp_rank`), which the router learns ahead of time.
//!
//! `schedule_style` is `DisaggScheduleStyle.GENERATION_FIRST`, an IntEnum.

use super::trt_auth;
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{Legs, PdContext};
use serde_json::{Map, Value};

/// `DisaggScheduleStyle.GENERATION_FIRST`.
const GENERATION_FIRST: u64 = 1;

/// The keys whose values pair the legs: the router's, whatever a server's
/// `/server_info` says.
const PAIRING: [&str; 4] = [
    "request_type",
    "ctx_request_id",
    "disagg_request_id",
    "schedule_style",
];

/// Both legs' `disaggregated_params` (and the generation leg's signature),
/// with `id` the split's disagg request id and `pod` the context server.
pub fn legs(
    ctx: &mut PdContext,
    pod: &Endpoint,
    id: i64,
    legs: &mut Legs,
) -> Result<(), EngineError> {
    let info = ctx.learned.trt_server_info(pod.id).ok_or_else(|| {
        EngineError::NotReady(format!(
            "the GET /server_info of TensorRT-LLM context server {} is not known yet",
            pod.name
        ))
    })?;
    legs.prefill.body.set_raw(
        "disaggregated_params",
        format!(
            r#"{{"request_type":"context_only","disagg_request_id":{id},"schedule_style":{GENERATION_FIRST}}}"#
        ),
    );
    let params = generation_params(info, id)?;
    // The generation leg names the context server's endpoint, a field
    // TensorRT-LLM's workers check the signature of.
    if let Some(key) = ctx.trt_auth_key {
        if let Some(signature) = trt_auth::sign(key, params.as_bytes())? {
            legs.decode.set_header(trt_auth::HEADER, signature);
        }
    }
    legs.decode.body.set_raw("disaggregated_params", params);
    Ok(())
}

/// The generation leg's `disaggregated_params`: the server's, then the
/// pairing.
fn generation_params(info: &str, id: i64) -> Result<String, EngineError> {
    let mut params: Map<String, Value> = serde_json::from_str(info).map_err(|e| {
        EngineError::Internal(format!("a learned /server_info is not an object: {e}"))
    })?;
    params.insert("request_type".into(), "generation_only".into());
    params.insert("ctx_request_id".into(), id.into());
    params.insert("disagg_request_id".into(), id.into());
    params.insert("schedule_style".into(), GENERATION_FIRST.into());
    Ok(Value::Object(params).to_string())
}

/// What a context server's `GET /server_info` says the generation leg
/// needs (`{"disaggregated_params": {"ctx_info_endpoint": [..],
/// "ctx_dp_rank": ..}}`), as the one string [`LearnedPods`] keeps: the
/// object, its endpoint reduced to the first of a list (as TensorRT-LLM's
/// orchestrator does), without the pairing keys.
///
/// [`LearnedPods`]: crate::handoff::LearnedPods
pub fn parse_server_info(body: &[u8]) -> Result<Vec<String>, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("not a /server_info answer: {e}"))?;
    let Some(Value::Object(mut params)) = v.get("disaggregated_params").cloned() else {
        return Err("no `disaggregated_params` object: generation-first needs a context worker that serves it (TensorRT-LLM with the Python cache transceiver)".into());
    };
    let endpoint = match params.remove("ctx_info_endpoint") {
        Some(Value::Array(items)) => items.into_iter().next(),
        other => other,
    };
    match endpoint {
        Some(Value::String(s)) if !s.is_empty() => {
            params.insert("ctx_info_endpoint".into(), Value::String(s));
        }
        _ => return Err(
            "`disaggregated_params.ctx_info_endpoint` is not a non-empty string or list of strings"
                .into(),
        ),
    }
    for key in PAIRING {
        params.remove(key);
    }
    Ok(vec![Value::Object(params).to_string()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_info_keeps_the_first_endpoint_and_drops_the_pairing() {
        let said = parse_server_info(
            br#"{"disaggregated_params":{"ctx_dp_rank":null,"ctx_info_endpoint":["10.0.0.5:7001","10.0.0.5:7002"],"disagg_request_id":5}}"#,
        )
        .expect("parses");
        assert_eq!(
            said,
            vec![r#"{"ctx_dp_rank":null,"ctx_info_endpoint":"10.0.0.5:7001"}"#.to_owned()]
        );
        let said = parse_server_info(
            br#"{"disaggregated_params":{"ctx_dp_rank":2,"ctx_info_endpoint":"h:1"}}"#,
        )
        .expect("parses");
        assert_eq!(
            said,
            vec![r#"{"ctx_dp_rank":2,"ctx_info_endpoint":"h:1"}"#.to_owned()]
        );
    }

    #[test]
    fn server_info_without_an_endpoint_is_refused() {
        for bad in [
            &br#"{}"#[..],
            br#"{"disaggregated_params":null}"#,
            br#"{"disaggregated_params":{"ctx_dp_rank":0}}"#,
            br#"{"disaggregated_params":{"ctx_info_endpoint":[]}}"#,
            br#"{"disaggregated_params":{"ctx_info_endpoint":""}}"#,
            br#"{"disaggregated_params":{"ctx_info_endpoint":[7]}}"#,
            b"not json",
        ] {
            assert!(
                parse_server_info(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_generation_leg_pairs_by_the_routers_id() {
        let params = generation_params(
            r#"{"ctx_dp_rank":1,"ctx_info_endpoint":"h:1"}"#,
            4_398_046_511_104_123,
        )
        .expect("object");
        let v: Value = serde_json::from_str(&params).expect("json");
        assert_eq!(v["request_type"], "generation_only");
        assert_eq!(v["ctx_request_id"], 4_398_046_511_104_123_i64);
        assert_eq!(v["disagg_request_id"], 4_398_046_511_104_123_i64);
        assert_eq!(v["schedule_style"], 1);
        assert_eq!(v["ctx_info_endpoint"], "h:1");
        assert_eq!(v["ctx_dp_rank"], 1);
    }
}

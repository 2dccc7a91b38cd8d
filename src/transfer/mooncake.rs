use super::agent::KvTransferAgent;
use crate::body::json_string;
use crate::error::EngineError;
use crate::fleet::Endpoint;
use crate::handoff::{LearnedPods, Legs, PdContext};
use std::collections::BTreeMap;

/// vLLM's `MooncakeConnector` (checked against vLLM 0.33's
/// `kv_connector/v1/mooncake/`): the legs run concurrently, paired by a
/// `transfer_id` the router mints. The prefill keeps its KV for that id; the
/// decode asks the prefill's bootstrap server (`remote_bootstrap_addr` +
/// `/query`) where the engine named `remote_engine_id` is, and pulls. The
/// engine id (one per data-parallel rank) is learned from the same
/// `GET /query` before a pod is used, and the rank is pinned on the prefill
/// with `X-data-parallel-rank`, so the decode names the engine that has the
/// KV. The prefill's answer carries nothing to relay.
pub struct Mooncake;

/// The prefill's DP rank header, as vLLM's entrypoints read it.
const DP_RANK_HEADER: &str = "x-data-parallel-rank";

impl KvTransferAgent for Mooncake {
    fn name(&self) -> &'static str {
        "mooncake"
    }

    fn concurrent(&self) -> bool {
        true
    }

    /// Only once its engine id is known (`GET /query`).
    fn prefill_ready(&self, pod: &Endpoint, learned: &LearnedPods) -> bool {
        learned
            .mooncake_engines(pod.id)
            .is_some_and(|ids| !ids.is_empty())
    }

    fn augment_prefill(
        &self,
        ctx: &mut PdContext,
        pod: &Endpoint,
        legs: &mut Legs,
    ) -> Result<(), EngineError> {
        let learned = ctx.learned;
        let engines = learned.mooncake_engines(pod.id).unwrap_or_default();
        if engines.is_empty() {
            return Err(EngineError::NotReady(format!(
                "the Mooncake engine id of prefill pod {} is not known yet (GET /query on its bootstrap port {})",
                pod.name, pod.bootstrap_port
            )));
        }
        let rank = if engines.len() > 1 {
            let r = ctx
                .ids
                .random_u64()
                .map_err(|e| EngineError::Internal(format!("no randomness: {e}")))?;
            (r % engines.len() as u64) as usize
        } else {
            0
        };
        let engine = engines.get(rank).cloned().unwrap_or_default();
        let tid = json_string(&format!("xfer-{}", ctx.random_hex()?));
        legs.prefill.body.set_raw(
            "kv_transfer_params",
            format!(r#"{{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":{tid}}}"#),
        );
        if engines.len() > 1 {
            legs.prefill.set_header(DP_RANK_HEADER, rank.to_string());
        }
        let host = if pod.ip.contains(':') {
            format!("[{}]", pod.ip)
        } else {
            pod.ip.clone()
        };
        let addr = json_string(&format!("http://{host}:{}", pod.bootstrap_port));
        legs.decode.body.set_raw(
            "kv_transfer_params",
            format!(
                r#"{{"do_remote_decode":false,"do_remote_prefill":true,"remote_bootstrap_addr":{addr},"remote_engine_id":{},"transfer_id":{tid}}}"#,
                json_string(&engine)
            ),
        );
        Ok(())
    }
}

/// The engine ids of a `GET /query` answer, by data-parallel rank (vLLM:
/// `{"<dp_rank>": {"engine_id": "...", "worker_addr": {...}}, ...}`). Ranks
/// must be 0..n without gaps: a decode is told one engine per rank.
pub fn parse_query(body: &[u8]) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct Entry {
        engine_id: String,
    }
    let map: BTreeMap<String, Entry> =
        serde_json::from_slice(body).map_err(|e| format!("not a /query answer: {e}"))?;
    let mut ranks: Vec<(u32, String)> = Vec::with_capacity(map.len());
    for (rank, entry) in map {
        let r: u32 = rank
            .parse()
            .map_err(|_| format!("rank {rank:?} is not a number"))?;
        if entry.engine_id.is_empty() {
            return Err(format!("rank {r} has an empty engine_id"));
        }
        ranks.push((r, entry.engine_id));
    }
    ranks.sort();
    if ranks.is_empty() {
        return Err("no engine has registered yet".into());
    }
    for (i, (r, _)) in ranks.iter().enumerate() {
        if *r as usize != i {
            return Err(format!(
                "ranks are not 0..{}: rank {i} is missing",
                ranks.len()
            ));
        }
    }
    Ok(ranks.into_iter().map(|(_, id)| id).collect())
}

#[cfg(test)]
mod tests {
    use super::parse_query;

    #[test]
    fn query_answers_give_one_engine_per_rank() {
        let one =
            br#"{"0": {"engine_id": "e-1", "worker_addr": {"0": {"0": "tcp://10.0.0.5:17000"}}}}"#;
        assert_eq!(parse_query(one), Ok(vec!["e-1".to_owned()]));
        let dp = br#"{"1": {"engine_id": "e_dp1", "worker_addr": {}}, "0": {"engine_id": "e_dp0", "worker_addr": {}}}"#;
        assert_eq!(
            parse_query(dp),
            Ok(vec!["e_dp0".to_owned(), "e_dp1".to_owned()])
        );
        assert!(parse_query(b"{}").unwrap_err().contains("registered"));
        assert!(parse_query(br#"{"1": {"engine_id": "e"}}"#)
            .unwrap_err()
            .contains("missing"));
        assert!(parse_query(br#"{"x": {"engine_id": "e"}}"#).is_err());
        assert!(parse_query(b"<html>").is_err());
    }
}

//! Choosing the prefill and decode pods: AIBrix's PD scheduling (roleset
//! pairing, prefix-cache and load-balancing scores, imbalance fast paths,
//! outlier filter, prompt-length buckets with combined pods) plus the
//! round-robin, random and power-of-two policies of SGLang's and vLLM's
//! routers. Everything here is pure: the router gathers the pods' state from
//! shared data and the scraped metrics, and hands it in.
//!
//! A placement runs in three stages: [`candidates`] (buckets, roleset
//! pairing, health), [`fast_paths`] (rules that decide outright when load or
//! the prefix cache say so), then [`score`] (the model's policies).

mod candidates;
mod choice;
pub mod decider;
mod fast_paths;
pub mod prefix;
mod random;
mod request;
mod score;
mod state;
mod work;

use crate::fleet::{DecodePolicy, Endpoint, Model, Scheduling};
use random::shuffle;
use state::state;
use std::rc::Rc;

pub use candidates::Candidate;
pub use choice::{Choice, NoPod};
pub use random::SplitMix64;
pub use request::{LoadBound, PlacementRequest};
pub use score::{decode_scores, prefill_scores};
pub use state::PodState;
pub use work::prefill_work;

/// Places one request.
pub fn schedule<'m>(
    model: &'m Model,
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Choice<'m> {
    let pool = match candidates::gather(model, pods, req) {
        Ok(pool) => pool,
        Err(decision) => return decision,
    };
    if let Some(d) = fast_paths::idle_combined(&pool, pods, s) {
        return d;
    }
    // A session's pods come from its key and the loads alone, as
    // consistent hashing's: every replica must rank them the same way.
    if let Some(key) = req.session {
        if let Some(d) = score::by_session(&pool, pods, req, key) {
            return d;
        }
    }
    // Consistent hashing decides the prefill pod from the prefix and the
    // shared load alone: the fast paths read this replica's own counters,
    // and would send one prefix to different pods from different replicas.
    // The least-TTFT cost weighs load and cache in tokens itself, and the
    // decode policy its own load: AIBrix's rules of thumb over counts of
    // requests would override them.
    if model.prefill_policy.skips_fast_paths() {
        return score::by_policy(model, &pool, pods, req, s);
    }
    let pool = fast_paths::without_prefill_outliers(pool, pods, s);
    let fast = [
        fast_paths::prefill_imbalance,
        fast_paths::prefix_affinity,
        fast_paths::decode_imbalance,
    ];
    for rule in fast {
        if let Some(d) = rule(model, &pool, pods, req, s) {
            return d;
        }
    }
    score::by_policy(model, &pool, pods, req, s)
}

/// The pod for a call of `model` that is not split (embeddings,
/// tokenize, an engine's unsplit path): any of its usable decode or
/// combined pods, by the model's decode policy; equal pods in random order.
pub fn unsplit_pod<'m>(
    model: &'m Model,
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Result<&'m Rc<Endpoint>, NoPod> {
    let mut all: Vec<&Rc<Endpoint>> = Vec::new();
    for e in model
        .rolesets
        .iter()
        .flat_map(|r| r.decode.iter())
        .chain(model.combined.iter())
    {
        if !all.iter().any(|seen| seen.id == e.id) {
            all.push(e);
        }
    }
    if all.is_empty() {
        return Err(NoPod::NotConfigured);
    }
    let mut usable: Vec<&Rc<Endpoint>> = all
        .into_iter()
        .filter(|e| !req.exclude.contains(&e.slot) && !state(pods, e).unhealthy)
        .collect();
    let turn = match model.decode_policy {
        DecodePolicy::RoundRobin => req.prefill_turn,
        _ => {
            shuffle(&mut usable, req.random);
            0
        }
    };
    let eps: Vec<&Endpoint> = usable.iter().map(|e| e.as_ref()).collect();
    let scores = score::decode_scores(model.decode_policy, &eps, pods, req, s, turn);
    score::argmin(&scores)
        .and_then(|i| usable.get(i).copied())
        .ok_or(NoPod::AllUnhealthy)
}

#[cfg(test)]
mod tests;

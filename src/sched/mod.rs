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
mod fast_paths;
pub mod prefix;
mod score;

use crate::fleet::{Endpoint, Model, Scheduling};
use crate::pods::PodMetrics;
use std::rc::Rc;

pub use candidates::Candidate;
pub use score::{decode_scores, prefill_scores};

/// What the scheduler knows about one pod of the model (indexed by the
/// endpoints' `slot`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodState {
    /// Prefills in flight from every worker of this Envoy.
    pub outstanding_prefills: u32,
    /// Decodes sent by this Envoy and not finished.
    pub pending_decodes: u32,
    pub unhealthy: bool,
    pub metrics: Option<PodMetrics>,
}

impl PodState {
    /// Running plus pending decodes, AIBrix's `run`.
    pub fn decode_load(&self) -> f64 {
        self.metrics.map(|m| m.running).unwrap_or(0.0) + self.pending_decodes as f64
    }

    /// Queue per drained request per second (AIBrix's overload ratio), when
    /// the pod reports both.
    fn queue_ratio(&self) -> Option<f64> {
        let m = self.metrics?;
        let drain = m.drain_rate?;
        Some(m.waiting / drain.max(0.01))
    }
}

/// The state of `ep` in `pods`; a pod the caller knows nothing about reads as
/// idle and healthy.
fn state(pods: &[PodState], ep: &Endpoint) -> PodState {
    pods.get(ep.slot).copied().unwrap_or_default()
}

/// What the scheduler is asked to place.
pub struct PlacementRequest<'a> {
    /// Estimated prompt length in tokens.
    pub prompt_tokens: u64,
    /// Prefix-cache match percentage per pod slot (0 when absent).
    pub prefix_match: &'a dyn Fn(usize) -> f64,
    /// This VM's turn counter for round-robin.
    pub turn: u64,
    /// Uniform random numbers.
    pub random: &'a mut dyn FnMut() -> u64,
    /// Slots of the pods this request already failed on.
    pub exclude: &'a [usize],
}

/// The scheduler's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<'m> {
    Split {
        prefill: &'m Rc<Endpoint>,
        decode: &'m Rc<Endpoint>,
        /// The fast path that decided, if any.
        reason: &'static str,
    },
    /// A pod serving both phases: no prefill call.
    Combined {
        pod: &'m Rc<Endpoint>,
        reason: &'static str,
    },
    NoPod(NoPod),
}

/// Why no pod could be chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPod {
    /// No roleset has both roles, and no combined pod is configured.
    NotConfigured,
    /// Pods exist but every candidate is unhealthy (or already failed).
    AllUnhealthy,
    /// No roleset's bucket and no combined pod fits the prompt length.
    NoBucket,
}

/// Places one request.
pub fn schedule<'m>(
    model: &'m Model,
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Decision<'m> {
    let pool = match candidates::gather(model, pods, req) {
        Ok(pool) => pool,
        Err(decision) => return decision,
    };
    if let Some(d) = fast_paths::idle_combined(&pool, pods, s) {
        return d;
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

/// Estimated tokens in a prompt of `bytes` bytes (about four bytes a token
/// for English BPE vocabularies; the router does not tokenize).
pub fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

#[cfg(test)]
mod tests;

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
pub mod decider;
mod fast_paths;
pub mod prefix;
mod score;

use crate::fleet::{DecodePolicy, Endpoint, Model, Scheduling};
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
    /// The prompt tokens they compute, as estimated when they were placed.
    pub outstanding_prefill_tokens: u64,
    /// Decodes sent by this Envoy and not finished.
    pub pending_decodes: u32,
    pub unhealthy: bool,
    /// Healthy, but its hand-off cannot run yet (a Mooncake prefill whose
    /// engine id is not known): no prefill goes to it.
    pub not_ready_for_prefill: bool,
    pub metrics: Option<PodMetrics>,
}

impl PodState {
    /// Running plus pending decodes, AIBrix's `run`: what the engine ran
    /// for others at the last scrape, plus this Envoy's own decodes now
    /// (its own, counted exactly, are not counted twice).
    pub fn decode_load(&self) -> f64 {
        let others = self
            .metrics
            .map(|m| (m.running - m.own_running).max(0.0))
            .unwrap_or(0.0);
        others + self.pending_decodes as f64
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
    /// `consistent_hash`: the hash naming the prompt's leading blocks.
    pub prefix_key: Option<u64>,
    /// `consistent_hash`: when a pod's load makes it give way (from
    /// [`Scheduling::bounded_load_factor`]).
    pub load_bound: LoadBound,
    /// This VM's round-robin turn over the model's prefill pods.
    pub prefill_turn: u64,
    /// The next round-robin turn over a roleset's decode pods (by roleset
    /// index): each phase rotates on its own, or decode pods whose index
    /// never lines up with their roleset's prefill turn would never be chosen.
    pub decode_turn: &'a mut dyn FnMut(usize) -> u64,
    /// Uniform random numbers: ties between equal pods and rolesets are
    /// broken with them, so idle capacity shares the work.
    pub random: &'a mut dyn FnMut() -> u64,
    /// Slots of the pods this request already failed on.
    pub exclude: &'a [usize],
}

/// When a pod holding a prefix is too busy to keep it (consistent hashing
/// with bounded loads, Mirrokni, Thorup and Zadimoghaddam): each pod takes
/// at most ⌈`factor` × (the pods' load + 1) / pods⌉, so no pod runs more
/// than `factor` times the mean, at any load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadBound {
    pub factor: f64,
}

impl LoadBound {
    pub fn of(s: &Scheduling) -> LoadBound {
        LoadBound {
            factor: s.bounded_load_factor,
        }
    }

    /// The load at which a pod gives way, when the candidates' loads sum to
    /// `total` over `pods` pods.
    pub fn capacity(&self, total: f64, pods: usize) -> f64 {
        (self.factor * (total + 1.0) / pods.max(1) as f64).ceil()
    }
}

/// SplitMix64: the scheduler's random numbers, seeded once per request
/// from the host (a host call per number would cost more than the choice).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Shuffles `items` (Fisher-Yates) so that "the first of equals" anywhere
/// later is a uniformly random one (AIBrix shuffles its candidates too).
fn shuffle<T>(items: &mut [T], random: &mut dyn FnMut() -> u64) {
    for i in (1..items.len()).rev() {
        let j = (random() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// The scheduler's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice<'m> {
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
) -> Choice<'m> {
    let pool = match candidates::gather(model, pods, req) {
        Ok(pool) => pool,
        Err(decision) => return decision,
    };
    if let Some(d) = fast_paths::idle_combined(&pool, pods, s) {
        return d;
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

//! The last stage of a placement: the model's policies score the pods
//! (lower wins, `INFINITY` means "not a candidate"), and the scores pick a
//! pair.

use super::candidates::{Candidate, Pool};
use super::choice::{Choice, NoPod};
use super::random::SplitMix64;
use super::request::{LoadBound, PlacementRequest};
use super::state::{state, PodState};
use super::work::prefill_work;
use crate::fleet::{DecodePolicy, Endpoint, Model, PrefillPolicy, Scheduling};
use std::rc::Rc;

/// Rotation: the pod at `turn % n` scores 0, the next 1, and so on.
fn round_robin(n: usize, turn: u64) -> Vec<f64> {
    let start = (turn % n.max(1) as u64) as usize;
    (0..n).map(|i| ((i + n - start) % n) as f64).collect()
}

fn random(n: usize, ask: &mut PlacementRequest) -> Vec<f64> {
    (0..n)
        .map(|_| ((ask.random)() >> 11) as f64 / (1u64 << 53) as f64)
        .collect()
}

/// Two distinct random candidates keep their load score; the rest are out.
fn power_of_two(load: Vec<f64>, ask: &mut PlacementRequest) -> Vec<f64> {
    let n = load.len();
    if n <= 2 {
        return load;
    }
    let a = ((ask.random)() % n as u64) as usize;
    let b = (a + 1 + ((ask.random)() % (n as u64 - 1)) as usize) % n;
    load.iter()
        .enumerate()
        .map(|(i, l)| if i == a || i == b { *l } else { f64::INFINITY })
        .collect()
}

/// Scores prefill candidates under `policy`.
pub fn prefill_scores(
    policy: PrefillPolicy,
    c: &[&Endpoint],
    pods: &[PodState],
    ask: &mut PlacementRequest,
    s: &Scheduling,
) -> Vec<f64> {
    let outstanding: Vec<f64> = c
        .iter()
        .map(|e| state(pods, e).outstanding_prefills as f64)
        .collect();
    match policy {
        PrefillPolicy::RoundRobin => round_robin(c.len(), ask.prefill_turn),
        PrefillPolicy::Random => random(c.len(), ask),
        PrefillPolicy::LeastRequest => outstanding,
        PrefillPolicy::PowerOfTwo => power_of_two(outstanding, ask),
        PrefillPolicy::ConsistentHash => bounded_rendezvous(c, pods, ask, &outstanding),
        PrefillPolicy::LeastTtft => least_ttft(c, pods, ask, s),
        PrefillPolicy::PrefixCache => {
            // AIBrix: (100 − match %) × 0.1 + outstanding / max outstanding.
            let max = outstanding.iter().copied().fold(1.0, f64::max);
            c.iter()
                .zip(&outstanding)
                .map(|(e, o)| {
                    (100.0 - (ask.prefix_match)(e.slot).clamp(0.0, 100.0)) * 0.1 + o / max
                })
                .collect()
        }
    }
}

/// The prompt tokens each candidate computes before this prompt's first
/// token, lowest first: those of the prefills queued on it (this Envoy's, as
/// estimated when each was placed; the requests it reported for others at
/// the last scrape, at this Envoy's mean prefill) and this prompt's tokens
/// it does not hold. Prefill time grows with the tokens computed, so this
/// is the order of the first tokens' times. With `attention_tokens` set,
/// each token counts for its attention too ([`prefill_work`]).
fn least_ttft(
    c: &[&Endpoint],
    pods: &[PodState],
    ask: &PlacementRequest,
    s: &Scheduling,
) -> Vec<f64> {
    let prompt = ask.prompt_tokens as f64;
    let lacks =
        |e: &Endpoint| prompt - prompt * (ask.prefix_match)(e.slot).clamp(0.0, 100.0) / 100.0;
    // In the queue's unit: what computing them costs that pod.
    let lacking_work = |e: &Endpoint| {
        let lacking = lacks(e);
        prefill_work(lacking, prompt - lacking, s.attention_tokens)
    };
    let cap = [s.affinity_cap_tokens, s.affinity_cap_prompts * prompt]
        .into_iter()
        .filter(|c| *c > 0.0)
        .reduce(f64::max);
    // Only a cap reads the fewest, so the default path makes no second pass.
    let fewest = match cap {
        Some(_) => c
            .iter()
            .map(|e| lacking_work(e))
            .fold(f64::INFINITY, f64::min),
        None => 0.0,
    };
    c.iter()
        .zip(queued_tokens(
            c,
            pods,
            prefill_work(prompt, 0.0, s.attention_tokens),
        ))
        .map(|(e, queued)| {
            queued
                + uncached_cost(lacking_work(e), fewest, cap, s)
                + busy_home_cost(lacks(e), pods, e, s)
        })
        .collect()
}

/// What computing `lacking` tokens on a pod costs the conversations whose
/// answers stream from its prefill (`busy_home_tokens`, 0: nothing): their
/// next turns arrive while it runs, in proportion to how long it runs, and
/// each waits for it. At most `busy_home_cap` times `lacking` when set.
/// Off (the default), the pod's state is not read.
fn busy_home_cost(lacking: f64, pods: &[PodState], e: &Endpoint, s: &Scheduling) -> f64 {
    if s.busy_home_tokens <= 0.0 {
        return 0.0;
    }
    let streams = f64::from(state(pods, e).live_streams);
    let cost = streams * lacking * lacking / s.busy_home_tokens;
    if s.busy_home_cap > 0.0 {
        cost.min(s.busy_home_cap * lacking)
    } else {
        cost
    }
}

/// The score of the prompt tokens a pod does not hold. Weighed in full
/// (`uncached_token_weight`) without a cap. With one (`affinity_cap_tokens`,
/// `affinity_cap_prompts` times the prompt), the tokens themselves count
/// once and the weight's part above 1 counts only on those beyond the
/// fewest any candidate lacks, at most the cap: so a pod holding the prompt
/// wins unless its queue is longer than another's by the tokens it saves
/// plus the cap. Subtracting the same amount from every candidate leaves the
/// uncapped order unchanged.
fn uncached_cost(uncached: f64, fewest: f64, cap: Option<f64>, s: &Scheduling) -> f64 {
    match cap {
        Some(cap) => {
            let extra = (s.uncached_token_weight - 1.0) * (uncached - fewest).max(0.0);
            uncached + extra.min(cap)
        }
        None => s.uncached_token_weight * uncached,
    }
}

/// The prompt tokens queued on each candidate: this Envoy's prefills, as
/// estimated when each was placed, and the requests the pod reported for
/// others at the last scrape, at this Envoy's mean prefill (`prompt`, the
/// placed prompt's own, when it has none in flight). In the unit the
/// prefills were held in: their tokens, or their work with
/// `attention_tokens` set.
fn queued_tokens(c: &[&Endpoint], pods: &[PodState], prompt: f64) -> Vec<f64> {
    let states: Vec<PodState> = c.iter().map(|e| state(pods, e)).collect();
    let (count, tokens) = states.iter().fold((0u64, 0u64), |(n, t), s| {
        (
            n + s.outstanding_prefills as u64,
            t.saturating_add(s.outstanding_prefill_tokens),
        )
    });
    let per_request = if count > 0 {
        tokens as f64 / count as f64
    } else {
        prompt
    };
    states
        .iter()
        .map(|s| {
            let others = s.metrics.map_or(0.0, |m| m.others_prefill_load());
            s.outstanding_prefill_tokens as f64 + others * per_request
        })
        .collect()
}

/// A session's pods: its home prefill pod, then its home decode pod of
/// that roleset, each the first of the session's rendezvous ranking.
/// `None` when either is at or above the load bound, when another prefill
/// pod holds more of the prompt, or the pool has no pod to pair: the
/// model's own policy places the request then. A busy
/// session moving to the next pod of its ranking would land where none of
/// its history is; the policy weighs the prefix table and the load instead
/// (measured: bench/README.md "Session affinity and next-turn reuse rows").
pub(crate) fn by_session<'m>(
    pool: &Pool<'m>,
    pods: &[PodState],
    req: &PlacementRequest,
    key: u64,
) -> Option<Choice<'m>> {
    let prefill = eps(&pool.prefill);
    let load = prefill_load(&prefill, pods);
    let pi = home_under_bound(key, &prefill, &load, req.load_bound)?;
    let pre = pool.prefill.get(pi)?;
    // Another pod holding more of the prompt (a first turn whose system
    // prompt others share, a session that moved while busy): the policy,
    // which weighs cache and load, places it.
    let best = prefill
        .iter()
        .map(|e| (req.prefix_match)(e.slot))
        .fold(0.0, f64::max);
    if (req.prefix_match)(pre.ep.slot) < best {
        return None;
    }
    let decode_pool = pool.decode_of(pre.roleset);
    let decode = eps(&decode_pool);
    let load: Vec<f64> = decode
        .iter()
        .map(|e| state(pods, e).decode_load())
        .collect();
    let di = home_under_bound(key, &decode, &load, req.load_bound)?;
    Some(Choice::Split {
        prefill: pre.ep,
        decode: decode_pool.get(di)?.ep,
        reason: "session",
    })
}

/// The first of `key`'s rendezvous ranking, when it is under the bound.
fn home_under_bound(key: u64, c: &[&Endpoint], load: &[f64], bound: LoadBound) -> Option<usize> {
    let home =
        (0..c.len()).max_by_key(|i| c.get(*i).map_or(0, |e| rendezvous_weight(key, e.id)))?;
    let cap = bound.capacity(load.iter().sum(), c.len());
    load.get(home).is_some_and(|l| *l < cap).then_some(home)
}

/// Each candidate's position in `key`'s rendezvous ranking, the pods at or
/// above the load bound after the others.
fn rendezvous_ranks(key: u64, c: &[&Endpoint], load: &[f64], bound: LoadBound) -> Vec<f64> {
    let cap = bound.capacity(load.iter().sum(), c.len());
    let mut order: Vec<usize> = (0..c.len()).collect();
    let weight = |i: usize| c.get(i).map_or(0, |e| rendezvous_weight(key, e.id));
    order.sort_by_key(|i| std::cmp::Reverse(weight(*i)));
    let (under, over): (Vec<usize>, Vec<usize>) = order
        .into_iter()
        .partition(|i| load.get(*i).is_some_and(|l| *l < cap));
    let mut ranks = vec![f64::INFINITY; c.len()];
    for (rank, i) in under.into_iter().chain(over).enumerate() {
        if let Some(r) = ranks.get_mut(i) {
            *r = rank as f64;
        }
    }
    ranks
}

/// Rendezvous hashing with bounded load: each pod's weight for the prompt's
/// prefix key orders the candidates the same way on every replica; a pod at
/// or above the load bound goes after the others. Scores are the positions.
/// Without a key (a prompt shorter than one block) the least loaded wins.
fn bounded_rendezvous(
    c: &[&Endpoint],
    pods: &[PodState],
    ask: &PlacementRequest,
    outstanding: &[f64],
) -> Vec<f64> {
    let Some(key) = ask.prefix_key else {
        return outstanding.to_vec();
    };
    rendezvous_ranks(key, c, &prefill_load(c, pods), ask.load_bound)
}

/// Each candidate's prefill load as every replica can see it: what the
/// engine reported for others plus this replica's own prefills, counted
/// exactly.
fn prefill_load(c: &[&Endpoint], pods: &[PodState]) -> Vec<f64> {
    c.iter()
        .map(|e| {
            let s = state(pods, e);
            s.metrics.map_or(0.0, |m| m.others_prefill_load()) + s.outstanding_prefills as f64
        })
        .collect()
}

/// A pod's weight for a prefix key: a stable mix of the two, the same on
/// every replica and in every build.
pub fn rendezvous_weight(key: u64, pod: crate::fleet::PodId) -> u64 {
    SplitMix64(key ^ pod.0.rotate_left(29)).next_u64()
}

/// Scores decode candidates under `policy`; `turn` is the round-robin turn
/// of the roleset they belong to.
pub fn decode_scores(
    policy: DecodePolicy,
    c: &[&Endpoint],
    pods: &[PodState],
    ask: &mut PlacementRequest,
    s: &Scheduling,
    turn: u64,
) -> Vec<f64> {
    let run: Vec<f64> = c.iter().map(|e| state(pods, e).decode_load()).collect();
    match policy {
        DecodePolicy::RoundRobin => round_robin(c.len(), turn),
        DecodePolicy::Random => random(c.len(), ask),
        DecodePolicy::LeastRequest => run,
        DecodePolicy::PowerOfTwo => power_of_two(run, ask),
        DecodePolicy::LoadBalancing => {
            // AIBrix: (w_run·run/max_run + w_thr·(1 − thr/max_thr)) / (free/max_free),
            // free = 100 − KV usage %, floored at 0.1; maxima floored at 1.
            // One deviation: an idle pod (nothing running or pending) counts
            // as generating nothing, which is what it does now. The scraped
            // rate lags by a scrape interval, and rewarding it sent every
            // request of sequential traffic to whichever idle pod had served
            // the last one.
            let thr: Vec<f64> = c
                .iter()
                .zip(&run)
                .map(|(e, run)| {
                    let thr = state(pods, e).metrics.and_then(|m| m.gen_throughput);
                    if *run > 0.0 {
                        thr.unwrap_or(0.0)
                    } else {
                        0.0
                    }
                })
                .collect();
            let free: Vec<f64> = c
                .iter()
                .map(|e| {
                    let used = state(pods, e)
                        .metrics
                        .and_then(|m| m.kv_usage)
                        .unwrap_or(0.0);
                    let f = (100.0 - used * 100.0).round();
                    if f <= 0.0 {
                        0.1
                    } else {
                        f
                    }
                })
                .collect();
            let max_run = run.iter().copied().fold(1.0, f64::max);
            let max_thr = thr.iter().copied().fold(1.0, f64::max);
            let max_free = free.iter().copied().fold(1.0, f64::max);
            run.iter()
                .zip(&thr)
                .zip(&free)
                .map(|((run, thr), free)| {
                    let load = s.decode_weight_running * run / max_run
                        + s.decode_weight_throughput * (1.0 - thr / max_thr);
                    let score = load / (free / max_free);
                    if score.is_nan() {
                        f64::INFINITY
                    } else {
                        score
                    }
                })
                .collect()
        }
    }
}

fn eps<'m>(c: &[Candidate<'m>]) -> Vec<&'m Endpoint> {
    c.iter().map(|c| c.ep.as_ref()).collect()
}

/// The index of the lowest finite score; the first of equals.
pub(crate) fn argmin(scores: &[f64]) -> Option<usize> {
    scores
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_finite())
        .fold(None, |best: Option<(usize, f64)>, (i, s)| match best {
            Some((_, b)) if b <= *s => best,
            _ => Some((i, *s)),
        })
        .map(|(i, _)| i)
}

/// Per roleset index (up to `rolesets`), the best of its candidates by
/// `scores` (aligned with `cands`): one pass, whatever the number of
/// rolesets; the first of equals.
fn best_by_roleset(cands: &[Candidate], scores: &[f64], rolesets: usize) -> Vec<Option<usize>> {
    let mut best: Vec<Option<usize>> = vec![None; rolesets];
    for (i, (c, s)) in cands.iter().zip(scores).enumerate() {
        if !s.is_finite() {
            continue;
        }
        if let Some(slot) = best.get_mut(c.roleset) {
            let better = match *slot {
                Some(b) => scores.get(b).is_some_and(|bs| *s < *bs),
                None => true,
            };
            if better {
                *slot = Some(i);
            }
        }
    }
    best
}

pub(crate) fn pick_one_prefill<'m>(
    model: &Model,
    c: &[Candidate<'m>],
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Option<&'m Rc<Endpoint>> {
    let scores = prefill_scores(model.prefill_policy, &eps(c), pods, req, s);
    argmin(&scores).and_then(|i| c.get(i)).map(|c| c.ep)
}

pub(crate) fn pick_one_decode<'m>(
    model: &Model,
    c: &[Candidate<'m>],
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Option<&'m Rc<Endpoint>> {
    // Only the round-robin policy advances the roleset's decode rotation.
    let turn = match (model.decode_policy, c.first()) {
        (DecodePolicy::RoundRobin, Some(first)) => (req.decode_turn)(first.roleset),
        _ => 0,
    };
    let scores = decode_scores(model.decode_policy, &eps(c), pods, req, s, turn);
    argmin(&scores).and_then(|i| c.get(i)).map(|c| c.ep)
}

/// The pair the model's policies choose.
pub(crate) fn by_policy<'m>(
    model: &'m Model,
    pool: &Pool<'m>,
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Choice<'m> {
    if model.prefill_policy.scores_all() && model.decode_policy.scores_all() {
        if let Some(d) = best_roleset(model, pool, pods, req, s) {
            return d;
        }
    }
    // Direct policies: the prefill pod first, then a decode pod of its roleset.
    let Some(pre) = pick_one_prefill(model, &pool.prefill, pods, req, s) else {
        return Choice::NoPod(NoPod::AllUnhealthy);
    };
    let ri = pool
        .prefill
        .iter()
        .find(|c| Rc::ptr_eq(c.ep, pre))
        .map(|c| c.roleset)
        .unwrap_or(0);
    match pick_one_decode(model, &pool.decode_of(ri), pods, req, s) {
        Some(dec) => Choice::Split {
            prefill: pre,
            decode: dec,
            reason: "policy",
        },
        None => Choice::NoPod(NoPod::AllUnhealthy),
    }
}

/// AIBrix: each roleset offers its best prefill and best decode pod; the pair
/// with the lowest normalised sum wins.
fn best_roleset<'m>(
    model: &'m Model,
    pool: &Pool<'m>,
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Option<Choice<'m>> {
    let ps = prefill_scores(model.prefill_policy, &eps(&pool.prefill), pods, req, s);
    // Score policies only: no rotation to advance.
    let ds = decode_scores(model.decode_policy, &eps(&pool.decode), pods, req, s, 0);
    let max_p = ps
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(1.0, f64::max);
    let max_d = ds
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(0.01, f64::max);
    let best_p = best_by_roleset(&pool.prefill, &ps, model.rolesets.len());
    let best_d = best_by_roleset(&pool.decode, &ds, model.rolesets.len());
    let mut best: Option<(f64, usize, usize)> = None;
    for &ri in &pool.fits {
        let pair = best_p
            .get(ri)
            .copied()
            .flatten()
            .zip(best_d.get(ri).copied().flatten());
        let Some((p, d)) = pair else { continue };
        let (Some(sp), Some(sd)) = (ps.get(p), ds.get(d)) else {
            continue;
        };
        let total = sp / max_p + sd / max_d;
        if best.is_none_or(|b| total < b.0) {
            best = Some((total, p, d));
        }
    }
    let (_, p, d) = best?;
    Some(Choice::Split {
        prefill: pool.prefill.get(p)?.ep,
        decode: pool.decode.get(d)?.ep,
        reason: "score",
    })
}

//! Rules that decide a placement outright when load or the prefix cache say
//! so (AIBrix's fast paths, plus SGLang's cache-aware affinity), tried in
//! order before the policies' scores.

use super::candidates::{least, Candidate, Pool};
use super::choice::Choice;
use super::request::PlacementRequest;
use super::score::{pick_one_decode, pick_one_prefill};
use super::state::{state, PodState};
use crate::fleet::{Endpoint, Model, PrefillPolicy, Scheduling};
use std::rc::Rc;

/// AIBrix: an idle combined pod takes the request while PD pods are overloaded.
pub(crate) fn idle_combined<'m>(
    pool: &Pool<'m>,
    pods: &[PodState],
    s: &Scheduling,
) -> Option<Choice<'m>> {
    let idle = pool
        .combined
        .iter()
        .filter_map(|c| state(pods, c).queue_ratio().map(|r| (*c, r)))
        .filter(|(_, r)| *r < s.combined_idle_ratio)
        .fold(None, |best: Option<(&Rc<Endpoint>, f64)>, x| match best {
            Some(b) if b.1 <= x.1 => Some(b),
            _ => Some(x),
        });
    let overloaded = pool.prefill.iter().chain(pool.decode.iter()).any(|c| {
        state(pods, c.ep)
            .queue_ratio()
            .is_some_and(|r| r > s.pd_overload_ratio)
    });
    match (idle, overloaded) {
        (Some((pod, _)), true) => Some(Choice::Combined {
            pod,
            reason: "pd_overloaded",
        }),
        _ => None,
    }
}

/// Outlier filter: prefill pods far above the mean (sample σ) are skipped.
pub(crate) fn without_prefill_outliers<'m>(
    mut pool: Pool<'m>,
    pods: &[PodState],
    s: &Scheduling,
) -> Pool<'m> {
    if pool.prefill.len() <= 2 {
        return pool;
    }
    let outstanding = |c: &Candidate| state(pods, c.ep).outstanding_prefills as f64;
    let loads: Vec<f64> = pool.prefill.iter().map(outstanding).collect();
    let n = loads.len() as f64;
    let mean = loads.iter().sum::<f64>() / n;
    let var = loads.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    if var <= 0.0 {
        return pool;
    }
    let limit = mean + s.prefill_outlier_stddev_factor * var.sqrt();
    let floor =
        loads.iter().copied().fold(f64::MAX, f64::min) + s.prefill_outlier_min_spread as f64;
    let kept: Vec<Candidate> = pool
        .prefill
        .iter()
        .filter(|c| {
            let o = outstanding(c);
            o <= limit || o < floor
        })
        .copied()
        .collect();
    if !kept.is_empty() {
        pool.prefill = kept;
    }
    pool
}

/// Prefill imbalance: the least-loaded prefill pod, decode aligned to its
/// roleset.
pub(crate) fn prefill_imbalance<'m>(
    model: &'m Model,
    pool: &Pool<'m>,
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Option<Choice<'m>> {
    let outstanding = |c: &Candidate| state(pods, c.ep).outstanding_prefills;
    let (pmin, pmax) = pool.prefill.iter().fold((u32::MAX, 0), |(lo, hi), c| {
        (lo.min(outstanding(c)), hi.max(outstanding(c)))
    });
    if pmax.saturating_sub(pmin) <= s.prefill_imbalance_min_spread {
        return None;
    }
    let mins: Vec<&Candidate> = pool
        .prefill
        .iter()
        .filter(|c| outstanding(c) == pmin)
        .collect();
    let pick = *mins.get(((req.random)() % mins.len().max(1) as u64) as usize)?;
    let decode = pick_one_decode(model, &pool.decode_of(pick.roleset), pods, req, s)?;
    Some(Choice::Split {
        prefill: pick.ep,
        decode,
        reason: "prefill_imbalance",
    })
}

/// Prefix affinity: a pod that already holds most of the prompt takes it.
pub(crate) fn prefix_affinity<'m>(
    model: &'m Model,
    pool: &Pool<'m>,
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Option<Choice<'m>> {
    if model.prefill_policy != PrefillPolicy::PrefixCache {
        return None;
    }
    let load = |c: &Candidate| state(pods, c.ep).outstanding_prefills;
    let (pick, _) = pool
        .prefill
        .iter()
        .map(|c| (c, (req.prefix_match)(c.ep.slot)))
        .filter(|(_, m)| *m >= s.prefix_affinity_min_match && *m > 0.0)
        .fold(None, |best: Option<(&Candidate, f64)>, (c, m)| match best {
            Some((b, bm)) if bm > m || (bm == m && load(b) <= load(c)) => Some((b, bm)),
            _ => Some((c, m)),
        })?;
    let decode = pick_one_decode(model, &pool.decode_of(pick.roleset), pods, req, s)?;
    Some(Choice::Split {
        prefill: pick.ep,
        decode,
        reason: "prefix_affinity",
    })
}

/// Decode imbalance: the decode pod is decided, prefill aligned.
pub(crate) fn decode_imbalance<'m>(
    model: &'m Model,
    pool: &Pool<'m>,
    pods: &[PodState],
    req: &mut PlacementRequest,
    s: &Scheduling,
) -> Option<Choice<'m>> {
    let (dec, reason) = imbalanced_decode(&pool.decode, pods, s, req)?;
    let prefill = pick_one_prefill(model, &pool.prefill_of(dec.roleset), pods, req, s)?;
    Some(Choice::Split {
        prefill,
        decode: dec.ep,
        reason,
    })
}

/// AIBrix's three decode imbalance checks, in order.
fn imbalanced_decode<'c, 'm>(
    decode: &'c [Candidate<'m>],
    pods: &[PodState],
    s: &Scheduling,
    req: &mut PlacementRequest,
) -> Option<(&'c Candidate<'m>, &'static str)> {
    if decode.len() < 2 {
        return None;
    }
    // Shuffled so ties don't always favour the first pod.
    let mut order: Vec<&Candidate> = decode.iter().collect();
    for i in (1..order.len()).rev() {
        let j = ((req.random)() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let run = |c: &Candidate| state(pods, c.ep).decode_load();
    let (lo, hi) = order.iter().fold((f64::MAX, f64::MIN), |(lo, hi), c| {
        (lo.min(run(c)), hi.max(run(c)))
    });
    if hi - lo >= s.decode_imbalance_min_spread {
        return least(&order, |c| run(c)).map(|c| (*c, "decode_running_imbalance"));
    }
    let with_thr: Vec<(&Candidate, f64)> = order
        .iter()
        .filter_map(|c| {
            state(pods, c.ep)
                .metrics
                .and_then(|m| m.gen_throughput)
                .map(|t| (*c, t))
        })
        .collect();
    if with_thr.len() >= 2 {
        let (lo, hi) = with_thr
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), (_, t)| {
                (lo.min(*t), hi.max(*t))
            });
        if hi - lo > s.decode_throughput_imbalance_min_spread {
            return least(&with_thr, |(_, t)| *t).map(|(c, _)| (*c, "decode_throughput_imbalance"));
        }
    }
    let drains: Option<Vec<(&Candidate, f64)>> = order
        .iter()
        .map(|c| {
            state(pods, c.ep)
                .metrics
                .and_then(|m| m.drain_rate)
                .filter(|d| *d > 0.0)
                .map(|d| (*c, run(c) / d.max(0.1)))
        })
        .collect();
    let ratios = drains?;
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), (_, r)| {
            (lo.min(*r), hi.max(*r))
        });
    if lo > 0.0 && hi / lo > s.decode_score_ratio_threshold {
        return least(&ratios, |(_, r)| *r).map(|(c, _)| (*c, "decode_drain_imbalance"));
    }
    None
}

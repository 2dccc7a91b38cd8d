//! Choosing the prefill and decode pods: AIBrix's PD scheduling (roleset
//! pairing, prefix-cache and load-balancing scores, imbalance fast paths,
//! outlier filter, prompt-length buckets with combined pods) plus the
//! round-robin, random and power-of-two policies of SGLang's and vLLM's
//! routers. Everything here is pure: the flow gathers the pods' state from
//! shared data and the scraped metrics, and hands it in.

mod policy;
pub mod prefix;
pub mod state;

use crate::config::{Endpoint, Model, Scheduling};
pub use policy::{decode_scores, prefill_scores};

/// How prefill pods are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillPolicy {
    RoundRobin,
    Random,
    /// Fewest outstanding prefills.
    LeastRequest,
    /// AIBrix: prefix-cache match, then outstanding prefills.
    #[default]
    PrefixCache,
    /// Two random pods, the less loaded of them.
    PowerOfTwo,
}

impl PrefillPolicy {
    pub const NAMES: [&'static str; 5] = [
        "round_robin",
        "random",
        "least_request",
        "prefix_cache",
        "power_of_two",
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "round_robin" => Self::RoundRobin,
            "random" => Self::Random,
            "least_request" => Self::LeastRequest,
            "prefix_cache" => Self::PrefixCache,
            "power_of_two" => Self::PowerOfTwo,
            _ => return None,
        })
    }

    /// Whether the policy yields comparable scores for every pod (so rolesets
    /// can be ranked by combined score) rather than picking directly.
    fn scores_all(self) -> bool {
        matches!(self, Self::LeastRequest | Self::PrefixCache)
    }
}

/// How decode pods are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodePolicy {
    RoundRobin,
    Random,
    /// Fewest running + pending decodes.
    LeastRequest,
    /// AIBrix: running requests, generation throughput and free KV cache.
    #[default]
    LoadBalancing,
    PowerOfTwo,
}

impl DecodePolicy {
    pub const NAMES: [&'static str; 5] = [
        "round_robin",
        "random",
        "least_request",
        "load_balancing",
        "power_of_two",
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "round_robin" => Self::RoundRobin,
            "random" => Self::Random,
            "least_request" => Self::LeastRequest,
            "load_balancing" => Self::LoadBalancing,
            "power_of_two" => Self::PowerOfTwo,
            _ => return None,
        })
    }

    fn scores_all(self) -> bool {
        matches!(self, Self::LeastRequest | Self::LoadBalancing)
    }
}

/// Load signals scraped from a pod's `/metrics`, still fresh.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodMetrics {
    pub running: f64,
    pub waiting: f64,
    /// KV-cache usage, a fraction.
    pub kv_usage: Option<f64>,
    /// Generated tokens per second.
    pub gen_throughput: Option<f64>,
    /// Finished requests per second.
    pub drain_rate: Option<f64>,
}

/// What the scheduler knows about one pod (indexed like `Config::pods`).
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

/// What the scheduler is asked to place.
pub struct Ask<'a> {
    /// Estimated prompt length in tokens.
    pub prompt_tokens: u64,
    /// Prefix-cache match percentage per pod index (0 when absent).
    pub prefix_match: &'a dyn Fn(usize) -> f64,
    /// This VM's turn counter for round-robin.
    pub turn: u64,
    /// Uniform random numbers.
    pub random: &'a mut dyn FnMut() -> u64,
    /// Pods this request already failed on.
    pub exclude: &'a [usize],
}

/// The scheduler's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<'m> {
    Split {
        prefill: &'m Endpoint,
        decode: &'m Endpoint,
        /// The fast path that decided, if any.
        reason: &'static str,
    },
    /// A pod serving both phases: no prefill call.
    Combined {
        pod: &'m Endpoint,
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

struct Cand<'m> {
    roleset: usize,
    ep: &'m Endpoint,
}

fn usable(ep: &Endpoint, pods: &[PodState], exclude: &[usize]) -> bool {
    !exclude.contains(&ep.pod) && pods.get(ep.pod).is_some_and(|p| !p.unhealthy)
}

fn least<T>(items: &[T], key: impl Fn(&T) -> f64) -> Option<&T> {
    items.iter().fold(None, |best: Option<&T>, x| match best {
        Some(b) if key(b) <= key(x) => Some(b),
        _ => Some(x),
    })
}

/// Places one request.
pub fn schedule<'m>(
    model: &'m Model,
    pods: &[PodState],
    ask: &mut Ask,
    s: &Scheduling,
) -> Decision<'m> {
    let configured = model.rolesets.iter().any(|r| r.is_eligible());
    let combined: Vec<&Endpoint> = model
        .combined
        .iter()
        .filter(|c| {
            c.prompt_tokens
                .is_none_or(|r| r.contains(ask.prompt_tokens))
        })
        .filter(|c| usable(c, pods, ask.exclude))
        .collect();
    if !configured && model.combined.is_empty() {
        return Decision::NoPod(NoPod::NotConfigured);
    }

    // Prompt-length buckets: a roleset without a range takes any length.
    let fits: Vec<usize> = model
        .rolesets
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_eligible())
        .filter(|(_, r)| {
            r.prompt_tokens
                .is_none_or(|b| b.contains(ask.prompt_tokens))
        })
        .map(|(i, _)| i)
        .collect();
    let mut prefill: Vec<Cand> = Vec::new();
    let mut decode: Vec<Cand> = Vec::new();
    for &ri in &fits {
        let rs = &model.rolesets[ri];
        let p: Vec<_> = rs
            .prefill
            .iter()
            .filter(|e| usable(e, pods, ask.exclude))
            .collect();
        let d: Vec<_> = rs
            .decode
            .iter()
            .filter(|e| usable(e, pods, ask.exclude))
            .collect();
        if p.is_empty() || d.is_empty() {
            continue;
        }
        prefill.extend(p.into_iter().map(|ep| Cand { roleset: ri, ep }));
        decode.extend(d.into_iter().map(|ep| Cand { roleset: ri, ep }));
    }

    if prefill.is_empty() {
        return match least(&combined, |c| pods[c.pod].decode_load()) {
            Some(pod) => Decision::Combined {
                pod,
                reason: if fits.is_empty() {
                    "no_bucket"
                } else {
                    "pd_unavailable"
                },
            },
            None if fits.is_empty() && configured => Decision::NoPod(NoPod::NoBucket),
            None if !configured && model.combined.is_empty() => {
                Decision::NoPod(NoPod::NotConfigured)
            }
            None => Decision::NoPod(NoPod::AllUnhealthy),
        };
    }

    // AIBrix: an idle combined pod takes the request while PD pods are overloaded.
    if !combined.is_empty() {
        let idle = combined
            .iter()
            .filter_map(|c| pods[c.pod].queue_ratio().map(|r| (c, r)))
            .filter(|(_, r)| *r < s.combined_idle_ratio)
            .fold(None, |best: Option<(&&Endpoint, f64)>, x| match best {
                Some(b) if b.1 <= x.1 => Some(b),
                _ => Some(x),
            });
        let overloaded = prefill.iter().chain(decode.iter()).any(|c| {
            pods[c.ep.pod]
                .queue_ratio()
                .is_some_and(|r| r > s.pd_overload_ratio)
        });
        if let (Some((pod, _)), true) = (idle, overloaded) {
            return Decision::Combined {
                pod,
                reason: "pd_overloaded",
            };
        }
    }

    // Outlier filter: skip prefill pods far above the mean (sample σ).
    if prefill.len() > 2 {
        let loads: Vec<f64> = prefill
            .iter()
            .map(|c| pods[c.ep.pod].outstanding_prefills as f64)
            .collect();
        let n = loads.len() as f64;
        let mean = loads.iter().sum::<f64>() / n;
        let var = loads.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let limit = mean + s.prefill_outlier_stddev_factor * var.sqrt();
        let floor =
            loads.iter().copied().fold(f64::MAX, f64::min) + s.prefill_outlier_min_spread as f64;
        if var > 0.0 {
            let kept: Vec<Cand> = prefill
                .iter()
                .filter(|c| {
                    let o = pods[c.ep.pod].outstanding_prefills as f64;
                    o <= limit || o < floor
                })
                .map(|c| Cand {
                    roleset: c.roleset,
                    ep: c.ep,
                })
                .collect();
            if !kept.is_empty() {
                prefill = kept;
            }
        }
    }

    // Prefill imbalance fast path: the least-loaded prefill pod, decode
    // aligned to its roleset.
    let (pmin, pmax) = prefill.iter().fold((u32::MAX, 0), |(lo, hi), c| {
        let v = pods[c.ep.pod].outstanding_prefills;
        (lo.min(v), hi.max(v))
    });
    if pmax - pmin > s.prefill_imbalance_min_spread {
        let mins: Vec<&Cand> = prefill
            .iter()
            .filter(|c| pods[c.ep.pod].outstanding_prefills == pmin)
            .collect();
        let pick = mins[((ask.random)() % mins.len() as u64) as usize];
        let d: Vec<Cand> = decode
            .iter()
            .filter(|c| c.roleset == pick.roleset)
            .map(|c| Cand {
                roleset: c.roleset,
                ep: c.ep,
            })
            .collect();
        if let Some(dec) = pick_one_decode(model, &d, pods, ask, s) {
            return Decision::Split {
                prefill: pick.ep,
                decode: dec,
                reason: "prefill_imbalance",
            };
        }
    }

    // Prefix affinity: a pod that already holds most of the prompt takes it.
    if model.prefill_policy == PrefillPolicy::PrefixCache {
        let best = prefill
            .iter()
            .map(|c| (c, (ask.prefix_match)(c.ep.pod)))
            .filter(|(_, m)| *m >= s.prefix_affinity_min_match && *m > 0.0)
            .fold(None, |best: Option<(&Cand, f64)>, (c, m)| {
                let load = |c: &Cand| pods[c.ep.pod].outstanding_prefills;
                match best {
                    Some((b, bm)) if bm > m || (bm == m && load(b) <= load(c)) => Some((b, bm)),
                    _ => Some((c, m)),
                }
            });
        if let Some((pick, _)) = best {
            let d: Vec<Cand> = decode
                .iter()
                .filter(|c| c.roleset == pick.roleset)
                .map(|c| Cand {
                    roleset: c.roleset,
                    ep: c.ep,
                })
                .collect();
            if let Some(dec) = pick_one_decode(model, &d, pods, ask, s) {
                return Decision::Split {
                    prefill: pick.ep,
                    decode: dec,
                    reason: "prefix_affinity",
                };
            }
        }
    }

    // Decode imbalance fast paths: the decode pod is decided, prefill aligned.
    if let Some((dec, reason)) = decode_imbalance(&decode, pods, s, ask) {
        let p: Vec<Cand> = prefill
            .iter()
            .filter(|c| c.roleset == dec.roleset)
            .map(|c| Cand {
                roleset: c.roleset,
                ep: c.ep,
            })
            .collect();
        if let Some(pre) = pick_one_prefill(model, &p, pods, ask) {
            return Decision::Split {
                prefill: pre,
                decode: dec.ep,
                reason,
            };
        }
    }

    if model.prefill_policy.scores_all() && model.decode_policy.scores_all() {
        // AIBrix: each roleset offers its best prefill and best decode pod;
        // the pair with the lowest normalised sum wins.
        let ps = prefill_scores(model.prefill_policy, &eps(&prefill), pods, ask);
        let ds = decode_scores(model.decode_policy, &eps(&decode), pods, ask, s);
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
        let mut best: Option<(f64, usize, usize)> = None;
        for &ri in &fits {
            let bp = best_in(&prefill, &ps, ri);
            let bd = best_in(&decode, &ds, ri);
            if let (Some(p), Some(d)) = (bp, bd) {
                let total = ps[p] / max_p + ds[d] / max_d;
                if best.is_none_or(|b| total < b.0) {
                    best = Some((total, p, d));
                }
            }
        }
        if let Some((_, p, d)) = best {
            return Decision::Split {
                prefill: prefill[p].ep,
                decode: decode[d].ep,
                reason: "score",
            };
        }
    }

    // Direct policies: the prefill pod first, then a decode pod of its roleset.
    let Some(pre) = pick_one_prefill(model, &prefill, pods, ask) else {
        return Decision::NoPod(NoPod::AllUnhealthy);
    };
    let ri = prefill
        .iter()
        .find(|c| std::ptr::eq(c.ep, pre))
        .map(|c| c.roleset)
        .unwrap_or(0);
    let d: Vec<Cand> = decode
        .iter()
        .filter(|c| c.roleset == ri)
        .map(|c| Cand {
            roleset: c.roleset,
            ep: c.ep,
        })
        .collect();
    match pick_one_decode(model, &d, pods, ask, s) {
        Some(dec) => Decision::Split {
            prefill: pre,
            decode: dec,
            reason: "policy",
        },
        None => Decision::NoPod(NoPod::AllUnhealthy),
    }
}

fn eps<'m>(c: &[Cand<'m>]) -> Vec<&'m Endpoint> {
    c.iter().map(|c| c.ep).collect()
}

fn best_in(cands: &[Cand], scores: &[f64], roleset: usize) -> Option<usize> {
    cands
        .iter()
        .enumerate()
        .filter(|(i, c)| c.roleset == roleset && scores[*i].is_finite())
        .fold(None, |best: Option<usize>, (i, _)| match best {
            Some(b) if scores[b] <= scores[i] => Some(b),
            _ => Some(i),
        })
}

fn argmin(scores: &[f64]) -> Option<usize> {
    (0..scores.len())
        .filter(|i| scores[*i].is_finite())
        .fold(None, |best: Option<usize>, i| match best {
            Some(b) if scores[b] <= scores[i] => Some(b),
            _ => Some(i),
        })
}

fn pick_one_prefill<'m>(
    model: &Model,
    c: &[Cand<'m>],
    pods: &[PodState],
    ask: &mut Ask,
) -> Option<&'m Endpoint> {
    let scores = prefill_scores(model.prefill_policy, &eps(c), pods, ask);
    argmin(&scores).map(|i| c[i].ep)
}

fn pick_one_decode<'m>(
    model: &Model,
    c: &[Cand<'m>],
    pods: &[PodState],
    ask: &mut Ask,
    s: &Scheduling,
) -> Option<&'m Endpoint> {
    let scores = decode_scores(model.decode_policy, &eps(c), pods, ask, s);
    argmin(&scores).map(|i| c[i].ep)
}

/// AIBrix's three decode imbalance checks, in order.
fn decode_imbalance<'c, 'm>(
    decode: &'c [Cand<'m>],
    pods: &[PodState],
    s: &Scheduling,
    ask: &mut Ask,
) -> Option<(&'c Cand<'m>, &'static str)> {
    if decode.len() < 2 {
        return None;
    }
    // Shuffled so ties don't always favour the first pod.
    let mut order: Vec<&Cand> = decode.iter().collect();
    for i in (1..order.len()).rev() {
        let j = ((ask.random)() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let run = |c: &Cand| pods[c.ep.pod].decode_load();
    let (lo, hi) = order.iter().fold((f64::MAX, f64::MIN), |(lo, hi), c| {
        (lo.min(run(c)), hi.max(run(c)))
    });
    if hi - lo >= s.decode_imbalance_min_spread {
        return least(&order, |c| run(c)).map(|c| (*c, "decode_running_imbalance"));
    }
    let with_thr: Vec<(&Cand, f64)> = order
        .iter()
        .filter_map(|c| {
            pods[c.ep.pod]
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
    let drains: Option<Vec<(&Cand, f64)>> = order
        .iter()
        .map(|c| {
            pods[c.ep.pod]
                .metrics
                .and_then(|m| m.drain_rate)
                .filter(|d| *d > 0.0)
                .map(|d| (*c, run(c) / d.max(0.1)))
        })
        .collect();
    if let Some(ratios) = drains {
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), (_, r)| {
                (lo.min(*r), hi.max(*r))
            });
        if lo > 0.0 && hi / lo > s.decode_score_ratio_threshold {
            return least(&ratios, |(_, r)| *r).map(|(c, _)| (*c, "decode_drain_imbalance"));
        }
    }
    None
}

/// Estimated tokens in a prompt of `bytes` bytes (about four bytes a token
/// for English BPE vocabularies; the router does not tokenize).
pub fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

#[cfg(test)]
mod tests;

//! Per-pod scores; lower wins, `INFINITY` means "not a candidate".

use super::{Ask, DecodePolicy, PodState, PrefillPolicy};
use crate::config::{Endpoint, Scheduling};

/// Rotation: the pod at `turn % n` scores 0, the next 1, and so on.
fn round_robin(n: usize, turn: u64) -> Vec<f64> {
    let start = (turn % n.max(1) as u64) as usize;
    (0..n).map(|i| ((i + n - start) % n) as f64).collect()
}

fn random(n: usize, ask: &mut Ask) -> Vec<f64> {
    (0..n)
        .map(|_| ((ask.random)() >> 11) as f64 / (1u64 << 53) as f64)
        .collect()
}

/// Two distinct random candidates keep their load score; the rest are out.
fn power_of_two(load: Vec<f64>, ask: &mut Ask) -> Vec<f64> {
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
    ask: &mut Ask,
) -> Vec<f64> {
    let outstanding: Vec<f64> = c
        .iter()
        .map(|e| pods[e.pod].outstanding_prefills as f64)
        .collect();
    match policy {
        PrefillPolicy::RoundRobin => round_robin(c.len(), ask.turn),
        PrefillPolicy::Random => random(c.len(), ask),
        PrefillPolicy::LeastRequest => outstanding,
        PrefillPolicy::PowerOfTwo => power_of_two(outstanding, ask),
        PrefillPolicy::PrefixCache => {
            // AIBrix: (100 − match %) × 0.1 + outstanding / max outstanding.
            let max = outstanding.iter().copied().fold(1.0, f64::max);
            c.iter()
                .zip(&outstanding)
                .map(|(e, o)| (100.0 - (ask.prefix_match)(e.pod).clamp(0.0, 100.0)) * 0.1 + o / max)
                .collect()
        }
    }
}

/// Scores decode candidates under `policy`.
pub fn decode_scores(
    policy: DecodePolicy,
    c: &[&Endpoint],
    pods: &[PodState],
    ask: &mut Ask,
    s: &Scheduling,
) -> Vec<f64> {
    let run: Vec<f64> = c.iter().map(|e| pods[e.pod].decode_load()).collect();
    match policy {
        DecodePolicy::RoundRobin => round_robin(c.len(), ask.turn),
        DecodePolicy::Random => random(c.len(), ask),
        DecodePolicy::LeastRequest => run,
        DecodePolicy::PowerOfTwo => power_of_two(run, ask),
        DecodePolicy::LoadBalancing => {
            // AIBrix: (w_run·run/max_run + w_thr·(1 − thr/max_thr)) / (free/max_free),
            // free = 100 − KV usage %, floored at 0.1; maxima floored at 1.
            let thr: Vec<f64> = c
                .iter()
                .map(|e| {
                    pods[e.pod]
                        .metrics
                        .and_then(|m| m.gen_throughput)
                        .unwrap_or(0.0)
                })
                .collect();
            let free: Vec<f64> = c
                .iter()
                .map(|e| {
                    let used = pods[e.pod].metrics.and_then(|m| m.kv_usage).unwrap_or(0.0);
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
            (0..c.len())
                .map(|i| {
                    let load = s.decode_weight_running * run[i] / max_run
                        + s.decode_weight_throughput * (1.0 - thr[i] / max_thr);
                    let score = load / (free[i] / max_free);
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

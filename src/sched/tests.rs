//! Scheduling on deterministic inputs, with AIBrix's formulas checked on
//! hand-computed examples.

use super::*;
use crate::config::Config;
use crate::fleet::{DecodePolicy, Endpoint, PrefillPolicy};
use crate::pods::PodMetrics;
use std::collections::HashMap;

/// 2 rolesets × 2 prefill × 2 decode; pods 0..8 in the order
/// rs0.p0 rs0.p1 rs0.d0 rs0.d1 rs1.p0 rs1.p1 rs1.d0 rs1.d1.
fn config(extra_model: &str) -> Config {
    let json = format!(
        r#"{{"models":[{{"name":"m","engine":"vllm"{extra_model},"rolesets":[
            {{"name":"rs0","prefill":["10.0.0.1:1","10.0.0.2:1"],"decode":["10.0.0.3:1","10.0.0.4:1"]}},
            {{"name":"rs1","prefill":["10.0.1.1:1","10.0.1.2:1"],"decode":["10.0.1.3:1","10.0.1.4:1"]}}]}}]}}"#
    );
    Config::parse(json.as_bytes()).expect("config")
}

/// AIBrix's policies, named (the defaults are `least_ttft` and
/// `least_request`): the tests of its formulas and fast paths use them.
const AIBRIX: &str = r#","prefill_policy":"prefix_cache","decode_policy":"load_balancing""#;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: deterministic, good enough for tests.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A request of `prompt_tokens` with the parts most tests do not vary: no
/// prefix key, session or excluded pods, a load bound of 1.25, turn 0.
/// Override a part with `PlacementRequest { part, ..request(..) }`.
fn request<'a>(
    prompt_tokens: u64,
    prefix_match: &'a dyn Fn(usize) -> f64,
    random: &'a mut dyn FnMut() -> u64,
) -> PlacementRequest<'a> {
    PlacementRequest {
        prompt_tokens,
        prefix_match,
        prefix_key: None,
        load_bound: LoadBound { factor: 1.25 },
        prefill_turn: 0,
        // Zero-sized: leaking it allocates nothing.
        decode_turn: Box::leak(Box::new(|_| 0)),
        random,
        exclude: &[],
        session: None,
    }
}

fn run(
    config: &Config,
    pods: &[PodState],
    tokens: u64,
    prefix: &dyn Fn(usize) -> f64,
) -> (String, String, &'static str) {
    run_seeded(config, pods, tokens, prefix, 42)
}

fn run_seeded(
    config: &Config,
    pods: &[PodState],
    tokens: u64,
    prefix: &dyn Fn(usize) -> f64,
    seed: u64,
) -> (String, String, &'static str) {
    let mut rng = Rng(seed);
    let mut random = || rng.next();
    let mut ask = request(tokens, prefix, &mut random);
    match schedule(&config.models[0], pods, &mut ask, &config.scheduling) {
        Choice::Split {
            prefill,
            decode,
            reason,
        } => (prefill.address.clone(), decode.address.clone(), reason),
        Choice::Combined { pod, reason } => ("combined".into(), pod.address.clone(), reason),
        Choice::NoPod(why) => ("none".into(), format!("{why:?}"), ""),
    }
}

fn idle(n: usize) -> Vec<PodState> {
    vec![PodState::default(); n]
}

fn no_prefix(_: usize) -> f64 {
    0.0
}

fn eps(c: &Config, pods: &[usize]) -> Vec<Endpoint> {
    let all: Vec<Endpoint> = c.models[0]
        .rolesets
        .iter()
        .flat_map(|r| {
            r.prefill
                .iter()
                .chain(r.decode.iter())
                .map(|e| (**e).clone())
        })
        .collect();
    pods.iter().map(|i| all[*i].clone()).collect()
}

/// `least_ttft`'s scores of pods 0 and 1 for a prompt of `tokens` under `s`.
fn ttft_scores(
    c: &Config,
    pods: &[PodState],
    tokens: u64,
    prefix: &dyn Fn(usize) -> f64,
    s: &crate::fleet::Scheduling,
) -> Vec<f64> {
    let cands = eps(c, &[0, 1]);
    let refs: Vec<&Endpoint> = cands.iter().collect();
    let mut random = || 0u64;
    let mut ask = request(tokens, prefix, &mut random);
    prefill_scores(PrefillPolicy::LeastTtft, &refs, pods, &mut ask, s)
}

#[test]
fn prefix_cache_score_matches_aibrix_formula() {
    let c = config(AIBRIX);
    let mut pods = idle(8);
    pods[0].outstanding_prefills = 2;
    let cands = eps(&c, &[0, 1]);
    let refs: Vec<&Endpoint> = cands.iter().collect();
    let mut random = || 0u64;
    let prefix = |pod: usize| if pod == 0 { 80.0 } else { 0.0 };
    let mut ask = request(0, &prefix, &mut random);
    // (100 − 80) × 0.1 + 2/2 = 3.0 ; (100 − 0) × 0.1 + 0/2 = 10.0
    assert_eq!(
        prefill_scores(
            PrefillPolicy::PrefixCache,
            &refs,
            &pods,
            &mut ask,
            &c.scheduling
        ),
        vec![3.0, 10.0]
    );
    assert_eq!(
        prefill_scores(
            PrefillPolicy::LeastRequest,
            &refs,
            &pods,
            &mut ask,
            &c.scheduling
        ),
        vec![2.0, 0.0]
    );
}

#[test]
fn least_ttft_counts_the_tokens_queued_and_those_not_held() {
    let c = config(r#","prefill_policy":"least_ttft""#);
    let mut pods = idle(8);
    // Pod 0 holds 80 % of a 10,000-token prompt and has 5,000 tokens of
    // prefills queued; pod 1 holds nothing and has 2 prefills queued of 300
    // and 200 tokens, plus 2 requests of others (scraped, besides this
    // Envoy's own 2): each counted at this Envoy's mean prefill
    // (5,500 / 3 tokens).
    pods[0].outstanding_prefills = 1;
    pods[0].outstanding_prefill_tokens = 5_000;
    pods[1].outstanding_prefills = 2;
    pods[1].outstanding_prefill_tokens = 500;
    pods[1].metrics = Some(PodMetrics {
        running: 3.0,
        waiting: 1.0,
        own_prefills: 2.0,
        ..Default::default()
    });
    let cands = eps(&c, &[0, 1]);
    let refs: Vec<&Endpoint> = cands.iter().collect();
    let mut random = || 0u64;
    let prefix = |pod: usize| if pod == 0 { 80.0 } else { 0.0 };
    let mut ask = request(10_000, &prefix, &mut random);
    let mut s = c.scheduling.clone();
    s.uncached_token_weight = 1.0;
    let scores = prefill_scores(PrefillPolicy::LeastTtft, &refs, &pods, &mut ask, &s);
    assert_eq!(scores[0], 5_000.0 + 2_000.0);
    assert!((scores[1] - (500.0 + 2.0 * 5_500.0 / 3.0 + 10_000.0)).abs() < 1e-6);
    // The tokens not held weigh 48 times the queued ones by default.
    let scores = prefill_scores(
        PrefillPolicy::LeastTtft,
        &refs,
        &pods,
        &mut ask,
        &c.scheduling,
    );
    assert_eq!(scores[0], 5_000.0 + 48.0 * 2_000.0);
    // Queued work past what the cache saves, so weighed, sends the prompt
    // elsewhere (to an idle pod of the other roleset here): 400,000 + 96,000
    // against 480,000.
    pods[0].outstanding_prefill_tokens = 400_000;
    let (p, _, reason) = run(&c, &pods, 10_000, &prefix);
    assert!(
        p.starts_with("10.0.1.") && reason == "policy",
        "{p} {reason}"
    );
    pods[0].outstanding_prefill_tokens = 370_000;
    assert_eq!(run(&c, &pods, 10_000, &prefix).0, "10.0.0.1:1");
}

#[test]
fn least_ttft_caps_what_holding_the_prompt_is_worth() {
    let c = config(r#","prefill_policy":"least_ttft""#);
    let mut pods = idle(8);
    // Pod 0 holds 80 % of a 10,000-token prompt, pod 1 nothing.
    pods[0].outstanding_prefill_tokens = 100_000;
    let prefix = |pod: usize| if pod == 0 { 80.0 } else { 0.0 };
    let mut s = c.scheduling.clone();
    s.affinity_cap_tokens = 20_000.0;
    let scores = ttft_scores(&c, &pods, 10_000, &prefix, &s);
    // Pod 0 lacks the fewest tokens (2,000): they count once. Pod 1 lacks
    // 8,000 more, which the weight's part above 1 makes 376,000, capped at
    // 20,000.
    assert_eq!(scores, vec![100_000.0 + 2_000.0, 10_000.0 + 20_000.0]);
    // The same cap as twice the prompt's 10,000 tokens; with both, the
    // larger holds (the tokens a floor).
    s.affinity_cap_tokens = 0.0;
    s.affinity_cap_prompts = 2.0;
    let scores = ttft_scores(&c, &pods, 10_000, &prefix, &s);
    assert_eq!(scores, vec![100_000.0 + 2_000.0, 10_000.0 + 20_000.0]);
    s.affinity_cap_tokens = 5_000.0;
    let scores = ttft_scores(&c, &pods, 10_000, &prefix, &s);
    assert_eq!(scores, vec![100_000.0 + 2_000.0, 10_000.0 + 20_000.0]);
    s.affinity_cap_tokens = 50_000.0;
    let scores = ttft_scores(&c, &pods, 10_000, &prefix, &s);
    assert_eq!(scores, vec![100_000.0 + 2_000.0, 10_000.0 + 50_000.0]);
    s.affinity_cap_prompts = 0.0;
    // Under the cap the order is the uncapped one: each score less 47 ×
    // 2,000.
    s.affinity_cap_tokens = 1_000_000.0;
    let scores = ttft_scores(&c, &pods, 10_000, &prefix, &s);
    assert_eq!(scores, vec![100_000.0 + 2_000.0, 10_000.0 + 376_000.0]);
    // So a queue 100,000 tokens longer than another's sends the prompt away
    // under a cap of 20,000 (it saves 8,000), and keeps it where it is
    // cached without one.
    let mut capped = c.clone();
    capped.scheduling.affinity_cap_tokens = 20_000.0;
    assert_ne!(run(&capped, &pods, 10_000, &prefix).0, "10.0.0.1:1");
    assert_eq!(run(&c, &pods, 10_000, &prefix).0, "10.0.0.1:1");
}

#[test]
fn least_ttft_weighs_tokens_by_their_attention_when_asked() {
    let c = config(r#","prefill_policy":"least_ttft""#);
    let pods = idle(8);
    let mut s = c.scheduling.clone();
    s.attention_tokens = 25_000.0;
    // Pod 0 holds 90,000 of a 100,000-token prompt: its 10,000 new tokens
    // attend to 95,000 before them on average, 4.8 times a short prompt's
    // cost. Pod 1 computes all of it: 3 times.
    let held = |pod: usize| if pod == 0 { 90.0 } else { 0.0 };
    let scores = ttft_scores(&c, &pods, 100_000, &held, &s);
    let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
    assert!(near(scores[0], 48.0 * 10_000.0 * 4.8), "{scores:?}");
    assert!(near(scores[1], 48.0 * 100_000.0 * 3.0), "{scores:?}");
    // Off (the default), tokens count alike.
    let scores = ttft_scores(&c, &pods, 100_000, &held, &c.scheduling);
    assert_eq!(scores, vec![48.0 * 10_000.0, 48.0 * 100_000.0]);
    // A cap compares the same unit: pod 1 lacks 90,000 tokens more, which
    // the weight's part above 1 makes far more than the cap.
    s.affinity_cap_tokens = 20_000.0;
    let scores = ttft_scores(&c, &pods, 100_000, &held, &s);
    assert!(near(scores[0], 48_000.0), "{scores:?}");
    assert!(near(scores[1], 300_000.0 + 20_000.0), "{scores:?}");
}

#[test]
fn least_ttft_sends_a_turn_away_from_a_giant_prefill_only_when_tokens_weigh_their_attention() {
    let mut c = config(r#","prefill_policy":"least_ttft""#);
    c.scheduling.affinity_cap_tokens = 200_000.0;
    let mut pods = idle(8);
    // A 20,000-token turn, 60 % held on pod 0, where a cold prompt of
    // 120,000 tokens is queued (held as its work with attention_tokens
    // set, as the router holds it); every other pod has 20,000 tokens of
    // short prompts queued.
    let held = |pod: usize| if pod == 0 { 60.0 } else { 0.0 };
    for p in pods.iter_mut() {
        p.outstanding_prefills = 4;
        p.outstanding_prefill_tokens = 20_000;
    }
    pods[0].outstanding_prefills = 1;
    pods[0].outstanding_prefill_tokens = 120_000;
    // Counted in tokens the giant is 100,000 more than elsewhere, under
    // the 12,000 saved plus the cap: the turn waits behind it.
    assert_eq!(run(&c, &pods, 20_000, &held).0, "10.0.0.1:1");
    // Weighed by its attention it is 3.4 times that, and the turn leaves.
    c.scheduling.attention_tokens = 25_000.0;
    let giant = crate::sched::prefill_work(120_000.0, 0.0, 25_000.0);
    let short = 4.0 * crate::sched::prefill_work(5_000.0, 0.0, 25_000.0);
    pods[0].outstanding_prefill_tokens = giant as u64;
    for p in pods.iter_mut().skip(1) {
        p.outstanding_prefill_tokens = short as u64;
    }
    assert_ne!(run(&c, &pods, 20_000, &held).0, "10.0.0.1:1");
}

#[test]
fn least_ttft_keeps_a_long_cold_prompt_off_the_pod_whose_conversations_stream() {
    let c = config(r#","prefill_policy":"least_ttft""#);
    let mut pods = idle(8);
    // Pod 0 has 4 answers streaming from its prefills, pod 1 none but
    // 20,000 tokens queued; neither holds the prompt.
    pods[0].live_streams = 4;
    pods[1].outstanding_prefill_tokens = 20_000;
    let mut s = c.scheduling.clone();
    s.busy_home_tokens = 100_000.0;
    let scores = ttft_scores(&c, &pods, 100_000, &no_prefix, &s);
    // 100,000 tokens at 100,000: each stream counts as the prompt again.
    let own = 48.0 * 100_000.0;
    assert_eq!(scores, vec![own + 4.0 * 100_000.0, 20_000.0 + own]);
    // A 5,000-token prompt costs each stream 250 tokens: the queue decides.
    let scores = ttft_scores(&c, &pods, 5_000, &no_prefix, &s);
    let own = 48.0 * 5_000.0;
    assert_eq!(scores, vec![own + 1_000.0, 20_000.0 + own]);
    // Bounded at an eighth of the tokens computed: 4 streams would cost
    // 400,000, the bound lets the prompt take 12,500 more queued tokens at
    // most to avoid them, so the less queued pod wins.
    s.busy_home_cap = 0.125;
    let scores = ttft_scores(&c, &pods, 100_000, &no_prefix, &s);
    let own = 48.0 * 100_000.0;
    assert_eq!(scores, vec![own + 12_500.0, 20_000.0 + own]);
    s.busy_home_cap = 0.0;
    // Tokens a pod holds cost its conversations nothing.
    let held = |pod: usize| if pod == 0 { 100.0 } else { 0.0 };
    let scores = ttft_scores(&c, &pods, 100_000, &held, &s);
    assert_eq!(scores[0], 0.0);
    // Off (the default), the streams do not count.
    let scores = ttft_scores(&c, &pods, 100_000, &no_prefix, &c.scheduling);
    assert_eq!(scores, vec![48.0 * 100_000.0, 20_000.0 + 48.0 * 100_000.0]);
    // Through the whole placement, the other roleset's pods busier still.
    pods[4].outstanding_prefill_tokens = 50_000;
    pods[5].outstanding_prefill_tokens = 50_000;
    let mut busy = c.clone();
    busy.scheduling.busy_home_tokens = 100_000.0;
    assert_eq!(run(&busy, &pods, 100_000, &no_prefix).0, "10.0.0.2:1");
    assert_eq!(run(&c, &pods, 100_000, &no_prefix).0, "10.0.0.1:1");
}

#[test]
fn least_ttft_is_not_overridden_by_counts_of_requests() {
    let c = config(r#","prefill_policy":"least_ttft""#);
    let mut pods = idle(8);
    // Pod 0 runs 20 short prefills (far above the others by count, an
    // outlier and an imbalance for the count rules), 2,000 tokens in all;
    // pod 1 one prefill of 50,000 tokens.
    pods[0].outstanding_prefills = 20;
    pods[0].outstanding_prefill_tokens = 2_000;
    pods[1].outstanding_prefills = 1;
    pods[1].outstanding_prefill_tokens = 50_000;
    for p in [4, 5] {
        pods[p].outstanding_prefills = 1;
        pods[p].outstanding_prefill_tokens = 50_000;
    }
    // Roleset 0's decode pods are busy, roleset 1's idle.
    pods[2].pending_decodes = 6;
    pods[3].pending_decodes = 4;
    let (p, d, reason) = run(&c, &pods, 1_000, &no_prefix);
    assert_eq!((p.as_str(), reason), ("10.0.0.1:1", "policy"));
    // The decode pod is the decode policy's, within the prefill's roleset,
    // though another roleset's decode pods are idler.
    assert_eq!(d, "10.0.0.4:1");
}

#[test]
fn load_balancing_score_matches_aibrix_formula() {
    let c = config(AIBRIX);
    let mut pods = idle(8);
    pods[2].pending_decodes = 1;
    pods[2].metrics = Some(PodMetrics {
        running: 3.0,
        kv_usage: Some(0.5),
        gen_throughput: Some(100.0),
        ..Default::default()
    });
    pods[3].metrics = Some(PodMetrics {
        kv_usage: Some(0.0),
        gen_throughput: Some(0.0),
        ..Default::default()
    });
    let cands = eps(&c, &[2, 3]);
    let refs: Vec<&Endpoint> = cands.iter().collect();
    let mut random = || 0u64;
    let mut ask = request(0, &no_prefix, &mut random);
    // d0: run 4, thr 100, free 50 → (4/4 + (1 − 100/100)) / (50/100) = 2.0
    // d1: run 0, thr 0, free 100 → (0 + (1 − 0)) / (100/100) = 1.0
    let s = &c.scheduling;
    assert_eq!(
        decode_scores(DecodePolicy::LoadBalancing, &refs, &pods, &mut ask, s, 0),
        vec![2.0, 1.0]
    );
    assert_eq!(
        decode_scores(DecodePolicy::LeastRequest, &refs, &pods, &mut ask, s, 0),
        vec![4.0, 0.0]
    );
    // Full KV cache: free floors at 0.1, so the score explodes rather than dividing by 0.
    pods[3].metrics = Some(PodMetrics {
        kv_usage: Some(1.0),
        ..Default::default()
    });
    let scores = decode_scores(DecodePolicy::LoadBalancing, &refs, &pods, &mut ask, s, 0);
    assert!(scores[1] > 100.0, "{scores:?}");
}

#[test]
fn an_idle_pods_past_throughput_does_not_make_it_the_favourite() {
    let c = config(AIBRIX);
    let mut pods = idle(8);
    // Both decode pods idle; d0 served the last requests, so its scraped
    // rate is high. Counting it would send it every next request.
    pods[2].metrics = Some(PodMetrics {
        gen_throughput: Some(500.0),
        ..Default::default()
    });
    let cands = eps(&c, &[2, 3]);
    let refs: Vec<&Endpoint> = cands.iter().collect();
    let mut random = || 0u64;
    let mut ask = request(0, &no_prefix, &mut random);
    let s = &c.scheduling;
    let scores = decode_scores(DecodePolicy::LoadBalancing, &refs, &pods, &mut ask, s, 0);
    assert_eq!(scores[0], scores[1], "{scores:?}");
    // Busy, the rate counts again (AIBrix's formula).
    pods[2].pending_decodes = 1;
    pods[3].pending_decodes = 1;
    let scores = decode_scores(DecodePolicy::LoadBalancing, &refs, &pods, &mut ask, s, 0);
    assert!(scores[0] < scores[1], "{scores:?}");
}

#[test]
fn rolesets_are_ranked_by_the_normalised_sum_of_their_best_pods() {
    let mut c = config(AIBRIX);
    // The scores alone, without the prefix-affinity shortcut.
    c.scheduling.prefix_affinity_min_match = 101.0;
    let mut pods = idle(8);
    // rs0's best prefill (pod 1) has a 50% prefix match; rs1's prefills none.
    // rs0's decodes are busy, rs1's idle.
    for d in [2, 3] {
        pods[d].metrics = Some(PodMetrics {
            running: 8.0,
            ..Default::default()
        });
    }
    let prefix = |pod: usize| if pod == 1 { 50.0 } else { 0.0 };
    // prefill: rs0 best = 5.0, rs1 best = 10.0, max = 10 → 0.5 vs 1.0
    // decode (least weight on thr since all 0): rs0 = (8/8 + 1)/1 = 2, rs1 = (0 + 1)/1 = 1, max = 2 → 1.0 vs 0.5
    // totals: rs0 1.5, rs1 1.5 → a tie, broken at random: over many
    // placements both rolesets win, each with its own best pods.
    let mut winners = HashMap::new();
    for seed in 1..=40 {
        let (p, d, why) = run_seeded(&c, &pods, 10, &prefix, seed);
        assert_eq!(why, "score");
        let rs = if p == "10.0.0.2:1" {
            assert!(d.starts_with("10.0.0."), "rs0's pair: {p} {d}");
            0
        } else {
            assert!(
                p.starts_with("10.0.1.") && d.starts_with("10.0.1."),
                "rs1's pair: {p} {d}"
            );
            1
        };
        *winners.entry(rs).or_insert(0) += 1;
    }
    assert_eq!(
        winners.len(),
        2,
        "both tied rolesets win sometimes: {winners:?}"
    );
    // A stronger match tips it: rs0 prefill 2.0/10 = 0.2 → total 1.2 < 1.5
    let prefix = |pod: usize| if pod == 1 { 80.0 } else { 0.0 };
    let (p, _, _) = run(&c, &pods, 10, &prefix);
    assert_eq!(p, "10.0.0.2:1");
    // Half-full KV caches on rs0's decodes tip the 50% case the other way:
    // rs0 decode (8/8 + 1) / (50/100) = 4 → 1.0, rs1 1 → 0.25;
    // totals rs0 0.5 + 1.0 = 1.5, rs1 1.0 + 0.25 = 1.25.
    for d in [2, 3] {
        pods[d].metrics = Some(PodMetrics {
            running: 8.0,
            kv_usage: Some(0.5),
            ..Default::default()
        });
    }
    let prefix = |pod: usize| if pod == 1 { 50.0 } else { 0.0 };
    let (p, d, why) = run(&c, &pods, 10, &prefix);
    // rs1's two prefill pods (and its two decode pods) are equal: either.
    assert!(
        p.starts_with("10.0.1.") && d.starts_with("10.0.1.") && why == "score",
        "{p} {d} {why}"
    );
}

#[test]
fn prefill_imbalance_takes_the_least_loaded_pod_and_aligns_decode() {
    let c = config(AIBRIX);
    let mut pods = idle(8);
    for p in [0, 1, 5] {
        pods[p].outstanding_prefills = 17;
    }
    // pod 4 (rs1.p0) has 0: spread 17 > 16.
    let (p, d, why) = run(&c, &pods, 10, &|pod| if pod == 0 { 100.0 } else { 0.0 });
    assert_eq!(why, "prefill_imbalance");
    assert_eq!(p, "10.0.1.1:1");
    assert!(
        d.starts_with("10.0.1."),
        "decode from the same roleset: {d}"
    );
    // A spread of exactly 16 does not trigger it.
    for p in [0, 1, 5] {
        pods[p].outstanding_prefills = 16;
    }
    assert_ne!(run(&c, &pods, 10, &no_prefix).2, "prefill_imbalance");
}

#[test]
fn outliers_are_filtered_before_scoring() {
    let c = config(AIBRIX);
    let mut pods = idle(8);
    // Loads 1, 1, 1, 10: mean 3.25, sample σ 4.5, limit 7.75 → pod 5 is out,
    // although its 100% prefix match would otherwise win.
    for (p, l) in [(0, 1), (1, 1), (4, 1), (5, 10)] {
        pods[p].outstanding_prefills = l;
    }
    let (p, _, _) = run(&c, &pods, 10, &|pod| if pod == 5 { 100.0 } else { 0.0 });
    assert_ne!(p, "10.0.1.2:1");
    // Without the outlier, it wins.
    pods[5].outstanding_prefills = 1;
    let (p, _, _) = run(&c, &pods, 10, &|pod| if pod == 5 { 100.0 } else { 0.0 });
    assert_eq!(p, "10.0.1.2:1");
}

#[test]
fn decode_imbalance_checks_in_aibrix_order() {
    let c = config(AIBRIX);
    let mut pods = idle(8);
    // 1. running + pending spread ≥ 16 → the least loaded decode pod.
    for d in [2, 3, 6] {
        pods[d].pending_decodes = 16;
    }
    let (p, d, why) = run(&c, &pods, 10, &no_prefix);
    assert_eq!(
        (d.as_str(), why),
        ("10.0.1.4:1", "decode_running_imbalance")
    );
    assert!(
        p.starts_with("10.0.1."),
        "prefill aligned to the decode's roleset"
    );

    // 2. throughput spread > 2048 tok/s → the least busy pod.
    let mut pods = idle(8);
    for (d, t) in [(2, 3000.0), (3, 2500.0), (6, 100.0), (7, 900.0)] {
        pods[d].metrics = Some(PodMetrics {
            gen_throughput: Some(t),
            ..Default::default()
        });
    }
    let (_, d, why) = run(&c, &pods, 10, &no_prefix);
    assert_eq!(
        (d.as_str(), why),
        ("10.0.1.3:1", "decode_throughput_imbalance")
    );

    // 3. every pod drains: running/drain ratio max/min > 1.5 → the lowest.
    let mut pods = idle(8);
    for (d, r, dr) in [(2, 4.0, 1.0), (3, 4.0, 1.0), (6, 4.0, 4.0), (7, 4.0, 1.0)] {
        pods[d].metrics = Some(PodMetrics {
            running: r,
            drain_rate: Some(dr),
            ..Default::default()
        });
    }
    let (_, d, why) = run(&c, &pods, 10, &no_prefix);
    assert_eq!((d.as_str(), why), ("10.0.1.3:1", "decode_drain_imbalance"));
}

#[test]
fn unhealthy_and_excluded_pods_are_skipped() {
    let c = config(r#","prefill_policy":"least_request","decode_policy":"least_request""#);
    let mut pods = idle(8);
    pods[0].unhealthy = true;
    pods[1].unhealthy = true;
    let (p, _, _) = run(&c, &pods, 10, &no_prefix);
    assert!(p.starts_with("10.0.1."), "rs0 has no healthy prefill: {p}");
    for p in pods.iter_mut() {
        p.unhealthy = true;
    }
    assert_eq!(run(&c, &pods, 10, &no_prefix).1, "AllUnhealthy");

    let pods = idle(8);
    let mut random = || 1u64;
    let exclude = [0usize, 4];
    let mut ask = PlacementRequest {
        exclude: &exclude,
        ..request(1, &no_prefix, &mut random)
    };
    match schedule(&c.models[0], &pods, &mut ask, &c.scheduling) {
        Choice::Split { prefill, .. } => assert!(![0, 4].contains(&prefill.slot)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn round_robin_rotates() {
    let c = config(r#","prefill_policy":"round_robin","decode_policy":"round_robin""#);
    let pods = idle(8);
    let mut seen = Vec::new();
    for turn in 0..4 {
        let mut random = || 0u64;
        let mut ask = PlacementRequest {
            prefill_turn: turn,
            ..request(1, &no_prefix, &mut random)
        };
        if let Choice::Split { prefill, .. } =
            schedule(&c.models[0], &pods, &mut ask, &c.scheduling)
        {
            seen.push(prefill.slot);
        }
    }
    assert_eq!(seen, vec![0, 1, 4, 5]);
}

#[test]
fn power_of_two_samples_two_and_takes_the_less_loaded() {
    let c = config(r#","prefill_policy":"power_of_two","decode_policy":"power_of_two""#);
    let mut pods = idle(8);
    for (p, l) in [(0, 5), (1, 4), (4, 3), (5, 6)] {
        pods[p].outstanding_prefills = l;
    }
    // The two sampled prefill pods are indices a and a+1+(r % 3) of the
    // candidate list; whatever they are, the less loaded one is taken.
    for seed in 1..20u64 {
        let mut rng = Rng(seed);
        let mut random = || rng.next();
        let mut ask = request(1, &no_prefix, &mut random);
        match schedule(&c.models[0], &pods, &mut ask, &c.scheduling) {
            Choice::Split {
                prefill, decode, ..
            } => {
                assert_ne!(prefill.slot, 5, "the most loaded pod never wins a pair");
                let rs = if prefill.slot < 4 { 0 } else { 1 };
                assert_eq!(decode.slot / 4, rs, "decode from the prefill's roleset");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn random_spreads_over_every_prefill_pod() {
    let c = config(r#","prefill_policy":"random","decode_policy":"random""#);
    let pods = idle(8);
    let mut counts = [0usize; 8];
    let mut rng = Rng(7);
    for _ in 0..400 {
        let mut random = || rng.next();
        let mut ask = request(1, &no_prefix, &mut random);
        if let Choice::Split { prefill, .. } =
            schedule(&c.models[0], &pods, &mut ask, &c.scheduling)
        {
            counts[prefill.slot] += 1;
        }
    }
    for p in [0, 1, 4, 5] {
        assert!(counts[p] > 50, "{counts:?}");
    }
}

fn bucket_config() -> Config {
    Config::parse(
        br#"{"models":[{"name":"m","engine":"vllm",
          "rolesets":[
            {"name":"short","prompt_tokens":{"max":1000},"prefill":["10.0.0.1:1"],"decode":["10.0.0.2:1"]},
            {"name":"long","prompt_tokens":{"min":1001,"max":8000},"prefill":["10.0.1.1:1"],"decode":["10.0.1.2:1"]}],
          "combined":[{"address":"10.0.9.1:1","name":"combo"}]}]}"#,
    )
    .expect("config")
}

#[test]
fn prompt_length_buckets_and_combined_pods() {
    let c = bucket_config();
    let pods = idle(5);
    assert_eq!(run(&c, &pods, 10, &no_prefix).0, "10.0.0.1:1");
    assert_eq!(run(&c, &pods, 5000, &no_prefix).0, "10.0.1.1:1");
    let (p, d, why) = run(&c, &pods, 9000, &no_prefix);
    assert_eq!(
        (p.as_str(), d.as_str(), why),
        ("combined", "10.0.9.1:1", "no_bucket")
    );

    let no_combined = Config::parse(
        br#"{"models":[{"name":"m","engine":"vllm","rolesets":[
            {"prompt_tokens":{"max":10},"prefill":["10.0.0.1:1"],"decode":["10.0.0.2:1"]}]}]}"#,
    )
    .expect("config");
    assert_eq!(run(&no_combined, &idle(2), 11, &no_prefix).1, "NoBucket");
}

#[test]
fn an_idle_combined_pod_takes_work_from_overloaded_pd_pods() {
    let c = bucket_config();
    let mut pods = idle(5);
    // combined: 1 waiting / 10 per s = 0.1 < 0.25; a decode pod: 30 / 10 = 3 > 1.
    pods[4].metrics = Some(PodMetrics {
        waiting: 1.0,
        drain_rate: Some(10.0),
        ..Default::default()
    });
    pods[1].metrics = Some(PodMetrics {
        waiting: 30.0,
        drain_rate: Some(10.0),
        ..Default::default()
    });
    let (p, _, why) = run(&c, &pods, 10, &no_prefix);
    assert_eq!((p.as_str(), why), ("combined", "pd_overloaded"));
    // Not overloaded: PD as usual.
    pods[1].metrics = Some(PodMetrics {
        waiting: 5.0,
        drain_rate: Some(10.0),
        ..Default::default()
    });
    assert_eq!(run(&c, &pods, 10, &no_prefix).0, "10.0.0.1:1");
}

#[test]
fn models_without_a_complete_roleset() {
    let c = Config::parse(
        br#"{"models":[{"name":"m","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:1"]}]}]}"#,
    )
    .expect("config");
    assert_eq!(run(&c, &idle(1), 1, &no_prefix).1, "NotConfigured");
    let only_combined =
        Config::parse(br#"{"models":[{"name":"m","engine":"vllm","combined":["10.0.0.9:1"]}]}"#)
            .expect("config");
    assert_eq!(run(&only_combined, &idle(1), 1, &no_prefix).0, "combined");
}

#[test]
fn a_pod_holding_most_of_the_prompt_takes_it_whatever_the_decode_load() {
    let c = config(AIBRIX);
    let mut pods = idle(8);
    // rs0's decodes are busier, which alone would favour rs1.
    for d in [2, 3] {
        pods[d].metrics = Some(PodMetrics {
            running: 8.0,
            kv_usage: Some(0.5),
            ..Default::default()
        });
    }
    let prefix = |pod: usize| if pod == 1 { 60.0 } else { 0.0 };
    let (p, d, why) = run(&c, &pods, 10, &prefix);
    assert_eq!((p.as_str(), why), ("10.0.0.2:1", "prefix_affinity"));
    assert!(
        d.starts_with("10.0.0."),
        "decode aligned to the prefill's roleset: {d}"
    );
    // Below the threshold the scores decide.
    let prefix = |pod: usize| if pod == 1 { 40.0 } else { 0.0 };
    assert_eq!(run(&c, &pods, 10, &prefix).2, "score");
    // A few requests in flight on the owner do not move the prompt away...
    pods[1].outstanding_prefills = 4;
    let prefix = |pod: usize| if pod == 1 { 90.0 } else { 0.0 };
    assert_eq!(run(&c, &pods, 10, &prefix).2, "prefix_affinity");
    // ...an overloaded owner is left (outlier filter, then imbalance).
    pods[1].outstanding_prefills = 17;
    let (p, _, why) = run(&c, &pods, 10, &prefix);
    assert_ne!(p, "10.0.0.2:1");
    assert_ne!(why, "prefix_affinity");
}

/// 3 rolesets × (1 prefill + 2 decode), slots in the order p, d, d per roleset.
fn three_rolesets(extra_model: &str) -> Config {
    let rs: Vec<String> = (0..3)
        .map(|r| {
            format!(
                r#"{{"name":"rs{r}","prefill":["10.0.{r}.1:1"],"decode":["10.0.{r}.2:1","10.0.{r}.3:1"]}}"#
            )
        })
        .collect();
    let json = format!(
        r#"{{"models":[{{"name":"m","engine":"vllm"{extra_model},"rolesets":[{}]}}]}}"#,
        rs.join(",")
    );
    Config::parse(json.as_bytes()).expect("config")
}

#[test]
fn equal_idle_pods_and_rolesets_share_placements_under_every_policy() {
    for policies in [
        "",
        AIBRIX,
        r#","prefill_policy":"least_request","decode_policy":"least_request""#,
        r#","prefill_policy":"power_of_two","decode_policy":"power_of_two""#,
        r#","prefill_policy":"random","decode_policy":"random""#,
        r#","prefill_policy":"least_request","decode_policy":"load_balancing""#,
    ] {
        let c = three_rolesets(policies);
        let pods = idle(9);
        let mut prefill = HashMap::new();
        let mut decode = HashMap::new();
        for seed in 1..=300u64 {
            let mut rng = Rng(seed);
            let mut random = || rng.next();
            let mut req = PlacementRequest {
                prefill_turn: seed,
                ..request(10, &no_prefix, &mut random)
            };
            let Choice::Split {
                prefill: p,
                decode: d,
                ..
            } = schedule(&c.models[0], &pods, &mut req, &c.scheduling)
            else {
                panic!("{policies}: no split");
            };
            *prefill.entry(p.address.clone()).or_insert(0) += 1;
            *decode.entry(d.address.clone()).or_insert(0) += 1;
        }
        for r in 0..3 {
            let n = prefill.get(&format!("10.0.{r}.1:1")).copied().unwrap_or(0);
            assert!(
                (50..=150).contains(&n),
                "{policies}: roleset {r} got {n}/300: {prefill:?}"
            );
            for k in [2, 3] {
                let d = decode.get(&format!("10.0.{r}.{k}:1")).copied().unwrap_or(0);
                assert!(
                    (n / 4..=n * 3 / 4).contains(&d),
                    "{policies}: decode {r}.{k} got {d} of its roleset's {n}: {decode:?}"
                );
            }
        }
    }
}

#[test]
fn round_robin_rotates_each_phase_on_its_own() {
    // Two rolesets of one prefill and two decode pods: one shared turn would
    // send each roleset's requests to the same decode pod every time.
    let rs = r#"[{"name":"a","prefill":["10.0.0.1:1"],"decode":["10.0.0.2:1","10.0.0.3:1"]},
                 {"name":"b","prefill":["10.0.1.1:1"],"decode":["10.0.1.2:1","10.0.1.3:1"]}]"#;
    let c = Config::parse(
        format!(r#"{{"models":[{{"name":"m","engine":"vllm","prefill_policy":"round_robin","decode_policy":"round_robin","rolesets":{rs}}}]}}"#)
            .as_bytes(),
    )
    .expect("config");
    let pods = idle(6);
    let mut turns = [0u64; 2];
    let mut decode = HashMap::new();
    for turn in 0..40u64 {
        let mut random = || 7u64;
        let mut decode_turn = |roleset: usize| {
            let t = turns[roleset];
            turns[roleset] += 1;
            t
        };
        let mut req = PlacementRequest {
            prefill_turn: turn,
            decode_turn: &mut decode_turn,
            ..request(1, &no_prefix, &mut random)
        };
        if let Choice::Split { decode: d, .. } =
            schedule(&c.models[0], &pods, &mut req, &c.scheduling)
        {
            *decode.entry(d.address.clone()).or_insert(0) += 1;
        }
    }
    for d in ["10.0.0.2:1", "10.0.0.3:1", "10.0.1.2:1", "10.0.1.3:1"] {
        assert_eq!(decode.get(d), Some(&10), "{decode:?}");
    }
}

/// 1 roleset per prefill pod (with its own decode), `consistent_hash`.
fn consistent(pods: usize) -> Config {
    let rs: Vec<String> = (0..pods)
        .map(|r| {
            format!(r#"{{"name":"rs{r}","prefill":["10.7.{r}.1:1"],"decode":["10.7.{r}.2:1"]}}"#)
        })
        .collect();
    let json = format!(
        r#"{{"scheduling":{{"bounded_load_factor":1.25}},
            "models":[{{"name":"m","engine":"vllm","prefill_policy":"consistent_hash","rolesets":[{}]}}]}}"#,
        rs.join(",")
    );
    Config::parse(json.as_bytes()).expect("config")
}

fn place_key(c: &Config, pods: &[PodState], key: u64, seed: u64) -> String {
    let mut rng = Rng(seed);
    let mut random = || rng.next();
    let mut req = PlacementRequest {
        prefix_key: Some(key),
        load_bound: LoadBound::of(&c.scheduling),
        prefill_turn: seed,
        ..request(100, &no_prefix, &mut random)
    };
    match schedule(&c.models[0], pods, &mut req, &c.scheduling) {
        Choice::Split {
            prefill,
            decode,
            reason,
        } => {
            assert_eq!(reason, "policy");
            assert_eq!(
                prefill.address.rsplit_once('.').map(|(a, _)| a),
                decode.address.rsplit_once('.').map(|(a, _)| a),
                "decode from the prefill's roleset"
            );
            prefill.address.clone()
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn consistent_hashing_agrees_across_replicas_and_moves_little() {
    let c5 = consistent(5);
    let idle5 = idle(10);
    // The choice is a function of the key and the pods: other randomness
    // (another replica's) changes nothing.
    let keys: Vec<u64> = (0..1000u64)
        .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let before: Vec<String> = keys.iter().map(|k| place_key(&c5, &idle5, *k, 1)).collect();
    let again: Vec<String> = keys
        .iter()
        .map(|k| place_key(&c5, &idle5, *k, 99))
        .collect();
    assert_eq!(before, again);
    // Keys spread over the pods.
    let mut share = HashMap::new();
    for p in &before {
        *share.entry(p.clone()).or_insert(0) += 1;
    }
    assert!(share.values().all(|n| (120..=280).contains(n)), "{share:?}");
    // One pod removed: only its keys move.
    let c4 = consistent(4);
    let idle4 = idle(8);
    let after: Vec<String> = keys.iter().map(|k| place_key(&c4, &idle4, *k, 1)).collect();
    let removed = "10.7.4.1:1";
    for (b, a) in before.iter().zip(&after) {
        if b != removed {
            assert_eq!(a, b, "a key not on the removed pod moved");
        } else {
            assert_ne!(a, removed);
        }
    }
}

#[test]
fn consistent_hashing_gives_way_under_load() {
    let c = consistent(3);
    let key = 0xDEAD_BEEF;
    let mut pods = idle(6);
    let first = place_key(&c, &pods, key, 1);
    let slot = |addr: &str| {
        c.models[0]
            .rolesets
            .iter()
            .flat_map(|r| r.prefill.iter())
            .find(|e| e.address == addr)
            .map(|e| e.slot)
            .expect("slot")
    };
    // The key's pod runs far more than its share (scraped, seen by all).
    pods[slot(&first)].metrics = Some(PodMetrics {
        running: 20.0,
        ..Default::default()
    });
    let second = place_key(&c, &pods, key, 1);
    assert_ne!(second, first, "an overloaded pod gives way");
    let set = |pods: &mut Vec<PodState>, loads: [f64; 3]| {
        for (addr, l) in [&first, &second].into_iter().zip(loads) {
            pods[slot(addr)].metrics = Some(PodMetrics {
                running: l,
                ..Default::default()
            });
        }
        let third = (0..3)
            .map(|r| format!("10.7.{r}.1:1"))
            .find(|a| *a != first && *a != second)
            .expect("a third pod");
        pods[slot(&third)].metrics = Some(PodMetrics {
            waiting: loads[2],
            ..Default::default()
        });
    };
    // At most ⌈1.25 × (load + 1) / pods⌉ a pod, whatever the load: under
    // light load one request in flight is a pod's share (1, 0, 0: at most 1).
    set(&mut pods, [1.0, 0.0, 0.0]);
    assert_eq!(place_key(&c, &pods, key, 1), second, "light load spreads");
    // 2, 1, 1: at most ⌈1.25 × 5 / 3⌉ = 3, so the key's pod keeps it.
    set(&mut pods, [2.0, 1.0, 1.0]);
    assert_eq!(place_key(&c, &pods, key, 1), first);
    // 3, 1, 1: at most ⌈1.25 × 6 / 3⌉ = 3, reached: the next of the ranking.
    set(&mut pods, [3.0, 1.0, 1.0]);
    assert_eq!(place_key(&c, &pods, key, 1), second);
    // This replica's own prefills count once: scraped while in flight, they
    // are taken out of the engine's figure (3 − 2 + 2 in flight now, not 5).
    set(&mut pods, [2.0, 1.0, 1.0]);
    pods[slot(&first)].metrics = Some(PodMetrics {
        running: 3.0,
        own_prefills: 2.0,
        ..Default::default()
    });
    pods[slot(&first)].outstanding_prefills = 2;
    assert_eq!(place_key(&c, &pods, key, 1), second, "3 of at most 3");
    pods[slot(&first)].outstanding_prefills = 1;
    assert_eq!(place_key(&c, &pods, key, 1), first, "2 of at most 3");
}

/// One roleset of 3 prefill and 2 decode pods; any policy (sessions skip it).
fn sessions() -> Config {
    let json = r#"{"models":[{"name":"m","engine":"vllm","prefill_policy":"round_robin",
        "decode_policy":"round_robin","session":{},"rolesets":[{
        "prefill":["10.8.0.1:1","10.8.0.2:1","10.8.0.3:1"],
        "decode":["10.8.1.1:1","10.8.1.2:1"]}]}]}"#;
    Config::parse(json.as_bytes()).expect("config")
}

/// The (prefill, decode) a session's request goes to, and whether the
/// session placed it (not the model's policy).
fn place_session_by(c: &Config, pods: &[PodState], key: u64, seed: u64) -> (String, String, bool) {
    let mut rng = Rng(seed);
    let mut random = || rng.next();
    let mut req = PlacementRequest {
        load_bound: LoadBound { factor: 1.5 },
        prefill_turn: seed,
        decode_turn: &mut |_| seed,
        session: Some(key),
        ..request(100, &no_prefix, &mut random)
    };
    match schedule(&c.models[0], pods, &mut req, &c.scheduling) {
        Choice::Split {
            prefill,
            decode,
            reason,
        } => (
            prefill.address.clone(),
            decode.address.clone(),
            reason == "session",
        ),
        other => panic!("{other:?}"),
    }
}

/// The (prefill, decode) of a request its session places.
fn place_session(c: &Config, pods: &[PodState], key: u64, seed: u64) -> (String, String) {
    let (p, d, by_session) = place_session_by(c, pods, key, seed);
    assert!(by_session, "placed by the policy");
    (p, d)
}

#[test]
fn a_session_keeps_its_pods_on_every_replica_and_sessions_spread() {
    let c = sessions();
    let pods = idle(5);
    let mut prefills = HashMap::new();
    let mut decodes = HashMap::new();
    for k in 0..300u64 {
        let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Round-robin turns and randomness (another replica's, another
        // turn's) change nothing.
        let home = place_session(&c, &pods, key, 1);
        for seed in [2, 3, 99] {
            assert_eq!(place_session(&c, &pods, key, seed), home);
        }
        *prefills.entry(home.0).or_insert(0) += 1;
        *decodes.entry(home.1).or_insert(0) += 1;
    }
    assert_eq!(prefills.len(), 3, "{prefills:?}");
    assert!(
        prefills.values().all(|n| (60..=140).contains(n)),
        "{prefills:?}"
    );
    assert!(
        decodes.values().all(|n| (100..=200).contains(n)),
        "{decodes:?}"
    );
}

#[test]
fn a_busy_session_pod_leaves_the_request_to_the_policy_and_it_comes_home_after() {
    let c = sessions();
    let key = 0x5E55_1011;
    let mut pods = idle(5);
    let home = place_session(&c, &pods, key, 1);
    let slot = |addr: &str| {
        c.models[0]
            .rolesets
            .iter()
            .flat_map(|r| r.prefill.iter().chain(r.decode.iter()))
            .find(|e| e.address == addr)
            .map(|e| e.slot)
            .expect("slot")
    };
    // Its prefill pod holds 4 of the 4 prefills in flight: past
    // ⌈1.5 × 5 / 3⌉ = 3.
    pods[slot(&home.0)].outstanding_prefills = 4;
    let (_, _, by_session) = place_session_by(&c, &pods, key, 1);
    assert!(!by_session, "the model's policy places it");
    // Once it drains, the session is home again.
    pods[slot(&home.0)].outstanding_prefills = 0;
    assert_eq!(place_session(&c, &pods, key, 1), home);
}

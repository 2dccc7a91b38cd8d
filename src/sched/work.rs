//! What a prefill costs a pod, in tokens of a short prompt: the unit
//! `least_ttft` compares queues and prompts in.

/// The work of computing `uncached` prompt tokens after `cached` ones.
/// Each token's linear layers cost the same whatever its position, but its
/// attention reads every token before it: the cached ones and, on average,
/// half of those computed with it. At `attention_tokens` tokens before it
/// a token's attention costs as much as its linear layers (for a dense
/// transformer, twice its non-embedding parameters over four times its
/// layers by its model width: about 26,600 for Llama-3.1-8B), so a
/// 120,000-token prompt costs about 3.3 tokens of a short one per token.
/// `attention_tokens` 0 counts every token alike.
pub fn prefill_work(uncached: f64, cached: f64, attention_tokens: f64) -> f64 {
    if attention_tokens <= 0.0 {
        return uncached;
    }
    uncached * (1.0 + (cached + uncached / 2.0) / attention_tokens)
}

#[cfg(test)]
mod tests {
    use super::prefill_work;

    #[test]
    fn without_attention_tokens_every_token_counts_once() {
        assert_eq!(prefill_work(5_000.0, 100_000.0, 0.0), 5_000.0);
    }

    #[test]
    fn a_long_prompt_costs_more_a_token_than_a_short_one() {
        let short = prefill_work(1_000.0, 0.0, 26_624.0) / 1_000.0;
        let long = prefill_work(120_000.0, 0.0, 26_624.0) / 120_000.0;
        assert!((short - 1.019).abs() < 0.001, "{short}");
        assert!((long - 3.254).abs() < 0.001, "{long}");
    }

    #[test]
    fn tokens_after_a_cached_history_cost_its_attention() {
        // A turn adding 1,000 tokens to 100,000 cached ones reads them all.
        let turn = prefill_work(1_000.0, 100_000.0, 26_624.0);
        assert!((turn - 4_774.8).abs() < 0.1, "{turn}");
        // Computing the whole prompt elsewhere costs far more than its
        // tokens alone.
        let whole = prefill_work(101_000.0, 0.0, 26_624.0);
        assert!(whole > 2.8 * 101_000.0, "{whole}");
    }
}

//! Whether a placed request is split or goes to its decode pod unsplit:
//! the rule of a model's decider (`models[].decider`), given what the router
//! knows when the pair is chosen. Pure; the router gathers the figures.

use crate::fleet::Decider;

/// Why a request goes unsplit (`None` from [`decide`]: it is split).
pub const SHORT: &str = "short";
pub const CACHED: &str = "cached";
pub const PREFILL_SATURATED: &str = "prefill_saturated";
/// The reason a split request is counted under.
pub const SPLIT: &str = "split";

/// What the router knows of the request and the chosen pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    /// Estimated prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens the chosen decode pod was last seen to hold (the
    /// decode prefix table's match).
    pub decode_cached_tokens: u64,
    /// Every prefill pod of the pair's roleset has requests waiting.
    pub prefill_saturated: bool,
    /// The decode pod has requests waiting.
    pub decode_saturated: bool,
}

impl Figures {
    /// Prompt tokens the decode pod would still have to get.
    pub fn uncached_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.decode_cached_tokens)
    }
}

/// The decider's reason to keep the request whole, or `None` to split.
pub fn decide(d: &Decider, f: &Figures) -> Option<&'static str> {
    if f.prompt_tokens < d.min_prompt_tokens {
        return Some(SHORT);
    }
    if f.uncached_tokens() < d.min_uncached_tokens {
        return Some(CACHED);
    }
    if d.prefill_saturated_local && f.prefill_saturated && !f.decode_saturated {
        return Some(PREFILL_SATURATED);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(prompt: u64, cached: u64) -> Figures {
        Figures {
            prompt_tokens: prompt,
            decode_cached_tokens: cached,
            prefill_saturated: false,
            decode_saturated: false,
        }
    }

    #[test]
    fn short_and_cached_prompts_stay_whole_the_rest_split() {
        let d = Decider::default();
        assert_eq!(decide(&d, &figures(20, 0)), Some(SHORT));
        assert_eq!(decide(&d, &figures(4000, 3900)), Some(CACHED));
        assert_eq!(decide(&d, &figures(4000, 3000)), None);
        assert_eq!(decide(&d, &figures(256, 0)), None, "the bounds split");
        assert_eq!(decide(&d, &figures(4000, 3744)), None);
    }

    #[test]
    fn saturated_prefills_keep_work_local_only_when_asked_and_the_decode_is_free() {
        let mut f = figures(4000, 0);
        f.prefill_saturated = true;
        assert_eq!(decide(&Decider::default(), &f), None, "off by default");
        let d = Decider {
            prefill_saturated_local: true,
            ..Decider::default()
        };
        assert_eq!(decide(&d, &f), Some(PREFILL_SATURATED));
        f.decode_saturated = true;
        assert_eq!(decide(&d, &f), None);
    }

    #[test]
    fn thresholds_of_zero_always_split() {
        let d = Decider {
            min_prompt_tokens: 0,
            min_uncached_tokens: 0,
            prefill_saturated_local: false,
        };
        assert_eq!(decide(&d, &figures(1, 1)), None);
    }
}

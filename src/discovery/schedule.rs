//! When the next call to the API server goes. Every delay carries a jitter,
//! so the replicas of a gateway (and the VMs taking over a lease) do not
//! call in step; failures back off exponentially, so an API server that
//! comes back is not met by every replica at once.

use super::kube::KubeDiscovery;

/// The longest wait after failures, whatever `interval_ms`.
pub const MAX_BACKOFF_MS: u64 = 30_000;
/// After failures the wait grows up to this many `interval_ms`.
const MAX_BACKOFF_STEPS: u32 = 4;

/// A small random source (xorshift64*): enough to spread calls, seeded
/// per VM, and a pure value a test can drive.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Any seed; zero is replaced (xorshift never leaves zero).
    pub fn new(seed: u64) -> Jitter {
        Jitter(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// Uniform in `0..bound` (`0` when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        if bound == 0 {
            return 0;
        }
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound
    }
}

/// The longest [`delay_ms`] can be: a lease held across it must last
/// longer, or another VM takes over during a backoff.
pub fn max_delay_ms(cfg: &KubeDiscovery) -> u64 {
    let backoff = cfg
        .interval_ms
        .saturating_mul(1 << MAX_BACKOFF_STEPS)
        .min(MAX_BACKOFF_MS);
    let list = cfg.interval_ms.saturating_add(cfg.interval_ms / 10 + 1);
    backoff.max(list).max(250)
}

/// What came of the last call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A list or a watch answered; `watching`: the next call is a watch.
    Synced { watching: bool },
    /// The `n`th failure in a row.
    Failed(u32),
}

/// Milliseconds until the next call.
///
/// - a watch follows a good answer almost at once (up to a tenth of the
///   watch window, at most 250 ms), so changes keep flowing;
/// - a list (list mode) follows `interval_ms` later, plus up to a tenth;
/// - after `n` failures: `interval_ms × 2^(n-1)`, capped at
///   `interval_ms × 16` and at 30 s, of which a random half ("equal
///   jitter": between half and all of it).
pub fn delay_ms(cfg: &KubeDiscovery, outcome: Outcome, jitter: &mut Jitter) -> u64 {
    match outcome {
        Outcome::Synced { watching: true } => {
            jitter.below((cfg.watch_seconds.saturating_mul(100)).clamp(1, 250))
        }
        Outcome::Synced { watching: false } => cfg
            .interval_ms
            .saturating_add(jitter.below(cfg.interval_ms / 10 + 1)),
        Outcome::Failed(n) => {
            let steps = n.saturating_sub(1).min(MAX_BACKOFF_STEPS);
            let full = cfg
                .interval_ms
                .saturating_mul(1 << steps)
                .clamp(1, MAX_BACKOFF_MS);
            full / 2 + jitter.below(full - full / 2 + 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(interval_ms: u64) -> KubeDiscovery {
        serde_json::from_value(json!({"cluster": "kube_api", "interval_ms": interval_ms}))
            .expect("defaults")
    }

    #[test]
    fn every_delay_is_jittered_within_its_bounds() {
        let c = cfg(2000);
        let mut j = Jitter::new(7);
        let watch: Vec<u64> = (0..200)
            .map(|_| delay_ms(&c, Outcome::Synced { watching: true }, &mut j))
            .collect();
        assert!(watch.iter().all(|d| *d < 200), "a tenth of the 2 s window");
        assert!(watch.iter().any(|d| *d != watch[0]), "not constant");
        for _ in 0..200 {
            let d = delay_ms(&c, Outcome::Synced { watching: false }, &mut j);
            assert!((2000..=2200).contains(&d), "{d}");
        }
    }

    #[test]
    fn failures_back_off_to_a_cap_with_equal_jitter() {
        let c = cfg(2000);
        let mut j = Jitter::new(1);
        let mut bound = |n| {
            (0..100)
                .map(|_| delay_ms(&c, Outcome::Failed(n), &mut Jitter::new(j.below(u64::MAX))))
                .fold((u64::MAX, 0), |(lo, hi), d| (lo.min(d), hi.max(d)))
        };
        let (lo, hi) = bound(1);
        assert!(lo >= 1000 && hi <= 2000, "{lo}..{hi}");
        let (lo, hi) = bound(3);
        assert!(lo >= 4000 && hi <= 8000, "{lo}..{hi}");
        let (lo, hi) = bound(40);
        assert!(lo >= 15_000 && hi <= MAX_BACKOFF_MS, "{lo}..{hi}");
        let short = cfg(200);
        let d = delay_ms(&short, Outcome::Failed(40), &mut j);
        assert!(d <= 3200, "16 intervals at most: {d}");
    }
}

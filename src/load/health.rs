//! The one ejection rule, used by the request flow (prefill answers) and by
//! the scrape loop (failed scrapes) alike.

use super::records::PodCounters;

/// What an answer says about its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The pod worked: its failure streak ends.
    Worked,
    /// The pod is down (refused, reset, no metrics answer): eject it now.
    Down,
    /// The pod failed (5xx, timeout): ejected after `eject_after_failures`
    /// in a row, since one bad request must not take a pod out.
    Failed,
    /// The request was refused for its own sake (4xx): says nothing.
    Neutral,
}

/// When a pod is ejected and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthRule {
    pub cooldown_ms: u64,
    pub eject_after_failures: u32,
}

impl HealthRule {
    /// Applies `verdict` to a pod's counters at `now_ms`. True when this
    /// ejected a pod that was healthy (what is counted and logged: a pod
    /// already out does not get ejected twice).
    pub fn judge(&self, c: &mut PodCounters, verdict: Verdict, now_ms: u64) -> bool {
        match verdict {
            Verdict::Worked => {
                c.failures = 0;
                false
            }
            Verdict::Neutral => false,
            Verdict::Down | Verdict::Failed => {
                c.failures = c.failures.saturating_add(1);
                if verdict == Verdict::Failed && c.failures < self.eject_after_failures {
                    return false;
                }
                let was_healthy = c.is_healthy(now_ms);
                let until = now_ms.saturating_add(self.cooldown_ms);
                c.unhealthy_until_ms = c.unhealthy_until_ms.max(until);
                c.failures = 0;
                was_healthy
            }
        }
    }

    /// The log line of an ejection.
    pub fn message(&self, pod_name: &str, cause: &str) -> String {
        format!(
            "pod {pod_name} marked unhealthy for {} ms: {cause}",
            self.cooldown_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: HealthRule = HealthRule {
        cooldown_ms: 1000,
        eject_after_failures: 3,
    };

    #[test]
    fn a_down_pod_is_ejected_at_once_and_counted_once() {
        let mut c = PodCounters::default();
        assert!(RULE.judge(&mut c, Verdict::Down, 10));
        assert_eq!(c.unhealthy_until_ms, 1010);
        assert!(!RULE.judge(&mut c, Verdict::Down, 20), "already out");
        assert_eq!(c.unhealthy_until_ms, 1020, "the cooldown is extended");
        assert!(RULE.judge(&mut c, Verdict::Down, 2000), "out again later");
    }

    #[test]
    fn failures_eject_only_in_a_row() {
        let mut c = PodCounters::default();
        assert!(!RULE.judge(&mut c, Verdict::Failed, 0));
        assert!(!RULE.judge(&mut c, Verdict::Failed, 0));
        assert!(!RULE.judge(&mut c, Verdict::Worked, 0));
        assert!(!RULE.judge(&mut c, Verdict::Neutral, 0));
        assert!(!RULE.judge(&mut c, Verdict::Failed, 0));
        assert!(!RULE.judge(&mut c, Verdict::Failed, 0));
        assert!(RULE.judge(&mut c, Verdict::Failed, 0), "third in a row");
        assert_eq!((c.failures, c.unhealthy_until_ms), (0, 1000));
    }
}

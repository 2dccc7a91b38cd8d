//! Prefill/decode pairs whose hand-offs fail while both pods work with
//! others (a decode's transfer engine that cannot reach one prefill: stale
//! NIXL state, a network path), one shared table per model. A pair that
//! fails `eject_after_failures` times in a row is avoided for the cooldown;
//! a pod failing with every partner is ejected by its own counters
//! ([`super::HealthRule`]).

use super::health::{HealthRule, Verdict};
use crate::codec::{records, RecordWriter};
use crate::fleet::PodId;
use crate::pods::{cas_update, SharedStore};

/// One pair's hand-off record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairCounters {
    /// Failures in a row.
    pub failures: u32,
    /// Avoided until this time (Unix ms).
    pub avoid_until_ms: u64,
}

/// Prefill id, decode id, failures, avoided until.
const RECORD: usize = 8 + 8 + 4 + 8;

/// One model's pairs that failed lately.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PairTable {
    rows: Vec<((PodId, PodId), PairCounters)>,
}

impl PairTable {
    pub fn decode(bytes: Option<&[u8]>) -> PairTable {
        let rows = records(bytes.unwrap_or_default(), RECORD)
            .filter_map(|mut r| {
                Some((
                    (PodId(r.u64()?), PodId(r.u64()?)),
                    PairCounters {
                        failures: r.u32()?,
                        avoid_until_ms: r.u64()?,
                    },
                ))
            })
            .collect();
        PairTable { rows }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = RecordWriter::with_capacity(self.rows.len() * RECORD);
        for ((p, d), c) in &self.rows {
            w.u64(p.0).u64(d.0).u32(c.failures).u64(c.avoid_until_ms);
        }
        w.finish()
    }

    pub fn get(&self, prefill: PodId, decode: PodId) -> PairCounters {
        self.rows
            .iter()
            .find(|(k, _)| *k == (prefill, decode))
            .map(|(_, c)| *c)
            .unwrap_or_default()
    }

    /// Whether the pair is avoided at `now_ms`.
    pub fn avoided(&self, prefill: PodId, decode: PodId, now_ms: u64) -> bool {
        self.get(prefill, decode).avoid_until_ms > now_ms
    }

    /// Applies a hand-off's verdict to its pair; true when this starts an
    /// avoidance. A pair that works again, or whose avoidance ran out,
    /// leaves the table.
    pub fn judge(
        &mut self,
        (prefill, decode): (PodId, PodId),
        verdict: Verdict,
        rule: &HealthRule,
        now_ms: u64,
    ) -> bool {
        let key = (prefill, decode);
        let mut c = self.get(prefill, decode);
        let mut started = false;
        match verdict {
            Verdict::Worked => c = PairCounters::default(),
            Verdict::Neutral => {}
            Verdict::Down | Verdict::Failed => {
                c.failures = c.failures.saturating_add(1);
                if c.failures >= rule.eject_after_failures {
                    started = c.avoid_until_ms <= now_ms;
                    c.avoid_until_ms = now_ms.saturating_add(rule.cooldown_ms);
                    c.failures = 0;
                }
            }
        }
        self.rows.retain(|(k, _)| *k != key);
        if c != PairCounters::default() {
            self.rows.push((key, c));
        }
        self.rows
            .retain(|(_, c)| c.failures > 0 || c.avoid_until_ms > now_ms);
        started
    }
}

/// Reads, changes and writes back one model's pair table.
pub fn update_pairs<S: SharedStore + ?Sized>(
    store: &mut S,
    key: &str,
    change: impl FnMut(&mut PairTable),
) -> Result<PairTable, String> {
    cas_update(store, key, PairTable::decode, PairTable::encode, change)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: HealthRule = HealthRule {
        cooldown_ms: 1_000,
        eject_after_failures: 3,
    };

    #[test]
    fn a_pair_failing_in_a_row_is_avoided_for_the_cooldown_only() {
        let (p, d) = (PodId(1), PodId(2));
        let mut t = PairTable::default();
        assert!(!t.judge((p, d), Verdict::Failed, &RULE, 100));
        assert!(!t.judge((p, d), Verdict::Failed, &RULE, 100));
        assert!(t.judge((p, d), Verdict::Failed, &RULE, 100));
        assert!(t.avoided(p, d, 500));
        assert!(!t.avoided(d, p, 500), "pairs are ordered: prefill, decode");
        assert!(!t.avoided(p, d, 1_100));
        assert_eq!(PairTable::decode(Some(&t.encode())), t);
    }

    #[test]
    fn a_success_resets_the_streak_and_the_table_forgets_settled_pairs() {
        let (p, d) = (PodId(1), PodId(2));
        let mut t = PairTable::default();
        t.judge((p, d), Verdict::Failed, &RULE, 0);
        t.judge((p, d), Verdict::Failed, &RULE, 0);
        t.judge((p, d), Verdict::Worked, &RULE, 0);
        assert_eq!(t, PairTable::default());
        t.judge((p, d), Verdict::Failed, &RULE, 0);
        t.judge((p, d), Verdict::Failed, &RULE, 0);
        assert!(!t.avoided(p, d, 1));
        assert_eq!(PairTable::decode(Some(b"garbage")), PairTable::default());
    }
}

//! Router-side load and health of pods, one shared table per model, rows
//! keyed by pod identity.
//!
//! A table per model keeps a request's reads proportional to its own model's
//! pods, not the cluster's. A pod named in two models is accounted once per
//! model (AIBrix pods serve one model each; a static configuration that
//! shares an address between models gets separate counts).

use super::store::{cas_update, SharedStore};
use crate::codec::{records, RecordWriter};
use crate::fleet::PodId;

/// Router-side counters and health of one pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounters {
    pub outstanding_prefills: u32,
    /// The prompt tokens those prefills compute, as estimated when they
    /// were placed (what they do not find cached on the pod).
    pub outstanding_prefill_tokens: u64,
    pub pending_decodes: u32,
    /// The pod is skipped until this time (Unix ms).
    pub unhealthy_until_ms: u64,
    /// Prefill failures in a row; reset by a success or an ejection.
    pub failures: u32,
}

impl PodCounters {
    pub fn is_healthy(&self, now_ms: u64) -> bool {
        self.unhealthy_until_ms <= now_ms
    }

    fn is_busy(&self) -> bool {
        self.outstanding_prefills > 0 || self.pending_decodes > 0
    }
}

/// `PodId`, outstanding, their tokens, pending, unhealthy until, failures.
const RECORD: usize = 8 + 4 + 8 + 4 + 8 + 4;

/// One model's rows. Absent rows read as idle and healthy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadTable {
    rows: Vec<(PodId, PodCounters)>,
}

impl LoadTable {
    /// Reads a table; a foreign or truncated value reads as empty rows.
    pub fn decode(bytes: Option<&[u8]>) -> LoadTable {
        let rows = records(bytes.unwrap_or_default(), RECORD)
            .filter_map(|mut r| {
                Some((
                    PodId(r.u64()?),
                    PodCounters {
                        outstanding_prefills: r.u32()?,
                        outstanding_prefill_tokens: r.u64()?,
                        pending_decodes: r.u32()?,
                        unhealthy_until_ms: r.u64()?,
                        failures: r.u32()?,
                    },
                ))
            })
            .collect();
        LoadTable { rows }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = RecordWriter::with_capacity(self.rows.len() * RECORD);
        for (id, c) in &self.rows {
            w.u64(id.0)
                .u32(c.outstanding_prefills)
                .u64(c.outstanding_prefill_tokens)
                .u32(c.pending_decodes)
                .u64(c.unhealthy_until_ms)
                .u32(c.failures);
        }
        w.finish()
    }

    pub fn get(&self, id: PodId) -> PodCounters {
        self.rows
            .iter()
            .find(|(p, _)| *p == id)
            .map(|(_, c)| *c)
            .unwrap_or_default()
    }

    /// Changes the row of `id`, adding it idle if absent.
    pub fn update(&mut self, id: PodId, change: impl FnOnce(&mut PodCounters)) {
        match self.rows.iter_mut().find(|(p, _)| *p == id) {
            Some((_, c)) => change(c),
            None => {
                let mut c = PodCounters::default();
                change(&mut c);
                self.rows.push((id, c));
            }
        }
    }

    /// Changes the row of `id` only if it has one: a pod that left the fleet
    /// while its requests ran still gets their load back, but nothing new is
    /// created for it.
    pub fn update_existing(&mut self, id: PodId, change: impl FnOnce(&mut PodCounters)) {
        if let Some((_, c)) = self.rows.iter_mut().find(|(p, _)| *p == id) {
            change(c);
        }
    }

    /// Drops what no longer says anything: rows that read as absent anyway,
    /// and rows of pods that left the fleet once their requests are done (an
    /// ejection still running is kept, in case the pod comes back).
    pub fn prune(&mut self, now_ms: u64, is_live: impl Fn(PodId) -> bool) {
        self.rows.retain(|(id, c)| {
            if c.is_busy() || !c.is_healthy(now_ms) {
                return true;
            }
            // Idle and healthy: only a live pod's failure streak says more
            // than an absent row (checked last: it is the costly question).
            c.failures > 0 && is_live(*id)
        });
    }

    pub fn rows(&self) -> &[(PodId, PodCounters)] {
        &self.rows
    }
}

/// Applies `change` to the table at `key` with a CAS retry loop and returns
/// what was written.
pub fn update_load<S: SharedStore + ?Sized>(
    store: &mut S,
    key: &str,
    change: impl FnMut(&mut LoadTable),
) -> Result<LoadTable, String> {
    cas_update(store, key, LoadTable::decode, LoadTable::encode, change)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::store::MemoryStore;

    const A: PodId = PodId(1);
    const B: PodId = PodId(2);

    #[test]
    fn rows_round_trip_and_garbage_reads_as_empty() {
        let mut t = LoadTable::default();
        t.update(A, |c| {
            *c = PodCounters {
                outstanding_prefills: 3,
                outstanding_prefill_tokens: 70_000,
                pending_decodes: 9,
                unhealthy_until_ms: u64::MAX,
                failures: 2,
            }
        });
        t.update(B, |c| c.pending_decodes = 1);
        let back = LoadTable::decode(Some(&t.encode()));
        assert_eq!(back, t);
        assert_eq!(back.get(PodId(3)), PodCounters::default());
        assert_eq!(LoadTable::decode(Some(&[1, 2, 3])), LoadTable::default());
        assert_eq!(LoadTable::decode(None), LoadTable::default());
    }

    #[test]
    fn pruning_keeps_live_state_and_drains_departed_pods() {
        let mut t = LoadTable::default();
        t.update(A, |c| c.pending_decodes = 1);
        t.update(B, |c| c.failures = 1);
        t.update(PodId(3), |c| c.unhealthy_until_ms = 500);
        t.update(PodId(4), |_| {});
        // Everything live: only the idle row goes.
        t.prune(100, |_| true);
        assert_eq!(t.rows().len(), 3);
        // None live: the busy row and the running ejection stay, the
        // failure streak of a departed pod goes.
        t.prune(100, |_| false);
        let ids: Vec<PodId> = t.rows().iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![A, PodId(3)]);
        // Its last request done, the ejection over: nothing left.
        t.update_existing(A, |c| c.pending_decodes = 0);
        t.prune(600, |_| false);
        assert!(t.rows().is_empty());
        t.update_existing(A, |c| c.pending_decodes = 1);
        assert!(t.rows().is_empty(), "a departed pod gets no new row");
    }

    #[test]
    fn updates_go_through_cas() {
        let mut s = MemoryStore::default();
        update_load(&mut s, "k", |t| t.update(B, |c| c.pending_decodes += 1)).unwrap();
        s.contend = 3;
        let out = update_load(&mut s, "k", |t| t.update(B, |c| c.pending_decodes += 1)).unwrap();
        assert_eq!(out.get(B).pending_decodes, 2);
    }
}

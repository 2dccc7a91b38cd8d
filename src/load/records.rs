//! Router-side load and health of pods: per model, one record per worker
//! slot (its writer is the VM that leases the slot, see
//! [`crate::pods::slots`]),
//! rows keyed by pod identity; readers merge the live slots' records.
//!
//! One writer per record is what makes the counts exact: a shared record
//! that every VM updated with CAS lost an update whenever two VMs created it
//! at once (shared data has no "create if absent"). A table per model keeps
//! a request's reads proportional to its own model's pods, not the
//! cluster's. A pod named in two models is accounted once per
//! model (AIBrix pods serve one model each; a static configuration that
//! shares an address between models gets separate counts).

use crate::codec::{records, RecordReader, RecordWriter};
use crate::fleet::PodId;

/// Router-side counters and health of one pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounters {
    pub outstanding_prefills: u32,
    /// The prompt tokens those prefills compute, as estimated when they
    /// were placed (what they do not find cached on the pod; weighed by
    /// their attention with `attention_tokens` set).
    pub outstanding_prefill_tokens: u64,
    pub pending_decodes: u32,
    /// The pod is skipped until this time (Unix ms).
    pub unhealthy_until_ms: u64,
    /// Prefill failures in a row; reset by a success or an ejection.
    pub failures: u32,
    /// Requests whose prefill this pod ran and whose answer still streams:
    /// conversations whose next turn will find their history here.
    pub live_streams: u32,
}

impl PodCounters {
    pub fn is_healthy(&self, now_ms: u64) -> bool {
        self.unhealthy_until_ms <= now_ms
    }

    fn is_busy(&self) -> bool {
        self.outstanding_prefills > 0 || self.pending_decodes > 0 || self.live_streams > 0
    }
}

/// `PodId`, outstanding, their tokens, pending, unhealthy until, failures,
/// live streams.
const RECORD: usize = 8 + 4 + 8 + 4 + 8 + 4 + 4;

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
                        live_streams: r.u32()?,
                    },
                ))
            })
            .collect();
        LoadTable { rows }
    }

    /// Reads one slot's record: its writer's lease holder id, and its rows.
    pub fn decode_record(bytes: &[u8]) -> Option<(u64, LoadTable)> {
        let holder = RecordReader::new(bytes).u64()?;
        let rows = bytes.get(8..)?;
        Some((holder, LoadTable::decode(Some(rows))))
    }

    /// One slot's record, written by `holder`.
    pub fn encode_record(&self, holder: u64) -> Vec<u8> {
        let mut w = RecordWriter::with_capacity(8 + self.rows.len() * RECORD);
        w.u64(holder);
        self.write_rows(&mut w);
        w.finish()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = RecordWriter::with_capacity(self.rows.len() * RECORD);
        self.write_rows(&mut w);
        w.finish()
    }

    fn write_rows(&self, w: &mut RecordWriter) {
        for (id, c) in &self.rows {
            w.u64(id.0)
                .u32(c.outstanding_prefills)
                .u64(c.outstanding_prefill_tokens)
                .u32(c.pending_decodes)
                .u64(c.unhealthy_until_ms)
                .u32(c.failures)
                .u32(c.live_streams);
        }
    }

    /// Adds another slot's rows: loads and failure streaks add up (a
    /// pod's streak is the sum of the workers' streaks, each ended by a
    /// success on that worker), the latest ejection holds.
    pub fn merge(&mut self, other: &LoadTable) {
        for (id, o) in &other.rows {
            self.update(*id, |c| {
                c.outstanding_prefills = c
                    .outstanding_prefills
                    .saturating_add(o.outstanding_prefills);
                c.outstanding_prefill_tokens = c
                    .outstanding_prefill_tokens
                    .saturating_add(o.outstanding_prefill_tokens);
                c.pending_decodes = c.pending_decodes.saturating_add(o.pending_decodes);
                c.unhealthy_until_ms = c.unhealthy_until_ms.max(o.unhealthy_until_ms);
                c.failures = c.failures.saturating_add(o.failures);
                c.live_streams = c.live_streams.saturating_add(o.live_streams);
            });
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
                live_streams: 4,
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
    fn records_carry_their_writer_and_merge_by_pod() {
        let mut a = LoadTable::default();
        a.update(A, |c| {
            c.outstanding_prefills = 1;
            c.outstanding_prefill_tokens = 100;
            c.failures = 1;
            c.unhealthy_until_ms = 50;
        });
        let mut b = LoadTable::default();
        b.update(A, |c| {
            c.outstanding_prefills = 2;
            c.outstanding_prefill_tokens = 10;
            c.pending_decodes = 1;
            c.failures = 1;
            c.unhealthy_until_ms = 70;
            c.live_streams = 2;
        });
        b.update(B, |c| c.pending_decodes = 4);
        assert_eq!(
            LoadTable::decode_record(&b.encode_record(9)),
            Some((9, b.clone()))
        );
        assert_eq!(LoadTable::decode_record(&[1, 2]), None);
        a.merge(&b);
        assert_eq!(
            a.get(A),
            PodCounters {
                outstanding_prefills: 3,
                outstanding_prefill_tokens: 110,
                pending_decodes: 1,
                unhealthy_until_ms: 70,
                failures: 2,
                live_streams: 2,
            }
        );
        assert_eq!(a.get(B).pending_decodes, 4);
    }
}

//! What each VM tells the others about its queue, through shared data: per
//! worker slot, its waiting counts by model and priority, and when it
//! wrote them. A VM lets its own request go only when no other VM has a
//! higher priority waiting for the same model that could go (one blocked
//! on its adapter's full pods holds no one back), so the highest priority
//! in the Envoy process goes first.

use super::queue::Count;
use crate::codec::{RecordReader, RecordWriter};
use crate::fleet::ModelId;

/// A VM's report older than this is ignored (the VM stopped ticking).
pub const STALE_MS: u64 = 5_000;

/// One VM's waiting counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub at_ms: u64,
    pub counts: Vec<Count>,
}

impl Report {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = RecordWriter::with_capacity(12 + self.counts.len() * 20);
        w.u64(self.at_ms);
        w.u32(self.counts.len() as u32);
        for c in &self.counts {
            w.u64(c.model.0);
            w.u32(c.priority as u32);
            w.u32(c.waiting);
            w.u32(c.open);
        }
        w.finish()
    }

    /// `None` for bytes that are not a report.
    pub fn decode(bytes: &[u8]) -> Option<Report> {
        let mut r = RecordReader::new(bytes);
        let at_ms = r.u64()?;
        let n = r.u32()? as usize;
        let mut counts = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            counts.push(Count {
                model: ModelId(r.u64()?),
                priority: r.u32()? as i32,
                waiting: r.u32()?,
                open: r.u32()?,
            });
        }
        Some(Report { at_ms, counts })
    }

    fn fresh(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.at_ms) < STALE_MS
    }
}

/// What the other VMs' fresh reports say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Others(Vec<Report>);

impl Others {
    pub fn new(reports: Vec<Report>, now_ms: u64) -> Others {
        Others(reports.into_iter().filter(|r| r.fresh(now_ms)).collect())
    }

    /// The highest priority another VM has waiting for `model` that could
    /// go at its last look.
    pub fn top_priority(&self, model: ModelId) -> Option<i32> {
        self.counts()
            .filter(|c| c.model == model && c.open > 0)
            .map(|c| c.priority)
            .max()
    }

    /// Requests waiting in the other VMs.
    pub fn total(&self) -> u32 {
        self.0
            .iter()
            .flat_map(|r| r.counts.iter())
            .map(|c| c.waiting)
            .sum()
    }

    /// Waiting counts in the other VMs, by (model, priority).
    pub fn counts(&self) -> impl Iterator<Item = &Count> {
        self.0.iter().flat_map(|r| r.counts.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(model: u64, priority: i32, waiting: u32, open: u32) -> Count {
        Count {
            model: ModelId(model),
            priority,
            waiting,
            open,
        }
    }

    #[test]
    fn reports_round_trip_and_stale_ones_are_ignored() {
        let r = Report {
            at_ms: 1000,
            counts: vec![
                count(7, -1, 3, 3),
                count(7, 10, 1, 1),
                count(7, 20, 1, 0),
                count(8, 0, 2, 2),
            ],
        };
        assert_eq!(Report::decode(&r.encode()), Some(r.clone()));
        assert_eq!(Report::decode(&[1, 2]), None);
        let old = Report {
            at_ms: 0,
            counts: vec![count(7, 99, 1, 1)],
        };
        let others = Others::new(vec![r, old], 1000 + STALE_MS - 1);
        assert_eq!(
            others.top_priority(ModelId(7)),
            Some(10),
            "priority 20 is blocked on its adapter's pods"
        );
        assert_eq!(others.top_priority(ModelId(9)), None);
        assert_eq!(others.total(), 7);
    }
}

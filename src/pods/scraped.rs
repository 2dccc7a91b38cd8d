//! Load signals scraped from the pods' `/metrics`, one shared table for the
//! whole fleet (written by the VM holding the scrape lease, copied by every
//! VM once per tick, so its size never costs a request anything).

use super::store::{cas_update, SharedStore};
use crate::codec::{records, RecordWriter};
use crate::fleet::PodId;
use std::collections::HashMap;

/// Load signals scraped from a pod's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodMetrics {
    pub running: f64,
    /// Of `running`, how many this Envoy had in flight on the pod when the
    /// scrape answered: those it counts exactly itself, and a scrape that
    /// caught one of them must not make the pod look busy until the next.
    pub own_running: f64,
    /// This Envoy's prefills in flight on the pod when the scrape answered
    /// (the larger count, at its leaving or its answer): the engine counts
    /// them in `running` or `waiting`, and the router exactly.
    pub own_prefills: f64,
    pub waiting: f64,
    /// KV-cache usage, a fraction.
    pub kv_usage: Option<f64>,
    /// Generated tokens per second.
    pub gen_throughput: Option<f64>,
    /// Finished requests per second.
    pub drain_rate: Option<f64>,
}

impl PodMetrics {
    /// Requests the engine runs or queues for others than this Envoy's
    /// prefills (other replicas', unsplit requests): what it reported
    /// beyond those prefills at the scrape.
    pub fn others_prefill_load(&self) -> f64 {
        (self.running + self.waiting - self.own_prefills).max(0.0)
    }
}

/// One pod's metrics as stored in shared data.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoredMetrics {
    /// When they were scraped (Unix ms); 0 = never.
    pub at_ms: u64,
    pub metrics: PodMetrics,
}

impl StoredMetrics {
    /// The metrics if scraped within `ttl_ms` of `now_ms`: stale load is no
    /// signal, and a pod that stopped answering must not look idle or busy
    /// forever.
    pub fn fresh(&self, now_ms: u64, ttl_ms: u64) -> Option<PodMetrics> {
        (self.at_ms > 0 && now_ms.saturating_sub(self.at_ms) <= ttl_ms).then_some(self.metrics)
    }
}

/// `PodId`, scraped at, running, own running, own prefills, waiting, KV
/// usage, throughput, drain rate.
const RECORD: usize = 8 + 8 + 7 * 4;

/// Every pod's last scrape, keyed by identity.
pub type ScrapedTable = HashMap<PodId, StoredMetrics>;

pub fn decode_scraped(bytes: Option<&[u8]>) -> ScrapedTable {
    records(bytes.unwrap_or_default(), RECORD)
        .filter_map(|mut r| {
            let id = PodId(r.u64()?);
            let at_ms = r.u64()?;
            let metrics = PodMetrics {
                running: r.f32()?.unwrap_or(0.0),
                own_running: r.f32()?.unwrap_or(0.0),
                own_prefills: r.f32()?.unwrap_or(0.0),
                waiting: r.f32()?.unwrap_or(0.0),
                kv_usage: r.f32()?,
                gen_throughput: r.f32()?,
                drain_rate: r.f32()?,
            };
            Some((id, StoredMetrics { at_ms, metrics }))
        })
        .collect()
}

pub fn encode_scraped(table: &ScrapedTable) -> Vec<u8> {
    // Sorted, so equal tables encode to equal bytes.
    let mut rows: Vec<_> = table.iter().collect();
    rows.sort_by_key(|(id, _)| **id);
    let mut w = RecordWriter::with_capacity(rows.len() * RECORD);
    for (id, s) in rows {
        let m = &s.metrics;
        w.u64(id.0)
            .u64(s.at_ms)
            .f32(Some(m.running))
            .f32(Some(m.own_running))
            .f32(Some(m.own_prefills))
            .f32(Some(m.waiting))
            .f32(m.kv_usage)
            .f32(m.gen_throughput)
            .f32(m.drain_rate);
    }
    w.finish()
}

/// Applies `change` to the shared table with a CAS retry loop.
pub fn update_scraped<S: SharedStore + ?Sized>(
    store: &mut S,
    key: &str,
    change: impl FnMut(&mut ScrapedTable),
) -> Result<(), String> {
    cas_update(store, key, decode_scraped, encode_scraped, change).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_round_trip_with_absent_values() {
        let m = StoredMetrics {
            at_ms: 77,
            metrics: PodMetrics {
                running: 5.0,
                own_running: 2.0,
                own_prefills: 3.0,
                waiting: 1.0,
                kv_usage: Some(0.5),
                gen_throughput: None,
                drain_rate: Some(2.0),
            },
        };
        let table: ScrapedTable = [(PodId(9), m)].into_iter().collect();
        let back = decode_scraped(Some(&encode_scraped(&table)));
        assert_eq!(back, table);
        assert_eq!(m.fresh(100, 50), Some(m.metrics));
        assert_eq!(m.fresh(1000, 50), None);
        assert_eq!(StoredMetrics::default().fresh(10, 1000), None);
        assert!(decode_scraped(Some(&[1, 2])).is_empty());
    }
}

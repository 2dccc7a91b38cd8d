//! The scheduler's shared state, as Envoy shared data: every worker VM of one
//! `vm_id` reads and writes the same keys. Values are fixed-layout
//! little-endian records (one per pod, indexed like `Config::pods`), updated
//! with compare-and-swap; a lost race re-reads and retries.

use super::PodMetrics;

/// Access to proxy-wasm shared data.
pub trait SharedStore {
    /// The value and its CAS token.
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);
    /// Writes `value` if the key's CAS token is still `cas` (`None`: always).
    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetError {
    /// Another worker wrote first.
    CasMismatch,
    Failed(String),
}

/// Router-side counters and health of one pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounters {
    pub outstanding_prefills: u32,
    pub pending_decodes: u32,
    /// The pod is skipped until this time (Unix ms).
    pub unhealthy_until_ms: u64,
    /// Prefill failures in a row; reset by a success or an ejection.
    pub failures: u32,
}

const LOAD_RECORD: usize = 20;

pub fn load_key(fingerprint: &str) -> String {
    format!("pd_router.{fingerprint}.load")
}

pub fn metrics_key(fingerprint: &str) -> String {
    format!("pd_router.{fingerprint}.metrics")
}

pub fn lease_key(fingerprint: &str) -> String {
    format!("pd_router.{fingerprint}.scrape_lease")
}

/// Decodes `n` pods' counters; missing or malformed records read as zero.
pub fn decode_load(bytes: Option<&[u8]>, n: usize) -> Vec<PodCounters> {
    let mut out = vec![PodCounters::default(); n];
    if let Some(b) = bytes {
        for (i, rec) in b.chunks_exact(LOAD_RECORD).take(n).enumerate() {
            let u32_at =
                |o: usize| u32::from_le_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]]);
            let mut u = [0u8; 8];
            u.copy_from_slice(&rec[8..16]);
            out[i] = PodCounters {
                outstanding_prefills: u32_at(0),
                pending_decodes: u32_at(4),
                unhealthy_until_ms: u64::from_le_bytes(u),
                failures: u32_at(16),
            };
        }
    }
    out
}

pub fn encode_load(pods: &[PodCounters]) -> Vec<u8> {
    let mut out = Vec::with_capacity(pods.len() * LOAD_RECORD);
    for p in pods {
        out.extend_from_slice(&p.outstanding_prefills.to_le_bytes());
        out.extend_from_slice(&p.pending_decodes.to_le_bytes());
        out.extend_from_slice(&p.unhealthy_until_ms.to_le_bytes());
        out.extend_from_slice(&p.failures.to_le_bytes());
    }
    out
}

/// Applies `change` to the shared counters with a CAS retry loop and returns
/// what was written.
pub fn update_load<S: SharedStore + ?Sized>(
    store: &mut S,
    key: &str,
    n: usize,
    mut change: impl FnMut(&mut [PodCounters]),
) -> Result<Vec<PodCounters>, String> {
    for _ in 0..64 {
        let (bytes, cas) = store.shared_get(key);
        let mut pods = decode_load(bytes.as_deref(), n);
        change(&mut pods);
        match store.shared_set(key, &encode_load(&pods), cas) {
            Ok(()) => return Ok(pods),
            Err(SetError::CasMismatch) => continue,
            Err(SetError::Failed(e)) => return Err(e),
        }
    }
    Err("shared data stayed contended for 64 attempts".into())
}

/// Scraped metrics of one pod as stored in shared data.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoredMetrics {
    /// When they were scraped (Unix ms); 0 = never.
    pub at_ms: u64,
    pub metrics: PodMetrics,
}

const METRICS_RECORD: usize = 28;

fn opt(v: f32) -> Option<f64> {
    if v.is_finite() {
        Some(v as f64)
    } else {
        None
    }
}

pub fn decode_metrics(bytes: Option<&[u8]>, n: usize) -> Vec<StoredMetrics> {
    let mut out = vec![StoredMetrics::default(); n];
    if let Some(b) = bytes {
        for (i, rec) in b.chunks_exact(METRICS_RECORD).take(n).enumerate() {
            let f = |o: usize| f32::from_le_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]]);
            let mut u = [0u8; 8];
            u.copy_from_slice(&rec[..8]);
            out[i] = StoredMetrics {
                at_ms: u64::from_le_bytes(u),
                metrics: PodMetrics {
                    running: opt(f(8)).unwrap_or(0.0),
                    waiting: opt(f(12)).unwrap_or(0.0),
                    kv_usage: opt(f(16)),
                    gen_throughput: opt(f(20)),
                    drain_rate: opt(f(24)),
                },
            };
        }
    }
    out
}

pub fn encode_metrics(pods: &[StoredMetrics]) -> Vec<u8> {
    let f = |v: Option<f64>| v.map(|v| v as f32).unwrap_or(f32::NAN).to_le_bytes();
    let mut out = Vec::with_capacity(pods.len() * METRICS_RECORD);
    for p in pods {
        let m = &p.metrics;
        out.extend_from_slice(&p.at_ms.to_le_bytes());
        out.extend_from_slice(&f(Some(m.running)));
        out.extend_from_slice(&f(Some(m.waiting)));
        out.extend_from_slice(&f(m.kv_usage));
        out.extend_from_slice(&f(m.gen_throughput));
        out.extend_from_slice(&f(m.drain_rate));
    }
    out
}

impl StoredMetrics {
    /// The metrics if scraped within `ttl_ms` of `now_ms`: stale load is no
    /// signal, and a pod that stopped answering must not look idle or busy
    /// forever.
    pub fn fresh(&self, now_ms: u64, ttl_ms: u64) -> Option<PodMetrics> {
        (self.at_ms > 0 && now_ms.saturating_sub(self.at_ms) <= ttl_ms).then_some(self.metrics)
    }
}

/// Applies `change` to the shared metrics table with a CAS retry loop.
pub fn update_metrics<S: SharedStore + ?Sized>(
    store: &mut S,
    key: &str,
    n: usize,
    mut change: impl FnMut(&mut [StoredMetrics]),
) -> Result<(), String> {
    for _ in 0..64 {
        let (bytes, cas) = store.shared_get(key);
        let mut pods = decode_metrics(bytes.as_deref(), n);
        change(&mut pods);
        match store.shared_set(key, &encode_metrics(&pods), cas) {
            Ok(()) => return Ok(()),
            Err(SetError::CasMismatch) => continue,
            Err(SetError::Failed(e)) => return Err(e),
        }
    }
    Err("shared data stayed contended for 64 attempts".into())
}

/// An in-memory store with proxy-wasm's CAS semantics, for tests and benches.
#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: std::collections::HashMap<String, (Vec<u8>, u32)>,
    /// Fail the next N sets with a CAS mismatch (to exercise retries).
    pub contend: u32,
}

impl SharedStore for MemoryStore {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        match self.entries.get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        }
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        if self.contend > 0 {
            self.contend -= 1;
            return Err(SetError::CasMismatch);
        }
        let current = self.entries.get(key).map(|(_, c)| *c);
        if let (Some(want), Some(have)) = (cas, current) {
            if want != have {
                return Err(SetError::CasMismatch);
            }
        }
        let next = current.unwrap_or(0).wrapping_add(1);
        self.entries.insert(key.to_owned(), (value.to_vec(), next));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_records_round_trip_and_tolerate_garbage() {
        let pods = vec![
            PodCounters {
                outstanding_prefills: 3,
                pending_decodes: 9,
                unhealthy_until_ms: u64::MAX,
                failures: 2,
            },
            PodCounters::default(),
        ];
        assert_eq!(decode_load(Some(&encode_load(&pods)), 2), pods);
        assert_eq!(
            decode_load(Some(&encode_load(&pods)), 3)[2],
            PodCounters::default()
        );
        assert_eq!(
            decode_load(Some(&[1, 2, 3]), 1),
            vec![PodCounters::default()]
        );
        assert_eq!(decode_load(None, 2).len(), 2);
    }

    #[test]
    fn metrics_round_trip_with_absent_values() {
        let m = vec![StoredMetrics {
            at_ms: 77,
            metrics: PodMetrics {
                running: 5.0,
                waiting: 1.0,
                kv_usage: Some(0.5),
                gen_throughput: None,
                drain_rate: Some(2.0),
            },
        }];
        let back = decode_metrics(Some(&encode_metrics(&m)), 1);
        assert_eq!(back, m);
        assert_eq!(back[0].fresh(100, 50), Some(m[0].metrics));
        assert_eq!(back[0].fresh(1000, 50), None);
        assert_eq!(StoredMetrics::default().fresh(10, 1000), None);
    }

    #[test]
    fn updates_retry_lost_races() {
        let mut s = MemoryStore::default();
        update_load(&mut s, "k", 2, |p| p[1].pending_decodes += 1).unwrap();
        s.contend = 5;
        let out = update_load(&mut s, "k", 2, |p| p[1].pending_decodes += 1).unwrap();
        assert_eq!(out[1].pending_decodes, 2);
        s.contend = 100;
        assert!(update_load(&mut s, "k", 2, |_| {}).is_err());
    }

    #[test]
    fn memory_store_enforces_cas() {
        let mut s = MemoryStore::default();
        s.shared_set("k", b"a", None).unwrap();
        let (_, cas) = s.shared_get("k");
        s.shared_set("k", b"b", cas).unwrap();
        assert_eq!(s.shared_set("k", b"c", cas), Err(SetError::CasMismatch));
    }
}

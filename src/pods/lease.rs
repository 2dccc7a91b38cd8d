//! Leases in shared data: which one VM does a periodic job (scraping,
//! listing pods) that every worker VM could do, so N workers do not do it N
//! times. A lease expires unless its holder renews it, so a VM that stops
//! (a reload, a crash) hands the job over.

use super::store::SharedStore;
use crate::codec::{RecordReader, RecordWriter};

/// The lease record: holder id and expiry (Unix ms).
pub fn encode_lease(holder: u64, expires_ms: u64) -> Vec<u8> {
    let mut w = RecordWriter::with_capacity(16);
    w.u64(holder).u64(expires_ms);
    w.finish()
}

pub fn decode_lease(bytes: &[u8]) -> Option<(u64, u64)> {
    if bytes.len() != 16 {
        return None;
    }
    let mut r = RecordReader::new(bytes);
    Some((r.u64()?, r.u64()?))
}

/// Whether `me` may take or renew the lease given its current record.
pub fn may_hold(current: Option<&[u8]>, me: u64, now_ms: u64) -> bool {
    match current.and_then(decode_lease) {
        None => true,
        Some((holder, expires)) => holder == me || expires <= now_ms,
    }
}

/// Takes or renews the lease at `key` for `ttl_ms`; true when `me` holds it.
pub fn try_hold<S: SharedStore + ?Sized>(
    store: &mut S,
    key: &str,
    me: u64,
    now_ms: u64,
    ttl_ms: u64,
) -> bool {
    let (current, cas) = store.shared_get(key);
    if !may_hold(current.as_deref(), me, now_ms) {
        return false;
    }
    let record = encode_lease(me, now_ms.saturating_add(ttl_ms));
    store.shared_set(key, &record, cas).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::MemoryStore;

    #[test]
    fn lease_is_taken_when_free_or_expired_and_kept_by_its_holder() {
        assert!(may_hold(None, 1, 100));
        let l = encode_lease(7, 1000);
        assert_eq!(decode_lease(&l), Some((7, 1000)));
        assert!(may_hold(Some(&l), 7, 500));
        assert!(!may_hold(Some(&l), 8, 500));
        assert!(may_hold(Some(&l), 8, 1000));
        assert!(may_hold(Some(&[1, 2]), 8, 0), "garbage is no lease");
    }

    #[test]
    fn one_holder_at_a_time() {
        let mut s = MemoryStore::default();
        assert!(try_hold(&mut s, "k", 1, 0, 100));
        assert!(!try_hold(&mut s, "k", 2, 50, 100), "held by 1");
        assert!(try_hold(&mut s, "k", 1, 60, 100), "renewed");
        assert!(try_hold(&mut s, "k", 2, 161, 100), "expired");
    }
}

//! Worker slots: each worker VM leases one of [`WORKER_SLOTS`] slots, and
//! everything a VM writes for the others (its load records, its admission
//! report) sits under its slot, so every such key has one writer.
//!
//! Why leases in one table and not a counter: Envoy's shared data has no
//! "create if absent". A `set` on a key that does not exist succeeds
//! whatever CAS it carries (proxy-wasm-cpp-host `SharedData::set`), so two
//! VMs that both read a key as absent both "create" it and one write is
//! lost. A CAS on a key that exists is exact. So the one key every VM
//! contends for, this table, is made to exist before any worker runs:
//! [`ensure_table`] is called from `on_configure`, and Envoy runs the
//! plugin's first `on_configure` in a configuration canary on the main
//! thread before it creates the worker VMs (proxy-wasm-cpp-host
//! `createWasm`). Every later claim and renewal is a CAS on an existing key.
//!
//! A lease expires unless its holder renews it, so a VM that stops (a
//! reload, a crash, the canary itself) frees its slot, and a slot number
//! is never held by two live VMs (a VM that finds its lease taken, after
//! being stalled longer than the lease, moves to another slot).

use super::store::{SetError, SharedStore};
use crate::codec::{records, RecordWriter};
use crate::trt_id::WORKER_SLOTS;

/// How long a lease holds without renewal. Renewed on every tick (at most
/// a second apart): a live VM never loses it; a dead VM's slot, and the
/// load its requests held, are forgotten this long after it stopped.
pub const LEASE_MS: u64 = 10_000;

/// Holder id and expiry (Unix ms) of each slot; holder 0 is a free slot.
const ENTRY: usize = 16;

/// The slot table: one lease per slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotTable {
    leases: [(u64, u64); WORKER_SLOTS as usize],
}

impl Default for SlotTable {
    fn default() -> Self {
        SlotTable {
            leases: [(0, 0); WORKER_SLOTS as usize],
        }
    }
}

impl SlotTable {
    /// A foreign or truncated value reads as all slots free.
    pub fn decode(bytes: Option<&[u8]>) -> SlotTable {
        let mut t = SlotTable::default();
        for (slot, mut r) in records(bytes.unwrap_or_default(), ENTRY)
            .take(WORKER_SLOTS as usize)
            .enumerate()
        {
            if let (Some(holder), Some(expires), Some(lease)) =
                (r.u64(), r.u64(), t.leases.get_mut(slot))
            {
                *lease = (holder, expires);
            }
        }
        t
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = RecordWriter::with_capacity(self.leases.len() * ENTRY);
        for (holder, expires) in &self.leases {
            w.u64(*holder).u64(*expires);
        }
        w.finish()
    }

    /// Who holds `slot` at `now_ms` (`None`: free or expired).
    pub fn holder(&self, slot: u8, now_ms: u64) -> Option<u64> {
        self.leases
            .get(usize::from(slot))
            .filter(|(h, expires)| *h != 0 && *expires > now_ms)
            .map(|(h, _)| *h)
    }

    /// The slots held at `now_ms`, with their holders.
    pub fn live(&self, now_ms: u64) -> impl Iterator<Item = (u8, u64)> + '_ {
        (0..WORKER_SLOTS).filter_map(move |s| self.holder(s, now_ms).map(|h| (s, h)))
    }

    /// Takes `me`'s slot, or the lowest free one, until `now_ms + LEASE_MS`.
    fn take(&mut self, me: u64, preferred: Option<u8>, now_ms: u64) -> Option<u8> {
        let free_or_mine = |s: u8| self.holder(s, now_ms).is_none_or(|h| h == me);
        let slot = preferred
            .filter(|s| *s < WORKER_SLOTS && free_or_mine(*s))
            .or_else(|| (0..WORKER_SLOTS).find(|s| self.holder(*s, now_ms).is_none()))?;
        let lease = self.leases.get_mut(usize::from(slot))?;
        *lease = (me, now_ms.saturating_add(LEASE_MS));
        Some(slot)
    }
}

/// CAS rounds before a claim gives up (as [`super::cas_update`]'s).
const CAS_ATTEMPTS: usize = 64;

/// Creates the slot table if it is absent. Exact only where no other VM
/// writes it at the same moment: Envoy's configuration canary (see the
/// module's comment) is where the first call happens.
pub fn ensure_table<S: SharedStore + ?Sized>(store: &mut S, key: &str) {
    if store.shared_get(key).0.is_none() {
        let _ = store.shared_set(key, &SlotTable::default().encode(), None);
    }
}

/// Leases a slot for `me` (keeping `preferred` if `me` still holds it or it
/// is free), or renews it. `None` when every slot is held by a live VM or
/// the store refused.
pub fn lease_slot<S: SharedStore + ?Sized>(
    store: &mut S,
    key: &str,
    me: u64,
    preferred: Option<u8>,
    now_ms: u64,
) -> Option<u8> {
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = store.shared_get(key);
        let mut table = SlotTable::decode(bytes.as_deref());
        let slot = table.take(me, preferred, now_ms)?;
        match store.shared_set(key, &table.encode(), cas) {
            Ok(()) => return Some(slot),
            Err(SetError::CasMismatch) => continue,
            Err(SetError::Failed(_)) => return None,
        }
    }
    None
}

/// Gives `slot` back if `me` holds it (a VM that stops), so a reload does
/// not keep it for the rest of the lease.
pub fn release_slot<S: SharedStore + ?Sized>(store: &mut S, key: &str, me: u64, slot: u8) {
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = store.shared_get(key);
        let mut table = SlotTable::decode(bytes.as_deref());
        match table.leases.get_mut(usize::from(slot)) {
            Some(lease) if lease.0 == me => *lease = (0, 0),
            _ => return,
        }
        if !matches!(
            store.shared_set(key, &table.encode(), cas),
            Err(SetError::CasMismatch)
        ) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::MemoryStore;

    const KEY: &str = "slots";

    #[test]
    fn vms_get_distinct_slots_and_keep_them_while_they_renew() {
        let mut s = MemoryStore::default();
        ensure_table(&mut s, KEY);
        let a = lease_slot(&mut s, KEY, 11, None, 0);
        let b = lease_slot(&mut s, KEY, 22, None, 0);
        assert_eq!((a, b), (Some(0), Some(1)));
        assert_eq!(lease_slot(&mut s, KEY, 11, a, 5_000), a, "renewed");
        let t = SlotTable::decode(s.shared_get(KEY).0.as_deref());
        assert_eq!(t.live(9_000).collect::<Vec<_>>(), vec![(0, 11), (1, 22)]);
        assert_eq!(
            t.live(LEASE_MS + 1).collect::<Vec<_>>(),
            vec![(0, 11)],
            "22 stopped renewing"
        );
    }

    #[test]
    fn a_dead_vms_slot_is_reused_after_its_lease_and_a_stalled_vm_moves() {
        let mut s = MemoryStore::default();
        ensure_table(&mut s, KEY);
        assert_eq!(lease_slot(&mut s, KEY, 11, None, 0), Some(0));
        // 11 stops (a reload): its slot is taken only once the lease ran out.
        assert_eq!(lease_slot(&mut s, KEY, 33, None, 100), Some(1));
        assert_eq!(lease_slot(&mut s, KEY, 44, None, LEASE_MS), Some(0));
        // 11 was only stalled: its renewal finds slot 0 taken and moves.
        assert_eq!(lease_slot(&mut s, KEY, 11, Some(0), LEASE_MS + 1), Some(2));
        // A VM that stops gives its slot back at once; not someone else's.
        release_slot(&mut s, KEY, 11, 0);
        release_slot(&mut s, KEY, 11, 2);
        let t = SlotTable::decode(s.shared_get(KEY).0.as_deref());
        assert_eq!(
            t.live(LEASE_MS + 2).collect::<Vec<_>>(),
            vec![(0, 44), (1, 33)]
        );
    }

    #[test]
    fn every_slot_held_means_no_claim_and_garbage_reads_as_free() {
        let mut s = MemoryStore::default();
        ensure_table(&mut s, KEY);
        for vm in 1..=u64::from(WORKER_SLOTS) {
            assert!(lease_slot(&mut s, KEY, vm, None, 0).is_some());
        }
        assert_eq!(lease_slot(&mut s, KEY, 999, None, 0), None);
        assert_eq!(SlotTable::decode(Some(&[1, 2, 3])), SlotTable::default());
        let mut t = SlotTable::default();
        assert_eq!(
            t.take(5, Some(200), 0),
            Some(0),
            "a slot out of range is not kept"
        );
    }
}

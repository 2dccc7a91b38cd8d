//! This VM's worker slot lease (`crate::pods::slots`): the slot its load
//! records, admission report, TensorRT-LLM ids and stat names sit under.

use crate::pods::slots::{lease_slot, release_slot};
use crate::pods::{SharedStore, WORKER_SLOTS_KEY};
use std::cell::Cell;

pub struct WorkerLease {
    slot: Cell<u8>,
    /// This VM's lease holder id (random per VM).
    holder: u64,
    /// When the lease was last renewed (Unix ms): the time other VMs'
    /// leases are judged live at.
    clock: Cell<u64>,
}

impl WorkerLease {
    /// The lease of `slot` as `holder` at `now_ms`.
    pub fn new(slot: u8, holder: u64, now_ms: u64) -> WorkerLease {
        WorkerLease {
            slot: Cell::new(slot),
            holder,
            clock: Cell::new(now_ms),
        }
    }

    pub fn slot(&self) -> u8 {
        self.slot.get()
    }

    pub fn holder(&self) -> u64 {
        self.holder
    }

    pub fn clock(&self) -> u64 {
        self.clock.get()
    }

    /// Renews the lease at `now_ms`; the slot it holds now, which is
    /// another one when a VM took this one while this VM was stalled past
    /// its lease (the caller moves what it wrote, then [`Self::move_to`]).
    pub fn renew<S: SharedStore + ?Sized>(&self, store: &mut S, now_ms: u64) -> Result<u8, String> {
        let old = self.slot.get();
        let slot = lease_slot(store, WORKER_SLOTS_KEY, self.holder, Some(old), now_ms)
            .ok_or_else(|| format!("pd-router: worker slot {old}'s lease could not be renewed and no slot is free; load counts of this VM may be overwritten"))?;
        self.clock.set(now_ms);
        Ok(slot)
    }

    pub fn move_to(&self, slot: u8) {
        self.slot.set(slot);
    }

    /// Gives the slot back (the VM is stopping).
    pub fn release<S: SharedStore + ?Sized>(&self, store: &mut S) {
        release_slot(store, WORKER_SLOTS_KEY, self.holder, self.slot.get());
    }
}

//! Names of the shared-data keys. Every key carries the configuration's
//! fingerprint, so a reloaded configuration never reads another one's state.

use crate::fleet::ModelId;
use crate::inline_str::InlineStr;

/// The layout of the records kept in shared data, folded into the
/// configuration's fingerprint. Bump the number when a record's bytes
/// change (the load table, scraped metrics, prefix entries, admission
/// reports); a release changes it anyway.
pub const SHARED_LAYOUT: &str = concat!(env!("CARGO_PKG_VERSION"), "/4");

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedKeys {
    prefix: String,
}

impl SharedKeys {
    pub fn new(fingerprint: &str) -> SharedKeys {
        SharedKeys {
            prefix: format!("pd_router.{fingerprint}"),
        }
    }

    /// One model's pod load and health as one worker slot's VM holds them
    /// (read and written on every request: built without allocating).
    pub fn load(&self, model: ModelId, slot: u8) -> Key {
        let mut k = Key::from(self.prefix.as_str());
        k.push_str(".load.");
        k.push_hex16(model.0);
        k.push_str(".");
        k.push_decimal(u64::from(slot));
        k
    }

    /// Every pod's scraped metrics.
    pub fn scraped(&self) -> String {
        format!("{}.metrics", self.prefix)
    }

    /// Which VM scrapes.
    pub fn scrape_lease(&self) -> String {
        format!("{}.scrape_lease", self.prefix)
    }

    /// Which VM lists pods from Kubernetes.
    pub fn discovery_lease(&self) -> String {
        format!("{}.discovery_lease", self.prefix)
    }

    /// The discovered pod set, as published by the VM that listed it.
    pub fn discovered(&self) -> String {
        format!("{}.discovered", self.prefix)
    }

    /// The discovered pod set's generation, read by every VM each tick
    /// (small, so the set itself is copied only when it changed).
    pub fn discovered_generation(&self) -> String {
        format!("{}.discovered_gen", self.prefix)
    }

    /// When the API server last confirmed the discovered pod set (a list or
    /// a watch answered), Unix ms: every VM reports the set's age from it.
    pub fn discovery_synced(&self) -> String {
        format!("{}.discovery_synced", self.prefix)
    }

    /// vLLM Mooncake prefill pods' engine ids, learned from their
    /// bootstrap servers by the scrape lease holder.
    pub fn mooncake_engines(&self) -> String {
        format!("{}.mooncake_engines", self.prefix)
    }

    /// Which VM asks Mooncake bootstrap servers.
    pub fn bootstrap_lease(&self) -> String {
        format!("{}.bootstrap_lease", self.prefix)
    }

    /// One slot of the prefix table (several per request: built without
    /// allocating).
    pub fn prefix_slot(&self, slot: u32) -> Key {
        let mut k = Key::from(self.prefix.as_str());
        k.push_str(".pfx.");
        k.push_decimal(u64::from(slot));
        k
    }
}

impl SharedKeys {
    /// One model's prefill/decode pairs whose hand-offs failed.
    pub fn pairs(&self, model: ModelId) -> Key {
        let mut k = Key::from(self.prefix.as_str());
        k.push_str(".pairs.");
        k.push_hex16(model.0);
        k
    }

    /// What one worker VM has waiting for admission (by its worker slot).
    pub fn admission(&self, slot: u8) -> Key {
        let mut k = Key::from(self.prefix.as_str());
        k.push_str(".adm.");
        k.push_decimal(u64::from(slot));
        k
    }

    /// One slot of a model's next-turn KV handles (`crate::reuse`).
    pub fn reuse_slot(&self, model: ModelId, slot: u32) -> Key {
        let mut k = Key::from(self.prefix.as_str());
        k.push_str(".kvr.");
        k.push_hex16(model.0);
        k.push_str(".");
        k.push_decimal(u64::from(slot));
        k
    }

    /// One slot of the decode prefix table: which decode pod last served a
    /// prompt (the decider's; as [`SharedKeys::prefix_slot`]).
    pub fn decode_prefix_slot(&self, slot: u32) -> Key {
        let mut k = Key::from(self.prefix.as_str());
        k.push_str(".dpfx.");
        k.push_decimal(u64::from(slot));
        k
    }
}

/// A key built on the stack: the prefix (`pd_router.` and a 16-digit
/// fingerprint) and the longest suffix fit in 64 bytes with room to spare.
pub type Key = InlineStr<64>;

/// The worker slots' leases (`super::slots`). Not per configuration: a
/// reload must not hand a new VM the slot of one still running.
pub const WORKER_SLOTS_KEY: &str = "pd_router.worker_leases";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_as_their_formatted_names() {
        let k = SharedKeys::new("00ff00ff00ff00ff");
        assert_eq!(
            &*k.load(ModelId(0x2a35_a700_dfc7_594c), 15),
            "pd_router.00ff00ff00ff00ff.load.2a35a700dfc7594c.15"
        );
        assert_eq!(
            &*k.load(ModelId(1), 0),
            "pd_router.00ff00ff00ff00ff.load.0000000000000001.0"
        );
        for slot in [0u32, 7, 10, 468, 13370, u32::MAX] {
            assert_eq!(
                &*k.prefix_slot(slot),
                format!("pd_router.00ff00ff00ff00ff.pfx.{slot}")
            );
        }
    }

    #[test]
    fn a_long_prefix_goes_to_the_heap_intact() {
        let fp = "f".repeat(80);
        let k = SharedKeys::new(&fp);
        assert_eq!(&*k.prefix_slot(42), format!("pd_router.{fp}.pfx.42"));
        assert_eq!(
            &*k.load(ModelId(u64::MAX), 3),
            format!("pd_router.{fp}.load.ffffffffffffffff.3")
        );
    }
}

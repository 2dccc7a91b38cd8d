//! Names of the shared-data keys. Every key carries the configuration's
//! fingerprint, so a reloaded configuration never reads another one's state.

use crate::fleet::ModelId;

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

    /// One model's pod load and health.
    pub fn load(&self, model: ModelId) -> String {
        format!("{}.load.{model}", self.prefix)
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

    /// vLLM Mooncake prefill pods' engine ids, learned from their
    /// bootstrap servers by the scrape lease holder.
    pub fn mooncake_engines(&self) -> String {
        format!("{}.mooncake_engines", self.prefix)
    }

    /// Which VM asks Mooncake bootstrap servers.
    pub fn bootstrap_lease(&self) -> String {
        format!("{}.bootstrap_lease", self.prefix)
    }

    /// One slot of the prefix table.
    pub fn prefix_slot(&self, slot: u32) -> String {
        format!("{}.pfx.{slot}", self.prefix)
    }
}

/// The counter that hands each worker VM its TensorRT-LLM id slot. Not per
/// configuration: a reload must not hand a new VM the slot of one still
/// running.
pub const WORKER_SLOTS_KEY: &str = "pd_router.worker_slots";

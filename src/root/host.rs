//! What the root side needs from Envoy besides logs, stats and shared data.

use crate::error::HostError;
use crate::fleet::Fleet;
use crate::host::Telemetry;
use crate::pods::SharedStore;
use std::collections::HashSet;

/// What the root side needs from Envoy besides logs, stats and shared data.
pub trait RootHost: SharedStore + Telemetry {
    /// Starts an HTTP call; its answer comes back through
    /// [`super::Root::on_call_answer`] with the returned token.
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, HostError>;
    /// Starts an HTTP call with a body (`headers` name its method); its
    /// answer comes back as [`RootHost::dispatch`]'s does.
    fn post(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError>;
    /// Up to `max` bytes of the call answer being delivered (empty when the
    /// host has none).
    fn call_answer_body(&self, len: usize, max: usize) -> Vec<u8>;
    /// Publishes the size of the discovered pod set and the generation of
    /// it this VM now routes by.
    fn record_discovered(&self, pods: u64, generation: u64);
    /// Publishes the generation of the pod set this VM (the lister) just
    /// published for all.
    fn record_published(&self, generation: u64);
    /// Publishes the discovered pod set's age: milliseconds since the API
    /// server last confirmed it.
    fn record_discovery_age(&self, age_ms: u64);
    /// Learns the pods' labels (their stats are named by them).
    fn know_fleet(&self, fleet: &Fleet);
    /// Publishes a pod's shared counters as gauges.
    fn record_pod(&self, pod: &str, outstanding: u32, pending: u32, healthy: bool);
    /// Zeroes the gauges of pods that left the fleet.
    fn zero_departed(&self, live: &HashSet<&str>);
}

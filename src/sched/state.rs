//! What the scheduler knows about each pod, as the router hands it in.

use crate::fleet::Endpoint;
use crate::pods::PodMetrics;

/// What the scheduler knows about one pod of the model (indexed by the
/// endpoints' `slot`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodState {
    /// Prefills in flight from every worker of this Envoy.
    pub outstanding_prefills: u32,
    /// The prompt tokens they compute, as estimated when they were placed.
    pub outstanding_prefill_tokens: u64,
    /// Decodes sent by this Envoy and not finished.
    pub pending_decodes: u32,
    /// Answers still streaming whose prefill this pod ran (this Envoy's):
    /// conversations whose next turn will find their history here.
    pub live_streams: u32,
    pub unhealthy: bool,
    /// Healthy, but its hand-off cannot run yet (a Mooncake prefill whose
    /// engine id is not known): no prefill goes to it.
    pub not_ready_for_prefill: bool,
    pub metrics: Option<PodMetrics>,
}

impl PodState {
    /// Running plus pending decodes, AIBrix's `run`: what the engine ran
    /// for others at the last scrape, plus this Envoy's own decodes now
    /// (its own, counted exactly, are not counted twice).
    pub fn decode_load(&self) -> f64 {
        let others = self
            .metrics
            .map(|m| (m.running - m.own_running).max(0.0))
            .unwrap_or(0.0);
        others + self.pending_decodes as f64
    }

    /// Queue per drained request per second (AIBrix's overload ratio), when
    /// the pod reports both.
    pub(crate) fn queue_ratio(&self) -> Option<f64> {
        let m = self.metrics?;
        let drain = m.drain_rate?;
        Some(m.waiting / drain.max(0.01))
    }
}

/// The state of `ep` in `pods`; a pod the caller knows nothing about reads as
/// idle and healthy.
pub(crate) fn state(pods: &[PodState], ep: &Endpoint) -> PodState {
    pods.get(ep.slot).copied().unwrap_or_default()
}

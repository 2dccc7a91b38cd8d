//! Envoy stats (`wasmcustom.pd_router.*`), defined once per VM.

use crate::config::Config;
use crate::host::{stat_segment, Counter, PodEvent};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{LogLevel, MetricType};
use std::cell::Cell;

#[derive(Default)]
pub(super) struct Stats {
    counters: Vec<(Counter, u32)>,
    /// Per pod, in [`PodEvent::ALL`] order.
    pod_events: Vec<Vec<Option<u32>>>,
    /// Per pod: outstanding prefills, pending decodes, healthy (0/1).
    pod_gauges: Vec<[Option<u32>; 3]>,
    /// This VM's linear memory, to see leaks under load; defined at the
    /// first tick, so a VM that never ticks (Envoy's base VM) shows none.
    vm_memory: Cell<Option<u32>>,
    worker_slot: u8,
    /// Envoy's log level for this plugin, read at start and on each tick.
    log_level: Cell<Option<LogLevel>>,
}

fn define(kind: MetricType, name: &str) -> Option<u32> {
    hostcalls::define_metric(kind, name).ok()
}

impl Stats {
    pub(super) fn define(config: &Config, worker_slot: u8) -> Stats {
        let counters = Counter::ALL
            .iter()
            .filter_map(|c| define(MetricType::Counter, c.name()).map(|id| (*c, id)))
            .collect();
        let mut pod_events = Vec::with_capacity(config.pods.len());
        let mut pod_gauges = Vec::with_capacity(config.pods.len());
        for pod in &config.pods {
            let base = format!("pd_router.pod.{}", stat_segment(&pod.name));
            pod_events.push(
                PodEvent::ALL
                    .iter()
                    .map(|e| define(MetricType::Counter, &format!("{base}.{}", e.suffix())))
                    .collect(),
            );
            pod_gauges.push([
                define(MetricType::Gauge, &format!("{base}.outstanding_prefills")),
                define(MetricType::Gauge, &format!("{base}.pending_decodes")),
                define(MetricType::Gauge, &format!("{base}.healthy")),
            ]);
        }
        Stats {
            counters,
            pod_events,
            pod_gauges,
            vm_memory: Cell::new(None),
            worker_slot,
            log_level: Cell::new(hostcalls::get_log_level().ok()),
        }
    }

    pub(super) fn log_level(&self) -> LogLevel {
        self.log_level.get().unwrap_or(LogLevel::Info)
    }

    pub(super) fn refresh_log_level(&self) {
        self.log_level.set(hostcalls::get_log_level().ok());
    }

    /// Publishes the size of this VM's linear memory.
    pub(super) fn record_vm_memory(&self) {
        if self.vm_memory.get().is_none() {
            let name = format!("pd_router.vm.{}.memory_bytes", self.worker_slot);
            self.vm_memory.set(define(MetricType::Gauge, &name));
        }
        if let Some(id) = self.vm_memory.get() {
            let bytes = core::arch::wasm32::memory_size(0) as u64 * 65_536;
            let _ = hostcalls::record_metric(id, bytes);
        }
    }

    pub(super) fn increment(&self, counter: Counter) {
        if let Some((_, id)) = self.counters.iter().find(|(c, _)| *c == counter) {
            let _ = hostcalls::increment_metric(*id, 1);
        }
    }

    pub(super) fn count_pod(&self, pod: usize, event: PodEvent) {
        let idx = PodEvent::ALL.iter().position(|e| *e == event);
        if let Some(Some(id)) = idx.and_then(|i| self.pod_events.get(pod)?.get(i).copied()) {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    /// Publishes a pod's shared counters as gauges.
    pub(super) fn record_pod(&self, pod: usize, outstanding: u32, pending: u32, healthy: bool) {
        if let Some(ids) = self.pod_gauges.get(pod) {
            for (id, v) in ids
                .iter()
                .zip([outstanding as u64, pending as u64, healthy as u64])
            {
                if let Some(id) = id {
                    let _ = hostcalls::record_metric(*id, v);
                }
            }
        }
    }
}

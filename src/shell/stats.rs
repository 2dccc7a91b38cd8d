//! Envoy stats (`wasmcustom.pd_router.*`), defined once per VM; per-pod
//! stats are defined the first time a pod is seen, so discovered pods get
//! theirs too.

use crate::host::{stat_segment, Counter, PodEvent};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{LogLevel, MetricType};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// One pod's stat ids.
struct PodStats {
    /// In [`PodEvent::ALL`] order.
    events: Vec<Option<u32>>,
    /// Outstanding prefills, pending decodes, healthy (0/1).
    gauges: [Option<u32>; 3],
}

#[derive(Default)]
pub(super) struct Stats {
    counters: Vec<(Counter, u32)>,
    pods: RefCell<HashMap<String, PodStats>>,
    /// This VM's linear memory, to see leaks under load; defined at the
    /// first tick, so a VM that never ticks (Envoy's base VM) shows none.
    vm_memory: Cell<Option<u32>>,
    worker_slot: u8,
    /// Envoy's log level for this plugin, read at start and on each tick.
    log_level: Cell<Option<LogLevel>>,
    /// Pods in the discovered set (defined when discovery is on).
    discovered: Cell<Option<u32>>,
}

fn define(kind: MetricType, name: &str) -> Option<u32> {
    hostcalls::define_metric(kind, name).ok()
}

impl Stats {
    pub(super) fn define(worker_slot: u8) -> Stats {
        let counters = Counter::ALL
            .iter()
            .filter_map(|c| define(MetricType::Counter, c.name()).map(|id| (*c, id)))
            .collect();
        Stats {
            counters,
            pods: RefCell::new(HashMap::new()),
            vm_memory: Cell::new(None),
            worker_slot,
            log_level: Cell::new(hostcalls::get_log_level().ok()),
            discovered: Cell::new(None),
        }
    }

    /// Publishes the size of the discovered pod set.
    pub(super) fn record_discovered(&self, pods: u64) {
        if self.discovered.get().is_none() {
            self.discovered
                .set(define(MetricType::Gauge, "pd_router.discovery.pods"));
        }
        if let Some(id) = self.discovered.get() {
            let _ = hostcalls::record_metric(id, pods);
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

    fn with_pod<T>(&self, pod: &str, f: impl FnOnce(&PodStats) -> T) -> T {
        let mut pods = self.pods.borrow_mut();
        if let Some(stats) = pods.get(pod) {
            return f(stats);
        }
        let stats = pods.entry(pod.to_owned()).or_insert_with(|| {
            let base = format!("pd_router.pod.{}", stat_segment(pod));
            PodStats {
                events: PodEvent::ALL
                    .iter()
                    .map(|e| define(MetricType::Counter, &format!("{base}.{}", e.suffix())))
                    .collect(),
                gauges: [
                    define(MetricType::Gauge, &format!("{base}.outstanding_prefills")),
                    define(MetricType::Gauge, &format!("{base}.pending_decodes")),
                    define(MetricType::Gauge, &format!("{base}.healthy")),
                ],
            }
        });
        f(stats)
    }

    /// Defines the stats of pods known now (the rest are defined when seen).
    pub(super) fn know_pods<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            self.with_pod(name, |_| ());
        }
    }

    pub(super) fn count_pod(&self, pod: &str, event: PodEvent) {
        let idx = PodEvent::ALL.iter().position(|e| *e == event);
        let id = self.with_pod(pod, |s| {
            idx.and_then(|i| s.events.get(i).copied().flatten())
        });
        if let Some(id) = id {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    /// Zeroes the gauges of pods that left the fleet: nothing is routed to
    /// them any more (requests still in flight on one drain unseen).
    pub(super) fn zero_departed(&self, live: &std::collections::HashSet<&str>) {
        for (name, stats) in self.pods.borrow().iter() {
            if !live.contains(name.as_str()) {
                for id in stats.gauges.iter().flatten() {
                    let _ = hostcalls::record_metric(*id, 0);
                }
            }
        }
    }

    /// Publishes a pod's shared counters as gauges.
    pub(super) fn record_pod(&self, pod: &str, outstanding: u32, pending: u32, healthy: bool) {
        let ids = self.with_pod(pod, |s| s.gauges);
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

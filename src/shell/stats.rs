//! Envoy stats (`wasmcustom.pd_router.*`), defined once per VM; per-pod and
//! per-model stats are defined the first time their pod or model is seen,
//! with their labels encoded in the name (see [`crate::stat_names`]).
//!
//! Envoy frees no wasm stat while it runs, so the per-pod ones are bounded:
//! at most `max_pod_stats` pods get their own series per VM (Envoy shares a
//! name between VMs, and all VMs see the same pods); later ones count under
//! `pd_pod="other"`, without gauges.

use super::abi::{self, LogLevel, MetricKind as MetricType};
use crate::fleet::Fleet;
use crate::host::{Counter, Histogram, PodEvent};
use crate::stat_names::{pod_labels, tagged, PodLabels};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

/// One pod's stat ids.
struct PodStats {
    selected: Option<u32>,
    ejected: Option<u32>,
    decode_failed: Option<u32>,
    /// Outstanding prefills, pending decodes, healthy (0/1).
    gauges: [Option<u32>; 3],
}

/// Models with their own histograms, at most (a model is a configured or
/// discovered name; more than this means labels are not model names).
const MAX_MODEL_STATS: usize = 256;

#[derive(Default)]
pub(super) struct Stats {
    counters: Vec<(Counter, u32)>,
    pods: RefCell<HashMap<String, PodStats>>,
    labels: RefCell<HashMap<String, PodLabels>>,
    max_pod_stats: usize,
    /// Per model, its histograms in [`Histogram::ALL`] order.
    histograms: RefCell<HashMap<String, [Option<u32>; Histogram::ALL.len()]>>,
    /// Decider decisions, by model and reason (bounded like the histograms).
    decisions: RefCell<HashMap<(String, &'static str), Option<u32>>>,
    /// Requests waiting for admission, by model and priority (bounded like
    /// the histograms).
    waiting: RefCell<HashMap<(String, i32), Option<u32>>>,
    replies: RefCell<HashMap<u16, Option<u32>>>,
    /// This VM's linear memory, to see leaks under load; defined at the
    /// first tick, so a VM that never ticks (Envoy's base VM) shows none.
    vm_memory: Cell<Option<u32>>,
    worker_slot: u8,
    /// Envoy's log level for this plugin, read at start and on each tick.
    log_level: Cell<Option<LogLevel>>,
    /// Pods in the discovered set (defined when discovery is on).
    discovered: Cell<Option<u32>>,
    /// The generation of the set this VM routes by, one gauge per VM: a
    /// worker that lags behind the others shows here.
    applied_generation: Cell<Option<u32>>,
    /// The generation the lister published last.
    published_generation: Cell<Option<u32>>,
    /// The discovered set's age in ms (defined when discovery is on).
    discovery_age: Cell<Option<u32>>,
}

fn define(kind: MetricType, name: &str) -> Option<u32> {
    abi::define_metric(kind, name).ok()
}

impl Stats {
    pub(super) fn define(worker_slot: u8, max_pod_stats: usize) -> Stats {
        let counters = Counter::ALL
            .iter()
            .filter_map(|c| define(MetricType::Counter, c.name()).map(|id| (*c, id)))
            .collect();
        Stats {
            counters,
            max_pod_stats,
            worker_slot,
            log_level: Cell::new(abi::log_level().ok()),
            ..Stats::default()
        }
    }

    /// Publishes the size of the discovered pod set and the generation of
    /// it this VM applied.
    pub(super) fn record_discovered(&self, pods: u64, generation: u64) {
        if self.discovered.get().is_none() {
            self.discovered
                .set(define(MetricType::Gauge, "pd_router.discovery.pods"));
            let slot = self.worker_slot.to_string();
            let name = tagged("pd_router.discovery.generation", &[("pd_vm", &slot)]);
            self.applied_generation
                .set(define(MetricType::Gauge, &name));
        }
        if let Some(id) = self.discovered.get() {
            let _ = abi::record_metric(id, pods);
        }
        if let Some(id) = self.applied_generation.get() {
            let _ = abi::record_metric(id, generation);
        }
    }

    /// Publishes the generation of the set this VM published for all.
    pub(super) fn record_published(&self, generation: u64) {
        if self.published_generation.get().is_none() {
            self.published_generation.set(define(
                MetricType::Gauge,
                "pd_router.discovery.published_generation",
            ));
        }
        if let Some(id) = self.published_generation.get() {
            let _ = abi::record_metric(id, generation);
        }
    }

    /// Publishes the discovered pod set's age.
    pub(super) fn record_discovery_age(&self, age_ms: u64) {
        if self.discovery_age.get().is_none() {
            self.discovery_age
                .set(define(MetricType::Gauge, "pd_router.discovery.age_ms"));
        }
        if let Some(id) = self.discovery_age.get() {
            let _ = abi::record_metric(id, age_ms);
        }
    }

    pub(super) fn log_level(&self) -> LogLevel {
        self.log_level.get().unwrap_or(LogLevel::Info)
    }

    pub(super) fn refresh_log_level(&self) {
        self.log_level.set(abi::log_level().ok());
    }

    /// Publishes the size of this VM's linear memory.
    pub(super) fn record_vm_memory(&self) {
        if self.vm_memory.get().is_none() {
            let slot = self.worker_slot.to_string();
            let name = tagged("pd_router.vm_memory_bytes", &[("pd_vm", &slot)]);
            self.vm_memory.set(define(MetricType::Gauge, &name));
        }
        if let Some(id) = self.vm_memory.get() {
            let bytes = core::arch::wasm32::memory_size(0) as u64 * 65_536;
            let _ = abi::record_metric(id, bytes);
        }
    }

    pub(super) fn increment(&self, counter: Counter) {
        self.add(counter, 1);
    }

    pub(super) fn add(&self, counter: Counter, n: u64) {
        if let Some((_, id)) = self.counters.iter().find(|(c, _)| *c == counter) {
            let _ = abi::increment_metric(*id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Counts a local reply by its status.
    pub(super) fn count_reply(&self, status: u16) {
        let id = *self.replies.borrow_mut().entry(status).or_insert_with(|| {
            let s = status.to_string();
            define(
                MetricType::Counter,
                &tagged("pd_router.replies", &[("pd_status", &s)]),
            )
        });
        if let Some(id) = id {
            let _ = abi::increment_metric(id, 1);
        }
    }

    /// Counts a decider's decision.
    pub(super) fn count_decision(&self, model: &str, reason: &'static str) {
        let mut ds = self.decisions.borrow_mut();
        let known = ds.len() < MAX_MODEL_STATS * 4;
        let label = if known { model } else { "other" };
        let id = *ds.entry((label.to_owned(), reason)).or_insert_with(|| {
            define(
                MetricType::Counter,
                &tagged(
                    "pd_router.decisions",
                    &[("pd_model", label), ("pd_reason", reason)],
                ),
            )
        });
        if let Some(id) = id {
            let _ = abi::increment_metric(id, 1);
        }
    }

    /// Publishes the waiting counts of the whole process: every series
    /// seen so far, 0 where nothing waits now.
    pub(super) fn record_waiting(&self, counts: &[(String, i32, u64)]) {
        let mut ws = self.waiting.borrow_mut();
        for (model, priority, _) in counts {
            let key = (model.clone(), *priority);
            if !ws.contains_key(&key) && ws.len() < MAX_MODEL_STATS * 4 {
                let p = priority.to_string();
                let name = tagged(
                    "pd_router.admission.waiting",
                    &[("pd_model", model), ("pd_priority", &p)],
                );
                ws.insert(key, define(MetricType::Gauge, &name));
            }
        }
        for ((model, priority), id) in ws.iter() {
            let n = counts
                .iter()
                .find(|(m, p, _)| m == model && p == priority)
                .map_or(0, |c| c.2);
            if let Some(id) = id {
                let _ = abi::record_metric(*id, n);
            }
        }
    }

    pub(super) fn record(&self, h: Histogram, model: &str, value: u64) {
        let slot = Histogram::ALL.iter().position(|x| *x == h).unwrap_or(0);
        let mut hs = self.histograms.borrow_mut();
        // Looked up by the borrowed name: no allocation once a model is known.
        if !hs.contains_key(model) {
            let label = if hs.len() < MAX_MODEL_STATS {
                model
            } else {
                "other"
            };
            let ids = Histogram::ALL.map(|h| {
                define(
                    MetricType::Histogram,
                    &tagged(h.name(), &[("pd_model", label)]),
                )
            });
            hs.insert(model.to_owned(), ids);
        }
        if let Some(id) = hs
            .get(model)
            .and_then(|ids| ids.get(slot).copied().flatten())
        {
            let _ = abi::record_metric(id, value);
        }
    }

    /// Learns the pods' labels from the fleet and defines their stats.
    pub(super) fn know_fleet(&self, fleet: &Fleet) {
        *self.labels.borrow_mut() = pod_labels(fleet);
        for p in fleet.pods() {
            self.with_pod(&p.name, |_| ());
        }
    }

    fn with_pod<T>(&self, pod: &str, f: impl FnOnce(&PodStats) -> T) -> T {
        let mut pods = self.pods.borrow_mut();
        if let Some(stats) = pods.get(pod) {
            return f(stats);
        }
        let labels = self.labels.borrow().get(pod).cloned().unwrap_or(PodLabels {
            model: String::new(),
            roleset: String::new(),
            role: "unknown",
        });
        let own = pods.len() < self.max_pod_stats;
        let name = if own { pod } else { "other" };
        let tags = [
            ("pd_model", labels.model.as_str()),
            ("pd_roleset", labels.roleset.as_str()),
            ("pd_role", labels.role),
            ("pd_pod", name),
        ];
        let series = |kind, n: &str| define(kind, &tagged(n, &tags));
        let stats = PodStats {
            selected: series(MetricType::Counter, "pd_router.pod.selected"),
            ejected: series(MetricType::Counter, "pd_router.pod.ejected"),
            decode_failed: series(MetricType::Counter, "pd_router.pod.decode_failed"),
            gauges: if own {
                [
                    series(MetricType::Gauge, "pd_router.pod.outstanding_prefills"),
                    series(MetricType::Gauge, "pd_router.pod.pending_decodes"),
                    series(MetricType::Gauge, "pd_router.pod.healthy"),
                ]
            } else {
                [None; 3]
            },
        };
        f(pods.entry(pod.to_owned()).or_insert(stats))
    }

    pub(super) fn count_pod(&self, pod: &str, event: PodEvent) {
        let id = self.with_pod(pod, |s| match event {
            PodEvent::PrefillSelected | PodEvent::DecodeSelected => s.selected,
            PodEvent::Ejected => s.ejected,
            PodEvent::DecodeFailed => s.decode_failed,
        });
        if let Some(id) = id {
            let _ = abi::increment_metric(id, 1);
        }
    }

    /// Zeroes the gauges of pods that left the fleet: nothing is routed to
    /// them any more (requests still in flight on one drain unseen).
    pub(super) fn zero_departed(&self, live: &HashSet<&str>) {
        for (name, stats) in self.pods.borrow().iter() {
            if !live.contains(name.as_str()) {
                for id in stats.gauges.iter().flatten() {
                    let _ = abi::record_metric(*id, 0);
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
                let _ = abi::record_metric(*id, v);
            }
        }
    }
}

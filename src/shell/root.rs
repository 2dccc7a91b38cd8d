use super::shared::Shared;
use super::stats::Stats;
use super::stream::Stream;
use crate::config::Config;
use crate::engine::set_connector_type;
use crate::flow::Router;
use crate::host::{Counter, PodEvent};
use crate::metrics::parse_engine_metrics;
use crate::sched::state::{self, StoredMetrics};
use crate::scrape::{self, Previous};
use crate::trt_id::WORKER_SLOTS;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

/// The largest `/metrics` answer read; a pod's metrics are a few KiB.
const MAX_METRICS_BYTES: usize = 1 << 20;

#[derive(Default)]
pub(super) struct Root {
    router: Option<Rc<Router>>,
    stats: Rc<Stats>,
    /// Identifies this VM in the scrape lease.
    vm_id: u64,
    last_scrape_ms: u64,
    /// Scrapes in flight: call token → pod index.
    scrapes: HashMap<u32, usize>,
    previous: Vec<Previous>,
}

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Hands this VM a distinct slot (mod [`WORKER_SLOTS`]) through shared data,
/// so TensorRT-LLM ids of different worker threads never collide. Shared data
/// is per `vm_id` and CAS-guarded; a lost race retries.
fn claim_worker_slot() -> u8 {
    const KEY: &str = "pd_router.worker_slots";
    for _ in 0..64 {
        let (value, cas) = super::shared::get(KEY);
        let current = value
            .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
            .map(u32::from_le_bytes)
            .unwrap_or(0);
        let next = current.wrapping_add(1);
        if super::shared::set(KEY, &next.to_le_bytes(), cas).is_ok() {
            return (current % WORKER_SLOTS as u32) as u8;
        }
    }
    log(
        LogLevel::Warn,
        "pd-router: could not claim a worker slot; using 0",
    );
    0
}

impl Root {
    /// Takes or renews the scrape lease; only its holder scrapes.
    fn hold_lease(&self, router: &Router, now: u64) -> bool {
        let key = state::lease_key(&router.config.fingerprint);
        let ttl = router.config.scrape_interval_ms.saturating_mul(3).max(1000);
        let (current, cas) = super::shared::get(&key);
        if !scrape::may_hold(current.as_deref(), self.vm_id, now) {
            return false;
        }
        super::shared::set(&key, &scrape::encode_lease(self.vm_id, now + ttl), cas).is_ok()
    }

    fn scrape(&mut self, router: &Router, now: u64) {
        let config = &router.config;
        self.last_scrape_ms = now;
        for (i, pod) in config.pods.iter().enumerate() {
            let headers = vec![
                (":method", "GET"),
                (":path", config.metrics_path.as_str()),
                (":authority", pod.address.as_str()),
                (config.routing_header.as_str(), pod.address.as_str()),
            ];
            match hostcalls::dispatch_http_call(
                &config.metrics_cluster,
                headers,
                None,
                Vec::new(),
                Duration::from_millis(config.scrape_timeout_ms),
            ) {
                Ok(token) => {
                    self.scrapes.insert(token, i);
                }
                Err(e) => log(
                    LogLevel::Warn,
                    &format!(
                        "pd-router: could not scrape {} through cluster {:?}: {e:?}",
                        pod.address, config.metrics_cluster
                    ),
                ),
            }
        }
    }

    /// Marks a pod unhealthy after a failed scrape; counts an ejection only
    /// when it was healthy.
    fn scrape_failed(&self, router: &Router, pod: usize, now: u64, why: &str) {
        let until = now.saturating_add(router.config.unhealthy_cooldown_ms);
        let mut was_healthy = false;
        let n = router.config.pods.len();
        let _ = state::update_load(&mut Shared, &router.load_key, n, |pods| {
            if let Some(c) = pods.get_mut(pod) {
                was_healthy = c.unhealthy_until_ms <= now;
                c.unhealthy_until_ms = c.unhealthy_until_ms.max(until);
                c.failures = 0;
            }
        });
        let _ = state::update_metrics(&mut Shared, &router.metrics_key, n, |m| {
            if let Some(m) = m.get_mut(pod) {
                *m = StoredMetrics::default();
            }
        });
        if was_healthy {
            self.stats.increment(Counter::Ejection);
            self.stats.count_pod(pod, PodEvent::Ejected);
            let name = router
                .config
                .pods
                .get(pod)
                .map(|p| p.name.as_str())
                .unwrap_or("?");
            log(
                LogLevel::Warn,
                &format!("pd-router: pod {name} marked unhealthy: scrape failed ({why})"),
            );
        }
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(pod) = self.scrapes.remove(&token) else {
            return;
        };
        let Some(router) = self.router.clone() else {
            return;
        };
        let now = now_ms();
        let status = super::shared::call_status(num_headers);
        if status != Some(200) {
            let why = status.map_or("no answer".to_owned(), |s| format!("status {s}"));
            self.scrape_failed(&router, pod, now, &why);
            return;
        }
        let body = hostcalls::get_buffer(
            BufferType::HttpCallResponseBody,
            0,
            body_size.min(MAX_METRICS_BYTES),
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        let parsed = parse_engine_metrics(&String::from_utf8_lossy(&body), None);
        let prev = self.previous.get(pod).copied().unwrap_or_default();
        let (metrics, next) = scrape::observe(&prev, now, &parsed);
        if let Some(p) = self.previous.get_mut(pod) {
            *p = next;
        }
        let n = router.config.pods.len();
        let _ = state::update_metrics(&mut Shared, &router.metrics_key, n, |m| {
            if let Some(m) = m.get_mut(pod) {
                *m = StoredMetrics {
                    at_ms: now,
                    metrics,
                };
            }
        });
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _size: usize) -> bool {
        log(
            LogLevel::Info,
            concat!("pd-router ", env!("CARGO_PKG_VERSION"), " starting"),
        );
        true
    }

    fn on_configure(&mut self, size: usize) -> bool {
        let raw = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size) {
            Ok(Some(raw)) => raw,
            _ => {
                log(
                    LogLevel::Critical,
                    "pd-router configuration: missing; the filter needs a JSON configuration with at least \"models\"",
                );
                return false;
            }
        };
        let config = match Config::parse(&raw) {
            Ok(c) => c,
            Err(e) => {
                // Envoy refuses the config when this returns false; this line is
                // what the operator sees.
                log(LogLevel::Critical, &e.to_string());
                return false;
            }
        };
        set_connector_type(config.kv_connector);
        let slot = claim_worker_slot();
        let router = match Router::new(config, slot) {
            Ok(r) => r,
            Err(e) => {
                log(
                    LogLevel::Critical,
                    &format!("pd-router configuration: trt_machine_id: {e}"),
                );
                return false;
            }
        };
        for m in &router.config.models {
            if !router.registry.is_known(&m.engine) {
                log(
                    LogLevel::Warn,
                    &format!(
                        "pd-router: model {:?} uses engine {:?}, which has no handler; it gets the default handler (known: {})",
                        m.name,
                        m.engine,
                        router.registry.valid_engine_names().join(", ")
                    ),
                );
            }
        }
        self.vm_id = getrandom::u64().unwrap_or_else(|_| now_ms());
        self.stats = Rc::new(Stats::define(&router.config, slot));
        self.previous = vec![Previous::default(); router.config.pods.len()];
        let tick = match router.config.scrape_interval_ms {
            0 => 1000,
            i => i.min(1000),
        };
        if let Err(e) = hostcalls::set_tick_period(Duration::from_millis(tick)) {
            log(
                LogLevel::Warn,
                &format!("pd-router: no tick ({e:?}): metrics and gauges will not refresh"),
            );
        }
        self.router = Some(Rc::new(router));
        true
    }

    fn on_tick(&mut self) {
        let Some(router) = self.router.clone() else {
            return;
        };
        let now = now_ms();
        router.refresh_metrics(&Shared);
        self.stats.record_vm_memory();
        self.stats.refresh_log_level();
        for (i, c) in router.counters(&Shared).iter().enumerate() {
            self.stats.record_pod(
                i,
                c.outstanding_prefills,
                c.pending_decodes,
                c.unhealthy_until_ms <= now,
            );
        }
        let interval = router.config.scrape_interval_ms;
        // A scrape still in flight is bounded by its timeout; wait for it.
        if interval > 0
            && self.scrapes.is_empty()
            && now.saturating_sub(self.last_scrape_ms) >= interval
            && self.hold_lease(&router, now)
        {
            self.scrape(&router, now);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let router = self.router.as_ref()?;
        Some(Box::new(Stream::new(
            Rc::clone(router),
            Rc::clone(&self.stats),
        )))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

use super::bootstrap::Bootstrap;
use super::discover::Discoverer;
use super::shared::{self, now_ms, Shared};
use super::stats::Stats;
use super::stream::Stream;
use crate::codec::{RecordReader, RecordWriter};
use crate::config::Config;
use crate::fleet::{Endpoint, PodId};
use crate::host::{Counter, PodEvent};
use crate::metrics::parse_engine_metrics;
use crate::pods::{lease, update_scraped, StoredMetrics, Verdict, WORKER_SLOTS_KEY};
use crate::router::{Ejection, Router};
use crate::scrape::{self, Previous};
use crate::trt_id::WORKER_SLOTS;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// The largest `/metrics` answer read; a pod's metrics are a few KiB.
const MAX_METRICS_BYTES: usize = 1 << 20;

/// The build, as logged at VM start.
const VERSION: &str = concat!(
    "pd-router ",
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PD_ROUTER_GIT_COMMIT"),
    ")"
);

#[derive(Default)]
pub(super) struct Root {
    router: Option<Rc<Router>>,
    stats: Rc<Stats>,
    /// Identifies this VM in the scrape lease.
    vm_id: u64,
    last_scrape_ms: u64,
    /// Scrapes in flight: call token → pod, and this Envoy's decodes on it
    /// when the scrape left.
    scrapes: HashMap<u32, (Rc<Endpoint>, u32)>,
    previous: HashMap<PodId, Previous>,
    discovery: Option<Discoverer>,
    bootstrap: Bootstrap,
}

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// Hands this VM a distinct slot (mod [`WORKER_SLOTS`]) through shared data,
/// so TensorRT-LLM ids of different worker threads never collide. Shared data
/// is per `vm_id` and CAS-guarded; a lost race retries.
fn claim_worker_slot() -> u8 {
    let decode = |b: Option<&[u8]>| b.and_then(|b| RecordReader::new(b).u32()).unwrap_or(0);
    let encode = |v: &u32| {
        let mut w = RecordWriter::with_capacity(4);
        w.u32(*v);
        w.finish()
    };
    let mut claimed = 0;
    let taken = crate::pods::cas_update(&mut Shared, WORKER_SLOTS_KEY, decode, encode, |v| {
        claimed = *v;
        *v = v.wrapping_add(1);
    });
    if taken.is_err() {
        log(
            LogLevel::Warn,
            "pd-router: could not claim a worker slot; using 0",
        );
        return 0;
    }
    (claimed % WORKER_SLOTS as u32) as u8
}

/// This replica's TensorRT-LLM machine id from the VM environment, if the
/// variable is set.
fn replica_machine_id(var: &str) -> Result<Option<u16>, String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => crate::trt_id::machine_id_from(&v)
            .map(Some)
            .map_err(|e| format!("${var}: {e}")),
        _ => Ok(None),
    }
}

impl Root {
    /// Takes or renews the scrape lease; only its holder scrapes.
    fn hold_lease(&self, router: &Router, now: u64) -> bool {
        let key = router.keys().scrape_lease();
        let ttl = router.config.scrape.interval_ms.saturating_mul(3).max(1000);
        lease::try_hold(&mut Shared, &key, self.vm_id, now, ttl)
    }

    fn scrape(&mut self, router: &Router, now: u64) {
        let config = &router.config;
        self.last_scrape_ms = now;
        for pod in router.fleet().pods() {
            let headers = vec![
                (":method", "GET"),
                (":path", config.scrape.path.as_str()),
                (":authority", pod.address.as_str()),
                (config.routing.header.as_str(), pod.address.as_str()),
            ];
            match hostcalls::dispatch_http_call(
                &config.scrape.cluster,
                headers,
                None,
                Vec::new(),
                Duration::from_millis(config.scrape.timeout_ms),
            ) {
                Ok(token) => {
                    let own = router.own_decodes(&Shared, &pod);
                    self.scrapes.insert(token, (pod, own));
                }
                Err(e) => log(
                    LogLevel::Warn,
                    &format!(
                        "pd-router: could not scrape {} through cluster {:?}: {e:?}",
                        pod.address, config.scrape.cluster
                    ),
                ),
            }
        }
    }

    fn report(&self, ejection: Option<Ejection>) {
        if let Some(e) = ejection {
            self.stats.increment(Counter::Ejection);
            self.stats.count_pod(&e.pod, PodEvent::Ejected);
            log(LogLevel::Warn, &format!("pd-router: {}", e.message));
        }
    }

    /// A failed scrape says the pod is down: eject it and forget its metrics.
    fn scrape_failed(&self, router: &Router, pod: &Endpoint, now: u64, why: &str) {
        let cause = format!("scrape failed ({why})");
        match router.judge_everywhere(&mut Shared, pod, Verdict::Down, &cause, now) {
            Ok(ejection) => self.report(ejection),
            Err(e) => log(
                LogLevel::Error,
                &format!("pd-router: could not update pod load: {e}"),
            ),
        }
        let _ = update_scraped(&mut Shared, &router.keys().scraped(), |t| {
            t.remove(&pod.id);
        });
    }

    /// `own_at_send`: this Envoy's decodes on the pod when the scrape left.
    fn scraped(
        &mut self,
        router: &Router,
        pod: &Endpoint,
        own_at_send: u32,
        now: u64,
        body_size: usize,
    ) {
        let body = hostcalls::get_buffer(
            BufferType::HttpCallResponseBody,
            0,
            body_size.min(MAX_METRICS_BYTES),
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        let parsed = parse_engine_metrics(&String::from_utf8_lossy(&body), None);
        let prev = self.previous.get(&pod.id).copied().unwrap_or_default();
        let (mut metrics, next) = scrape::observe(&prev, now, &parsed);
        self.previous.insert(pod.id, next);
        // The engine counted its running requests somewhere between the
        // scrape leaving and its answer: ours then were at most the larger.
        metrics.own_running = router.own_decodes(&Shared, pod).max(own_at_send) as f64;
        let fleet = router.fleet();
        let _ = update_scraped(&mut Shared, &router.keys().scraped(), |t| {
            t.insert(
                pod.id,
                StoredMetrics {
                    at_ms: now,
                    metrics,
                },
            );
            // Pods that left the fleet are scraped no more.
            let live: Vec<PodId> = fleet.pods().iter().map(|p| p.id).collect();
            t.retain(|id, _| live.contains(id));
        });
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
        let Some(router) = self.router.clone() else {
            return;
        };
        if self.bootstrap.owns(token) {
            let status = shared::call_status(num_headers);
            self.bootstrap.on_answer(&router, token, status, body_size);
            return;
        }
        if let Some(d) = self.discovery.as_mut().filter(|d| d.owns(token)) {
            let status = shared::call_status(num_headers);
            d.on_answer(&router, &self.stats, status, body_size);
            return;
        }
        let Some((pod, own_at_send)) = self.scrapes.remove(&token) else {
            return;
        };
        let now = now_ms();
        match shared::call_status(num_headers) {
            Some(200) => self.scraped(&router, &pod, own_at_send, now, body_size),
            status => {
                let why = status.map_or("no answer".to_owned(), |s| format!("status {s}"));
                self.scrape_failed(&router, &pod, now, &why);
            }
        }
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _size: usize) -> bool {
        log(LogLevel::Info, &format!("{VERSION} starting"));
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
        let mut config = config;
        match replica_machine_id(&config.trt.machine_id_env) {
            Ok(Some(id)) => config.trt.machine_id = id,
            Ok(None) => {}
            Err(e) => {
                log(
                    LogLevel::Critical,
                    &format!("pd-router configuration: trt_machine_id_env: {e}"),
                );
                return false;
            }
        }
        let auth_key = match std::env::var(&config.trt.auth_key_env) {
            Ok(k) if !k.is_empty() => Some(k.into_bytes()),
            _ => None,
        };
        let slot = claim_worker_slot();
        let mut router = match Router::new(config, slot) {
            Ok(r) => r,
            Err(e) => {
                log(
                    LogLevel::Critical,
                    &format!("pd-router configuration: trt_machine_id: {e}"),
                );
                return false;
            }
        };
        if auth_key.is_some() {
            log(
                LogLevel::Info,
                &format!(
                    "pd-router: TensorRT-LLM hand-offs are signed with the key in ${}",
                    router.config.trt.auth_key_env
                ),
            );
        }
        router.set_trt_auth_key(auth_key);
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
        let stats = Stats::define(slot, router.config.max_pod_stats);
        stats.know_fleet(&router.fleet());
        self.stats = Rc::new(stats);
        self.discovery = router.config.discovery.clone().map(Discoverer::new);
        // Ticks drive the scrape, the pod lists and the gauges: as often as
        // the most frequent of them, at most once a second.
        let tick = [
            router.config.scrape.interval_ms,
            self.discovery.as_ref().map_or(0, Discoverer::interval_ms),
        ]
        .into_iter()
        .filter(|i| *i > 0)
        .fold(1000, u64::min)
        .max(50);
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
        if let Some(d) = self.discovery.as_mut() {
            if d.apply(&router, &self.stats) {
                // Counter readings of pods that left make no rate any more.
                let live: Vec<PodId> = router.fleet().pods().iter().map(|p| p.id).collect();
                self.previous.retain(|id, _| live.contains(id));
            }
            d.maybe_list(&router, self.vm_id, now);
        }
        self.bootstrap.refresh(&router);
        self.bootstrap.ask(&router, self.vm_id, now);
        router.refresh_metrics(&Shared);
        self.stats.record_vm_memory();
        self.stats.refresh_log_level();
        let counters = router.pod_counters(&Shared);
        for (pod, c) in &counters {
            self.stats.record_pod(
                &pod.name,
                c.outstanding_prefills,
                c.pending_decodes,
                c.is_healthy(now),
            );
        }
        if self.discovery.is_some() {
            let live = counters.iter().map(|(p, _)| p.name.as_str()).collect();
            self.stats.zero_departed(&live);
        }
        let interval = router.config.scrape.interval_ms;
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

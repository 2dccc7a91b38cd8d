//! The root context: forwards Envoy's VM callbacks to [`crate::root`] and
//! implements its [`RootHost`] over the shell's host calls.

use super::abi::{self, Buffer, LogLevel};
use super::shared::{self, now_ms};
use super::stats::Stats;
use super::stream::{self, Stream, StreamCore};
use super::streams::Streams;
use crate::admission::Turn;
use crate::error::HostError;
use crate::fleet::Fleet;
use crate::host::{Counter, Histogram, Level, PodEvent, Telemetry};
use crate::pods::{SetError, SharedStore};
use crate::root::{configure, Root as RootState, RootHost};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::collections::HashSet;
use std::rc::Rc;

/// The build, as logged at VM start.
const VERSION: &str = concat!(
    "pd-router ",
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PD_ROUTER_GIT_COMMIT"),
    ")"
);

pub(super) struct Root {
    /// This root context's id: host calls point back at it after the root
    /// drove a stream.
    id: u32,
    state: Option<RootState>,
    stats: Rc<Stats>,
    streams: Rc<Streams<StreamCore>>,
}

impl Root {
    pub(super) fn new(id: u32) -> Root {
        Root {
            id,
            state: None,
            stats: Rc::default(),
            streams: Rc::default(),
        }
    }

    /// Admission control, on each tick ([`crate::router::Router::pump`]):
    /// each turn drives its stream with the host calls pointed at it.
    fn pump_admission(&mut self) {
        let Some(state) = self.state.as_ref() else {
            return;
        };
        let router = Rc::clone(&state.router);
        if router.config.admission.is_none() {
            return;
        }
        let mut io = RootIo { stats: &self.stats };
        let (streams, root) = (&self.streams, self.id);
        router.pump(&mut io, now_ms(), |context, turn| {
            streams.drive(context, root, |core| {
                let (flow, io) = core.parts();
                match turn {
                    Turn::Expire => {
                        flow.expire(io);
                        true
                    }
                    Turn::Admit => flow.admit(io),
                }
            })
        });
        self.stats.record_waiting(&router.waiting_counts());
    }
}

fn log(level: LogLevel, msg: &str) {
    let _ = abi::log(level, msg);
}

/// The root context's host: shared data, the clock, calls and this VM's
/// stats.
struct RootIo<'a> {
    stats: &'a Stats,
}

impl SharedStore for RootIo<'_> {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        shared::get(key)
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        shared::set(key, value, cas)
    }
}

impl Telemetry for RootIo<'_> {
    fn log(&self, level: Level, message: &str) {
        log(stream::log_level(level), message);
    }

    fn log_enabled(&self, level: Level) -> bool {
        stream::log_level(level) as u32 >= self.stats.log_level() as u32
    }

    fn increment(&self, counter: Counter) {
        self.stats.increment(counter);
    }

    fn add(&self, counter: Counter, n: u64) {
        self.stats.add(counter, n);
    }

    fn count_pod(&self, pod: &str, event: PodEvent) {
        self.stats.count_pod(pod, event);
    }

    fn now_ms(&self) -> u64 {
        now_ms()
    }

    fn record(&self, histogram: Histogram, model: &str, value: u64) {
        self.stats.record(histogram, model, value);
    }
}

impl RootHost for RootIo<'_> {
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        stream::dispatch(cluster, headers, &[], timeout_ms)
    }

    fn post(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        stream::dispatch(cluster, headers, body, timeout_ms)
    }

    fn call_answer_body(&self, len: usize, max: usize) -> Vec<u8> {
        abi::buffer(Buffer::HttpCallResponseBody, 0, len.min(max))
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    fn record_discovered(&self, pods: u64, generation: u64) {
        self.stats.record_discovered(pods, generation);
    }

    fn record_published(&self, generation: u64) {
        self.stats.record_published(generation);
    }

    fn record_discovery_age(&self, age_ms: u64) {
        self.stats.record_discovery_age(age_ms);
    }

    fn know_fleet(&self, fleet: &Fleet) {
        self.stats.know_fleet(fleet);
    }

    fn record_pod(&self, pod: &str, outstanding: u32, pending: u32, healthy: bool) {
        self.stats.record_pod(pod, outstanding, pending, healthy);
    }

    fn zero_departed(&self, live: &HashSet<&str>) {
        self.stats.zero_departed(live);
    }
}

impl Context for Root {
    /// The VM is stopping (a reload, a shutdown): its worker slot is free
    /// for the next VM now rather than when its lease lapses.
    fn on_done(&mut self) -> bool {
        if let Some(state) = self.state.as_ref() {
            state
                .router
                .release_lease(&mut RootIo { stats: &self.stats });
        }
        true
    }

    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let status = shared::call_status(num_headers);
        // A prefill a stream made while the root drove it (admission).
        if let Some(context) = self.streams.owner_of_call(token) {
            self.streams.drive(context, self.id, |core| {
                let (flow, io) = core.parts();
                flow.on_prefill_response(io, token, status, body_size);
            });
            return;
        }
        let Some(state) = self.state.as_mut() else {
            return;
        };
        let mut io = RootIo { stats: &self.stats };
        state.on_call_answer(&mut io, token, status, body_size);
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _size: usize) -> bool {
        log(LogLevel::Info, &format!("{VERSION} starting"));
        true
    }

    fn on_configure(&mut self, size: usize) -> bool {
        let raw = abi::buffer(Buffer::PluginConfiguration, 0, size)
            .ok()
            .flatten();
        let env = |name: &str| std::env::var(name).ok();
        let mut io = RootIo { stats: &self.stats };
        let vm_id = getrandom::u64().unwrap_or_else(|_| now_ms());
        let configured = match configure(raw.as_deref(), &env, &mut io, vm_id, now_ms()) {
            Ok(c) => c,
            Err(e) => {
                // Envoy refuses the config when this returns false; this line
                // is what the operator sees.
                log(LogLevel::Critical, &e.to_string());
                return false;
            }
        };
        for note in &configured.notes {
            log(LogLevel::Info, note);
        }
        for warning in &configured.warnings {
            log(LogLevel::Warn, warning);
        }
        let router = configured.router;
        let stats = Stats::define(router.worker_slot(), router.config.max_pod_stats);
        stats.know_fleet(&router.fleet());
        self.stats = Rc::new(stats);
        let state = RootState::new(Rc::new(router), vm_id, configured.kube_token);
        let tick = u32::try_from(state.tick_period_ms()).unwrap_or(1000);
        if let Err(e) = abi::set_tick_period_ms(tick) {
            log(
                LogLevel::Warn,
                &format!("pd-router: no tick ({e:?}): metrics and gauges will not refresh"),
            );
        }
        self.state = Some(state);
        true
    }

    fn on_tick(&mut self) {
        let Some(state) = self.state.as_mut() else {
            return;
        };
        self.stats.record_vm_memory();
        self.stats.refresh_log_level();
        let mut io = RootIo { stats: &self.stats };
        state.on_tick(&mut io);
        self.pump_admission();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let router = &self.state.as_ref()?.router;
        Some(Box::new(Stream::new(
            Rc::clone(router),
            Rc::clone(&self.stats),
            context_id,
            Rc::clone(&self.streams),
        )))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

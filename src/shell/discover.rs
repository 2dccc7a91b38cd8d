//! Discovery's host side: listing pods through the API server's Envoy
//! cluster (one VM, holding the lease) and applying the published pod set
//! (every VM). The logic is in `crate::discovery`.

use super::shared::{self, Shared};
use super::stats::Stats;
use crate::discovery::{build_fleet, published, KubeDiscovery, ListRun, Listed, Step};
use crate::host::Counter;
use crate::pods::lease;
use crate::router::Router;
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel};
use std::time::Duration;

/// The largest list answer read (a few thousand pods are a few MiB).
const MAX_LIST_BYTES: usize = 64 << 20;

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, &format!("pd-router discovery: {msg}"));
}

pub(super) struct Discoverer {
    cfg: KubeDiscovery,
    /// The bearer token, from the VM environment variable `token_env`.
    token: Option<String>,
    /// The list in flight: its call token and its progress.
    in_flight: Option<(u32, ListRun)>,
    last_start_ms: u64,
    /// The kind of the failure the lists are in, if they are failing:
    /// logged when it changes, not on every list.
    failing: Option<&'static str>,
    /// The generation of the pod set this VM's fleet is built from.
    applied: u64,
}

impl Discoverer {
    pub(super) fn new(cfg: KubeDiscovery) -> Discoverer {
        let token = std::env::var(&cfg.token_env)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        if token.is_none() {
            log(
                LogLevel::Info,
                &format!(
                    "no token in the VM environment variable {:?}; listing without an Authorization header",
                    cfg.token_env
                ),
            );
        }
        Discoverer {
            cfg,
            token,
            in_flight: None,
            last_start_ms: 0,
            failing: None,
            applied: 0,
        }
    }

    pub(super) fn interval_ms(&self) -> u64 {
        self.cfg.interval_ms
    }

    /// Every VM, every tick: builds the fleet anew when the published pod
    /// set changed. Returns whether it did.
    pub(super) fn apply(&mut self, router: &Router, stats: &Stats) -> bool {
        let keys = router.keys();
        let (gen, _) = shared::get(&keys.discovered_generation());
        let generation = published::decode_generation(gen.as_deref());
        if generation == 0 || generation == self.applied {
            return false;
        }
        let Some(set) = published::read(&Shared, &keys.discovered()) else {
            return false;
        };
        let (fleet, _unused) = build_fleet(&router.config.models, &set.pods);
        stats.know_fleet(&fleet);
        router.set_fleet(fleet);
        stats.record_discovered(set.pods.len() as u64);
        self.applied = set.generation;
        true
    }

    /// Starts a list if this VM holds the lease and one is due.
    pub(super) fn maybe_list(&mut self, router: &Router, vm_id: u64, now: u64) {
        if self.in_flight.is_some() || now.saturating_sub(self.last_start_ms) < self.cfg.interval_ms
        {
            return;
        }
        let ttl = self
            .cfg
            .interval_ms
            .saturating_add(self.cfg.timeout_ms)
            .saturating_mul(2);
        if !lease::try_hold(
            &mut Shared,
            &router.keys().discovery_lease(),
            vm_id,
            now,
            ttl,
        ) {
            return;
        }
        self.last_start_ms = now;
        let (run, path) = ListRun::start(&self.cfg);
        self.send(run, &path);
    }

    fn send(&mut self, run: ListRun, path: &str) {
        let bearer = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers = vec![
            (":method", "GET"),
            (":path", path),
            (":authority", self.cfg.authority.as_str()),
            ("accept", "application/json"),
            (
                "user-agent",
                concat!("pd-router/", env!("CARGO_PKG_VERSION")),
            ),
        ];
        if let Some(b) = &bearer {
            headers.push(("authorization", b.as_str()));
        }
        match hostcalls::dispatch_http_call(
            &self.cfg.cluster,
            headers,
            None,
            Vec::new(),
            Duration::from_millis(self.cfg.timeout_ms),
        ) {
            Ok(token) => self.in_flight = Some((token, run)),
            Err(e) => log(
                LogLevel::Warn,
                &format!(
                    "could not list pods through cluster {:?}: {e:?}",
                    self.cfg.cluster
                ),
            ),
        }
    }

    pub(super) fn owns(&self, token: u32) -> bool {
        self.in_flight.as_ref().is_some_and(|(t, _)| *t == token)
    }

    /// A list answer arrived.
    pub(super) fn on_answer(
        &mut self,
        router: &Router,
        stats: &Stats,
        status: Option<u16>,
        body_size: usize,
    ) {
        let Some((_, mut run)) = self.in_flight.take() else {
            return;
        };
        let body = hostcalls::get_buffer(
            BufferType::HttpCallResponseBody,
            0,
            body_size.min(MAX_LIST_BYTES),
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        match run.on_answer(&self.cfg, status, &body) {
            Step::Fetch(path) => self.send(run, &path),
            Step::Done(listed) => self.listed(router, stats, listed),
            Step::Failed(failure) => {
                stats.increment(Counter::DiscoveryFailure);
                if self.failing != Some(failure.kind()) {
                    self.failing = Some(failure.kind());
                    log(
                        LogLevel::Warn,
                        &format!("listing pods failed, keeping the last good pod set: {failure}"),
                    );
                }
            }
        }
    }

    fn listed(&mut self, router: &Router, stats: &Stats, listed: Listed) {
        stats.increment(Counter::DiscoveryList);
        if let Some(kind) = self.failing.take() {
            log(
                LogLevel::Info,
                &format!("listing pods works again (was: {kind})"),
            );
        }
        let keys = router.keys();
        let published = published::publish(
            &mut Shared,
            &keys.discovered(),
            &keys.discovered_generation(),
            &listed.pods,
        );
        match published {
            Ok(Some(generation)) => {
                let (fleet, unused) = build_fleet(&router.config.models, &listed.pods);
                let models = fleet.models().iter().filter(|m| !m.pods.is_empty()).count();
                log(
                    LogLevel::Info,
                    &format!(
                        "pod set {generation}: {} routable pods in {models} models ({} pages; {} pods skipped)",
                        listed.pods.len(),
                        listed.pages,
                        listed.skipped.len()
                    ),
                );
                for u in unused {
                    log(LogLevel::Warn, &format!("pod {}: {}", u.pod, u.why));
                }
            }
            Ok(None) => {}
            Err(e) => log(
                LogLevel::Error,
                &format!("could not publish the pod set: {e}"),
            ),
        }
    }
}

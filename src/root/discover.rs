//! Discovery's tick: listing pods through the API server's Envoy cluster
//! (one VM, holding the lease) and applying the published pod set (every
//! VM). Reading a list is [`crate::discovery`].

use super::RootHost;
use crate::discovery::{build_fleet, published, KubeDiscovery, ListRun, Listed, Step};
use crate::host::{Counter, Level};
use crate::pods::lease;
use crate::router::Router;

/// The largest list answer read (a few thousand pods are a few MiB).
pub const MAX_LIST_BYTES: usize = 64 << 20;

fn log<H: RootHost>(host: &H, level: Level, msg: &str) {
    host.log(level, &format!("pd-router discovery: {msg}"));
}

pub struct Discoverer {
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
    /// `token`: the API server's bearer token, if the VM has one.
    pub fn new(cfg: KubeDiscovery, token: Option<String>) -> Discoverer {
        Discoverer {
            cfg,
            token,
            in_flight: None,
            last_start_ms: 0,
            failing: None,
            applied: 0,
        }
    }

    pub fn interval_ms(&self) -> u64 {
        self.cfg.interval_ms
    }

    /// Every VM, every tick: builds the fleet anew when the published pod
    /// set changed. Returns whether it did.
    pub fn apply<H: RootHost>(&mut self, host: &H, router: &Router) -> bool {
        let keys = router.keys();
        let (gen, _) = host.shared_get(&keys.discovered_generation());
        let generation = published::decode_generation(gen.as_deref());
        if generation == 0 || generation == self.applied {
            return false;
        }
        let Some(set) = published::read(host, &keys.discovered()) else {
            return false;
        };
        let (fleet, _unused) = build_fleet(&router.config.models, &set.pods);
        host.know_fleet(&fleet);
        router.set_fleet(fleet);
        host.record_discovered(set.pods.len() as u64);
        self.applied = set.generation;
        true
    }

    /// Starts a list if this VM holds the lease and one is due.
    pub fn maybe_list<H: RootHost>(&mut self, host: &mut H, router: &Router, vm_id: u64, now: u64) {
        if self.in_flight.is_some() || now.saturating_sub(self.last_start_ms) < self.cfg.interval_ms
        {
            return;
        }
        let ttl = self
            .cfg
            .interval_ms
            .saturating_add(self.cfg.timeout_ms)
            .saturating_mul(2);
        if !lease::try_hold(host, &router.keys().discovery_lease(), vm_id, now, ttl) {
            return;
        }
        self.last_start_ms = now;
        let (run, path) = ListRun::start(&self.cfg);
        self.send(host, run, &path);
    }

    fn send<H: RootHost>(&mut self, host: &mut H, run: ListRun, path: &str) {
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
        match host.dispatch(&self.cfg.cluster, &headers, self.cfg.timeout_ms) {
            Ok(token) => self.in_flight = Some((token, run)),
            Err(e) => log(
                host,
                Level::Warn,
                &format!(
                    "could not list pods through cluster {:?}: {}",
                    self.cfg.cluster, e.status
                ),
            ),
        }
    }

    pub fn owns(&self, token: u32) -> bool {
        self.in_flight.as_ref().is_some_and(|(t, _)| *t == token)
    }

    /// A list answer arrived.
    pub fn on_answer<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        status: Option<u16>,
        body_size: usize,
    ) {
        let Some((_, mut run)) = self.in_flight.take() else {
            return;
        };
        let body = host.call_answer_body(body_size, MAX_LIST_BYTES);
        match run.on_answer(&self.cfg, status, &body) {
            Step::Fetch(path) => self.send(host, run, &path),
            Step::Done(listed) => self.listed(host, router, listed),
            Step::Failed(failure) => {
                host.increment(Counter::DiscoveryFailure);
                if self.failing != Some(failure.kind()) {
                    self.failing = Some(failure.kind());
                    log(
                        host,
                        Level::Warn,
                        &format!("listing pods failed, keeping the last good pod set: {failure}"),
                    );
                }
            }
        }
    }

    fn listed<H: RootHost>(&mut self, host: &mut H, router: &Router, listed: Listed) {
        host.increment(Counter::DiscoveryList);
        if let Some(kind) = self.failing.take() {
            log(
                host,
                Level::Info,
                &format!("listing pods works again (was: {kind})"),
            );
        }
        let keys = router.keys();
        let published = published::publish(
            host,
            &keys.discovered(),
            &keys.discovered_generation(),
            &listed.pods,
        );
        match published {
            Ok(Some(generation)) => {
                let (fleet, unused) = build_fleet(&router.config.models, &listed.pods);
                let models = fleet.models().iter().filter(|m| !m.pods.is_empty()).count();
                log(
                    host,
                    Level::Info,
                    &format!(
                        "pod set {generation}: {} routable pods in {models} models ({} pages; {} pods skipped)",
                        listed.pods.len(),
                        listed.pages,
                        listed.skipped.len()
                    ),
                );
                for u in unused {
                    log(host, Level::Warn, &format!("pod {}: {}", u.pod, u.why));
                }
            }
            Ok(None) => {}
            Err(e) => log(
                host,
                Level::Error,
                &format!("could not publish the pod set: {e}"),
            ),
        }
    }
}

//! Discovery's tick: listing pods through the API server's Envoy cluster,
//! then watching them (one VM, holding the lease), and applying the
//! published pod set (every VM). Reading lists and watch events is
//! [`crate::discovery`].

use super::host::RootHost;
use crate::discovery::adapter::read_adapters;
use crate::discovery::lister::failure;
use crate::discovery::pod::Reader;
use crate::discovery::pool::{pool_path, read_pool};
use crate::discovery::published::PublishedPods;
use crate::discovery::schedule::{delay_ms, max_delay_ms, Jitter, Outcome, MAX_BACKOFF_MS};
use crate::discovery::{
    build_fleet, published, DiscoveredAdapter, DiscoveredPod, KubeDiscovery, ListFailure, ListRun,
    Step, WatchOutcome, Watched,
};
use crate::host::{Counter, Level};
use crate::pods::lease;
use crate::router::Router;

/// The largest list or watch answer read (a few thousand pods are a few MiB).
pub const MAX_LIST_BYTES: usize = 64 << 20;
/// How late the lease holder's next tick may come before another VM takes
/// the discovery over. The TTL without it is exactly the longest gap
/// between two calls when ticks are on time.
const LEASE_SLACK_MS: u64 = 2_000;
/// A call answered without a status this close to the end of its timeout
/// is taken as timed out.
const TIMEOUT_CLOCK_SLACK_MS: u64 = 5;

fn log<H: RootHost>(host: &H, level: Level, msg: &str) {
    host.log(level, &format!("pd-router discovery: {msg}"));
}

/// The call in flight.
enum Call {
    List(ListRun),
    Watch,
    /// The InferencePool, read before the pods it selects.
    Pool,
    /// AIBrix's ModelAdapters, read after the pods.
    Adapters,
}

pub struct Discoverer {
    cfg: KubeDiscovery,
    /// The bearer token, from the VM environment variable `token_env`.
    token: Option<String>,
    /// The call in flight: its token, what it is, and when its timeout
    /// ends (Unix ms).
    in_flight: Option<(u32, Call, u64)>,
    /// No call starts before this (Unix ms).
    next_at_ms: u64,
    jitter: Jitter,
    /// Failed calls in a row (the backoff).
    failures: u32,
    /// The kind of the failure the calls are in, if they are failing:
    /// logged when it changes, not on every call.
    failing: Option<&'static str>,
    /// The generation of the pod set this VM's fleet is built from.
    applied: u64,
    /// The set a watch keeps current (the lease holder, watch mode).
    watched: Option<Watched>,
    /// This VM's first tick: the age of a set never confirmed.
    born_ms: Option<u64>,
    /// This VM holds the lease (and so says when the set is stale).
    lister: bool,
    /// The set was said to be stale, and has not been current since.
    stale_said: bool,
    /// When the InferencePool was last read (it is read again every
    /// `interval_ms`, so a changed selector or port list takes effect).
    pool_read_ms: u64,
    /// This VM has synced the pods (adapters are read after them).
    pods_synced: bool,
    /// No ModelAdapter list starts before this (Unix ms).
    adapters_at_ms: u64,
    /// Failed ModelAdapter lists in a row (their own backoff: pods go on).
    adapter_failures: u32,
    /// What was last said about reading ModelAdapters: a failure's kind,
    /// "absent" (no such resource), or nothing while they read well.
    adapters_said: Option<&'static str>,
}

impl Discoverer {
    /// `token`: the API server's bearer token, if the VM has one; `seed`
    /// spreads this VM's calls from other VMs' and replicas'.
    pub fn new(cfg: KubeDiscovery, token: Option<String>, seed: u64) -> Discoverer {
        Discoverer {
            cfg,
            token,
            in_flight: None,
            next_at_ms: 0,
            jitter: Jitter::new(seed),
            failures: 0,
            failing: None,
            applied: 0,
            watched: None,
            born_ms: None,
            lister: false,
            stale_said: false,
            pool_read_ms: 0,
            pods_synced: false,
            adapters_at_ms: 0,
            adapter_failures: 0,
            adapters_said: None,
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
        let (fleet, _unused) = build_fleet(&router.config.models, &set.pods, &set.adapters);
        host.know_fleet(&fleet);
        router.set_fleet(fleet);
        host.record_discovered(set.pods.len() as u64, set.generation);
        self.applied = set.generation;
        true
    }

    /// Every VM, every tick: publishes the pod set's age (since the API
    /// server last confirmed it); the lease holder says when it is stale
    /// and when it is current again.
    pub fn report_age<H: RootHost>(&mut self, host: &H, router: &Router, now: u64) {
        let born = *self.born_ms.get_or_insert(now);
        let (synced, _) = host.shared_get(&router.keys().discovery_synced());
        let since = match published::decode_generation(synced.as_deref()) {
            0 => born,
            at => at,
        };
        let age = now.saturating_sub(since);
        host.record_discovery_age(age);
        if !self.lister {
            return;
        }
        let stale = age > self.cfg.stale_after_ms;
        if stale && !self.stale_said {
            self.stale_said = true;
            log(
                host,
                Level::Warn,
                &format!(
                    "the pod set is {} s old (stale_after_ms {}): the API server has not confirmed it since; routing on the last good set",
                    age / 1000,
                    self.cfg.stale_after_ms
                ),
            );
        } else if !stale && self.stale_said {
            self.stale_said = false;
            log(host, Level::Info, "the pod set is current again");
        }
    }

    /// Starts a list or a watch if this VM holds the lease and one is due.
    pub fn maybe_list<H: RootHost>(&mut self, host: &mut H, router: &Router, vm_id: u64, now: u64) {
        let adapters = self.cfg.reads_adapters() && self.pods_synced && now >= self.adapters_at_ms;
        if self.in_flight.is_some() || (now < self.next_at_ms && !adapters) {
            return;
        }
        let watching = self.cfg.watch && self.watched.is_some();
        // Held through the call, the longest wait before the next one (a
        // backoff included), the tick that notices it is due, and slack for
        // a tick that runs late on a loaded Envoy: the holder keeps its
        // watch's resourceVersion and its failure state, which another VM
        // would have to list for and would report afresh.
        let ttl = self
            .cfg
            .call_timeout_ms(watching)
            .saturating_add(max_delay_ms(&self.cfg))
            .saturating_add(self.cfg.interval_ms)
            .saturating_add(LEASE_SLACK_MS);
        self.lister = lease::try_hold(host, &router.keys().discovery_lease(), vm_id, now, ttl);
        if !self.lister {
            return;
        }
        if adapters {
            let path = self.cfg.adapters_path();
            self.send(host, Call::Adapters, &path);
            return;
        }
        let pool_due = self.cfg.inference_pool.is_some()
            && (self.cfg.pool.is_none()
                || now >= self.pool_read_ms.saturating_add(self.cfg.interval_ms));
        if let Some(pool) = self.cfg.inference_pool.as_ref().filter(|_| pool_due) {
            let ns = pool.namespace.as_deref().unwrap_or(&self.cfg.namespace);
            let path = pool_path(ns, &pool.name);
            self.send(host, Call::Pool, &path);
            return;
        }
        match self.watched.as_ref().filter(|_| self.cfg.watch) {
            Some(w) => {
                let path = self.cfg.watch_path(w.resource_version());
                self.send(host, Call::Watch, &path);
            }
            None => {
                let (run, path) = ListRun::start(&self.cfg);
                self.send(host, Call::List(run), &path);
            }
        }
    }

    fn send<H: RootHost>(&mut self, host: &mut H, call: Call, path: &str) {
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
        let timeout = self.cfg.call_timeout_ms(matches!(call, Call::Watch));
        match host.dispatch(&self.cfg.cluster, &headers, timeout) {
            Ok(token) => {
                let ends = host.now_ms().saturating_add(timeout);
                self.in_flight = Some((token, call, ends));
            }
            Err(e) => {
                log(
                    host,
                    Level::Warn,
                    &format!(
                        "could not call the API server through cluster {:?}: {}",
                        self.cfg.cluster, e.status
                    ),
                );
                let now = host.now_ms();
                self.failed_at(now);
            }
        }
    }

    pub fn owns(&self, token: u32) -> bool {
        self.in_flight.as_ref().is_some_and(|(t, ..)| *t == token)
    }

    /// A list or watch answer arrived.
    pub fn on_answer<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        status: Option<u16>,
        body_size: usize,
    ) {
        let Some((_, call, ends)) = self.in_flight.take() else {
            return;
        };
        // Envoy answers a call whose timeout ends before its headers with
        // a 504 of its own, but cuts one whose timeout ends mid-answer (a
        // watch, a slow list page) with a reset and no status: that is the
        // timeout too, and "connection reset" would send an operator
        // after the network. The slack covers whole-millisecond clocks.
        let status = status.or_else(|| {
            (host.now_ms().saturating_add(TIMEOUT_CLOCK_SLACK_MS) >= ends).then_some(504)
        });
        let body = host.call_answer_body(body_size, MAX_LIST_BYTES);
        match call {
            Call::List(mut run) => match run.on_answer(&self.cfg, status, &body) {
                Step::Fetch(path) => self.send(host, Call::List(run), &path),
                Step::Done(listed) => {
                    host.increment(Counter::DiscoveryList);
                    self.watched = Watched::from_list(&listed).filter(|_| self.cfg.watch);
                    let how = format!(
                        "{} pages; {} pods skipped",
                        listed.pages,
                        listed.skipped.len()
                    );
                    self.synced(host, router, &listed.pods, &how);
                }
                Step::Failed(failure) => self.failed(host, failure),
            },
            Call::Watch => self.on_watch_answer(host, router, status, &body),
            Call::Pool => self.on_pool_answer(host, status, &body),
            Call::Adapters => self.on_adapters_answer(host, router, status, &body),
        }
    }

    /// The ModelAdapters answered: a good list replaces the published
    /// adapters; a 404 (AIBrix's CRD is not installed) means none, asked
    /// again after the longest backoff; a failure keeps the last good set.
    fn on_adapters_answer<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        status: Option<u16>,
        body: &[u8],
    ) {
        let now = host.now_ms();
        let read = match status {
            Some(200) => {
                read_adapters(body, self.cfg.namespace.is_empty()).map_err(ListFailure::Unparsable)
            }
            Some(404) => Ok(Vec::new()),
            other => Err(failure(other, body)),
        };
        let adapters = match read {
            Ok(adapters) => adapters,
            Err(f) => {
                host.increment(Counter::DiscoveryFailure);
                self.adapter_failures = self.adapter_failures.saturating_add(1);
                let wait = delay_ms(
                    &self.cfg,
                    Outcome::Failed(self.adapter_failures),
                    &mut self.jitter,
                );
                self.adapters_at_ms = now.saturating_add(wait);
                let why = match &f {
                    ListFailure::Forbidden(m) => format!("403 Forbidden ({m}): the ServiceAccount needs list on modeladapters.model.aibrix.ai (deploy/values/rbac.yaml), or set discovery.kubernetes.model_adapters to false"),
                    other => other.to_string(),
                };
                let msg =
                    format!("reading ModelAdapters failed, keeping the last good adapters: {why}");
                self.say_adapters(host, Some(f.kind()), Level::Warn, &msg);
                return;
            }
        };
        self.adapter_failures = 0;
        let (said, wait) = match status {
            Some(404) => (Some("absent"), MAX_BACKOFF_MS),
            _ => (None, self.cfg.interval_ms),
        };
        self.adapters_at_ms = now.saturating_add(wait);
        let msg = match said {
            Some(_) => "the API server has no ModelAdapter resource (AIBrix is not installed): no adapters discovered",
            None => "ModelAdapters are read again",
        };
        self.say_adapters(host, said, Level::Info, msg);
        publish(host, router, None, Some(&adapters), "ModelAdapters");
    }

    /// Logs `msg` when the state of reading ModelAdapters changes.
    fn say_adapters<H: RootHost>(
        &mut self,
        host: &H,
        state: Option<&'static str>,
        level: Level,
        msg: &str,
    ) {
        // The first good read is no news.
        let news = self.adapters_said != state && (state.is_some() || self.adapters_said.is_some());
        self.adapters_said = state;
        if news {
            log(host, level, msg);
        }
    }

    /// The InferencePool answered: a changed selector or port list starts
    /// a fresh list; a pool that is gone keeps the last good set.
    fn on_pool_answer<H: RootHost>(&mut self, host: &mut H, status: Option<u16>, body: &[u8]) {
        let Some(pool) = self.cfg.inference_pool.clone() else {
            return;
        };
        let read = match status {
            Some(200) => read_pool(body).map_err(ListFailure::Unparsable),
            Some(404) => Err(ListFailure::Status(
                404,
                format!(
                    "the InferencePool {:?} does not exist in {:?}",
                    pool.name,
                    pool.namespace.as_deref().unwrap_or(&self.cfg.namespace)
                ),
            )),
            other => Err(failure(other, body)),
        };
        match read {
            Ok(view) => {
                let now = host.now_ms();
                self.pool_read_ms = now;
                self.next_at_ms = now;
                if self.cfg.pool.as_ref() != Some(&view) {
                    log(
                        host,
                        Level::Info,
                        &format!(
                            "InferencePool {}: pods {} on ports {:?}; listing them",
                            pool.name, view.selector, view.ports
                        ),
                    );
                    self.cfg.pool = Some(view);
                    // A watch of the old selector is of the wrong pods.
                    self.watched = None;
                }
            }
            Err(f) => self.failed(host, f),
        }
    }

    fn on_watch_answer<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        status: Option<u16>,
        body: &[u8],
    ) {
        let Some(w) = self.watched.as_mut() else {
            return;
        };
        match w.on_answer(status, body, &Reader::of(&self.cfg)) {
            WatchOutcome::Applied { events } => {
                host.increment(Counter::DiscoveryWatch);
                let pods = w.pods();
                self.synced(host, router, &pods, &format!("{events} watch events"));
            }
            WatchOutcome::Relist(why) => {
                // The API server's history no longer reaches back to our
                // resourceVersion: only a fresh list is a consistent view.
                host.increment(Counter::DiscoveryRelist);
                log(
                    host,
                    Level::Info,
                    &format!("the watch expired ({why}); listing again"),
                );
                self.watched = None;
                let now = host.now_ms();
                self.next_at_ms = now.saturating_add(delay_ms(
                    &self.cfg,
                    Outcome::Synced { watching: true },
                    &mut self.jitter,
                ));
            }
            WatchOutcome::Failed(failure) => self.failed(host, failure),
        }
    }

    fn failed<H: RootHost>(&mut self, host: &mut H, failure: ListFailure) {
        host.increment(Counter::DiscoveryFailure);
        if self.failing != Some(failure.kind()) {
            self.failing = Some(failure.kind());
            log(
                host,
                Level::Warn,
                &format!("the API server call failed, keeping the last good pod set: {failure}"),
            );
        }
        let now = host.now_ms();
        self.failed_at(now);
    }

    fn failed_at(&mut self, now: u64) {
        self.failures = self.failures.saturating_add(1);
        self.next_at_ms = now.saturating_add(delay_ms(
            &self.cfg,
            Outcome::Failed(self.failures),
            &mut self.jitter,
        ));
    }

    /// The API server answered: the set is current; publish it if it
    /// changed, and schedule the next call.
    fn synced<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        pods: &[DiscoveredPod],
        how: &str,
    ) {
        let now = host.now_ms();
        self.failures = 0;
        if let Some(kind) = self.failing.take() {
            log(
                host,
                Level::Info,
                &format!("the API server answers again (was: {kind})"),
            );
        }
        let keys = router.keys();
        if let Err(e) = host.shared_set(
            &keys.discovery_synced(),
            &published::encode_generation(now),
            None,
        ) {
            log(
                host,
                Level::Error,
                &format!("could not record the sync time: {e:?}"),
            );
        }
        let outcome = Outcome::Synced {
            watching: self.watched.is_some(),
        };
        self.next_at_ms = now.saturating_add(delay_ms(&self.cfg, outcome, &mut self.jitter));
        self.pods_synced = true;
        // Adapters not read: none (a set published before is dropped).
        let adapters: Option<&[DiscoveredAdapter]> = if self.cfg.reads_adapters() {
            None
        } else {
            Some(&[])
        };
        publish(host, router, Some(pods), adapters, how);
    }
}

/// Publishes the pods and adapters (`None`: as published) if they
/// changed, saying what the fleet is made of.
fn publish<H: RootHost>(
    host: &mut H,
    router: &Router,
    pods: Option<&[DiscoveredPod]>,
    adapters: Option<&[DiscoveredAdapter]>,
    how: &str,
) {
    let keys = router.keys();
    let set_key = keys.discovered();
    let generation_key = keys.discovered_generation();
    match published::publish(host, &set_key, &generation_key, pods, adapters) {
        Ok(Some(set)) => {
            host.record_published(set.generation);
            report(host, router, &set, how)
        }
        Ok(None) => {}
        Err(e) => log(
            host,
            Level::Error,
            &format!("could not publish the pod set: {e}"),
        ),
    }
}

/// Says what a newly published set makes of the fleet, and what of it
/// is not used.
fn report<H: RootHost>(host: &H, router: &Router, set: &PublishedPods, how: &str) {
    let (fleet, unused) = build_fleet(&router.config.models, &set.pods, &set.adapters);
    let models = fleet.models().iter().filter(|m| !m.pods.is_empty()).count();
    log(
        host,
        Level::Info,
        &format!(
            "pod set {}: {} routable pods in {models} models, {} adapters ({how})",
            set.generation,
            set.pods.len(),
            set.adapters.len()
        ),
    );
    for u in unused {
        log(host, Level::Warn, &format!("{}: {}", u.what, u.why));
    }
}

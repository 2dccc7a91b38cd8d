//! Scraping the pods' engine metrics: the lease holder asks every pod's
//! `/metrics` each interval and shares what they say; a pod that does not
//! answer is ejected and forgotten. The parsing and
//! rates are [`crate::scrape`].

use super::host::RootHost;
use crate::error::{envoy_failure, upstream_message, EnvoyFailure};
use crate::fleet::{Endpoint, PodId};
use crate::host::{Counter, Level, PodEvent};
use crate::load::Ejection;
use crate::load::Verdict;
use crate::pods::{lease, update_scraped, StoredMetrics};
use crate::router::Router;
use crate::scrape::parse_engine_metrics;
use crate::scrape::{self, Previous};
use std::collections::HashMap;
use std::rc::Rc;

/// The largest `/metrics` answer read; a pod's metrics are a few KiB.
pub const MAX_METRICS_BYTES: usize = 1 << 20;

#[derive(Default)]
pub struct Scraper {
    last_scrape_ms: u64,
    /// Scrapes in flight: call token → pod, and this Envoy's decodes and
    /// prefills on it when the scrape left.
    in_flight: HashMap<u32, (Rc<Endpoint>, (u32, u32))>,
    previous: HashMap<PodId, Previous>,
}

/// Counts and logs an ejection.
pub(super) fn report<H: RootHost>(host: &H, ejection: Option<Ejection>) {
    if let Some(e) = ejection {
        host.increment(Counter::Ejection);
        host.count_pod(&e.pod, PodEvent::Ejected);
        host.log(Level::Warn, &format!("pd-router: {}", e.message));
    }
}

impl Scraper {
    /// Counter readings of pods that left make no rate any more.
    pub fn forget_departed(&mut self, live: &[PodId]) {
        self.previous.retain(|id, _| live.contains(id));
    }

    /// Scrapes every pod when the interval has passed, no scrape is still
    /// in flight (each is bounded by its timeout), and this VM holds the
    /// lease.
    pub fn maybe_scrape<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        vm_id: u64,
        now: u64,
    ) {
        let interval = router.config.scrape.interval_ms;
        if interval == 0
            || !self.in_flight.is_empty()
            || now.saturating_sub(self.last_scrape_ms) < interval
        {
            return;
        }
        let key = router.keys().scrape_lease();
        let ttl = interval.saturating_mul(3).max(1000);
        if lease::try_hold(host, &key, vm_id, now, ttl) {
            self.scrape(host, router, now);
        }
    }

    fn scrape<H: RootHost>(&mut self, host: &mut H, router: &Router, now: u64) {
        let config = &router.config;
        self.last_scrape_ms = now;
        for pod in router.fleet().pods() {
            let headers = [
                (":method", "GET"),
                (":path", config.scrape.path.as_str()),
                (":authority", pod.address.as_str()),
                (config.routing.header.as_str(), pod.address.as_str()),
            ];
            match host.dispatch(&config.scrape.cluster, &headers, config.scrape.timeout_ms) {
                Ok(token) => {
                    let own = router.own_in_flight(&*host, &pod);
                    self.in_flight.insert(token, (pod, own));
                }
                Err(e) => host.log(
                    Level::Warn,
                    &format!(
                        "pd-router: could not scrape {} through cluster {:?}: {}",
                        pod.address, config.scrape.cluster, e.status
                    ),
                ),
            }
        }
    }

    /// A scrape answered, or failed.
    pub fn on_answer<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        token: u32,
        status: Option<u16>,
        body_size: usize,
    ) {
        let Some((pod, own_at_send)) = self.in_flight.remove(&token) else {
            return;
        };
        let now = host.now_ms();
        match status {
            Some(200) => self.scraped(host, router, &pod, own_at_send, now, body_size),
            // Scrapes share the prefill cluster's circuit breaker by default,
            // and its pooled connections: a breaker that is full, or a
            // keep-alive connection the pod closed as the scrape went out,
            // says nothing of the pod. The next scrape judges it.
            Some(503) if envoy_not_the_pod(host, body_size) => {
                let msg = format!(
                    "pd-router: scrape of {} not answered by the pod (Envoy's circuit breaker or a closed keep-alive connection); not judged",
                    pod.address
                );
                host.log(Level::Debug, &msg);
            }
            status => {
                let why = status.map_or("no answer".to_owned(), |s| format!("status {s}"));
                scrape_failed(host, router, &pod, now, &why);
            }
        }
    }

    /// `own_at_send`: this Envoy's decodes and prefills on the pod when the
    /// scrape left.
    fn scraped<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        pod: &Endpoint,
        own_at_send: (u32, u32),
        now: u64,
        body_size: usize,
    ) {
        let body = host.call_answer_body(body_size, MAX_METRICS_BYTES);
        let parsed = parse_engine_metrics(&String::from_utf8_lossy(&body), None);
        let prev = self.previous.get(&pod.id).copied().unwrap_or_default();
        let (mut metrics, next) = scrape::observe(&prev, now, &parsed);
        self.previous.insert(pod.id, next);
        // The engine counted its running requests somewhere between the
        // scrape leaving and its answer: ours then were at most the larger.
        let (decodes, prefills) = router.own_in_flight(&*host, pod);
        metrics.own_running = decodes.max(own_at_send.0) as f64;
        metrics.own_prefills = prefills.max(own_at_send.1) as f64;
        let fleet = router.fleet();
        let _ = update_scraped(host, &router.keys().scraped(), |t| {
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

/// Whether a scrape's 503 is Envoy's own overflow or connection
/// termination rather than the pod's answer.
fn envoy_not_the_pod<H: RootHost>(host: &H, body_size: usize) -> bool {
    let body = host.call_answer_body(body_size, 1024);
    matches!(
        envoy_failure(&upstream_message(&body)),
        Some(EnvoyFailure::Overflow | EnvoyFailure::Terminated)
    )
}

/// A failed scrape says the pod is down: eject it and forget its metrics.
fn scrape_failed<H: RootHost>(host: &mut H, router: &Router, pod: &Endpoint, now: u64, why: &str) {
    let cause = format!("scrape failed ({why})");
    match router.judge_everywhere(host, pod, Verdict::Down, &cause, now) {
        Ok(ejection) => report(host, ejection),
        Err(e) => host.log(
            Level::Error,
            &format!("pd-router: could not update pod load: {e}"),
        ),
    }
    let _ = update_scraped(host, &router.keys().scraped(), |t| {
        t.remove(&pod.id);
    });
}

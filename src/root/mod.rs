//! The root side of a VM as plain code: the configuration read into a
//! router, and what each tick does (apply the published pod set, list pods,
//! learn Mooncake engine ids, scrape metrics), against a [`RootHost`] the
//! shell implements over Envoy and tests implement with a fake. Only the
//! VM that holds each lease lists, asks or scrapes; every VM applies what
//! the holders share.
//!
//! [`configure`] turns the plugin configuration into a [`Root`], [`scrape`],
//! [`discover`] and [`bootstrap`] hold each tick's work and the answers to
//! its calls.

pub mod bootstrap;
pub mod configure;
pub mod discover;
pub mod export;
pub mod host;
pub mod scrape;

use crate::fleet::PodId;
use crate::router::Router;
use bootstrap::Bootstrap;
use discover::Discoverer;
use export::Exporter;
use scrape::Scraper;
use std::rc::Rc;

pub use configure::{configure, Configured};
pub use host::RootHost;

/// One VM's root side once configured.
pub struct Root {
    pub router: Rc<Router>,
    /// Identifies this VM in the leases.
    vm_id: u64,
    scraper: Scraper,
    discovery: Option<Discoverer>,
    bootstrap: Bootstrap,
    exporter: Exporter,
}

impl Root {
    /// `vm_id` tells this VM's leases from other VMs'; `kube_token` is the
    /// API server's bearer token, if discovery has one.
    pub fn new(router: Rc<Router>, vm_id: u64, kube_token: Option<String>) -> Root {
        let discovery = router
            .config
            .discovery
            .clone()
            .map(|cfg| Discoverer::new(cfg, kube_token, vm_id));
        Root {
            router,
            vm_id,
            scraper: Scraper::default(),
            discovery,
            bootstrap: Bootstrap::default(),
            exporter: Exporter::default(),
        }
    }

    /// How often ticks come: as often as the most frequent of the scrape,
    /// the pod lists and admission's look at its queue, at most once a
    /// second and at least every 50 ms.
    pub fn tick_period_ms(&self) -> u64 {
        [
            self.router.config.scrape.interval_ms,
            self.discovery.as_ref().map_or(0, Discoverer::interval_ms),
            self.router.config.admission.map_or(0, |a| a.tick_ms),
        ]
        .into_iter()
        .filter(|i| *i > 0)
        .fold(1000, u64::min)
        .max(50)
    }

    /// One tick: every VM applies what was shared; lease holders start the
    /// calls that are due.
    pub fn on_tick<H: RootHost>(&mut self, host: &mut H) {
        let router = Rc::clone(&self.router);
        let now = host.now_ms();
        if let Err(warning) = router.renew_lease(host, now) {
            host.log(crate::host::Level::Warn, &warning);
        }
        if let Some(d) = self.discovery.as_mut() {
            if d.apply(host, &router) {
                // Counter readings of pods that left make no rate any more.
                let live: Vec<PodId> = router.fleet().pods().iter().map(|p| p.id).collect();
                self.scraper.forget_departed(&live);
            }
            d.maybe_list(host, &router, self.vm_id, now);
            d.report_age(host, &router, now);
        }
        self.bootstrap.refresh(host, &router);
        self.bootstrap.ask(host, &router, self.vm_id, now);
        router.refresh_metrics(&*host);
        self.publish_gauges(host, now);
        self.scraper.maybe_scrape(host, &router, self.vm_id, now);
        self.exporter.send(host, &router, now);
    }

    fn publish_gauges<H: RootHost>(&self, host: &H, now: u64) {
        let counters = self.router.pod_counters(host);
        for (pod, c) in &counters {
            host.record_pod(
                &pod.name,
                c.outstanding_prefills,
                c.pending_decodes,
                c.is_healthy(now),
            );
        }
        if self.discovery.is_some() {
            let live = counters.iter().map(|(p, _)| p.name.as_str()).collect();
            host.zero_departed(&live);
        }
    }

    /// A call this VM's root side made answered (`status` is `None` when
    /// it came with no headers at all).
    pub fn on_call_answer<H: RootHost>(
        &mut self,
        host: &mut H,
        token: u32,
        status: Option<u16>,
        body_size: usize,
    ) {
        let router = Rc::clone(&self.router);
        if self.bootstrap.owns(token) {
            self.bootstrap
                .on_answer(host, &router, token, status, body_size);
        } else if self.exporter.owns(token) {
            self.exporter.on_answer(host, &router, token, status);
        } else if let Some(d) = self.discovery.as_mut().filter(|d| d.owns(token)) {
            d.on_answer(host, &router, status, body_size);
        } else {
            self.scraper
                .on_answer(host, &router, token, status, body_size);
        }
    }
}

#[cfg(test)]
mod tests;

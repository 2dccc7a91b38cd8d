//! The load book as the flow, the scrape loop and the tests reach it: the
//! router opens `crate::load::Book` with its slot, lease and fleet.

use super::Router;
use crate::fleet::{Endpoint, ModelId, PodId};
use crate::load::Verdict;
use crate::load::{Book, Ejection, HeldLoad, LoadTable, PodCounters};
use crate::pods::SharedStore;
use std::rc::Rc;

impl Router {
    /// This VM's view of the load records.
    pub fn book(&self) -> Book<'_> {
        Book {
            keys: self.keys(),
            slot: self.lease.slot(),
            holder: self.lease.holder(),
            lease_clock: self.lease.clock(),
            fleet: self.fleet(),
            health: self.config.health,
        }
    }

    /// One model's load table over the whole Envoy.
    pub fn load<S: SharedStore + ?Sized>(&self, store: &S, model: ModelId) -> LoadTable {
        self.book().load(store, model)
    }

    /// Moves this VM's records to `slot`, its new lease.
    pub(super) fn move_records<S: SharedStore + ?Sized>(&self, store: &mut S, slot: u8) {
        self.book().move_records(store, slot);
        self.lease.move_to(slot);
    }

    /// Every pod of the fleet with its counters: for gauges and tests.
    pub fn pod_counters<S: SharedStore + ?Sized>(
        &self,
        store: &S,
    ) -> Vec<(Rc<Endpoint>, PodCounters)> {
        self.book().pod_counters(store)
    }

    /// The counters of every pod, in the fleet's order.
    pub fn counters<S: SharedStore + ?Sized>(&self, store: &S) -> Vec<PodCounters> {
        self.book().counters(store)
    }

    /// Takes load on the chosen pods.
    pub fn hold<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        held: HeldLoad,
        now_ms: u64,
    ) -> Result<(), String> {
        self.book().hold(store, held, now_ms)
    }

    /// Gives back `released` load and applies what a prefill answer said
    /// about its pod.
    pub fn release<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        released: HeldLoad,
        judged: Option<(&Endpoint, Verdict, &str)>,
        now_ms: u64,
    ) -> Result<Option<Ejection>, String> {
        self.book().release(store, released, judged, now_ms)
    }

    /// Applies a hand-off's verdict to its prefill/decode pair.
    pub fn judge_pair<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        model: ModelId,
        pair: (PodId, PodId),
        verdict: Verdict,
        now_ms: u64,
    ) -> Result<bool, String> {
        self.book().judge_pair(store, model, pair, verdict, now_ms)
    }

    /// Applies `verdict` to `pod` in every model that serves it.
    pub fn judge_everywhere<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        pod: &Endpoint,
        verdict: Verdict,
        cause: &str,
        now_ms: u64,
    ) -> Result<Option<Ejection>, String> {
        self.book()
            .judge_everywhere(store, pod, verdict, cause, now_ms)
    }

    /// The (decodes, prefills) this Envoy has in flight on `pod`.
    pub fn own_in_flight<S: SharedStore + ?Sized>(&self, store: &S, pod: &Endpoint) -> (u32, u32) {
        self.book().own_in_flight(store, pod)
    }

    /// The queue `pod`'s engine reported at its last fresh scrape (running
    /// plus waiting), 0 when there is none: how encoder pods, whose calls
    /// the router does not hold load for, are told apart by load.
    pub fn scraped_queue(&self, pod: &Endpoint, now_ms: u64) -> f64 {
        self.copies
            .scraped()
            .get(&pod.id)
            .and_then(|m| m.fresh(now_ms, self.config.scrape.ttl_ms))
            .map_or(0.0, |m| m.running + m.waiting)
    }

    /// Whether `pod` is healthy in every model that serves it.
    pub fn is_healthy<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        pod: &Endpoint,
        now_ms: u64,
    ) -> bool {
        self.book().is_healthy(store, pod, now_ms)
    }

    /// The prefills this Envoy has in flight on `pod`, over every model.
    #[cfg(test)]
    pub fn own_prefills<S: SharedStore + ?Sized>(&self, store: &S, pod: &Endpoint) -> u32 {
        self.book().own_prefills(store, pod)
    }

    /// The decodes this Envoy has in flight on `pod`, over every model.
    #[cfg(test)]
    pub fn own_decodes<S: SharedStore + ?Sized>(&self, store: &S, pod: &Endpoint) -> u32 {
        self.book().own_decodes(store, pod)
    }
}

//! The per-VM router: the validated configuration, the fleet as known now,
//! and what the router remembers between requests. Load, health and prefix
//! entries live in Envoy shared data, keyed by pod identity, and are reached
//! through here by the flow and the scrape loop alike.
//!
//! The VM's parts, each a file beside this one: its round-robin turns,
//! worker lease, tick copies of the shared tables, log-once lines; the
//! admission waitlist and learned Mooncake ids are the features' own
//! (`crate::admission`, `crate::mooncake`). `placement.rs` chooses a split
//! request's pods, [`unsplit`] the pod of a request that is not split;
//! `admission.rs` and `load.rs` hand those features the VM's parts.

mod admission;
mod copies;
pub mod if_available;
mod lease;
mod load;
mod log_once;
pub mod picked;
mod placement;
pub mod spans;
mod turns;
pub mod unsplit;

use crate::config::Config;
use crate::engine::Registry;
use crate::fleet::{Connector, Fleet, ModelId, PodId};
use crate::handoff::LearnedPods;
use crate::load::HealthRule;
use crate::pods::{SharedKeys, SharedStore};
use crate::split::SplitContext;
use crate::trt_id::{DisaggIdGenerator, InvalidMachineId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// Per-VM state shared by every stream of the VM.
pub struct Router {
    pub config: Config,
    pub registry: Registry,
    keys: SharedKeys,
    fleet: RefCell<Rc<Fleet>>,
    /// The global KV connector (AIBrix's `SetConnectorTypeFunc`): the
    /// configuration's `kv_connector` until set otherwise.
    kv_connector: Cell<Connector>,
    /// Round-robin turns over pods.
    turns: turns::Turns,
    trt_ids: RefCell<DisaggIdGenerator>,
    /// This VM's worker slot.
    lease: lease::WorkerLease,
    /// The shared tables copied at the last tick.
    copies: copies::TickCopies,
    /// Mooncake engine ids per prefill pod, copied from shared data each tick.
    learned: crate::mooncake::Learned,
    /// TensorRT-LLM's `internal_request_auth_key`, from the VM environment.
    trt_auth_key: Option<Vec<u8>>,
    /// Log lines said once per pod, or once a minute.
    log_once: log_once::LogOnce,
    /// This VM's part of admission control.
    pub(crate) admission: crate::admission::Waitlist,
    /// Finished spans waiting for export (tracing).
    pub spans: spans::Spans,
}

impl Router {
    /// `worker_slot` keeps TensorRT-LLM ids of this VM apart from other
    /// workers' (see [`crate::trt_id`]).
    pub fn new(config: Config, worker_slot: u8) -> Result<Router, InvalidMachineId> {
        Router::leased(config, worker_slot, u64::from(worker_slot) + 1, 0)
    }

    /// A router whose VM leased `worker_slot` as `holder` at `now_ms`.
    pub fn leased(
        config: Config,
        worker_slot: u8,
        holder: u64,
        now_ms: u64,
    ) -> Result<Router, InvalidMachineId> {
        let trt_ids = DisaggIdGenerator::new(config.trt.machine_id, worker_slot)?;
        Ok(Router {
            registry: Registry::builtin(),
            keys: SharedKeys::new(&config.fingerprint),
            fleet: RefCell::new(Rc::new(config.fleet())),
            kv_connector: Cell::new(config.kv_connector),
            turns: Default::default(),
            trt_ids: RefCell::new(trt_ids),
            lease: lease::WorkerLease::new(worker_slot, holder, now_ms),
            copies: Default::default(),
            log_once: Default::default(),
            admission: Default::default(),
            learned: Default::default(),
            trt_auth_key: None,
            spans: spans::Spans::new(config.tracing.as_ref()),
            config,
        })
    }

    pub fn worker_slot(&self) -> u8 {
        self.lease.slot()
    }

    /// Gives this VM's slot back (the VM is stopping).
    pub fn release_lease<S: SharedStore + ?Sized>(&self, store: &mut S) {
        self.lease.release(store);
    }

    /// Renews this VM's slot lease (each tick). A VM stalled past its lease
    /// whose slot another VM took moves to a free slot, with its load
    /// records and TensorRT-LLM ids; `Err` when no slot could be had (the
    /// VM keeps writing under its old one and says so).
    pub fn renew_lease<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        now_ms: u64,
    ) -> Result<(), String> {
        let old = self.lease.slot();
        let slot = self.lease.renew(store, now_ms)?;
        if slot != old {
            self.move_records(store, slot);
            if let Ok(ids) = DisaggIdGenerator::new(self.config.trt.machine_id, slot) {
                *self.trt_ids.borrow_mut() = ids;
            }
        }
        Ok(())
    }

    /// Whether this VM's copy of the pair table knows the pair as failing.
    pub fn pair_failing(&self, model: ModelId, prefill: PodId, decode: PodId) -> bool {
        self.copies.pair_failing(model, prefill, decode)
    }

    /// The fleet as known now.
    pub fn fleet(&self) -> Rc<Fleet> {
        Rc::clone(&self.fleet.borrow())
    }

    /// Replaces the pod set. Requests in flight keep the endpoints they were
    /// placed on and give their load back to them; shared rows of pods that
    /// left drain and are dropped by later updates.
    pub fn set_fleet(&self, fleet: Fleet) {
        // Pods churn for the life of the process (each re-created pod is a
        // new identity): keep only what is logged of pods still here.
        let here: std::collections::HashSet<PodId> = fleet.pods().iter().map(|p| p.id).collect();
        self.log_once.keep_pods(&here);
        *self.fleet.borrow_mut() = Rc::new(fleet);
    }

    /// Sets the KV connector used when neither the prefill pod nor the model
    /// names one.
    pub fn set_connector_type(&self, connector: Connector) {
        self.kv_connector.set(connector);
    }

    pub fn connector_type(&self) -> Connector {
        self.kv_connector.get()
    }

    pub fn keys(&self) -> &SharedKeys {
        &self.keys
    }

    pub fn health_rule(&self) -> HealthRule {
        self.config.health
    }

    /// What a split sees of this router, over `fleet` and what it
    /// `learned` of the pods ([`Router::learned`]).
    pub fn view<'a>(&'a self, fleet: &'a Fleet, learned: &'a LearnedPods) -> SplitContext<'a> {
        SplitContext {
            fleet,
            registry: &self.registry,
            default_connector: self.kv_connector.get(),
            scheduling: &self.config.scheduling,
            learned,
            trt_auth_key: self.trt_auth_key.as_deref(),
        }
    }

    /// What this VM learned of the pods so far (a snapshot).
    pub fn learned(&self) -> Rc<LearnedPods> {
        self.learned.snapshot()
    }

    /// Sets the key TensorRT-LLM generation requests are signed with.
    pub fn set_trt_auth_key(&mut self, key: Option<Vec<u8>>) {
        self.trt_auth_key = key.filter(|k| !k.is_empty());
    }

    /// Replaces what the asked prefill pods said (Mooncake engine ids,
    /// TensorRT-LLM server info).
    pub fn set_learned(&self, engines: HashMap<PodId, Vec<String>>) {
        self.learned.set(engines);
    }

    /// Reads what the asked prefill pods said afresh from shared data; true
    /// when they changed.
    pub fn reread_learned<S: SharedStore + ?Sized>(&self, store: &S) -> bool {
        self.learned.reread(store, &self.keys.mooncake_engines())
    }

    /// What the asked prefill pods said, as this VM knows it.
    pub fn learned_known(&self) -> HashMap<PodId, Vec<String>> {
        self.learned.known()
    }

    /// The prefill pods whose hand-off needs what they say about themselves.
    pub fn asked_prefill_pods(&self) -> Vec<crate::mooncake::AskedPod> {
        crate::mooncake::prefill_pods(&self.fleet(), self.kv_connector.get())
    }

    /// `model`'s next-turn KV handles in shared data.
    pub fn kv_handles(
        &self,
        model: &crate::fleet::Model,
        reuse: crate::fleet::KvReuse,
    ) -> crate::reuse::HandleStore<'_> {
        crate::reuse::HandleStore {
            keys: &self.keys,
            model: model.id,
            max_entries: reuse.max_entries,
        }
    }

    /// Whether this VM sees `what` about `pod` for the first time.
    pub fn first_time(&self, pod: PodId, what: &'static str) -> bool {
        self.log_once.first_time(pod, what)
    }

    /// Whether a request without the endpoint picker's pick is to be logged
    /// at `now_ms`: the first one, then one a minute per VM (each is counted).
    pub fn pick_missing_log_due(&self, now_ms: u64) -> bool {
        self.log_once.pick_missing_due(now_ms)
    }

    /// How many "once per pod" lines this VM remembers.
    #[cfg(test)]
    fn logged_len(&self) -> usize {
        self.log_once.len()
    }

    /// The turn of the next request that is not split.
    pub fn next_unsplit_turn(&self) -> u64 {
        self.turns.next_unsplit()
    }

    /// The next TensorRT-LLM disagg request id at `now_ms`.
    pub fn next_disagg_id(&self, now_ms: u64) -> i64 {
        self.trt_ids.borrow_mut().next_id(now_ms)
    }

    /// Copies the shared metrics table into this VM (once per tick, not per
    /// request: metrics change only as often as they are scraped).
    pub fn refresh_metrics<S: SharedStore + ?Sized>(&self, store: &S) {
        self.copies.refresh(store, &self.keys, &self.fleet());
    }
}

#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;

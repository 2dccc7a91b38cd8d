//! The per-VM router: the validated configuration, the fleet as known now,
//! and what the router remembers between requests. Load, health and prefix
//! entries live in Envoy shared data, keyed by pod identity, and are reached
//! through here by the flow and the scrape loop alike.

use crate::config::Config;
use crate::engine::Registry;
use crate::error::PdError;
use crate::fleet::{Connector, Endpoint, EngineKind, Fleet, Model, ModelId, PodId, PrefillPolicy};
use crate::pods::{
    decode_scraped, update_load, HealthRule, LoadTable, PodCounters, ScrapedTable, SharedKeys,
    SharedStore, Verdict,
};
use crate::sched::prefix::{self, PrefixEntry, PrefixMatch};
use crate::sched::{schedule, Decision, LoadBound, NoPod, PlacementRequest, PodState, SplitMix64};
use crate::split::{Placement, RouterView, SplitRequest};
use crate::trt_id::{DisaggIdGenerator, InvalidMachineId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// Per-VM state shared by every stream of the VM.
pub struct Router {
    pub config: Config,
    pub registry: Registry,
    keys: SharedKeys,
    health: HealthRule,
    fleet: RefCell<Rc<Fleet>>,
    /// The global KV connector (AIBrix's `SetConnectorTypeFunc`): the
    /// configuration's `kv_connector` until set otherwise.
    kv_connector: Cell<Connector>,
    /// Round-robin turns: over each model's prefill pods, and over each
    /// roleset's decode pods (by model and roleset name).
    turns: RefCell<HashMap<ModelId, u64>>,
    decode_turns: RefCell<HashMap<(ModelId, String), u64>>,
    unsplit_turn: Cell<u64>,
    trt_ids: RefCell<DisaggIdGenerator>,
    /// This VM's copy of the scraped metrics, refreshed on each tick.
    scraped: RefCell<ScrapedTable>,
    /// Mooncake engine ids per prefill pod, copied from shared data each tick.
    mooncake: RefCell<HashMap<PodId, Vec<String>>>,
    /// TensorRT-LLM's `internal_request_auth_key`, from the VM environment.
    trt_auth_key: Option<Vec<u8>>,
    /// (pod, what) pairs already logged, for "once per pod" log lines.
    logged: RefCell<std::collections::HashSet<(PodId, &'static str)>>,
}

impl crate::engine::LearnedPods for Router {
    fn mooncake_engines(&self, pod: PodId) -> Option<Vec<String>> {
        self.mooncake.borrow().get(&pod).cloned()
    }
}

/// Load a stream holds, to give back exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLoad {
    pub model: ModelId,
    pub prefill: Option<PodId>,
    pub decode: Option<PodId>,
}

/// A pod a judgement ejected: what to count and log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ejection {
    pub pod: String,
    pub message: String,
}

impl Router {
    /// `worker_slot` keeps TensorRT-LLM ids of this VM apart from other
    /// workers' (see [`crate::trt_id`]).
    pub fn new(config: Config, worker_slot: u8) -> Result<Router, InvalidMachineId> {
        let trt_ids = DisaggIdGenerator::new(config.trt_machine_id, worker_slot)?;
        Ok(Router {
            registry: Registry::builtin(),
            keys: SharedKeys::new(&config.fingerprint),
            health: HealthRule {
                cooldown_ms: config.unhealthy_cooldown_ms,
                eject_after_failures: config.eject_after_failures,
            },
            fleet: RefCell::new(Rc::new(config.fleet())),
            kv_connector: Cell::new(config.kv_connector),
            turns: RefCell::new(HashMap::new()),
            decode_turns: RefCell::new(HashMap::new()),
            unsplit_turn: Cell::new(0),
            trt_ids: RefCell::new(trt_ids),
            scraped: RefCell::new(ScrapedTable::new()),
            logged: RefCell::new(std::collections::HashSet::new()),
            mooncake: RefCell::new(HashMap::new()),
            trt_auth_key: None,
            config,
        })
    }

    /// The fleet as known now.
    pub fn fleet(&self) -> Rc<Fleet> {
        Rc::clone(&self.fleet.borrow())
    }

    /// Replaces the pod set. Requests in flight keep the endpoints they were
    /// placed on and give their load back to them; shared rows of pods that
    /// left drain and are dropped by later updates.
    pub fn set_fleet(&self, fleet: Fleet) {
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
        self.health
    }

    /// What a split sees of this router, over `fleet`.
    pub fn view<'a>(&'a self, fleet: &'a Fleet) -> RouterView<'a> {
        RouterView {
            fleet,
            registry: &self.registry,
            default_connector: self.kv_connector.get(),
            scheduling: &self.config.scheduling,
            learned: self,
            trt_auth_key: self.trt_auth_key.as_deref(),
        }
    }

    /// Sets the key TensorRT-LLM generation requests are signed with.
    pub fn set_trt_auth_key(&mut self, key: Option<Vec<u8>>) {
        self.trt_auth_key = key.filter(|k| !k.is_empty());
    }

    /// Replaces the learned Mooncake engine ids.
    pub fn set_mooncake_engines(&self, engines: HashMap<PodId, Vec<String>>) {
        *self.mooncake.borrow_mut() = engines;
    }

    /// The Mooncake engine ids this VM knows.
    pub fn mooncake_engines_known(&self) -> HashMap<PodId, Vec<String>> {
        self.mooncake.borrow().clone()
    }

    /// The prefill pods whose hand-off needs their Mooncake engine ids.
    pub fn mooncake_prefill_pods(&self) -> Vec<Rc<Endpoint>> {
        let fleet = self.fleet();
        let global = self.kv_connector.get();
        let mut out: Vec<Rc<Endpoint>> = Vec::new();
        for m in fleet.models().iter().filter(|m| m.kind == EngineKind::Vllm) {
            for e in m.rolesets.iter().flat_map(|r| r.prefill.iter()) {
                if e.connector(m.kv_connector, global) == Connector::Mooncake
                    && !out.iter().any(|o| o.id == e.id)
                {
                    out.push(Rc::clone(e));
                }
            }
        }
        out
    }

    /// Copies the shared metrics table into this VM (once per tick, not per
    /// request: metrics change only as often as they are scraped).
    pub fn refresh_metrics<S: SharedStore + ?Sized>(&self, store: &S) {
        let (bytes, _) = store.shared_get(&self.keys.scraped());
        *self.scraped.borrow_mut() = decode_scraped(bytes.as_deref());
    }

    /// One model's shared load table.
    pub fn load<S: SharedStore + ?Sized>(&self, store: &S, model: ModelId) -> LoadTable {
        let (bytes, _) = store.shared_get(&self.keys.load(model));
        LoadTable::decode(bytes.as_deref())
    }

    /// Every pod of the fleet with its counters (summed over the models that
    /// name it), in order of first mention: for gauges and tests.
    pub fn pod_counters<S: SharedStore + ?Sized>(
        &self,
        store: &S,
    ) -> Vec<(Rc<Endpoint>, PodCounters)> {
        let fleet = self.fleet();
        let tables: Vec<LoadTable> = fleet
            .models()
            .iter()
            .map(|m| self.load(store, m.id))
            .collect();
        fleet
            .pods()
            .into_iter()
            .map(|ep| {
                let mut sum = PodCounters::default();
                for t in &tables {
                    let c = t.get(ep.id);
                    sum.outstanding_prefills += c.outstanding_prefills;
                    sum.pending_decodes += c.pending_decodes;
                    sum.unhealthy_until_ms = sum.unhealthy_until_ms.max(c.unhealthy_until_ms);
                    sum.failures = sum.failures.max(c.failures);
                }
                (ep, sum)
            })
            .collect()
    }

    /// The counters of every pod, in the fleet's order.
    pub fn counters<S: SharedStore + ?Sized>(&self, store: &S) -> Vec<PodCounters> {
        self.pod_counters(store)
            .into_iter()
            .map(|(_, c)| c)
            .collect()
    }

    /// The scheduler's view of `model`'s pods, by slot.
    fn pod_states(&self, model: &Model, table: &LoadTable, now_ms: u64) -> Vec<PodState> {
        let scraped = self.scraped.borrow();
        let mut states: Vec<PodState> = model
            .pods
            .iter()
            .map(|id| {
                let c = table.get(*id);
                PodState {
                    outstanding_prefills: c.outstanding_prefills,
                    pending_decodes: c.pending_decodes,
                    unhealthy: !c.is_healthy(now_ms),
                    not_ready_for_prefill: false,
                    metrics: scraped
                        .get(id)
                        .and_then(|m| m.fresh(now_ms, self.config.metrics_ttl_ms)),
                }
            })
            .collect();
        let handler = self.registry.resolve(&model.engine);
        let global = self.kv_connector.get();
        for e in model.rolesets.iter().flat_map(|r| r.prefill.iter()) {
            let connector = e.connector(model.kv_connector, global);
            if !handler.prefill_ready(e, connector, self) {
                if let Some(s) = states.get_mut(e.slot) {
                    s.not_ready_for_prefill = true;
                }
            }
        }
        states
    }

    fn next_turn(&self, model: ModelId) -> u64 {
        let mut turns = self.turns.borrow_mut();
        let t = turns.entry(model).or_insert(0);
        let v = *t;
        *t = v.wrapping_add(1);
        v
    }

    fn next_decode_turn(&self, model: &Model, roleset: usize) -> u64 {
        let name = model.rolesets.get(roleset).map_or("", |r| r.name.as_str());
        let mut turns = self.decode_turns.borrow_mut();
        let t = turns.entry((model.id, name.to_owned())).or_insert(0);
        let v = *t;
        *t = v.wrapping_add(1);
        v
    }

    /// Whether this VM sees `what` about `pod` for the first time (the set
    /// is bounded by pods × a handful of log lines).
    pub fn first_time(&self, pod: PodId, what: &'static str) -> bool {
        self.logged.borrow_mut().insert((pod, what))
    }

    /// The turn of the next request that is not split.
    pub fn next_unsplit_turn(&self) -> u64 {
        let t = self.unsplit_turn.get();
        self.unsplit_turn.set(t.wrapping_add(1));
        t
    }

    /// The next TensorRT-LLM disagg request id at `now_ms`.
    pub fn next_disagg_id(&self, now_ms: u64) -> i64 {
        self.trt_ids.borrow_mut().next_id(now_ms)
    }

    /// Chooses pods for `request` from the shared load and the prefix table.
    pub fn place<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        request: &SplitRequest,
        exclude: &[PodId],
        random: &mut dyn FnMut(&mut S) -> u64,
        now_ms: u64,
    ) -> Result<Placement, PdError> {
        let model = &request.model;
        let s = &self.config.scheduling;
        // Only the prefix-cache policy reads the table (consistent hashing
        // needs no memory of where prompts went).
        let remembered: &[u64] = if model.prefill_policy == PrefillPolicy::PrefixCache {
            &request.prompt.hashes
        } else {
            &[]
        };
        let found = prefix::walk(
            remembered,
            |h| {
                let key = self
                    .keys
                    .prefix_slot(prefix::slot_of(h, s.prefix_table_slots));
                let (v, _) = store.shared_get(&key);
                v.as_deref().and_then(PrefixEntry::decode)
            },
            now_ms,
            s.prefix_ttl_ms,
        );
        let table = self.load(&*store, model.id);
        let pods = self.pod_states(model, &table, now_ms);
        let excluded: Vec<usize> = model
            .pods
            .iter()
            .enumerate()
            .filter(|(_, id)| exclude.contains(id))
            .map(|(slot, _)| slot)
            .collect();
        let match_of = |slot: usize| model.pods.get(slot).map_or(0.0, |id| found.percent(*id));
        // Seeded from the host at the first draw: a placement with one
        // candidate pair needs no randomness and costs no host call.
        let mut rng: Option<SplitMix64> = None;
        let mut draw = || {
            rng.get_or_insert_with(|| SplitMix64(random(&mut *store)))
                .next_u64()
        };
        let mut decode_turn = |roleset: usize| self.next_decode_turn(model, roleset);
        let key_block = s.consistent_hash_blocks.min(request.prompt.hashes.len());
        let mut query = PlacementRequest {
            prompt_tokens: request.prompt.tokens,
            prefix_match: &match_of,
            prefix_key: key_block
                .checked_sub(1)
                .and_then(|i| request.prompt.hashes.get(i))
                .copied(),
            load_bound: LoadBound::of(s),
            prefill_turn: self.next_turn(model.id),
            decode_turn: &mut decode_turn,
            random: &mut draw,
            exclude: &excluded,
        };
        match schedule(model, &pods, &mut query, s) {
            Decision::Split {
                prefill,
                decode,
                reason,
            } => Ok(Placement::Split {
                prefill: Rc::clone(prefill),
                decode: Rc::clone(decode),
                reason,
                prefix: found,
            }),
            Decision::Combined { pod, reason } => Ok(Placement::Combined {
                pod: Rc::clone(pod),
                reason,
            }),
            Decision::NoPod(NoPod::NotConfigured) => Err(PdError::NoEndpoint {
                model: model.name.clone(),
            }),
            Decision::NoPod(NoPod::AllUnhealthy) => Err(PdError::Unavailable(format!(
                "every prefill/decode pod of model `{}` is unhealthy, not ready (a Mooncake prefill's engine id not known yet, a NIXL push prefill without its side channel) or failed this request; retry later",
                model.name
            ))),
            Decision::NoPod(NoPod::NoBucket) => Err(PdError::Unavailable(format!(
                "no pod of model `{}` serves prompts of about {} tokens",
                model.name, request.prompt.tokens
            ))),
        }
    }

    /// Records `pod` as the holder of the prompt's blocks it does not hold
    /// yet. Last writer wins: the table is a hint, not an account.
    pub fn remember_prefix<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        request: &SplitRequest,
        found: &PrefixMatch,
        pod: PodId,
        now_ms: u64,
    ) {
        let hashes = &request.prompt.hashes;
        if hashes.is_empty() || request.model.prefill_policy != PrefillPolicy::PrefixCache {
            return;
        }
        let held = if found.percent(pod) > 0.0 {
            found.depth
        } else {
            0
        };
        let slots = self.config.scheduling.prefix_table_slots;
        for h in prefix::to_record(hashes, held) {
            let entry = PrefixEntry {
                hash: h,
                pod,
                at_ms: now_ms,
            };
            let key = self.keys.prefix_slot(prefix::slot_of(h, slots));
            let _ = store.shared_set(&key, &entry.encode(), None);
        }
    }

    /// Whether a pod is still one of `model`'s.
    fn is_live(&self, model: ModelId) -> impl Fn(PodId) -> bool {
        let model = self
            .fleet()
            .models()
            .iter()
            .find(|m| m.id == model)
            .cloned();
        move |id| model.as_ref().is_some_and(|m| m.pods.contains(&id))
    }

    /// Takes load on the chosen pods.
    pub fn hold<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        held: HeldLoad,
        now_ms: u64,
    ) -> Result<(), String> {
        let live = self.is_live(held.model);
        update_load(store, &self.keys.load(held.model), |t| {
            if let Some(p) = held.prefill {
                t.update(p, |c| {
                    c.outstanding_prefills = c.outstanding_prefills.saturating_add(1)
                });
            }
            if let Some(d) = held.decode {
                t.update(d, |c| {
                    c.pending_decodes = c.pending_decodes.saturating_add(1)
                });
            }
            t.prune(now_ms, &live);
        })
        .map(|_| ())
    }

    /// Gives back `released` load and applies what a prefill answer said
    /// about its pod (`judged`), in one shared-data update.
    pub fn release<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        released: HeldLoad,
        judged: Option<(&Endpoint, Verdict, &str)>,
        now_ms: u64,
    ) -> Result<Option<Ejection>, String> {
        let live = self.is_live(released.model);
        let rule = self.health;
        let mut ejected = false;
        update_load(store, &self.keys.load(released.model), |t| {
            ejected = false;
            if let Some(p) = released.prefill {
                t.update_existing(p, |c| {
                    c.outstanding_prefills = c.outstanding_prefills.saturating_sub(1)
                });
            }
            if let Some(d) = released.decode {
                t.update_existing(d, |c| {
                    c.pending_decodes = c.pending_decodes.saturating_sub(1)
                });
            }
            if let Some((pod, verdict, _)) = judged {
                let judge = |c: &mut PodCounters| ejected = rule.judge(c, verdict, now_ms);
                if live(pod.id) {
                    t.update(pod.id, judge);
                } else {
                    t.update_existing(pod.id, judge);
                }
            }
            t.prune(now_ms, &live);
        })?;
        Ok(judged.filter(|_| ejected).map(|(pod, _, cause)| Ejection {
            pod: pod.name.clone(),
            message: rule.message(&pod.name, cause),
        }))
    }

    /// Applies `verdict` to `pod` in every model that serves it (a failed
    /// scrape says the pod is down, whichever model asked).
    pub fn judge_everywhere<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        pod: &Endpoint,
        verdict: Verdict,
        cause: &str,
        now_ms: u64,
    ) -> Result<Option<Ejection>, String> {
        let fleet = self.fleet();
        let rule = self.health;
        let mut any = false;
        for m in fleet.models().iter().filter(|m| m.pods.contains(&pod.id)) {
            let live = self.is_live(m.id);
            let mut ejected = false;
            update_load(store, &self.keys.load(m.id), |t| {
                t.update(pod.id, |c| ejected = rule.judge(c, verdict, now_ms));
                t.prune(now_ms, &live);
            })?;
            any |= ejected;
        }
        Ok(any.then(|| Ejection {
            pod: pod.name.clone(),
            message: rule.message(&pod.name, cause),
        }))
    }

    /// The decodes this Envoy has in flight on `pod`, over every model.
    pub fn own_decodes<S: SharedStore + ?Sized>(&self, store: &S, pod: &Endpoint) -> u32 {
        self.fleet()
            .models()
            .iter()
            .filter(|m| m.pods.contains(&pod.id))
            .map(|m| self.load(store, m.id).get(pod.id).pending_decodes)
            .sum()
    }

    /// Whether `pod` is healthy in every model that serves it.
    pub fn is_healthy<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        pod: &Endpoint,
        now_ms: u64,
    ) -> bool {
        self.fleet()
            .models()
            .iter()
            .filter(|m| m.pods.contains(&pod.id))
            .all(|m| self.load(store, m.id).get(pod.id).is_healthy(now_ms))
    }
}

//! Load the router's requests hold on pods, given back exactly once, and
//! the health their answers and scrapes judge. Each VM writes its own
//! record per model, under its worker slot, and reads the others' (live
//! slots only), so every worker VM sees the same counts and no update is
//! lost to another VM's write.

use super::health::{HealthRule, Verdict};
use super::pairs::update_pairs;
use super::records::{LoadTable, PodCounters};
use crate::fleet::{Endpoint, Fleet, ModelId, PodId};
use crate::pods::slots::SlotTable;
use crate::pods::{SharedKeys, SharedStore, WORKER_SLOTS_KEY};
use std::rc::Rc;

/// Load a stream holds, to give back exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLoad {
    pub model: ModelId,
    pub prefill: Option<PodId>,
    /// The prompt tokens the prefill computes, as estimated at placement
    /// (weighed by their attention with `attention_tokens` set:
    /// [`crate::sched::prefill_work`]).
    pub prefill_tokens: u64,
    pub decode: Option<PodId>,
    /// The prefill pod of a split whose answer still streams (taken with
    /// the prefill, given back when the stream ends): the pod its
    /// conversation's next turn will find its history on.
    pub streaming: Option<PodId>,
}

/// A pod a judgement ejected: what to count and log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ejection {
    pub pod: String,
    pub message: String,
}

/// One VM's view of the load book: what it reads the records with and
/// writes its own under.
pub struct Book<'a> {
    pub keys: &'a SharedKeys,
    /// The VM's worker slot and its lease holder id: its own record's
    /// key and writer.
    pub slot: u8,
    pub holder: u64,
    /// When the VM last renewed its lease: other slots' leases are judged
    /// live at this time.
    pub lease_clock: u64,
    pub fleet: Rc<Fleet>,
    pub health: HealthRule,
}

impl Book<'_> {
    /// One model's load table over the whole Envoy: this VM's record and
    /// those of the other live worker slots. A record whose writer no longer
    /// holds its slot (a VM that stopped) counts for nothing.
    pub fn load<S: SharedStore + ?Sized>(&self, store: &S, model: ModelId) -> LoadTable {
        let mine = self.slot;
        let mut table = self.own_load(store, model);
        let (slots, _) = store.shared_get(WORKER_SLOTS_KEY);
        let Some(slots) = slots else {
            return table;
        };
        let now = self.lease_clock;
        for (slot, holder) in SlotTable::decode(Some(&slots)).live(now) {
            if slot == mine {
                continue;
            }
            let (bytes, _) = store.shared_get(&self.keys.load(model, slot));
            if let Some((writer, rows)) = bytes.as_deref().and_then(LoadTable::decode_record) {
                if writer == holder {
                    table.merge(&rows);
                }
            }
        }
        table
    }

    /// This VM's own record for `model` (empty if another VM wrote it last:
    /// the slot was someone else's before this VM leased it).
    fn own_load<S: SharedStore + ?Sized>(&self, store: &S, model: ModelId) -> LoadTable {
        let (bytes, _) = store.shared_get(&self.keys.load(model, self.slot));
        bytes
            .as_deref()
            .and_then(LoadTable::decode_record)
            .filter(|(writer, _)| *writer == self.holder)
            .map(|(_, t)| t)
            .unwrap_or_default()
    }

    /// Changes this VM's own record for `model`: it is the record's only
    /// writer, so a plain write (no CAS) loses nothing.
    fn update_own<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        model: ModelId,
        change: impl FnOnce(&mut LoadTable),
    ) -> Result<LoadTable, String> {
        let mut table = self.own_load(&*store, model);
        change(&mut table);
        store
            .shared_set(
                &self.keys.load(model, self.slot),
                &table.encode_record(self.holder),
                None,
            )
            .map_err(|e| format!("{e:?}"))?;
        Ok(table)
    }

    /// Writes this VM's records under `slot`, which its lease moved to (it
    /// was stalled past its lease and another VM took the old slot).
    pub fn move_records<S: SharedStore + ?Sized>(&self, store: &mut S, slot: u8) {
        let tables: Vec<(ModelId, LoadTable)> = self
            .fleet
            .models()
            .iter()
            .map(|m| (m.id, self.own_load(&*store, m.id)))
            .collect();
        for (model, table) in tables {
            let _ = store.shared_set(
                &self.keys.load(model, slot),
                &table.encode_record(self.holder),
                None,
            );
        }
    }

    /// Every pod of the fleet with its counters (summed over the models that
    /// name it), in order of first mention: for gauges and tests.
    pub fn pod_counters<S: SharedStore + ?Sized>(
        &self,
        store: &S,
    ) -> Vec<(Rc<Endpoint>, PodCounters)> {
        let fleet = &self.fleet;
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
                    sum.outstanding_prefill_tokens += c.outstanding_prefill_tokens;
                    sum.pending_decodes += c.pending_decodes;
                    sum.unhealthy_until_ms = sum.unhealthy_until_ms.max(c.unhealthy_until_ms);
                    sum.failures = sum.failures.max(c.failures);
                    sum.live_streams += c.live_streams;
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

    /// The failure streaks the other VMs' records hold for `pod`, where
    /// `verdict` needs them: only a failure's ejection depends on the streak
    /// (a request's common case, a success, reads nothing more).
    fn others_failures<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        model: ModelId,
        pod: PodId,
        verdict: Verdict,
    ) -> u32 {
        if verdict != Verdict::Failed {
            return 0;
        }
        let all = self.load(store, model).get(pod).failures;
        all.saturating_sub(self.own_load(store, model).get(pod).failures)
    }

    /// Whether a pod is still one of `model`'s.
    fn is_live(&self, model: ModelId) -> impl Fn(PodId) -> bool {
        let model = self.fleet.models().iter().find(|m| m.id == model).cloned();
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
        self.update_own(store, held.model, |t| {
            if let Some(p) = held.prefill {
                t.update(p, |c| {
                    c.outstanding_prefills = c.outstanding_prefills.saturating_add(1);
                    c.outstanding_prefill_tokens = c
                        .outstanding_prefill_tokens
                        .saturating_add(held.prefill_tokens);
                });
            }
            if let Some(d) = held.decode {
                t.update(d, |c| {
                    c.pending_decodes = c.pending_decodes.saturating_add(1)
                });
            }
            if let Some(p) = held.streaming {
                t.update(p, |c| c.live_streams = c.live_streams.saturating_add(1));
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
        // The other VMs' failure streaks on the judged pod count towards
        // its ejection too.
        let others = judged.map_or(0, |(pod, verdict, _)| {
            self.others_failures(&*store, released.model, pod.id, verdict)
        });
        self.update_own(store, released.model, |t| {
            if let Some(p) = released.prefill {
                t.update_existing(p, |c| {
                    c.outstanding_prefills = c.outstanding_prefills.saturating_sub(1);
                    c.outstanding_prefill_tokens = if c.outstanding_prefills == 0 {
                        0
                    } else {
                        c.outstanding_prefill_tokens
                            .saturating_sub(released.prefill_tokens)
                    };
                });
            }
            if let Some(d) = released.decode {
                t.update_existing(d, |c| {
                    c.pending_decodes = c.pending_decodes.saturating_sub(1)
                });
            }
            if let Some(p) = released.streaming {
                t.update_existing(p, |c| c.live_streams = c.live_streams.saturating_sub(1));
            }
            if let Some((pod, verdict, _)) = judged {
                let judge =
                    |c: &mut PodCounters| ejected = judge_with(rule, c, others, verdict, now_ms);
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

    /// Applies a hand-off's verdict to its prefill/decode pair; true when
    /// the pair is now avoided.
    pub fn judge_pair<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        model: ModelId,
        pair: (PodId, PodId),
        verdict: Verdict,
        now_ms: u64,
    ) -> Result<bool, String> {
        let rule = self.health;
        let mut avoided = false;
        update_pairs(store, &self.keys.pairs(model), |t| {
            avoided = t.judge(pair, verdict, &rule, now_ms);
        })?;
        Ok(avoided)
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
        let fleet = &self.fleet;
        let rule = self.health;
        let mut any = false;
        for m in fleet.models().iter().filter(|m| m.pods.contains(&pod.id)) {
            let live = self.is_live(m.id);
            let mut ejected = false;
            let others = self.others_failures(&*store, m.id, pod.id, verdict);
            self.update_own(store, m.id, |t| {
                t.update(pod.id, |c| {
                    ejected = judge_with(rule, c, others, verdict, now_ms)
                });
                t.prune(now_ms, &live);
            })?;
            any |= ejected;
        }
        Ok(any.then(|| Ejection {
            pod: pod.name.clone(),
            message: rule.message(&pod.name, cause),
        }))
    }

    /// The (decodes, prefills) this Envoy has in flight on `pod`, over every
    /// model: each model's table read once.
    pub fn own_in_flight<S: SharedStore + ?Sized>(&self, store: &S, pod: &Endpoint) -> (u32, u32) {
        self.fleet
            .models()
            .iter()
            .filter(|m| m.pods.contains(&pod.id))
            .map(|m| self.load(store, m.id).get(pod.id))
            .fold((0, 0), |(d, p), c| {
                (
                    d.saturating_add(c.pending_decodes),
                    p.saturating_add(c.outstanding_prefills),
                )
            })
    }

    /// The prefills this Envoy has in flight on `pod`, over every model.
    pub fn own_prefills<S: SharedStore + ?Sized>(&self, store: &S, pod: &Endpoint) -> u32 {
        self.own_in_flight(store, pod).1
    }

    /// The decodes this Envoy has in flight on `pod`, over every model.
    pub fn own_decodes<S: SharedStore + ?Sized>(&self, store: &S, pod: &Endpoint) -> u32 {
        self.own_in_flight(store, pod).0
    }

    /// Whether `pod` is healthy in every model that serves it.
    pub fn is_healthy<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        pod: &Endpoint,
        now_ms: u64,
    ) -> bool {
        self.fleet
            .models()
            .iter()
            .filter(|m| m.pods.contains(&pod.id))
            .all(|m| self.load(store, m.id).get(pod.id).is_healthy(now_ms))
    }
}

/// Judges this VM's row of a pod with the other VMs' failure streaks
/// added to its own: `eject_after_failures` failures across the workers
/// eject the pod. Only this VM's streak is kept in its row.
fn judge_with(
    rule: HealthRule,
    own: &mut PodCounters,
    others: u32,
    verdict: Verdict,
    now_ms: u64,
) -> bool {
    let mut seen = *own;
    seen.failures = seen.failures.saturating_add(others);
    let ejected = rule.judge(&mut seen, verdict, now_ms);
    own.unhealthy_until_ms = seen.unhealthy_until_ms;
    // A success or an ejection ends the streak (this VM's part of it);
    // otherwise this VM's part is what the judgement added to its own.
    own.failures = seen.failures.saturating_sub(others);
    ejected
}

//! Choosing a request's pods: the scheduler's view of a model's pods (load,
//! health, readiness, scraped metrics), the prefix table, and the turns of
//! the round-robin policies.

use super::Router;
use crate::error::PdError;
use crate::fleet::{Model, ModelId, PodId, PrefillPolicy};
use crate::pods::{LoadTable, SharedStore};
use crate::sched::prefix::{self, PrefixEntry, PrefixMatch};
use crate::sched::{schedule, Choice, LoadBound, NoPod, PlacementRequest, PodState, SplitMix64};
use crate::split::{Placement, SplitRequest};
use std::rc::Rc;

impl Router {
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
                        .and_then(|m| m.fresh(now_ms, self.config.scrape.ttl_ms)),
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
            Choice::Split {
                prefill,
                decode,
                reason,
            } => Ok(Placement::Split {
                prefill: Rc::clone(prefill),
                decode: Rc::clone(decode),
                reason,
                prefix: found,
            }),
            Choice::Combined { pod, reason } => Ok(Placement::Combined {
                pod: Rc::clone(pod),
                reason,
            }),
            Choice::NoPod(NoPod::NotConfigured) => Err(PdError::NoEndpoint {
                model: model.name.clone(),
            }),
            Choice::NoPod(NoPod::AllUnhealthy) => Err(PdError::Unavailable(format!(
                "every prefill/decode pod of model `{}` is unhealthy, not ready (a Mooncake prefill's engine id not known yet, a NIXL push prefill without its side channel) or failed this request; retry later",
                model.name
            ))),
            Choice::NoPod(NoPod::NoBucket) => Err(PdError::Unavailable(format!(
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
}

//! Choosing a request's pods: the scheduler's view of a model's pods (load,
//! health, readiness, scraped metrics), the prefix table, and the turns of
//! the round-robin policies.

use super::Router;
use crate::error::PdError;
use crate::fleet::Decider;
use crate::fleet::{Model, PodId};
use crate::load::LoadTable;
use crate::pods::Key;
use crate::pods::SharedStore;
use crate::sched::decider::{self, decide, Figures};
use crate::sched::prefix::{self, PrefixEntry, PrefixMatch, PREFILL_CHECKPOINT_EVERY};
use crate::sched::{
    schedule, unsplit_pod, Choice, LoadBound, NoPod, PlacementRequest, PodState, SplitMix64,
};
use crate::split::{Decided, Placement, SplitRequest};

/// How far apart the decode prefix table's checkpoints are, in blocks: the
/// decider compares the tokens a decode pod holds with a threshold of a few
/// hundred tokens, so a match is found to within four blocks (512 bytes at
/// the default block size) rather than the prefill table's sixteen.
const DECODE_CHECKPOINT_EVERY: usize = 4;

/// The slots of `model`'s pods for which `pick` holds.
fn slots_of(model: &Model, pick: impl Fn(PodId) -> bool) -> Vec<usize> {
    model
        .pods
        .iter()
        .enumerate()
        .filter(|(_, id)| pick(**id))
        .map(|(slot, _)| slot)
        .collect()
}
use std::rc::Rc;

impl Router {
    /// The scheduler's view of `model`'s pods, by slot.
    pub(super) fn pod_states(
        &self,
        model: &Model,
        table: &LoadTable,
        now_ms: u64,
    ) -> Vec<PodState> {
        let scraped = self.copies.scraped();
        let mut states: Vec<PodState> = model
            .pods
            .iter()
            .map(|id| {
                let c = table.get(*id);
                PodState {
                    outstanding_prefills: c.outstanding_prefills,
                    outstanding_prefill_tokens: c.outstanding_prefill_tokens,
                    pending_decodes: c.pending_decodes,
                    live_streams: c.live_streams,
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
        let learned = self.learned();
        for e in model.rolesets.iter().flat_map(|r| r.prefill.iter()) {
            let connector = e.connector(model.kv_connector, global);
            if !handler.prefill_ready(model, e, connector, &learned) {
                if let Some(s) = states.get_mut(e.slot) {
                    s.not_ready_for_prefill = true;
                }
            }
        }
        states
    }

    /// Chooses pods for `request` from the shared load and the prefix table,
    /// none in `exclude` and only pods that serve its adapter; with a
    /// decider, keeps it whole on its decode pod when a split would not pay
    /// (`sched::decider`).
    pub fn place<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        request: &SplitRequest,
        exclude: &[PodId],
        random: &mut dyn FnMut(&mut S) -> u64,
        now_ms: u64,
    ) -> Result<Placement, PdError> {
        let model = &request.model;
        let found = self.prefill_prefix(&*store, request, now_ms);
        let seen = model
            .decider
            .map(|_| self.decode_prefix(&*store, request, now_ms));
        let table = self.load(&*store, model.id);
        let mut pods = self.pod_states(model, &table, now_ms);
        // A prefill pod not ready here may be ready in the process: its
        // Mooncake engine ids learned by another VM since this one's tick.
        if pods.iter().any(|p| p.not_ready_for_prefill) && self.reread_learned(&*store) {
            pods = self.pod_states(model, &table, now_ms);
        }
        let adapter = request.adapter.as_deref();
        let excluded = slots_of(model, |id| {
            exclude.contains(&id) || !model.serves(adapter, id)
        });
        // Seeded from the host at the first draw: a placement with one
        // candidate pair needs no randomness and costs no host call.
        let mut rng: Option<SplitMix64> = None;
        let mut draw = || {
            rng.get_or_insert_with(|| SplitMix64(random(&mut *store)))
                .next_u64()
        };
        let mut placed = self.choose(request, &pods, &found, &excluded, &mut draw)?;
        if let Some(seen) = &seen {
            placed =
                self.follow_decode_kv(request, &pods, &found, &excluded, &mut draw, placed, seen);
        }
        // This VM's copy of the failing pairs, refreshed each tick.
        let pairs = self.copies.pairs(model.id);
        let fresh = |p: &Placement| match p {
            Placement::Split {
                prefill, decode, ..
            } => !pairs.avoided(prefill.id, decode.id, now_ms),
            _ => true,
        };
        if !fresh(&placed) {
            placed = self.avoid_pair(request, &pods, &found, &excluded, &mut draw, placed, &fresh);
        }
        match (model.decider, seen) {
            (Some(decider), Some(seen)) => {
                Ok(self.apply_decider(&decider, request, &pods, placed, seen))
            }
            _ => Ok(placed),
        }
    }

    /// The pod for a call of `model` (or its `adapter`) the router does not
    /// split (it names the model, as embeddings and tokenize calls do): one
    /// of the model's decode or combined pods that serves it, by its decode
    /// policy.
    pub fn place_unsplit<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        model: &Model,
        adapter: Option<&str>,
        random: &mut dyn FnMut(&mut S) -> u64,
        now_ms: u64,
    ) -> Result<Rc<crate::fleet::Endpoint>, PdError> {
        let table = self.load(&*store, model.id);
        let pods = self.pod_states(model, &table, now_ms);
        let mut rng: Option<SplitMix64> = None;
        let mut draw = || {
            rng.get_or_insert_with(|| SplitMix64(random(&mut *store)))
                .next_u64()
        };
        let mut no_turn = |_: usize| 0;
        let excluded = slots_of(model, |id| !model.serves(adapter, id));
        let mut query = PlacementRequest {
            prompt_tokens: 0,
            prefix_match: &|_| 0.0,
            prefix_key: None,
            load_bound: LoadBound::of(&self.config.scheduling),
            prefill_turn: self.turns.next_prefill(model.id),
            decode_turn: &mut no_turn,
            random: &mut draw,
            exclude: &excluded,
            session: None,
        };
        match unsplit_pod(model, &pods, &mut query, &self.config.scheduling) {
            Ok(pod) => Ok(Rc::clone(pod)),
            Err(NoPod::AllUnhealthy) => Err(PdError::Unavailable(format!(
                "every decode pod of model `{}` is unhealthy; retry later",
                model.name
            ))),
            Err(_) => Err(PdError::NoEndpoint {
                model: model.name.clone(),
            }),
        }
    }

    /// What the prefill prefix table knows of the prompt (only the policies
    /// that remember prefixes read it: consistent hashing needs no memory of
    /// where prompts went).
    fn prefill_prefix<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        request: &SplitRequest,
        now_ms: u64,
    ) -> PrefixMatch {
        let s = &self.config.scheduling;
        if !request.model.prefill_policy.remembers_prefixes() {
            return PrefixMatch::default();
        }
        prefix::walk(
            &request.prompt.hashes,
            |h| {
                let key = self
                    .keys
                    .prefix_slot(prefix::slot_of(h, s.prefix_table_slots));
                let (v, _) = store.shared_get(&key);
                v.as_deref().and_then(PrefixEntry::decode)
            },
            now_ms,
            s.prefix_ttl_ms,
        )
    }

    /// What the decode prefix table knows of the prompt: which decode pod
    /// last served how much of it.
    fn decode_prefix<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        request: &SplitRequest,
        now_ms: u64,
    ) -> PrefixMatch {
        let s = &self.config.scheduling;
        prefix::walk_every(
            &request.prompt.hashes,
            |h| {
                let key = self
                    .keys
                    .decode_prefix_slot(prefix::slot_of(h, s.prefix_table_slots));
                let (v, _) = store.shared_get(&key);
                v.as_deref().and_then(PrefixEntry::decode)
            },
            now_ms,
            s.prefix_ttl_ms,
            DECODE_CHECKPOINT_EVERY,
        )
    }

    /// One run of the scheduler over `pods`, `excluded` slots left out.
    fn choose(
        &self,
        request: &SplitRequest,
        pods: &[PodState],
        found: &PrefixMatch,
        excluded: &[usize],
        draw: &mut dyn FnMut() -> u64,
    ) -> Result<Placement, PdError> {
        let model = &request.model;
        let s = &self.config.scheduling;
        let match_of = |slot: usize| model.pods.get(slot).map_or(0.0, |id| found.percent(*id));
        let mut decode_turn = |roleset: usize| self.turns.next_decode(model, roleset);
        let key_block = s.consistent_hash_blocks.min(request.prompt.hashes.len());
        let mut query = PlacementRequest {
            prompt_tokens: request.prompt.tokens,
            prefix_match: &match_of,
            prefix_key: key_block
                .checked_sub(1)
                .and_then(|i| request.prompt.hashes.get(i))
                .copied(),
            load_bound: match (&model.session, request.session) {
                (Some(affinity), Some(_)) => LoadBound {
                    factor: affinity.load_factor,
                },
                _ => LoadBound::of(s),
            },
            prefill_turn: self.turns.next_prefill(model.id),
            decode_turn: &mut decode_turn,
            random: draw,
            exclude: excluded,
            session: request.session.filter(|_| model.session.is_some()),
        };
        match schedule(model, pods, &mut query, s) {
            Choice::Split {
                prefill,
                decode,
                reason,
            } => Ok(Placement::Split {
                prefill: Rc::clone(prefill),
                decode: Rc::clone(decode),
                reason,
                prefix: found.clone(),
                decided: None,
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

    /// A decode pod holds the KV it pulled or computed: when the decode
    /// prefix table names a healthy one for most of the prompt, the pair is
    /// chosen again within its rolesets, with it as the decode pod.
    #[allow(clippy::too_many_arguments)]
    fn follow_decode_kv(
        &self,
        request: &SplitRequest,
        pods: &[PodState],
        found: &PrefixMatch,
        excluded: &[usize],
        draw: &mut dyn FnMut() -> u64,
        first: Placement,
        seen: &PrefixMatch,
    ) -> Placement {
        let model = &request.model;
        let min = self.config.scheduling.prefix_affinity_min_match;
        let Some((holder, _)) = seen.holders().find(|(_, m)| *m >= min) else {
            return first;
        };
        let Placement::Split { decode, .. } = &first else {
            return first;
        };
        if decode.id == holder {
            return first;
        }
        let rolesets: Vec<&crate::fleet::Roleset> = model
            .rolesets
            .iter()
            .filter(|r| r.decode.iter().any(|d| d.id == holder))
            .collect();
        let keep = |id: PodId| {
            id == holder
                || rolesets
                    .iter()
                    .any(|r| r.prefill.iter().any(|p| p.id == id))
        };
        let mut only = slots_of(model, |id| !keep(id));
        only.extend_from_slice(excluded);
        match self.choose(request, pods, found, &only, draw) {
            Ok(p @ Placement::Split { .. }) => p,
            _ => first,
        }
    }

    /// A pair whose hand-offs keep failing is avoided: the decode pod goes
    /// first, then the prefill pod; where nothing else is left, the pair
    /// stays (a failing hand-off beats none).
    #[allow(clippy::too_many_arguments)]
    fn avoid_pair(
        &self,
        request: &SplitRequest,
        pods: &[PodState],
        found: &PrefixMatch,
        excluded: &[usize],
        draw: &mut dyn FnMut() -> u64,
        placed: Placement,
        fresh: &dyn Fn(&Placement) -> bool,
    ) -> Placement {
        let Placement::Split {
            prefill, decode, ..
        } = &placed
        else {
            return placed;
        };
        for pod in [decode.slot, prefill.slot] {
            let mut without = excluded.to_vec();
            without.push(pod);
            if let Ok(other) = self.choose(request, pods, found, &without, draw) {
                if fresh(&other) {
                    return other;
                }
            }
        }
        placed
    }

    /// The decider's decision on a split placement.
    fn apply_decider(
        &self,
        decider: &Decider,
        request: &SplitRequest,
        pods: &[PodState],
        placed: Placement,
        seen: PrefixMatch,
    ) -> Placement {
        let Placement::Split {
            prefill,
            decode,
            reason,
            prefix,
            ..
        } = placed
        else {
            return placed;
        };
        let model = &request.model;
        let prompt_tokens = request.prompt.tokens;
        let decode_cached_tokens = self.cached_tokens(request, &seen, decode.id);
        let waiting = |id: PodId| {
            model
                .pods
                .iter()
                .position(|p| *p == id)
                .and_then(|slot| pods.get(slot))
                .and_then(|s| s.metrics)
                .is_some_and(|m| m.waiting >= 1.0)
        };
        let roleset_prefills: Vec<PodId> = model
            .rolesets
            .iter()
            .filter(|r| r.decode.iter().any(|d| d.id == decode.id))
            .flat_map(|r| r.prefill.iter().map(|p| p.id))
            .collect();
        let figures = Figures {
            prompt_tokens,
            decode_cached_tokens,
            prefill_saturated: !roleset_prefills.is_empty()
                && roleset_prefills.iter().all(|p| waiting(*p)),
            decode_saturated: waiting(decode.id),
        };
        let kept_whole = decide(decider, &figures);
        let decided = Box::new(Decided {
            reason: kept_whole.unwrap_or(decider::SPLIT),
            uncached_tokens: figures.uncached_tokens(),
            decode_prefix: seen,
        });
        match kept_whole {
            Some(_) => Placement::Unsplit {
                pod: decode,
                decided,
            },
            None => Placement::Split {
                prefill,
                decode,
                reason,
                prefix,
                decided: Some(decided),
            },
        }
    }

    /// Prompt tokens `found` says `pod` holds (the blocks it holds, in
    /// estimated tokens; 0 when the table names it for none).
    pub fn cached_tokens(&self, request: &SplitRequest, found: &PrefixMatch, pod: PodId) -> u64 {
        let depth = found.depth_of(pod);
        if depth == 0 {
            return 0;
        }
        let model = &request.model;
        let block = model.block_bytes(self.config.scheduling.prefix_block_tokens);
        model
            .estimate_tokens(depth.saturating_mul(block))
            .min(request.prompt.tokens)
    }

    /// Prompt tokens the prefill on `pod` computes, as far as the router
    /// knows: the load it holds there until it answers.
    pub fn uncached_tokens(&self, request: &SplitRequest, found: &PrefixMatch, pod: PodId) -> u64 {
        request
            .prompt
            .tokens
            .saturating_sub(self.cached_tokens(request, found, pod))
    }

    /// What a prefill computing `uncached` of the prompt's tokens (as
    /// [`Router::uncached_tokens`] says) costs its pod, in the unit
    /// `least_ttft` weighs queues in: the tokens weighed by their attention
    /// (`attention_tokens`; the tokens themselves when 0).
    pub fn prefill_work(&self, request: &SplitRequest, uncached: u64) -> u64 {
        let cached = request.prompt.tokens.saturating_sub(uncached);
        let work = crate::sched::prefill_work(
            uncached as f64,
            cached as f64,
            self.config.scheduling.attention_tokens,
        );
        work.round() as u64
    }

    /// Records `pod` as the decode pod that last served the prompt, for the
    /// decider's next look (as [`Router::remember_prefix`], checkpoints
    /// closer together: the decider compares tokens, not pods).
    pub fn remember_decode<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        request: &SplitRequest,
        seen: &PrefixMatch,
        pod: PodId,
        now_ms: u64,
    ) {
        let key = |slot| self.keys.decode_prefix_slot(slot);
        self.record_prefix(
            store,
            key,
            request,
            seen.depth_of(pod),
            pod,
            now_ms,
            DECODE_CHECKPOINT_EVERY,
        );
    }

    /// Adds `pod` to the holders of the checkpoints of the prompt past the
    /// `held` blocks it holds already, in the table whose slot keys `key`
    /// makes: a read and a write per checkpoint. Two writers of one slot at
    /// once can lose one's holder: the table is a hint, not an account.
    #[allow(clippy::too_many_arguments)]
    fn record_prefix<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        key: impl Fn(u32) -> Key,
        request: &SplitRequest,
        held: usize,
        pod: PodId,
        now_ms: u64,
        every: usize,
    ) {
        let s = &self.config.scheduling;
        let hashes = &request.prompt.hashes;
        for h in prefix::to_record_every(hashes, held, every) {
            let key = key(prefix::slot_of(h, s.prefix_table_slots));
            let (previous, _) = store.shared_get(&key);
            let previous = previous.as_deref().and_then(PrefixEntry::decode);
            let entry = PrefixEntry::merged(previous, h, hashes, pod, now_ms, s.prefix_ttl_ms);
            let _ = store.shared_set(&key, &entry.encode(), None);
        }
    }

    /// Records `pod` as a holder of the prompt's blocks it does not hold
    /// yet, before the pods that served them earlier.
    pub fn remember_prefix<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        request: &SplitRequest,
        found: &PrefixMatch,
        pod: PodId,
        now_ms: u64,
    ) {
        let hashes = &request.prompt.hashes;
        if hashes.is_empty() || !request.model.prefill_policy.remembers_prefixes() {
            return;
        }
        let key = |slot| self.keys.prefix_slot(slot);
        self.record_prefix(
            store,
            key,
            request,
            found.depth_of(pod),
            pod,
            now_ms,
            PREFILL_CHECKPOINT_EVERY,
        );
    }
}

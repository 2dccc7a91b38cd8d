//! One VM's waiting requests: taken highest priority first; within a
//! priority, round robin over fairness ids (the tenant served longest ago
//! goes next; a tenant that enters the queue, or comes back to it, joins
//! at the back of the rotation), and first come first served within a
//! tenant. Only tenants with requests waiting are remembered, so the state
//! is bounded by the queue, and a client that sends a fresh tenant id with
//! each request gains nothing over one that keeps its own. A request that cannot go now (its LoRA
//! adapter's own pods are full) is passed over, not waited on: it keeps its
//! place, and the requests behind it that can go do.

use crate::fleet::ModelId;
use std::collections::HashMap;

/// A request waiting for room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The stream's context id: the shell resumes it by this.
    pub context: u32,
    pub model: ModelId,
    /// The LoRA adapter it names: only the pods that serve it can take it.
    pub adapter: Option<String>,
    /// Its prompt's estimated length: only the pods whose bucket takes it
    /// can.
    pub prompt_tokens: u64,
    pub priority: i32,
    pub fairness: String,
    pub since_ms: u64,
    /// Arrival order.
    seq: u64,
    /// The last look found no pod of its own free: other VMs do not let
    /// their requests wait behind it.
    blocked: bool,
}

/// Who a request is and where it goes, as it enters the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub context: u32,
    pub model: ModelId,
    pub adapter: Option<String>,
    pub prompt_tokens: u64,
    pub priority: i32,
    pub fairness: String,
}

/// One (model, priority)'s waiting requests: all of them, and those not
/// blocked on their own pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub model: ModelId,
    pub priority: i32,
    pub waiting: u32,
    pub open: u32,
}

#[derive(Debug, Default)]
pub struct Queue {
    waiting: Vec<Waiting>,
    /// When each (model, priority, tenant) with requests waiting was last
    /// served (or entered the queue), in service order; dropped once it has
    /// none waiting.
    served: HashMap<(ModelId, i32, String), u64>,
    arrivals: u64,
    services: u64,
}

impl Queue {
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn push(&mut self, e: Entry, now_ms: u64) {
        self.arrivals += 1;
        // A tenant new to the queue goes behind every tenant already in the
        // rotation: as if served just now.
        self.served
            .entry((e.model, e.priority, e.fairness.clone()))
            .or_insert(self.services);
        self.waiting.push(Waiting {
            context: e.context,
            model: e.model,
            adapter: e.adapter,
            prompt_tokens: e.prompt_tokens,
            priority: e.priority,
            fairness: e.fairness,
            since_ms: now_ms,
            seq: self.arrivals,
            blocked: false,
        });
    }

    /// Puts back a request [`Queue::take_next`] gave out that could not go
    /// after all, in its old place. Not blocked: another worker took the
    /// place it was to have, and the pods are full for every request, so
    /// the other workers' lower priorities still wait behind it.
    pub fn put_back(&mut self, w: Waiting) {
        // It was about to go: its tenant's turn is not over.
        self.served
            .entry((w.model, w.priority, w.fairness.clone()))
            .or_insert(0);
        self.waiting.push(w);
    }

    /// Takes `context` out (its client left, or it was answered).
    pub fn remove(&mut self, context: u32) -> Option<Waiting> {
        let i = self.waiting.iter().position(|w| w.context == context)?;
        let w = self.waiting.remove(i);
        self.forget_if_idle(&w);
        Some(w)
    }

    /// Takes out every request that has waited `ttl_ms` or longer.
    pub fn expired(&mut self, now_ms: u64, ttl_ms: u64) -> Vec<Waiting> {
        let (gone, kept): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| now_ms.saturating_sub(w.since_ms) >= ttl_ms);
        self.waiting = kept;
        for w in &gone {
            self.forget_if_idle(w);
        }
        gone
    }

    /// The highest priority waiting for `model` here.
    pub fn top_priority(&self, model: ModelId) -> Option<i32> {
        self.waiting
            .iter()
            .filter(|w| w.model == model)
            .map(|w| w.priority)
            .max()
    }

    /// The highest priority waiting for `model` here that the last look
    /// did not find blocked on its own pods.
    pub fn top_open_priority(&self, model: ModelId) -> Option<i32> {
        self.waiting
            .iter()
            .filter(|w| w.model == model && !w.blocked)
            .map(|w| w.priority)
            .max()
    }

    /// The models with requests waiting, each once.
    pub fn models(&self) -> Vec<ModelId> {
        let mut out: Vec<ModelId> = Vec::new();
        for w in &self.waiting {
            if !out.contains(&w.model) {
                out.push(w.model);
            }
        }
        out
    }

    /// Takes the next request of `model` that `can_go` lets go: at the
    /// highest priority that has one, the tenant served longest ago, its
    /// oldest request. Those `can_go` refuses stay, marked blocked.
    pub fn take_next(
        &mut self,
        model: ModelId,
        can_go: &mut dyn FnMut(&Waiting) -> bool,
    ) -> Option<Waiting> {
        let mut priorities: Vec<i32> = self
            .waiting
            .iter()
            .filter(|w| w.model == model)
            .map(|w| w.priority)
            .collect();
        priorities.sort_unstable_by(|a, b| b.cmp(a));
        priorities.dedup();
        for priority in priorities {
            for w in self.waiting.iter_mut() {
                if w.model == model && w.priority == priority {
                    w.blocked = !can_go(w);
                }
            }
            let served = |w: &Waiting| {
                self.served
                    .get(&(w.model, w.priority, w.fairness.clone()))
                    .copied()
                    .unwrap_or(self.services)
            };
            let next = self
                .waiting
                .iter()
                .enumerate()
                .filter(|(_, w)| w.model == model && w.priority == priority && !w.blocked)
                .min_by_key(|(_, w)| (served(w), w.seq))
                .map(|(i, _)| i);
            let Some(i) = next else {
                continue;
            };
            let w = self.waiting.remove(i);
            self.services += 1;
            self.served
                .insert((w.model, w.priority, w.fairness.clone()), self.services);
            self.forget_if_idle(&w);
            return Some(w);
        }
        None
    }

    /// Waiting requests by (model, priority).
    pub fn counts(&self) -> Vec<Count> {
        let mut out: Vec<Count> = Vec::new();
        for w in &self.waiting {
            let open = u32::from(!w.blocked);
            match out
                .iter_mut()
                .find(|c| c.model == w.model && c.priority == w.priority)
            {
                Some(c) => {
                    c.waiting += 1;
                    c.open += open;
                }
                None => out.push(Count {
                    model: w.model,
                    priority: w.priority,
                    waiting: 1,
                    open,
                }),
            }
        }
        out
    }

    fn forget_if_idle(&mut self, gone: &Waiting) {
        let still = self.waiting.iter().any(|w| {
            w.model == gone.model && w.priority == gone.priority && w.fairness == gone.fairness
        });
        if !still {
            self.served
                .remove(&(gone.model, gone.priority, gone.fairness.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: ModelId = ModelId(1);
    const N: ModelId = ModelId(2);

    fn order(q: &mut Queue, model: ModelId) -> Vec<u32> {
        std::iter::from_fn(|| q.take_next(model, &mut |_| true).map(|w| w.context)).collect()
    }

    fn push(q: &mut Queue, context: u32, model: ModelId, priority: i32, tenant: &str, at: u64) {
        let e = Entry {
            context,
            model,
            adapter: None,
            prompt_tokens: 1,
            priority,
            fairness: tenant.into(),
        };
        q.push(e, at);
    }

    fn count(model: ModelId, priority: i32, waiting: u32, open: u32) -> Count {
        Count {
            model,
            priority,
            waiting,
            open,
        }
    }

    #[test]
    fn priority_first_then_first_come() {
        let mut q = Queue::default();
        push(&mut q, 1, M, 0, "", 0);
        push(&mut q, 2, M, 10, "", 1);
        push(&mut q, 3, M, 0, "", 2);
        push(&mut q, 4, N, 99, "", 3);
        push(&mut q, 5, M, 10, "", 4);
        assert_eq!(q.top_priority(M), Some(10));
        assert_eq!(
            q.counts(),
            vec![count(M, 0, 2, 2), count(M, 10, 2, 2), count(N, 99, 1, 1)]
        );
        assert_eq!(order(&mut q, M), vec![2, 5, 1, 3]);
        assert_eq!(q.models(), vec![N]);
    }

    #[test]
    fn tenants_take_turns_within_a_priority() {
        let mut q = Queue::default();
        for (ctx, tenant) in [(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "c"), (6, "b")] {
            push(&mut q, ctx, M, 0, tenant, ctx as u64);
        }
        assert_eq!(order(&mut q, M), vec![1, 4, 5, 2, 6, 3]);
        assert!(
            q.served.is_empty(),
            "nothing kept for tenants with none waiting"
        );
    }

    #[test]
    fn expiry_and_removal_take_requests_out() {
        let mut q = Queue::default();
        push(&mut q, 1, M, 0, "a", 100);
        push(&mut q, 2, M, 0, "a", 500);
        push(&mut q, 3, M, 0, "b", 900);
        let gone: Vec<u32> = q.expired(1500, 1000).iter().map(|w| w.context).collect();
        assert_eq!(gone, vec![1, 2]);
        assert_eq!(q.remove(3).map(|w| w.context), Some(3));
        assert!(q.remove(3).is_none());
        assert!(q.is_empty());
    }

    #[test]
    fn a_request_that_cannot_go_keeps_its_place_and_the_next_goes() {
        let mut q = Queue::default();
        push(&mut q, 1, M, 10, "a", 0);
        push(&mut q, 2, M, 0, "b", 1);
        push(&mut q, 3, M, 10, "c", 2);
        // Requests 1 and 3 name an adapter whose pods are full.
        let mut base_only = |w: &Waiting| w.priority == 0;
        assert_eq!(q.take_next(M, &mut base_only).map(|w| w.context), Some(2));
        assert_eq!(q.top_priority(M), Some(10));
        assert_eq!(q.top_open_priority(M), None, "both are blocked");
        assert_eq!(q.counts(), vec![count(M, 10, 2, 0)]);
        // Room again: first come, first served, as if never passed over.
        assert_eq!(order(&mut q, M), vec![1, 3]);
    }

    #[test]
    fn a_request_put_back_keeps_its_arrival() {
        let mut q = Queue::default();
        push(&mut q, 1, M, 0, "", 0);
        push(&mut q, 2, M, 0, "", 1);
        let first = q.take_next(M, &mut |_| true).expect("one waits");
        assert_eq!(first.context, 1);
        q.put_back(first);
        assert_eq!(q.top_open_priority(M), Some(0), "request 2 is open");
        assert_eq!(order(&mut q, M), vec![1, 2]);
    }

    #[test]
    fn a_returning_tenant_joins_the_back_of_the_rotation() {
        let mut q = Queue::default();
        push(&mut q, 1, M, 0, "a", 0);
        push(&mut q, 2, M, 0, "a", 1);
        push(&mut q, 3, M, 0, "b", 2);
        let next = |q: &mut Queue| q.take_next(M, &mut |_| true).map(|w| w.context);
        assert_eq!(next(&mut q), Some(1));
        assert_eq!(next(&mut q), Some(3), "b's turn; b has none left");
        // b comes back at once: a has waited longer since its last turn.
        push(&mut q, 4, M, 0, "b", 3);
        assert_eq!(order(&mut q, M), vec![2, 4]);
    }

    #[test]
    fn a_flood_of_fresh_tenant_ids_does_not_starve_a_backlogged_tenant() {
        let mut q = Queue::default();
        for ctx in 1..=4 {
            push(&mut q, ctx, M, 0, "backlog", 0);
        }
        // One place frees at a time; between two, a request with a tenant id
        // never seen before arrives.
        let mut served = Vec::new();
        for fresh in 100..108u32 {
            push(&mut q, fresh, M, 0, &format!("fresh-{fresh}"), 1);
            served.extend(q.take_next(M, &mut |_| true).map(|w| w.context));
        }
        // Each fresh id joins the rotation behind the backlog; ids that were
        // remembered as never served went first, every time.
        assert_eq!(served, vec![1, 100, 2, 101, 102, 3, 103, 104]);
        assert!(q.served.len() <= q.len(), "only waiting tenants are kept");
    }
}

//! One VM's waiting requests: taken highest priority first; within a
//! priority, round robin over fairness ids (the tenant served longest ago
//! goes next, one that was never served first), and first come first
//! served within a tenant.

use crate::fleet::ModelId;
use std::collections::HashMap;

/// A request waiting for room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The stream's context id: the shell resumes it by this.
    pub context: u32,
    pub model: ModelId,
    pub priority: i32,
    pub fairness: String,
    pub since_ms: u64,
    /// Arrival order.
    seq: u64,
}

#[derive(Debug, Default)]
pub struct Queue {
    waiting: Vec<Waiting>,
    /// When each (model, priority, tenant) with requests waiting was last
    /// served, in service order; dropped once it has none waiting.
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

    pub fn push(
        &mut self,
        context: u32,
        model: ModelId,
        priority: i32,
        fairness: String,
        now_ms: u64,
    ) {
        self.arrivals += 1;
        self.waiting.push(Waiting {
            context,
            model,
            priority,
            fairness,
            since_ms: now_ms,
            seq: self.arrivals,
        });
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

    /// Takes the next request of `model` at its highest waiting priority.
    pub fn take_next(&mut self, model: ModelId) -> Option<Waiting> {
        let priority = self.top_priority(model)?;
        let served = |w: &Waiting| {
            self.served
                .get(&(w.model, w.priority, w.fairness.clone()))
                .copied()
                .unwrap_or(0)
        };
        // The tenant served longest ago; its oldest request.
        let i = self
            .waiting
            .iter()
            .enumerate()
            .filter(|(_, w)| w.model == model && w.priority == priority)
            .min_by_key(|(_, w)| (served(w), w.seq))
            .map(|(i, _)| i)?;
        let w = self.waiting.remove(i);
        self.services += 1;
        self.served
            .insert((w.model, w.priority, w.fairness.clone()), self.services);
        self.forget_if_idle(&w);
        Some(w)
    }

    /// Waiting requests by (model, priority).
    pub fn counts(&self) -> Vec<(ModelId, i32, u32)> {
        let mut out: Vec<(ModelId, i32, u32)> = Vec::new();
        for w in &self.waiting {
            match out
                .iter_mut()
                .find(|(m, p, _)| *m == w.model && *p == w.priority)
            {
                Some(c) => c.2 += 1,
                None => out.push((w.model, w.priority, 1)),
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
        std::iter::from_fn(|| q.take_next(model).map(|w| w.context)).collect()
    }

    #[test]
    fn priority_first_then_first_come() {
        let mut q = Queue::default();
        q.push(1, M, 0, String::new(), 0);
        q.push(2, M, 10, String::new(), 1);
        q.push(3, M, 0, String::new(), 2);
        q.push(4, N, 99, String::new(), 3);
        q.push(5, M, 10, String::new(), 4);
        assert_eq!(q.top_priority(M), Some(10));
        assert_eq!(q.counts(), vec![(M, 0, 2), (M, 10, 2), (N, 99, 1)]);
        assert_eq!(order(&mut q, M), vec![2, 5, 1, 3]);
        assert_eq!(q.models(), vec![N]);
    }

    #[test]
    fn tenants_take_turns_within_a_priority() {
        let mut q = Queue::default();
        for (ctx, tenant) in [(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "c"), (6, "b")] {
            q.push(ctx, M, 0, tenant.into(), ctx as u64);
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
        q.push(1, M, 0, "a".into(), 100);
        q.push(2, M, 0, "a".into(), 500);
        q.push(3, M, 0, "b".into(), 900);
        let gone: Vec<u32> = q.expired(1500, 1000).iter().map(|w| w.context).collect();
        assert_eq!(gone, vec![1, 2]);
        assert_eq!(q.remove(3).map(|w| w.context), Some(3));
        assert!(q.remove(3).is_none());
        assert!(q.is_empty());
    }
}

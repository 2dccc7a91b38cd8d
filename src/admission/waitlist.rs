//! The VM's side of admission control: this VM's queue, what the other
//! VMs reported of theirs, whether a model has room now, and the tick's
//! pump. It reads the rest of the VM (settings, fleet, where reports live,
//! the pods' state) as values in a [`VmView`], so nothing here calls back
//! into the router.

use super::queue::{Entry, Queue, Waiting};
use super::room::{room, Room};
use super::settings::Admission;
use super::shared::{Others, Report};
use crate::fleet::{Fleet, Model, ModelId, PodId};
use crate::pods::{SharedKeys, SharedStore};
use crate::sched::PodState;
use crate::trt_id::WORKER_SLOTS;
use std::cell::RefCell;

/// At most this many requests are let in per VM per tick: a tick never
/// stalls the VM behind a long queue.
pub const MAX_ADMITTED_PER_TICK: usize = 256;

/// What admission control's tick asks of a waiting stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// It waited `queue_ttl_ms`: answer 429.
    Expire,
    /// Its model has room: place and send it.
    Admit,
}

/// What the waitlist reads of its VM.
pub struct VmView<'a> {
    pub settings: &'a Admission,
    pub fleet: &'a Fleet,
    /// Where the VMs' reports live, and this VM's slot among them.
    pub keys: &'a SharedKeys,
    pub slot: u8,
}

/// This VM's waiting requests, and the other VMs' as of the last tick.
#[derive(Default)]
pub struct Waitlist {
    queue: RefCell<Queue>,
    others: RefCell<Others>,
}

impl Waitlist {
    /// The tick: reads the other VMs' reports, has the requests that
    /// waited their TTL answered, lets in what the pods have room for (the
    /// highest priority in the process first, at most
    /// `MAX_ADMITTED_PER_TICK`), and publishes what still waits here.
    /// `pods` reads a model's pods from the store; `run` carries a turn out
    /// on the waiting stream `context`: `None` when the stream is gone,
    /// else whether it went (`Some(false)`: its pods filled between the
    /// look and the placement; it keeps its place, and the next tick looks
    /// again).
    pub fn pump<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        vm: &VmView<'_>,
        now_ms: u64,
        pods: impl Fn(&S, &Model) -> Vec<PodState>,
        mut run: impl FnMut(u32, Turn) -> Option<bool>,
    ) {
        self.read_others(&*store, vm, now_ms);
        for w in self.take_expired(vm.settings, now_ms) {
            run(w.context, Turn::Expire);
        }
        let mut admitted = 0;
        while let Some(w) = self.next_admitted(vm, admitted, |m| pods(&*store, m)) {
            admitted += 1;
            if run(w.context, Turn::Admit) == Some(false) {
                self.put_back(w);
                break;
            }
        }
        self.publish(store, vm, now_ms);
    }

    /// Whether a request of `model` at `priority` must queue behind others
    /// already waiting for it (here, or in another VM at the last tick)
    /// rather than take a free pod first.
    pub fn waits_behind(&self, model: ModelId, priority: i32) -> bool {
        let here = self.queue.borrow().top_open_priority(model);
        let there = self.others.borrow().top_priority(model);
        here.max(there).is_some_and(|p| p >= priority)
    }

    /// Requests waiting in the whole process (as of the last tick for the
    /// other VMs).
    pub fn total(&self) -> u64 {
        self.queue.borrow().len() as u64 + u64::from(self.others.borrow().total())
    }

    /// Queues a request of this VM's stream.
    pub fn enqueue(&self, entry: Entry, now_ms: u64) {
        self.queue.borrow_mut().push(entry, now_ms);
    }

    /// Puts back a request [`Waitlist::next_admitted`] gave out that found
    /// its pods full after all: in its old place.
    pub fn put_back(&self, w: Waiting) {
        self.queue.borrow_mut().put_back(w);
    }

    /// Takes `context` out of the queue (its client left).
    pub fn dequeue(&self, context: u32) -> Option<Waiting> {
        self.queue.borrow_mut().remove(context)
    }

    /// Takes out the requests that waited their TTL.
    pub fn take_expired(&self, settings: &Admission, now_ms: u64) -> Vec<Waiting> {
        self.queue
            .borrow_mut()
            .expired(now_ms, settings.queue_ttl_ms)
    }

    /// Reads the other VMs' reports (once per tick).
    pub fn read_others<S: SharedStore + ?Sized>(&self, store: &S, vm: &VmView<'_>, now_ms: u64) {
        let reports = (0..WORKER_SLOTS)
            .filter(|s| *s != vm.slot)
            .filter_map(|s| store.shared_get(&vm.keys.admission(s)).0)
            .filter_map(|b| Report::decode(&b))
            .collect();
        *self.others.borrow_mut() = Others::new(reports, now_ms);
    }

    /// The next of this VM's waiting requests to let in now: one that has
    /// room (a request naming an adapter: on the pods that serve it), at
    /// the highest priority that has one waiting here, unless another VM has
    /// a higher one that could go (that VM goes first). A request whose
    /// pods are full is passed over and keeps its place. `pods` reads a
    /// model's pods, once for all its requests.
    pub fn next_admitted(
        &self,
        vm: &VmView<'_>,
        admitted: usize,
        pods: impl Fn(&Model) -> Vec<PodState>,
    ) -> Option<Waiting> {
        if admitted >= MAX_ADMITTED_PER_TICK {
            return None;
        }
        let mut models = self.queue.borrow().models();
        // Highest waiting priority first, across models.
        models.sort_by_key(|m| std::cmp::Reverse(self.queue.borrow().top_priority(*m)));
        for id in models {
            let Some(mine) = self.queue.borrow().top_priority(id) else {
                continue;
            };
            // Another VM's higher priority goes first, unless it is higher
            // only than requests of ours that cannot go anyway.
            if self
                .others
                .borrow()
                .top_priority(id)
                .is_some_and(|p| p > mine)
            {
                continue;
            }
            let Some(model) = vm.fleet.models().iter().find(|m| m.id == id) else {
                continue;
            };
            let pods = pods(model);
            // No room for the model at all: nothing of it can go, and none
            // of its requests is blocked on its own pods (other VMs keep
            // deferring to its priorities).
            if matches!(
                room_in(vm.settings, model, &pods, None, None),
                Room::Saturated
            ) {
                continue;
            }
            // Unservable goes too: placement answers why.
            let mut can_go = |w: &Waiting| {
                let adapter = w.adapter.as_deref();
                let room = room_in(vm.settings, model, &pods, adapter, Some(w.prompt_tokens));
                !matches!(room, Room::Saturated)
            };
            let next = self.queue.borrow_mut().take_next(id, &mut can_go);
            if next.is_some() {
                return next;
            }
        }
        None
    }

    /// Publishes this VM's waiting counts for the others.
    pub fn publish<S: SharedStore + ?Sized>(&self, store: &mut S, vm: &VmView<'_>, now_ms: u64) {
        let report = Report {
            at_ms: now_ms,
            counts: self.queue.borrow().counts(),
        };
        let _ = store.shared_set(&vm.keys.admission(vm.slot), &report.encode(), None);
    }

    /// Waiting requests in the process by (model name, priority): this VM's
    /// queue now, the others' as of this tick.
    pub fn counts(&self, fleet: &Fleet) -> Vec<(String, i32, u64)> {
        let mut out: Vec<(String, i32, u64)> = Vec::new();
        let queue = self.queue.borrow();
        let others = self.others.borrow();
        let mine = queue.counts();
        for c in mine.iter().chain(others.counts()) {
            let Some(model) = fleet.models().iter().find(|x| x.id == c.model) else {
                continue;
            };
            let n = u64::from(c.waiting);
            match out
                .iter_mut()
                .find(|(name, p, _)| *name == model.name && *p == c.priority)
            {
                Some(o) => o.2 += n,
                None => out.push((model.name.clone(), c.priority, n)),
            }
        }
        out
    }
}

/// Whether `model` can take a request of `prompt_tokens` (`None`: any
/// length) naming `adapter`, on pod states already read: only the pods
/// that serve the adapter count.
pub fn room_in(
    settings: &Admission,
    model: &Model,
    pods: &[PodState],
    adapter: Option<&str>,
    prompt_tokens: Option<u64>,
) -> Room {
    let mut pods = pods.to_vec();
    // A pod without the adapter can never take it: as if down.
    for (state, id) in pods.iter_mut().zip(&model.pods) {
        if !model.serves(adapter, *id) {
            state.unhealthy = true;
        }
    }
    room(model, &pods, settings, prompt_tokens)
}

/// The pod ids of `full` slots of `model`.
pub fn pods_at(model: &Model, full: &[usize]) -> Vec<PodId> {
    full.iter()
        .filter_map(|slot| model.pods.get(*slot).copied())
        .collect()
}

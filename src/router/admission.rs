//! Admission control as the flow and the shell reach it: the router hands
//! its waitlist (`crate::admission::Waitlist`) the settings, the fleet,
//! the report keys and its pods' state.

use super::Router;
use crate::admission::waitlist::{pods_at, room_in, Turn, VmView};
use crate::admission::{over_limit, Entry, Room, Waiting};
use crate::fleet::{Fleet, Model, ModelId, PodId};
use crate::load::HeldLoad;
use crate::pods::{Fresh, SharedStore};
use crate::sched::PodState;

impl Router {
    /// What the waitlist reads of this VM, over `fleet`; `None` without
    /// admission control.
    fn admission_view<'a>(&'a self, fleet: &'a Fleet) -> Option<VmView<'a>> {
        Some(VmView {
            settings: self.config.admission.as_ref()?,
            fleet,
            keys: self.keys(),
            slot: self.worker_slot(),
        })
    }

    /// The pods of `model` as admission judges them, from `store`.
    fn admission_pods<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        model: &Model,
        now_ms: u64,
    ) -> Vec<PodState> {
        self.pod_states(model, &self.load(store, model.id), now_ms)
    }

    /// Admission control's tick (`Waitlist::pump`); nothing without it.
    pub fn pump<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        now_ms: u64,
        run: impl FnMut(u32, Turn) -> Option<bool>,
    ) {
        let fleet = self.fleet();
        if let Some(vm) = self.admission_view(&fleet) {
            let pods = |s: &S, m: &Model| self.admission_pods(s, m, now_ms);
            self.admission.pump(store, &vm, now_ms, pods, run);
        }
    }

    /// Whether `model` can take a request of `prompt_tokens` (`None`: any
    /// length) naming `adapter` now (only the pods that serve the adapter
    /// and take the prompt's length count); with room, the pods that are
    /// full (to leave out of its placement). Without admission, room.
    pub fn room<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        model: &Model,
        adapter: Option<&str>,
        prompt_tokens: Option<u64>,
        now_ms: u64,
    ) -> Room {
        let Some(settings) = &self.config.admission else {
            return Room::Free { full: Vec::new() };
        };
        let pods = self.admission_pods(store, model, now_ms);
        room_in(settings, model, &pods, adapter, prompt_tokens)
    }

    /// Takes `held` for a request admission control let in, if its pods
    /// stay within `max_in_flight_per_pod` with it; else takes nothing and
    /// answers false. The look that let it in read the load before this
    /// write: another worker may have taken the last place in between. So
    /// after writing, this reads every worker's load afresh. Of two workers
    /// that both took a pod's last place, at least one reads the other's
    /// write (each writes, then reads), and gives its place back; both may.
    /// Without admission control it is a plain hold.
    pub fn hold_admitted<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        held: HeldLoad,
        now_ms: u64,
    ) -> Result<bool, String> {
        self.hold(store, held, now_ms)?;
        let Some(settings) = &self.config.admission else {
            return Ok(true);
        };
        let table = self.load(&Fresh(&*store), held.model);
        let over = [held.prefill, held.decode].into_iter().flatten().any(|id| {
            let c = table.get(id);
            over_limit(
                c.outstanding_prefills.saturating_add(c.pending_decodes),
                settings,
            )
        });
        if over {
            self.release(store, held, None, now_ms)?;
        }
        Ok(!over)
    }

    /// The pod ids of `full` slots of `model`.
    pub fn pods_at(&self, model: &Model, full: &[usize]) -> Vec<PodId> {
        pods_at(model, full)
    }

    /// See `Waitlist::waits_behind`.
    pub fn waits_behind(&self, model: ModelId, priority: i32) -> bool {
        self.admission.waits_behind(model, priority)
    }

    /// Requests waiting in the whole process (as of the last tick for the
    /// other VMs).
    pub fn waiting_total(&self) -> u64 {
        self.admission.total()
    }

    /// Queues a request of this VM's stream.
    pub fn enqueue(&self, entry: Entry, now_ms: u64) {
        self.admission.enqueue(entry, now_ms);
    }

    /// Takes `context` out of the queue (its client left).
    pub fn dequeue(&self, context: u32) -> Option<Waiting> {
        self.admission.dequeue(context)
    }

    /// Takes out the requests that waited their TTL.
    pub fn take_expired(&self, now_ms: u64) -> Vec<Waiting> {
        match &self.config.admission {
            Some(settings) => self.admission.take_expired(settings, now_ms),
            None => Vec::new(),
        }
    }

    /// Reads the other VMs' reports (once per tick).
    pub fn read_others<S: SharedStore + ?Sized>(&self, store: &S, now_ms: u64) {
        let fleet = self.fleet();
        if let Some(vm) = self.admission_view(&fleet) {
            self.admission.read_others(store, &vm, now_ms);
        }
    }

    /// See `Waitlist::next_admitted`.
    pub fn next_admitted<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        now_ms: u64,
        admitted: usize,
    ) -> Option<Waiting> {
        let fleet = self.fleet();
        let vm = self.admission_view(&fleet)?;
        let pods = |m: &Model| self.admission_pods(store, m, now_ms);
        self.admission.next_admitted(&vm, admitted, pods)
    }

    /// Publishes this VM's waiting counts for the others.
    pub fn publish_queue<S: SharedStore + ?Sized>(&self, store: &mut S, now_ms: u64) {
        let fleet = self.fleet();
        if let Some(vm) = self.admission_view(&fleet) {
            self.admission.publish(store, &vm, now_ms);
        }
    }

    /// See `Waitlist::counts`.
    pub fn waiting_counts(&self) -> Vec<(String, i32, u64)> {
        self.admission.counts(&self.fleet())
    }
}

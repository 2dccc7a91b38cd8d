//! Admission control in the flow: a request of a saturated model waits,
//! paused, until the shell's tick lets it in ([`Flow::admit`]), its TTL
//! runs out ([`Flow::expire`]) or its client leaves; a negative priority
//! is shed at once, and a full queue refuses it.

use super::phase::{Next, QueuedRequest};
use super::{Attempt, Flow};
use crate::admission::{Admission, Entry, Room};
use crate::error::{ClientError, Dropped, PdError};
use crate::fleet::PodId;
use crate::host::{Counter, Histogram, Host, Level};
use crate::split::SplitRequest;
use std::rc::Rc;

impl Flow {
    /// Places `request` now when its model has room (leaving full pods
    /// out), or makes it wait, or drops it.
    pub(super) fn admit_or_wait<H: Host>(
        &mut self,
        host: &mut H,
        request: SplitRequest,
    ) -> Result<Next, PdError> {
        let router = Rc::clone(&self.router);
        let Some(settings) = router.config.admission else {
            return self.place(host, request, Attempt::default());
        };
        // An endpoint picker before the router does its own flow control.
        if self.head.picked.is_some() {
            return self.place(host, request, Attempt::default());
        }
        let now = host.now_ms();
        let model = Rc::clone(&request.model);
        let priority = self.head.priority;
        let tokens = Some(request.prompt.tokens);
        let room = router.room(&*host, &model, request.adapter.as_deref(), tokens, now);
        match room {
            Room::Free { full } if !router.waits_behind(model.id, priority) => {
                let attempt = Attempt {
                    full: router.pods_at(&model, &full),
                    admitted: true,
                    ..Attempt::default()
                };
                match self.place(host, request, attempt)? {
                    // Another worker took the last place since the look.
                    Next::Queue(q) => self.wait(host, q.request, Room::Saturated, settings),
                    next => Ok(next),
                }
            }
            Room::Unservable => self.place(host, request, Attempt::default()),
            room => self.wait(host, request, room, settings),
        }
    }

    /// Queues `request`, whose model has `room` (none, or others wait
    /// ahead of it), or drops it: a negative priority on a saturated model,
    /// or any request past `max_queued`.
    fn wait<H: Host>(
        &mut self,
        host: &mut H,
        request: SplitRequest,
        room: Room,
        settings: Admission,
    ) -> Result<Next, PdError> {
        let router = Rc::clone(&self.router);
        let now = host.now_ms();
        let model = Rc::clone(&request.model);
        let priority = self.head.priority;
        let drop = |why| PdError::Dropped {
            why,
            model: model.name.clone(),
            retry_after_s: settings.retry_after_s(why),
        };
        // Shed only when the model is full: with room free and others
        // waiting ahead of it, a negative priority waits its turn like any
        // other.
        if priority < 0 && matches!(room, Room::Saturated) {
            host.increment(Counter::AdmissionShed);
            return Err(drop(Dropped::Shed));
        }
        if router.waiting_total() >= u64::from(settings.max_queued) {
            host.increment(Counter::AdmissionQueueFull);
            return Err(drop(Dropped::QueueFull));
        }
        let entry = Entry {
            context: self.context,
            model: model.id,
            adapter: request.adapter.clone(),
            prompt_tokens: request.prompt.tokens,
            priority,
            fairness: self.head.fairness.clone(),
        };
        router.enqueue(entry, now);
        // The other VMs learn of it now, not at this VM's next tick: they
        // let their own lower priorities go only when no higher one waits
        // anywhere.
        router.publish_queue(host, now);
        host.increment(Counter::AdmissionQueued);
        self.debug(host, || {
            format!(
                "model {} saturated: waiting at priority {priority}",
                model.name
            )
        });
        Ok(Next::Queue(Box::new(QueuedRequest {
            request,
            since_ms: now,
        })))
    }

    /// Lets a waiting request in (the tick found room for it): places and
    /// sends it as if it had just arrived, its model's full pods left out.
    /// False when its pods are all full after all: it is still waiting, and
    /// the caller puts it back in its place.
    pub fn admit<H: Host>(&mut self, host: &mut H) -> bool {
        let router = Rc::clone(&self.router);
        let now = host.now_ms();
        // The fleet may have changed while the request waited (pods added
        // or gone through discovery): it is judged and placed on the model
        // as it is now, not as it was when it arrived.
        let fleet = router.fleet();
        let room = match self.queued_mut() {
            Some(q) => {
                let r = &mut q.request;
                match fleet.models().iter().find(|m| m.id == r.model.id) {
                    Some(current) => r.model = Rc::clone(current),
                    None => {
                        let gone = ClientError::UnknownModel(r.model.name.clone());
                        if let Some(q) = self.take_queued(host) {
                            drop(q);
                            self.fail(host, gone.into());
                        }
                        return true;
                    }
                }
                let tokens = Some(r.prompt.tokens);
                router.room(&*host, &r.model, r.adapter.as_deref(), tokens, now)
            }
            None => return true,
        };
        let full = match room {
            Room::Free { full } => full,
            Room::Saturated => return false,
            Room::Unservable => Vec::new(),
        };
        let Some(queued) = self.take_queued_phase() else {
            return true;
        };
        let (since_ms, model) = (queued.since_ms, Rc::clone(&queued.request.model));
        let full = router.pods_at(&model, &full);
        let attempt = Attempt {
            full,
            admitted: true,
            ..Attempt::default()
        };
        let next = match self.place(host, queued.request, attempt) {
            // Another worker took the last place since the look: it waits
            // on, as it was.
            Ok(Next::Queue(q)) => {
                let request = q.request;
                self.enter(Next::Queue(Box::new(QueuedRequest { request, since_ms })));
                return false;
            }
            next => next,
        };
        // Out of the queue only now that it holds its pods: another worker
        // that reads this VM's report without it also reads its load, so
        // does not let a lower priority take the place it took.
        self.left_queue(host, &model.name, since_ms);
        self.resume_after(host, next);
        true
    }

    /// The pods admission control finds full now, for a retry's placement:
    /// those full when the request was let in may have room by then. When
    /// every pod is full, none is left out: the request was let in already.
    pub(super) fn full_now<H: Host>(&self, host: &H, request: &SplitRequest) -> Vec<PodId> {
        if self.router.config.admission.is_none() {
            return Vec::new();
        }
        let (model, adapter) = (&request.model, request.adapter.as_deref());
        let tokens = Some(request.prompt.tokens);
        match self
            .router
            .room(host, model, adapter, tokens, host.now_ms())
        {
            Room::Free { full } => self.router.pods_at(model, &full),
            Room::Saturated | Room::Unservable => Vec::new(),
        }
    }

    /// Answers a request that waited its TTL.
    pub fn expire<H: Host>(&mut self, host: &mut H) {
        let Some(queued) = self.take_queued(host) else {
            return;
        };
        let why = Dropped::Expired;
        let retry_after_s = self
            .router
            .config
            .admission
            .map_or(1, |a| a.retry_after_s(why));
        host.increment(Counter::AdmissionExpired);
        let err = PdError::Dropped {
            why,
            model: queued.request.model.name.clone(),
            retry_after_s,
        };
        self.fail(host, err);
    }

    /// The client left while its request waited: its place goes.
    pub(super) fn leave_queue<H: Host>(&mut self, host: &mut H) {
        if self.take_queued(host).is_some() {
            host.increment(Counter::AdmissionCancelled);
            self.log(host, Level::Debug, "client left while waiting for room");
        }
    }

    /// The waiting request, out of the queue and the phase, its wait
    /// recorded.
    fn take_queued<H: Host>(&mut self, host: &mut H) -> Option<QueuedRequest> {
        let q = self.take_queued_phase()?;
        self.left_queue(host, &q.request.model.name, q.since_ms);
        Some(q)
    }

    /// This stream's request is out of the queue: the other VMs hear of it,
    /// and its wait since `since_ms` is recorded.
    fn left_queue<H: Host>(&mut self, host: &mut H, model: &str, since_ms: u64) {
        self.router.dequeue(self.context);
        let now = host.now_ms();
        self.router.publish_queue(host, now);
        host.record(
            Histogram::QueueDuration,
            model,
            now.saturating_sub(since_ms),
        );
    }
}

//! One simulated pod at run time: its engine driven step by step against
//! the wall clock, and the channels through which each request hears what
//! the steps did to it.
//!
//! Time is modelled: every duration the engine computes is divided by the
//! time scale before it is slept, so an hour of GPU time replays in minutes.
//! A step's end is kept in modelled time, not re-read from the clock, so a
//! pod that falls behind (a busy machine) catches up without drifting.

use super::engine::{Counters, Engine, EngineConfig, Event, Job};
use super::kv_events::KvEvents;
use super::text::Prompt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

/// The simulation's clock: modelled seconds since it started.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    scale: f64,
}

impl Clock {
    pub fn new(scale: f64) -> Clock {
        Clock {
            start: Instant::now(),
            scale,
        }
    }

    pub fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * self.scale
    }

    /// The instant modelled time `t` is reached.
    pub fn instant_at(&self, t: f64) -> Instant {
        self.start + Duration::from_secs_f64((t / self.scale).max(0.0))
    }

    /// Sleeps `s` modelled seconds.
    pub async fn sleep(&self, s: f64) {
        tokio::time::sleep(Duration::from_secs_f64((s / self.scale).max(0.0))).await;
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }
}

/// Which leg a pod serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Prefill,
    Decode,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One pod.
pub struct Pod {
    pub index: usize,
    pub name: String,
    pub role: Role,
    pub ip: String,
    pub port: u16,
    /// SGLang's bootstrap port (named, not served: the pods of one
    /// simulation meet in process).
    pub bootstrap_port: u16,
    pub clock: Clock,
    engine: Mutex<Engine>,
    wake: Notify,
    sinks: Mutex<HashMap<u64, mpsc::UnboundedSender<Event>>>,
    next_key: AtomicU64,
    /// Where its cache's changes go, once it publishes KV events.
    kv_events: OnceLock<Arc<KvEvents>>,
}

/// A request's place in its pod: events arrive on `events`; dropping it
/// takes the request out of the engine (a client that left).
pub struct Ticket {
    pub key: u64,
    pub events: mpsc::UnboundedReceiver<Event>,
    pod: Arc<Pod>,
    done: bool,
}

impl Ticket {
    /// The request ended on its own: nothing to cancel.
    pub fn finished(&mut self) {
        self.done = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        lock(&self.pod.sinks).remove(&self.key);
        if !self.done {
            lock(&self.pod.engine).cancel(self.key);
            self.pod.wake.notify_one();
        }
    }
}

impl Pod {
    pub fn new(
        index: usize,
        name: String,
        role: Role,
        (ip, port, bootstrap_port): (String, u16, u16),
        config: EngineConfig,
        clock: Clock,
    ) -> Arc<Pod> {
        Arc::new(Pod {
            index,
            name,
            role,
            ip,
            port,
            bootstrap_port,
            clock,
            engine: Mutex::new(Engine::new(config)),
            wake: Notify::new(),
            sinks: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            kv_events: OnceLock::new(),
        })
    }

    /// Publishes its cache's changes to `events` from now on.
    pub fn publish_kv_events(&self, events: Arc<KvEvents>) {
        lock(&self.engine).track_changes();
        let _ = self.kv_events.set(events);
    }

    /// Hands what its cache changed to the KV events, if it publishes them.
    fn publish_changes(&self) {
        let Some(kv) = self.kv_events.get() else {
            return;
        };
        if let Some(c) = lock(&self.engine).take_changes() {
            kv.publish(&self.ip, &c.stored, &c.removed);
        }
    }

    pub fn address(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// Queues a request on this pod's engine (its key is the pod's to give).
    pub fn submit(self: &Arc<Self>, job: Job) -> Ticket {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(kv) = self.kv_events.get() {
            kv.learn(&job.prompt);
        }
        lock(&self.sinks).insert(key, tx);
        lock(&self.engine).submit(Job { key, ..job });
        self.wake.notify_one();
        Ticket {
            key,
            events: rx,
            pod: Arc::clone(self),
            done: false,
        }
    }

    /// Frees what finished request `key` held for a pull; false when it
    /// holds nothing.
    pub fn release_held(&self, key: u64) -> bool {
        let released = lock(&self.engine).release_held(key);
        self.wake.notify_one();
        released
    }

    /// Tokens of `prompt` this pod holds as a cached prefix now.
    pub fn cached_tokens(&self, prompt: &Prompt) -> u32 {
        lock(&self.engine).cached_tokens(prompt)
    }

    /// Running and waiting requests, the KV in use (0 to 1), and the counters.
    pub fn load(&self) -> (usize, usize, f64, Counters) {
        let e = lock(&self.engine);
        (e.running(), e.waiting(), e.kv_usage(), e.counters())
    }

    fn dispatch(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let sinks = lock(&self.sinks);
        for ev in events {
            let key = match ev {
                Event::Admitted { key, .. }
                | Event::Tokens { key, .. }
                | Event::Finished { key } => key,
            };
            if let Some(tx) = sinks.get(&key) {
                let _ = tx.send(ev);
            }
        }
    }

    /// Runs the engine for as long as the process lives.
    pub async fn drive(self: Arc<Self>) {
        let mut t = self.clock.now_s();
        loop {
            let mut events = Vec::new();
            let planned = lock(&self.engine).plan(&mut events);
            self.publish_changes();
            self.dispatch(events);
            let Some(dt) = planned else {
                self.wake.notified().await;
                t = t.max(self.clock.now_s());
                continue;
            };
            let end = t + dt;
            tokio::time::sleep_until(self.clock.instant_at(end).into()).await;
            t = end;
            let mut events = Vec::new();
            lock(&self.engine).complete(&mut events);
            self.publish_changes();
            self.dispatch(events);
        }
    }
}

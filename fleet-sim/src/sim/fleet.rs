//! What the pods of one simulation share: the hand-offs in flight between
//! them (vLLM NIXL's prefill offers, SGLang's bootstrap rooms), the NICs
//! their KV transfers share, and the record of every request each pod
//! served, which the benchmark reads back (`GET /sim/records`).

use super::model::Gpu;
use super::nic::Links;
use super::pod::{Clock, Pod};
use super::text::Shape;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// Which engine's wire contract the pods speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// vLLM with the NIXL connector (pull): the prefill answers
    /// `kv_transfer_params`, the decode must bring them back.
    Vllm,
    /// SGLang: both legs carry the same bootstrap room and run concurrently.
    Sglang,
}

/// A vLLM prefill's KV, kept for one decode until the lease ends.
#[derive(Debug, Clone)]
pub struct Offer {
    pub prefill: usize,
    pub ids: Vec<u64>,
    pub at_s: f64,
}

/// An SGLang bootstrap room: the prefill and the decode wait for each other.
pub struct Room {
    /// The prefill pod and when its KV was ready.
    pub prefill: watch::Sender<Option<(usize, f64)>>,
    pub decode_here: watch::Sender<bool>,
}

/// One request as one pod served it. Times are modelled seconds since the
/// simulation started.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// The client's `user` field: the replayer's request id.
    pub user: String,
    /// `prefill`, `decode` (a leg with a hand-off), or `whole` (a request
    /// served on one pod, prompt and output).
    pub role: &'static str,
    pub pod: String,
    pub status: u16,
    pub arrival_s: f64,
    pub admitted_s: Option<f64>,
    pub first_token_s: Option<f64>,
    pub finish_s: Option<f64>,
    pub prompt_tokens: u32,
    /// The prompt's prefix this pod held when the request was admitted.
    pub cached_tokens: u32,
    /// Prompt tokens this pod computed.
    pub computed_tokens: u32,
    /// Prompt tokens whose KV came from the prefill pod.
    pub transferred_tokens: u32,
    pub output_tokens: u32,
    /// The hand-off a decode leg got: `ok`, `missing` (it computed the
    /// prompt itself), `expired` (after the lease), or `none`.
    pub handoff: &'static str,
    pub prefill_pod: Option<String>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// The simulation.
pub struct Fleet {
    pub flavor: Flavor,
    pub model: String,
    pub pods: Vec<Arc<Pod>>,
    pub gpu: Gpu,
    /// vLLM NIXL's `kv_lease_duration`, modelled seconds.
    pub lease_s: f64,
    /// How often a stream sends the tokens generated since its last chunk.
    pub flush: Duration,
    /// How the replayer made the prompts' text (bytes per token, seed).
    pub text: Shape,
    offers: Mutex<HashMap<String, Offer>>,
    rooms: Mutex<HashMap<u64, Arc<Room>>>,
    records: Mutex<Vec<Record>>,
    next_offer: AtomicU64,
    links: Mutex<Links>,
    /// A transfer started or ended: the others' rates changed.
    links_changed: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Fleet {
    pub fn new(
        flavor: Flavor,
        model: String,
        pods: Vec<Arc<Pod>>,
        gpu: Gpu,
        lease_s: f64,
        flush: Duration,
        text: Shape,
    ) -> Fleet {
        Fleet {
            flavor,
            model,
            pods,
            gpu,
            lease_s,
            flush,
            text,
            offers: Mutex::new(HashMap::new()),
            rooms: Mutex::new(HashMap::new()),
            records: Mutex::new(Vec::new()),
            next_offer: AtomicU64::new(1),
            links: Mutex::new(Links::new(gpu.transfer_bytes_per_s)),
            links_changed: Notify::new(),
        }
    }

    /// Moves `tokens` of KV from pod `src` to pod `dst`: the transfer's
    /// fixed overhead, then its bytes over the two pods' NICs, shared with
    /// the other transfers on them (nic.rs). Returns when it has arrived.
    pub async fn transfer(&self, clock: &Clock, src: usize, dst: usize, tokens: u32) {
        if tokens == 0 {
            return;
        }
        clock.sleep(self.gpu.transfer_overhead_s).await;
        let bytes = tokens as f64 * self.gpu.kv_bytes_per_token;
        let id = lock(&self.links).start(clock.now_s(), src, dst, bytes);
        self.links_changed.notify_waiters();
        loop {
            let (eta, changed) = {
                let mut links = lock(&self.links);
                links.advance(clock.now_s());
                let eta = links.eta_s(id);
                if eta <= 1e-9 {
                    links.finish(id);
                    break;
                }
                // Registered before the lock goes: no change is missed.
                (eta, self.links_changed.notified())
            };
            tokio::select! {
                _ = clock.sleep(eta) => {}
                _ = changed => {}
            }
        }
        self.links_changed.notify_waiters();
    }

    pub fn pod(&self, index: usize) -> Option<&Arc<Pod>> {
        self.pods.get(index)
    }

    /// The pod at `ip` whose SGLang bootstrap port is `port`.
    pub fn by_bootstrap(&self, ip: &str, port: u16) -> Option<&Arc<Pod>> {
        self.pods
            .iter()
            .find(|p| p.ip == ip && p.bootstrap_port == port)
    }

    /// Keeps a prefill's KV for a decode; returns the id the decode names.
    pub fn offer(&self, offer: Offer) -> String {
        let id = format!("sim-{}", self.next_offer.fetch_add(1, Ordering::Relaxed));
        lock(&self.offers).insert(id.clone(), offer);
        id
    }

    /// Takes the offer a decode names (each is read once).
    pub fn take_offer(&self, id: &str) -> Option<Offer> {
        lock(&self.offers).remove(id)
    }

    /// The room `room`, made on first use by either leg.
    pub fn room(&self, room: u64) -> Arc<Room> {
        let mut rooms = lock(&self.rooms);
        Arc::clone(rooms.entry(room).or_insert_with(|| {
            Arc::new(Room {
                prefill: watch::channel(None).0,
                decode_here: watch::channel(false).0,
            })
        }))
    }

    /// Forgets a room both legs are done with.
    pub fn close_room(&self, room: u64) {
        lock(&self.rooms).remove(&room);
    }

    pub fn record(&self, r: Record) {
        lock(&self.records).push(r);
    }

    pub fn records(&self) -> Vec<Record> {
        lock(&self.records).clone()
    }
}

//! What the pods of one simulation share: the hand-offs in flight between
//! them (vLLM NIXL's prefill offers, SGLang's bootstrap rooms), the NICs
//! their KV transfers share, and the record of every request each pod
//! served, which the benchmark reads back (`GET /sim/records`).

use super::model::Gpu;
use super::nic::Links;
use super::pod::{Clock, Pod};
use super::text::{Shape, BLOCK_TOKENS};
use serde::Serialize;
use serde_json::{json, Value};
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

/// vLLM's `kv_recompute_threshold`: a pull of fewer tokens is not made,
/// they are computed.
pub const KV_RECOMPUTE_THRESHOLD: u32 = 64;

/// A decode's KV held for the next turn's prefill to pull (vLLM's
/// bidirectional NIXL transfer): single use, until `expiry_s`.
#[derive(Debug, Clone)]
pub struct Kept {
    pub decode: usize,
    /// The finished request's key on the decode pod's engine (its blocks).
    pub key: u64,
    /// Prompt and generated tokens in its KV, but the last generated.
    pub tokens: u32,
    pub expiry_s: f64,
}

/// What a prefill pulls of a decode's kept KV: the tokens of `prompt`
/// beyond the `cached` this pod holds, up to the `remote` the decode holds;
/// none below [`KV_RECOMPUTE_THRESHOLD`].
pub fn pull_tokens(remote: u32, prompt: u32, cached: u32) -> u32 {
    let n = remote.min(prompt).saturating_sub(cached);
    if n < KV_RECOMPUTE_THRESHOLD {
        0
    } else {
        n
    }
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
    /// vLLM's `decoder_kv_blocks_ttl` (modelled seconds) when the decode
    /// pods keep their KV for the next turn (bidirectional NIXL); `None`:
    /// they free it as they finish.
    pub decoder_kv_ttl_s: Option<f64>,
    /// The pods' KV events (`--kv-events`), read at `/sim/kv_events`.
    pub kv_events: Option<Arc<super::kv_events::KvEvents>>,
    offers: Mutex<HashMap<String, Offer>>,
    kept: Mutex<HashMap<String, Kept>>,
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
            decoder_kv_ttl_s: None,
            kv_events: None,
            offers: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
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

    /// Every pod publishes its cache's changes as KV events from now on,
    /// read at `/sim/kv_events` (`--kv-events`).
    pub fn publish_kv_events(&mut self) {
        let events = Arc::new(super::kv_events::KvEvents::new(self.text));
        for pod in &self.pods {
            pod.publish_kv_events(Arc::clone(&events));
        }
        self.kv_events = Some(events);
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

    /// Keeps finished decode `key` of `pod` (its blocks held by the engine)
    /// for the next turn's prefill until the TTL ends, and returns the
    /// `kv_transfer_params` its answer carries; `None` when the decode pods
    /// do not keep their KV. `tokens`: prompt and generated.
    pub fn keep(self: &Arc<Self>, pod: &Arc<Pod>, key: u64, tokens: u32) -> Option<Value> {
        let ttl = self.decoder_kv_ttl_s?;
        let id = format!("simd-{}", self.next_offer.fetch_add(1, Ordering::Relaxed));
        let expiry_s = pod.clock.now_s() + ttl;
        let tokens = tokens.saturating_sub(1);
        let kept = Kept {
            decode: pod.index,
            key,
            tokens,
            expiry_s,
        };
        lock(&self.kept).insert(id.clone(), kept);
        let (fleet, clock, expiring) = (Arc::clone(self), pod.clock, id.clone());
        tokio::spawn(async move {
            clock.sleep(ttl).await;
            fleet.drop_kept(&expiring);
        });
        let blocks: Vec<u32> = (0..tokens.div_ceil(BLOCK_TOKENS).max(1)).collect();
        Some(json!({
            "do_remote_prefill": false,
            "do_remote_decode": true,
            "remote_block_ids": [blocks],
            "remote_engine_id": pod.name,
            "remote_request_id": id,
            "remote_host": "localhost",
            "remote_port": pod.port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": tokens,
            "remote_blocks_expiry_time": expiry_s,
            "remote_registration_generation": 0,
            "transfer_mode": "pull",
        }))
    }

    /// Forgets kept KV `id` and frees its blocks (its TTL ended).
    fn drop_kept(&self, id: &str) {
        let kept = lock(&self.kept).remove(id);
        if let Some(k) = kept {
            if let Some(pod) = self.pod(k.decode) {
                pod.release_held(k.key);
            }
        }
    }

    /// The kept decode KV a prefill's `kv_transfer_params` name, taken
    /// (single use) and its blocks freed, at modelled time `now_s`: the
    /// decode pod and the tokens it holds. `Err`: why there is nothing to
    /// pull (unknown, already pulled, expired, or another pod named), which
    /// vLLM's `kv_load_failure_policy: fail` answers with a 500. The pod may
    /// be named `localhost` (as it answered) or by its address, as a router
    /// rewrites it.
    pub fn take_kept(&self, kv: &Value, now_s: f64) -> Result<(usize, u32), String> {
        let str_of = |k: &str| kv.get(k).and_then(Value::as_str);
        let (Some(id), Some(engine), Some(host), Some(port)) = (
            str_of("remote_request_id"),
            str_of("remote_engine_id"),
            str_of("remote_host"),
            kv.get("remote_port").and_then(Value::as_u64),
        ) else {
            return Err(
                "remote_request_id, remote_engine_id, remote_host and remote_port are required"
                    .into(),
            );
        };
        let mut kept = lock(&self.kept);
        let k = kept
            .get(id)
            .cloned()
            .ok_or_else(|| format!("no KV kept as {id}: already pulled, expired or unknown"))?;
        let pod = self
            .pod(k.decode)
            .ok_or_else(|| format!("no pod holds {id}"))?;
        let named = engine == pod.name
            && port == u64::from(pod.port)
            && ["localhost", pod.ip.as_str(), pod.address().as_str()].contains(&host);
        if !named {
            return Err(format!(
                "{engine} at {host}:{port} holds no {id} (it is {}'s, at {})",
                pod.name,
                pod.address()
            ));
        }
        kept.remove(id);
        drop(kept);
        pod.release_held(k.key);
        if now_s > k.expiry_s {
            return Err(format!("the KV of {id} expired at {:.1} s", k.expiry_s));
        }
        Ok((k.decode, k.tokens))
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

//! Shared state of one mock pod: its config, where it listens, what it has
//! seen (for /debug/requests and /metrics) and the hand-off stores.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{Config, Connector, Load};
use crate::peer::Peers;
use crate::store::aborts::Aborts;
use crate::store::encoded::Encoded;
use crate::store::gen_first::GenFirst;
use crate::store::offers::Offers;
use crate::store::rooms::Rooms;
use crate::store::side::{CtxEntry, SideStore};

/// How long offered KV waits for its consumer: vLLM Mooncake's
/// `VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT` (480 s); NIXL push holds the
/// prefill's blocks for `kv_lease_duration` (30 s).
const MOONCAKE_TTL: Duration = Duration::from_secs(480);
const PUSH_LEASE: Duration = Duration::from_secs(30);

/// Addresses actually bound (ports are usually chosen by the OS).
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub http: SocketAddr,
    pub side: Option<SocketAddr>,
    pub bootstrap: Option<SocketAddr>,
    /// vLLM P2P NCCL: the "ZMQ" listener.
    pub zmq: Option<SocketAddr>,
}

#[derive(Serialize, Clone)]
pub struct DebugRecord {
    pub path: String,
    /// The model the request named (JSON `model`, or the multipart form's
    /// `model` field); `None` when it named none.
    pub model: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

pub struct AppState {
    pub config: Config,
    pub bound: Bound,
    pub running: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// POSTs that ended with a complete successful answer (non-streamed
    /// answer built, or stream sent to its end): `request_success_total`.
    pub finished: AtomicU64,
    /// Reported load, starting from the `--report-*` flags; `POST /debug/load`
    /// changes it.
    pub load: Mutex<Load>,
    pub debug: Mutex<Vec<DebugRecord>>,
    pub side: SideStore,
    /// TensorRT-LLM generation-first: contexts and generations meeting.
    pub gen_first: GenFirst<CtxEntry>,
    pub rooms: Rooms,
    /// SGLang: the request ids `POST /abort_request` named.
    pub aborts: Aborts,
    /// vLLM E/P/D encoder (NIXL): the hashes of the items it encoded.
    pub encoded: Encoded,
    /// Mooncake / NIXL push (prefill side), P2P NCCL (decode side).
    pub offers: Offers,
    /// vLLM Mooncake prefill: the engine id, `<name>-<random hex>` (with
    /// `--dp-size` N > 1 rank r is `<id>_dp<r>`), drawn at start so a router
    /// has to read it from `GET /query`.
    pub mooncake_engine_id: String,
    pub started: Instant,
    pub peers: Peers,
    /// API POSTs received so far (numbers them for `fail-after:N`).
    pub posts: AtomicU64,
    seq: AtomicU64,
    random: RandomState,
    random_seq: AtomicU64,
}

pub type Shared = Arc<AppState>;

/// Seconds since the Unix epoch (0 if the clock is before it): `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl AppState {
    pub fn new(config: Config, bound: Bound, peers: Peers) -> Self {
        let load = config.load;
        let random = RandomState::new();
        let mut h = random.build_hasher();
        h.write(b"mooncake engine id");
        let mooncake_engine_id = format!("{}-{:016x}", config.name, h.finish());
        let ttl = if config.connector == Connector::NixlPush {
            PUSH_LEASE
        } else {
            MOONCAKE_TTL
        };
        AppState {
            config,
            bound,
            running: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            load: Mutex::new(load),
            debug: Mutex::new(Vec::new()),
            side: SideStore::default(),
            gen_first: GenFirst::default(),
            rooms: Rooms::default(),
            aborts: Aborts::default(),
            encoded: Encoded::default(),
            offers: Offers::new(ttl),
            mooncake_engine_id,
            started: Instant::now(),
            peers,
            posts: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            random,
            random_seq: AtomicU64::new(0),
        }
    }

    /// `mock <engine> <role>`: the prefix of every error message.
    pub fn label(&self) -> String {
        format!(
            "mock {} {}",
            self.config.engine.as_str(),
            self.config.role.as_str()
        )
    }

    /// The Mooncake engine id of data-parallel rank `rank`.
    pub fn mooncake_rank_id(&self, rank: u64) -> String {
        if self.config.dp_size > 1 {
            format!("{}_dp{rank}", self.mooncake_engine_id)
        } else {
            self.mooncake_engine_id.clone()
        }
    }

    /// A fresh id suffix: pod name plus a per-process sequence number, so ids
    /// are unique and still readable in logs.
    pub fn next_id(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.config.name)
    }

    /// Unpredictable 64-bit value (std's per-process random hash keys mixed
    /// with a counter), so block ids differ between runs without a rand crate.
    pub fn random_u64(&self) -> u64 {
        let mut h = self.random.build_hasher();
        h.write_u64(self.random_seq.fetch_add(1, Ordering::Relaxed));
        h.finish()
    }

    /// Counts a POST as running until the guard (possibly moved into a
    /// streaming body) is dropped.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.running.fetch_add(1, Ordering::Relaxed);
        InFlight {
            state: self.clone(),
            succeeded: false,
            countable: true,
        }
    }

    /// Like [`AppState::in_flight`], for a POST whose answer a fault will
    /// spoil after the engine built it: never counted as finished.
    pub fn in_flight_faulted(self: &Arc<Self>) -> InFlight {
        let mut guard = self.in_flight();
        guard.countable = false;
        guard
    }
}

/// One running POST. Dropped plainly (error, fault, client gone mid-stream)
/// it only stops counting as running; [`InFlight::finish`] also counts it as
/// a finished request.
pub struct InFlight {
    state: Shared,
    succeeded: bool,
    countable: bool,
}

impl InFlight {
    /// The request ended with a complete answer.
    pub fn finish(mut self) {
        self.succeeded = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.succeeded && self.countable {
            self.state.finished.fetch_add(1, Ordering::Relaxed);
        }
        self.state.running.fetch_sub(1, Ordering::Relaxed);
    }
}

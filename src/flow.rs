//! The per-request state machine. Each host callback is one `match` on the
//! phase, and every path ends in exactly one resume or one local reply.
//! Router-side load (outstanding prefills, pending decodes) is taken when a
//! pod is chosen and given back when its part ends, or at the end of the
//! stream whatever happened, so the shared counters return to zero.

use crate::api::{read_facts, Api, Facts};
use crate::body::{Edits, TopLevel};
use crate::config::{fnv1a, Config, Endpoint};
use crate::engine::{build_legs, Entropy, Merged, PdContext, PrefillAnswer, Registry};
use crate::error::{upstream_message, ClientError, PdError, PrefillFailure};
use crate::host::{Action, Counter, Host, Level, PodEvent};
use crate::sched::prefix::{self, PrefixEntry, PrefixMatch};
use crate::sched::state::{self, PodCounters, SharedStore, StoredMetrics};
use crate::sched::{estimate_tokens, schedule, Ask, Decision, NoPod, PodState, PrefillPolicy};
use crate::select::RoundRobin;
use crate::trt_id::{DisaggIdGenerator, InvalidMachineId};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Response headers naming the pods of a request.
pub const PREFILL_POD_HEADER: &str = "prefill-target-pod";
pub const PREFILL_POD_IP_HEADER: &str = "prefill-target-pod-ip";
pub const DECODE_POD_HEADER: &str = "decode-target-pod";

/// Client headers that travel to the prefill leg too: credentials, and trace
/// context so both legs land in one trace.
const FORWARDED_HEADERS: [&str; 14] = [
    "authorization",
    "traceparent",
    "tracestate",
    "baggage",
    "b3",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "x-b3-flags",
    "x-ot-span-context",
    "x-cloud-trace-context",
    "x-datadog-trace-id",
    "x-datadog-parent-id",
];

/// Per-VM state shared by every stream: the validated config and what the
/// router remembers between requests.
pub struct Router {
    pub config: Config,
    pub registry: Registry,
    round_robin: RoundRobin,
    turns: Vec<Cell<u64>>,
    trt_ids: RefCell<DisaggIdGenerator>,
    /// This VM's copy of the scraped metrics, refreshed on each tick.
    metrics: RefCell<Vec<StoredMetrics>>,
    pub load_key: String,
    pub metrics_key: String,
}

impl Router {
    /// `worker_slot` keeps TensorRT-LLM ids of this VM apart from other
    /// workers' (see [`crate::trt_id`]).
    pub fn new(config: Config, worker_slot: u8) -> Result<Router, InvalidMachineId> {
        let trt_ids = DisaggIdGenerator::new(config.trt_machine_id, worker_slot)?;
        Ok(Router {
            round_robin: RoundRobin::new(&config),
            registry: Registry::builtin(),
            turns: config.models.iter().map(|_| Cell::new(0)).collect(),
            metrics: RefCell::new(vec![StoredMetrics::default(); config.pods.len()]),
            load_key: state::load_key(&config.fingerprint),
            metrics_key: state::metrics_key(&config.fingerprint),
            config,
            trt_ids: RefCell::new(trt_ids),
        })
    }

    /// Copies the shared metrics table into this VM (once per tick, not per
    /// request: metrics change only as often as they are scraped).
    pub fn refresh_metrics<S: SharedStore + ?Sized>(&self, store: &S) {
        let (bytes, _) = store.shared_get(&self.metrics_key);
        *self.metrics.borrow_mut() =
            state::decode_metrics(bytes.as_deref(), self.config.pods.len());
    }

    /// The shared counters of every pod.
    pub fn counters<S: SharedStore + ?Sized>(&self, store: &S) -> Vec<PodCounters> {
        let (bytes, _) = store.shared_get(&self.load_key);
        state::decode_load(bytes.as_deref(), self.config.pods.len())
    }

    fn pod_states(&self, counters: &[PodCounters], now_ms: u64) -> Vec<PodState> {
        let metrics = self.metrics.borrow();
        counters
            .iter()
            .enumerate()
            .map(|(i, c)| PodState {
                outstanding_prefills: c.outstanding_prefills,
                pending_decodes: c.pending_decodes,
                unhealthy: c.unhealthy_until_ms > now_ms,
                metrics: metrics
                    .get(i)
                    .and_then(|m| m.fresh(now_ms, self.config.metrics_ttl_ms)),
            })
            .collect()
    }

    fn next_turn(&self, model: usize) -> u64 {
        self.turns
            .get(model)
            .map(|t| {
                let v = t.get();
                t.set(v.wrapping_add(1));
                v
            })
            .unwrap_or(0)
    }
}

/// A client request being placed, kept until its prefill succeeded so it can
/// be placed again after a prefill failure.
struct Placing {
    body: Vec<u8>,
    top: TopLevel,
    facts: Facts,
    model: usize,
    tokens: u64,
    hashes: Vec<u64>,
    prefix: PrefixMatch,
    exclude: Vec<usize>,
    attempt: u32,
}

/// A sync prefill in flight.
struct Pending {
    token: u32,
    req: Placing,
    decode: Edits,
    prefill: Endpoint,
    decode_pod: Endpoint,
}

enum Phase {
    /// Before request headers.
    Start,
    /// A split path: collecting the body.
    Buffering(Api),
    /// Paused until the prefill answers.
    AwaitingPrefill(Box<Pending>),
    /// The request went upstream. For async engines the prefill may still be
    /// in flight; `body_seen` tells whether decode output already reached the
    /// client.
    Forwarded {
        async_prefill: Option<(u32, usize)>,
        body_seen: bool,
    },
    /// A local reply ended the stream.
    Replied,
}

/// Load this stream holds on pods (pod indices), given back exactly once.
#[derive(Debug, Default)]
struct Held {
    prefill: Option<usize>,
    decode: Option<usize>,
}

/// Where `place` left the stream.
enum Placed {
    /// Sent upstream: a body callback returns Continue, a call callback resumes.
    Upstream,
    /// Waiting for the prefill answer.
    Waiting,
}

/// One HTTP stream's flow.
pub struct Flow {
    router: Rc<Router>,
    phase: Phase,
    request_id: String,
    path: String,
    authority: String,
    forwarded: Vec<(&'static str, String)>,
    /// The prefill pod of a split request (name, IP), for the response.
    prefill_pod: Option<(String, String)>,
    /// The pod the request went to.
    decode_pod: Option<String>,
    held: Held,
}

struct HostEntropy<'a, H: Host> {
    host: &'a mut H,
    trt: &'a RefCell<DisaggIdGenerator>,
}

impl<H: Host> Entropy for HostEntropy<'_, H> {
    fn random_u64(&mut self) -> Result<u64, String> {
        self.host.random_u64()
    }
    fn disagg_request_id(&mut self) -> i64 {
        let now = self.host.now_ms();
        self.trt.borrow_mut().next_id(now)
    }
}

/// The bytes that identify a prompt for prefix matching and its length:
/// `messages` (then `tools`), `prompt`, or `input`, as sent. Only the first
/// `cap` bytes are copied.
fn prompt_key(api: Api, body: &[u8], top: &TopLevel, cap: usize) -> (Vec<u8>, usize) {
    let parts: Vec<&[u8]> = match api {
        Api::ChatCompletions => ["messages", "tools"]
            .iter()
            .filter_map(|k| top.raw(body, k))
            .collect(),
        Api::Completions => top.raw(body, "prompt").into_iter().collect(),
        Api::Responses => top.raw(body, "input").into_iter().collect(),
    };
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut key = Vec::with_capacity(len.min(cap));
    for p in parts {
        let room = cap - key.len();
        key.extend_from_slice(&p[..p.len().min(room)]);
    }
    (key, len)
}

/// What a prefill answer says about its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The pod worked: its failure streak ends.
    Worked,
    /// The pod is down (refused, reset): eject it now.
    Down,
    /// The pod failed (5xx, timeout): ejected after `eject_after_failures`
    /// in a row, since one bad request must not take a pod out.
    Failed,
    /// The request was refused for its own sake (4xx): says nothing.
    Neutral,
}

fn verdict(outcome: &Result<(), PrefillFailure>) -> Verdict {
    match outcome {
        Ok(()) => Verdict::Worked,
        Err(PrefillFailure::Unreachable(_) | PrefillFailure::Reset) => Verdict::Down,
        Err(PrefillFailure::Timeout | PrefillFailure::ServerError { .. }) => Verdict::Failed,
        Err(_) => Verdict::Neutral,
    }
}

/// Failures another prefill pod may not have (SMG's list: 408, 429, 5xx).
fn retryable(f: &PrefillFailure) -> bool {
    matches!(
        f,
        PrefillFailure::Unreachable(_)
            | PrefillFailure::Reset
            | PrefillFailure::Timeout
            | PrefillFailure::ServerError { .. }
            | PrefillFailure::Rejected {
                status: 408 | 429,
                ..
            }
    )
}

impl Flow {
    pub fn new(router: Rc<Router>) -> Flow {
        Flow {
            router,
            phase: Phase::Start,
            request_id: String::new(),
            path: String::new(),
            authority: String::new(),
            forwarded: Vec::new(),
            prefill_pod: None,
            decode_pod: None,
            held: Held::default(),
        }
    }

    /// A debug line, formatted only when debug logging is on.
    fn debug<H: Host>(&self, host: &H, msg: impl FnOnce() -> String) {
        if host.log_enabled(Level::Debug) {
            self.log(host, Level::Debug, &msg());
        }
    }

    fn log<H: Host>(&self, host: &H, level: Level, msg: &str) {
        let id = if self.request_id.is_empty() {
            "-"
        } else {
            &self.request_id
        };
        host.log(level, &format!("[{id}] {msg}"));
    }

    /// Ends the stream with the error's reply.
    fn fail<H: Host>(&mut self, host: &mut H, err: PdError) -> Action {
        let reply = err.reply();
        let level = if reply.status >= 500 {
            Level::Warn
        } else {
            Level::Info
        };
        self.log(
            host,
            level,
            &format!("{} {}: {err}", reply.status, self.path),
        );
        host.increment(Counter::LocalReply);
        self.release(host, true, true, None);
        host.send_reply(
            reply.status,
            &[("content-type", "application/json")],
            &reply.body,
        );
        self.phase = Phase::Replied;
        Action::Pause
    }

    /// Gives back held load, and records what a prefill answer said about its
    /// pod (`judged`), in one shared-data update.
    fn release<H: Host>(
        &mut self,
        host: &mut H,
        prefill: bool,
        decode: bool,
        judged: Option<(usize, Verdict)>,
    ) {
        let p = if prefill {
            self.held.prefill.take()
        } else {
            None
        };
        let d = if decode {
            self.held.decode.take()
        } else {
            None
        };
        if p.is_none() && d.is_none() && judged.is_none() {
            return;
        }
        let router = Rc::clone(&self.router);
        let until = host
            .now_ms()
            .saturating_add(router.config.unhealthy_cooldown_ms);
        let threshold = router.config.eject_after_failures;
        let n = router.config.pods.len();
        let mut ejected = None;
        let result = state::update_load(host, &router.load_key, n, |pods| {
            ejected = None;
            if let Some(c) = p.and_then(|i| pods.get_mut(i)) {
                c.outstanding_prefills = c.outstanding_prefills.saturating_sub(1);
            }
            if let Some(c) = d.and_then(|i| pods.get_mut(i)) {
                c.pending_decodes = c.pending_decodes.saturating_sub(1);
            }
            if let Some((i, v)) = judged {
                if let Some(c) = pods.get_mut(i) {
                    match v {
                        Verdict::Worked => c.failures = 0,
                        Verdict::Neutral => {}
                        Verdict::Down | Verdict::Failed => {
                            c.failures = c.failures.saturating_add(1);
                            if v == Verdict::Down || c.failures >= threshold {
                                c.unhealthy_until_ms = c.unhealthy_until_ms.max(until);
                                c.failures = 0;
                                ejected = Some(i);
                            }
                        }
                    }
                }
            }
        });
        if let Err(e) = result {
            self.log(
                host,
                Level::Error,
                &format!("could not update pod load: {e}"),
            );
        }
        if let Some(pod) = ejected {
            host.increment(Counter::Ejection);
            host.count_pod(pod, PodEvent::Ejected);
            let name = router
                .config
                .pods
                .get(pod)
                .map(|p| p.name.as_str())
                .unwrap_or("?");
            self.log(
                host,
                Level::Warn,
                &format!(
                    "pod {name} marked unhealthy for {} ms",
                    router.config.unhealthy_cooldown_ms
                ),
            );
        }
    }

    fn hold<H: Host>(&mut self, host: &mut H, prefill: Option<usize>, decode: Option<usize>) {
        let router = Rc::clone(&self.router);
        let n = router.config.pods.len();
        let result = state::update_load(host, &router.load_key, n, |pods| {
            if let Some(c) = prefill.and_then(|i| pods.get_mut(i)) {
                c.outstanding_prefills = c.outstanding_prefills.saturating_add(1);
            }
            if let Some(c) = decode.and_then(|i| pods.get_mut(i)) {
                c.pending_decodes = c.pending_decodes.saturating_add(1);
            }
        });
        match result {
            Ok(_) => {
                self.held.prefill = prefill.or(self.held.prefill);
                self.held.decode = decode.or(self.held.decode);
            }
            // Routing goes on without load accounting rather than failing.
            Err(e) => self.log(
                host,
                Level::Error,
                &format!("could not update pod load: {e}"),
            ),
        }
        if let Some(p) = prefill {
            host.count_pod(p, PodEvent::PrefillSelected);
        }
        if let Some(d) = decode {
            host.count_pod(d, PodEvent::DecodeSelected);
        }
    }

    pub fn on_request_headers<H: Host>(&mut self, host: &mut H, end_of_stream: bool) -> Action {
        let router = Rc::clone(&self.router);
        let config = &router.config;
        // Whatever happens next, the client never picks the upstream.
        host.set_request_header(&config.routing_header, None);

        let headers = host.request_headers();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        self.request_id = header("x-request-id").unwrap_or_default();
        self.path = header(":path").unwrap_or_default();
        let method = header(":method").unwrap_or_default();

        let Some(api) = Api::from_path(&self.path) else {
            return self.forward_unsplit(host);
        };
        if method != "POST" {
            return self.fail(host, ClientError::MethodNotAllowed(method).into());
        }
        if end_of_stream {
            return self.fail(host, crate::body::BodyError::Empty.into());
        }
        if let Some(len) = header("content-length") {
            if len
                .trim()
                .parse::<u64>()
                .is_ok_and(|n| n > config.max_body_bytes as u64)
            {
                return self.fail(
                    host,
                    ClientError::TooLarge {
                        limit: config.max_body_bytes,
                    }
                    .into(),
                );
            }
        }
        self.authority = header(":authority").unwrap_or_default();
        self.forwarded = FORWARDED_HEADERS
            .iter()
            .filter_map(|name| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| std::str::from_utf8(v).ok())
                    .map(|v| (*name, v.to_owned()))
            })
            .collect();
        self.phase = Phase::Buffering(api);
        // Pausing keeps the header map writable until the decode routing header
        // is known (needs allow_on_headers_stop_iteration in the filter config).
        Action::Pause
    }

    /// Paths the router does not split go to a healthy decode pod it chose.
    fn forward_unsplit<H: Host>(&mut self, host: &mut H) -> Action {
        let router = Rc::clone(&self.router);
        let now = host.now_ms();
        let counters = router.counters(host);
        let healthy = |e: &Endpoint| {
            counters
                .get(e.pod)
                .is_none_or(|c| c.unhealthy_until_ms <= now)
        };
        match router.round_robin.any_decode(healthy) {
            Some(pod) => {
                host.set_request_header(&router.config.routing_header, Some(&pod.address));
                host.increment(Counter::Unsplit);
                self.decode_pod = Some(pod.name.clone());
                self.phase = Phase::Forwarded {
                    async_prefill: None,
                    body_seen: false,
                };
                Action::Continue
            }
            None => self.fail(
                host,
                PdError::NoEndpoint {
                    model: "(any)".into(),
                },
            ),
        }
    }

    pub fn on_request_body<H: Host>(
        &mut self,
        host: &mut H,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        match self.phase {
            Phase::Buffering(api) => {
                let limit = self.router.config.max_body_bytes;
                if body_size > limit {
                    return self.fail(host, ClientError::TooLarge { limit }.into());
                }
                if !end_of_stream {
                    // body_size is the total buffered so far; read once at the end.
                    return Action::Pause;
                }
                match self.split(host, api, body_size) {
                    Ok(Placed::Upstream) => Action::Continue,
                    Ok(Placed::Waiting) => Action::Pause,
                    Err(e) => self.fail(host, e),
                }
            }
            Phase::Replied | Phase::AwaitingPrefill(_) => Action::Pause,
            Phase::Start | Phase::Forwarded { .. } => Action::Continue,
        }
    }

    fn split<H: Host>(
        &mut self,
        host: &mut H,
        api: Api,
        body_size: usize,
    ) -> Result<Placed, PdError> {
        let router = Rc::clone(&self.router);
        let config = &router.config;
        let body = host.request_body(body_size).unwrap_or_default();
        let top = TopLevel::parse(&body)?;
        let facts = read_facts(api, &body, &top)?;
        let (model_index, model) = config
            .model_entry(&facts.model)
            .ok_or_else(|| ClientError::UnknownModel(facts.model.clone()))?;
        let handler = router.registry.resolve(&model.engine);
        if let Some(key) = handler.owned_keys().iter().find(|k| top.contains(k)) {
            return Err(ClientError::RouterOwnedKey {
                key: (*key).to_owned(),
                engine: handler.name().to_owned(),
            }
            .into());
        }
        let s = &config.scheduling;
        let hashing = model.prefill_policy == PrefillPolicy::PrefixCache;
        // Only the prefix policy reads the prompt's bytes; the others need its
        // length alone, so nothing is copied for them.
        let cap = if hashing {
            s.prefix_block_bytes.saturating_mul(s.prefix_max_blocks)
        } else {
            0
        };
        let (key, prompt_len) = prompt_key(api, &body, &top, cap);
        let hashes = if hashing {
            prefix::block_hashes(
                &key,
                fnv1a(model.name.as_bytes()),
                s.prefix_block_bytes,
                s.prefix_max_blocks,
            )
        } else {
            Vec::new()
        };
        let now = host.now_ms();
        let slots = s.prefix_table_slots;
        let fp = &config.fingerprint;
        let prefix = prefix::walk(
            &hashes,
            |h| {
                let (v, _) = host.shared_get(&prefix::slot_key(fp, prefix::slot_of(h, slots)));
                v.as_deref().and_then(PrefixEntry::decode)
            },
            now,
            s.prefix_ttl_ms,
        );
        let req = Placing {
            body,
            top,
            facts,
            model: model_index,
            tokens: estimate_tokens(prompt_len),
            hashes,
            prefix,
            exclude: Vec::new(),
            attempt: 0,
        };
        self.place(host, req, body_size)
    }

    /// Chooses pods for `req` and sends it on: the prefill dispatched (and,
    /// for async engines, the decode too), or the whole request to one pod.
    fn place<H: Host>(
        &mut self,
        host: &mut H,
        req: Placing,
        body_size: usize,
    ) -> Result<Placed, PdError> {
        let router = Rc::clone(&self.router);
        let config = &router.config;
        let model = &config.models[req.model];
        let handler = router.registry.resolve(&model.engine);

        let now = host.now_ms();
        let counters = router.counters(host);
        let pods = router.pod_states(&counters, now);
        let turn = router.next_turn(req.model);
        let decision = {
            let prefix = &req.prefix;
            let match_of = |pod: usize| prefix.percent(pod);
            let mut random = || {
                host.random_u64()
                    .unwrap_or(turn.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            };
            let mut ask = Ask {
                prompt_tokens: req.tokens,
                prefix_match: &match_of,
                turn,
                random: &mut random,
                exclude: &req.exclude,
            };
            schedule(model, &pods, &mut ask, &config.scheduling)
        };
        let (prefill, decode) = match decision {
            Decision::NoPod(NoPod::NotConfigured) => {
                return Err(PdError::NoEndpoint {
                    model: model.name.clone(),
                })
            }
            Decision::NoPod(NoPod::AllUnhealthy) => {
                return Err(PdError::Unavailable(format!(
                    "every prefill/decode pod of model `{}` is unhealthy or failed this request; retry later",
                    model.name
                )))
            }
            Decision::NoPod(NoPod::NoBucket) => {
                return Err(PdError::Unavailable(format!(
                    "no pod of model `{}` serves prompts of about {} tokens",
                    model.name, req.tokens
                )))
            }
            Decision::Combined { pod, reason } => {
                host.increment(Counter::Combined);
                self.debug(host, || format!("combined pod {} ({reason})", pod.address));
                return Ok(self.forward_whole(host, pod));
            }
            Decision::Split { prefill, decode, .. } => (prefill, decode),
        };

        let request_id = self.request_id.clone();
        let mut entropy = HostEntropy {
            host: &mut *host,
            trt: &router.trt_ids,
        };
        let mut ctx = PdContext {
            facts: &req.facts,
            body: &req.body,
            top: &req.top,
            request_id: &request_id,
            model_connector: model.kv_connector,
            entropy: &mut entropy,
        };
        if !handler.should_split(&ctx, prefill) {
            return Ok(self.forward_whole(host, decode));
        }
        let legs = build_legs(handler, &mut ctx, prefill)?;
        let prefill_body = req.top.render(&req.body, &legs.prefill);

        self.hold(host, Some(prefill.pod), Some(decode.pod));
        self.remember_prefix(host, &req, prefill.pod, now);
        let token = match self.dispatch_prefill(host, prefill, &prefill_body) {
            Ok(t) => t,
            Err(e) => {
                self.release(host, true, true, None);
                return Err(e);
            }
        };
        host.increment(Counter::Split);
        self.prefill_pod = Some((prefill.name.clone(), prefill.ip.clone()));
        self.decode_pod = Some(decode.name.clone());
        self.debug(host, || {
            format!(
                "{} {}: prefill {} decode {} (attempt {})",
                handler.name(),
                self.path,
                prefill.address,
                decode.address,
                req.attempt + 1
            )
        });

        if handler.is_async() {
            // SGLang: the prefill waits for the decode to register its room, so
            // the decode goes out now and the prefill answer is only watched.
            let decode_body = req.top.render(&req.body, &legs.decode);
            if let Err(e) = self.send_decode(host, body_size, &decode_body, &decode.address) {
                self.release(host, true, true, None);
                return Err(e);
            }
            self.phase = Phase::Forwarded {
                async_prefill: Some((token, prefill.pod)),
                body_seen: false,
            };
            return Ok(Placed::Upstream);
        }
        self.phase = Phase::AwaitingPrefill(Box::new(Pending {
            token,
            decode: legs.decode,
            prefill: prefill.clone(),
            decode_pod: decode.clone(),
            req,
        }));
        Ok(Placed::Waiting)
    }

    /// Sends the client's request unchanged to one pod (a combined pod, or
    /// the decode pod of a request that is not split).
    fn forward_whole<H: Host>(&mut self, host: &mut H, pod: &Endpoint) -> Placed {
        host.set_request_header(&self.router.config.routing_header, Some(&pod.address));
        host.increment(Counter::Unsplit);
        self.hold(host, None, Some(pod.pod));
        self.decode_pod = Some(pod.name.clone());
        self.phase = Phase::Forwarded {
            async_prefill: None,
            body_seen: false,
        };
        Placed::Upstream
    }

    /// Records `pod` as the holder of the prompt's blocks it does not hold yet.
    fn remember_prefix<H: Host>(&self, host: &mut H, req: &Placing, pod: usize, now: u64) {
        if req.hashes.is_empty() {
            return;
        }
        let s = &self.router.config.scheduling;
        let held = if req.prefix.percent(pod) > 0.0 {
            req.prefix.depth
        } else {
            0
        };
        for h in &prefix::to_record(&req.hashes, held) {
            let entry = PrefixEntry {
                hash: *h,
                pod: pod as u32,
                at_ms: now,
            };
            let key = prefix::slot_key(
                &self.router.config.fingerprint,
                prefix::slot_of(*h, s.prefix_table_slots),
            );
            // Last writer wins: the table is a hint, not an account.
            let _ = host.shared_set(&key, &entry.encode(), None);
        }
    }

    fn dispatch_prefill<H: Host>(
        &self,
        host: &mut H,
        pod: &Endpoint,
        body: &[u8],
    ) -> Result<u32, PdError> {
        let config = &self.router.config;
        let authority = if self.authority.is_empty() {
            pod.address.as_str()
        } else {
            self.authority.as_str()
        };
        let mut headers: Vec<(&str, &str)> = Vec::with_capacity(8 + self.forwarded.len());
        headers.push((":method", "POST"));
        headers.push((":path", &self.path));
        headers.push((":authority", authority));
        headers.push(("content-type", "application/json"));
        headers.push((&config.routing_header, &pod.address));
        if !self.request_id.is_empty() {
            headers.push(("x-request-id", &self.request_id));
        }
        for (k, v) in &self.forwarded {
            headers.push((k, v));
        }
        host.dispatch(
            &config.prefill_cluster,
            &headers,
            body,
            config.prefill_timeout_ms,
        )
        .map_err(|e| {
            PdError::Prefill(PrefillFailure::Dispatch(format!(
                "cluster {:?}: {e}",
                config.prefill_cluster
            )))
        })
    }

    /// Points the paused request at the decode pod with its new body.
    fn send_decode<H: Host>(
        &self,
        host: &mut H,
        old_len: usize,
        body: &[u8],
        decode_address: &str,
    ) -> Result<(), PdError> {
        host.replace_request_body(old_len, body)
            .map_err(|e| PdError::Internal(format!("could not replace the request body: {e}")))?;
        // Envoy does not fix content-length after a body change; a stale one
        // corrupts the upstream connection.
        host.set_request_header("content-length", Some(&body.len().to_string()));
        host.set_request_header("transfer-encoding", None);
        host.set_request_header(&self.router.config.routing_header, Some(decode_address));
        Ok(())
    }

    /// The prefill call answered: `status` is `None` when the connection was
    /// reset before any header.
    pub fn on_prefill_response<H: Host>(
        &mut self,
        host: &mut H,
        token: u32,
        status: Option<u16>,
        body_size: usize,
    ) {
        match std::mem::replace(&mut self.phase, Phase::Replied) {
            Phase::AwaitingPrefill(pending) if pending.token == token => {
                let pending = *pending;
                let outcome = classify(status, || host.call_response_body(body_size));
                self.release(
                    host,
                    true,
                    false,
                    Some((pending.prefill.pod, verdict(&outcome))),
                );
                let result = match outcome {
                    Ok(()) => self.finish_sync(host, pending, body_size),
                    Err(f) => self.retry_or_fail(host, pending, f),
                };
                if let Err(e) = result {
                    if matches!(e, PdError::Prefill(_)) {
                        host.increment(Counter::PrefillFailed);
                    }
                    self.fail(host, e);
                }
            }
            Phase::Forwarded {
                async_prefill: Some((t, pod)),
                body_seen,
            } if t == token => {
                self.phase = Phase::Forwarded {
                    async_prefill: None,
                    body_seen,
                };
                let outcome = classify(status, || host.call_response_body(body_size));
                self.release(host, true, false, Some((pod, verdict(&outcome))));
                if let Err(failure) = outcome {
                    host.increment(Counter::PrefillFailed);
                    if body_seen {
                        // Decode output already reached the client, so the
                        // hand-off worked; the prefill's late error is noise.
                        self.log(
                            host,
                            Level::Warn,
                            &format!("prefill failed after the decode produced output: {failure}"),
                        );
                    } else {
                        // Without its prefill the decode would wait out its
                        // bootstrap timeout: fail now. After the response
                        // headers this cuts the stream short. No retry: the
                        // decode already went out with this prefill's room.
                        self.fail(host, PdError::AsyncPrefill(failure));
                    }
                }
            }
            other => {
                // A stale token (the stream already replied or moved on).
                self.phase = other;
            }
        }
    }

    /// A failed sync prefill: place the request again on another pod while
    /// retries remain, else fail with the prefill's error.
    fn retry_or_fail<H: Host>(
        &mut self,
        host: &mut H,
        p: Pending,
        failure: PrefillFailure,
    ) -> Result<(), PdError> {
        let max = self.router.config.prefill_max_retries;
        if !retryable(&failure) || p.req.attempt >= max {
            return Err(PdError::Prefill(failure));
        }
        self.log(
            host,
            Level::Info,
            &format!(
                "prefill {} failed ({failure}); retrying on another pod",
                p.prefill.address
            ),
        );
        host.increment(Counter::PrefillRetry);
        self.release(host, false, true, None);
        let body_size = p.req.body.len();
        let mut req = p.req;
        req.exclude.push(p.prefill.pod);
        req.attempt += 1;
        match self.place(host, req, body_size) {
            Ok(Placed::Waiting) => Ok(()),
            Ok(Placed::Upstream) => {
                host.resume_request();
                Ok(())
            }
            // Nowhere left to go: the prefill's own failure says more.
            Err(PdError::Unavailable(_)) | Err(PdError::NoEndpoint { .. }) => {
                Err(PdError::Prefill(failure))
            }
            Err(e) => Err(e),
        }
    }

    fn finish_sync<H: Host>(
        &mut self,
        host: &mut H,
        p: Pending,
        body_size: usize,
    ) -> Result<(), PdError> {
        let answer = host.call_response_body(body_size).unwrap_or_default();
        let answer_top = TopLevel::parse(&answer)
            .map_err(|e| PdError::Prefill(PrefillFailure::BadAnswer(e.describe("the answer"))))?;

        let router = Rc::clone(&self.router);
        let model = &router.config.models[p.req.model];
        let handler = router.registry.resolve(&model.engine);
        let request_id = self.request_id.clone();
        let mut entropy = HostEntropy {
            host: &mut *host,
            trt: &router.trt_ids,
        };
        let mut ctx = PdContext {
            facts: &p.req.facts,
            body: &p.req.body,
            top: &p.req.top,
            request_id: &request_id,
            model_connector: model.kv_connector,
            entropy: &mut entropy,
        };
        let mut decode = p.decode;
        let merged = handler.merge_prefill_response(
            &mut ctx,
            &PrefillAnswer {
                body: &answer,
                top: &answer_top,
            },
            &p.prefill,
            &mut decode,
        )?;
        match merged {
            Merged::Answer { body, content_type } => {
                host.increment(Counter::ContextAnswered);
                self.release(host, true, true, None);
                host.send_reply(200, &[("content-type", content_type)], &body);
                self.phase = Phase::Replied;
                return Ok(());
            }
            Merged::ForwardWithoutHandoff => {
                host.increment(Counter::HandoffMissing);
                self.log(
                    host,
                    Level::Warn,
                    &format!(
                        "prefill {} answered without hand-off data; decode {} will recompute the prompt",
                        p.prefill.address, p.decode_pod.address
                    ),
                );
            }
            Merged::Forward => {}
        }
        if decode.is_empty() {
            // The decode leg is the client's body as sent (default engine, or
            // no hand-off): leave Envoy's buffer and content-length alone
            // rather than copying the body out and back in.
            host.set_request_header(
                &self.router.config.routing_header,
                Some(&p.decode_pod.address),
            );
        } else {
            let decode_body = p.req.top.render(&p.req.body, &decode);
            self.send_decode(host, p.req.body.len(), &decode_body, &p.decode_pod.address)?;
        }
        self.phase = Phase::Forwarded {
            async_prefill: None,
            body_seen: false,
        };
        host.resume_request();
        Ok(())
    }

    pub fn on_response_headers<H: Host>(&mut self, host: &mut H) -> Action {
        // Upstreams must not be able to forge which pods were used.
        let (name, ip) = match &self.prefill_pod {
            Some((n, ip)) => (Some(n.as_str()), Some(ip.as_str())),
            None => (None, None),
        };
        host.set_response_header(PREFILL_POD_HEADER, name);
        host.set_response_header(PREFILL_POD_IP_HEADER, ip);
        host.set_response_header(DECODE_POD_HEADER, self.decode_pod.as_deref());
        Action::Continue
    }

    pub fn on_response_body<H: Host>(&mut self, _host: &mut H, body_size: usize) -> Action {
        if let Phase::Forwarded { body_seen, .. } = &mut self.phase {
            *body_seen |= body_size > 0;
        }
        Action::Continue
    }

    /// The stream is over (completed, failed, or the client went away): give
    /// back whatever load it still holds. A prefill still in flight answers
    /// into the void.
    pub fn on_stream_end<H: Host>(&mut self, host: &mut H) {
        self.release(host, true, true, None);
    }
}

/// Classifies a prefill answer by status before anything parses its body:
/// Envoy reports refused connections as 503 and its own timeout as 504.
fn classify(
    status: Option<u16>,
    body: impl FnOnce() -> Option<Vec<u8>>,
) -> Result<(), PrefillFailure> {
    match status {
        None => Err(PrefillFailure::Reset),
        Some(s) if (200..300).contains(&s) => Ok(()),
        Some(504) => Err(PrefillFailure::Timeout),
        Some(503) => {
            let message = upstream_message(&body().unwrap_or_default());
            // Envoy's own reply when it could not reach the pod at all.
            if message.starts_with("upstream connect error")
                || message.starts_with("no healthy upstream")
            {
                Err(PrefillFailure::Unreachable(message))
            } else {
                Err(PrefillFailure::ServerError {
                    status: 503,
                    message,
                })
            }
        }
        Some(s) if (400..500).contains(&s) => Err(PrefillFailure::Rejected {
            status: s,
            message: upstream_message(&body().unwrap_or_default()),
        }),
        Some(s) => Err(PrefillFailure::ServerError {
            status: s,
            message: upstream_message(&body().unwrap_or_default()),
        }),
    }
}

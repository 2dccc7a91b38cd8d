//! The per-request state machine. Each host callback is one `match` on the
//! phase, and every path ends in exactly one resume or one local reply.

use crate::api::{read_facts, Api, Facts};
use crate::body::{Edits, TopLevel};
use crate::config::{Config, Endpoint};
use crate::engine::{build_legs, Entropy, Merged, PdContext, PrefillAnswer, Registry};
use crate::error::{upstream_message, ClientError, PdError, PrefillFailure};
use crate::host::{Action, Counter, Host, Level};
use crate::select::RoundRobin;
use crate::trt_id::{DisaggIdGenerator, InvalidMachineId};
use std::cell::RefCell;
use std::rc::Rc;

/// Response headers naming the prefill pod of a split request.
pub const PREFILL_POD_HEADER: &str = "prefill-target-pod";
pub const PREFILL_POD_IP_HEADER: &str = "prefill-target-pod-ip";

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
    trt_ids: RefCell<DisaggIdGenerator>,
}

impl Router {
    /// `worker_slot` keeps TensorRT-LLM ids of this VM apart from other
    /// workers' (see [`crate::trt_id`]).
    pub fn new(config: Config, worker_slot: u8) -> Result<Router, InvalidMachineId> {
        let trt_ids = DisaggIdGenerator::new(config.trt_machine_id, worker_slot)?;
        Ok(Router {
            round_robin: RoundRobin::new(&config),
            registry: Registry::builtin(),
            config,
            trt_ids: RefCell::new(trt_ids),
        })
    }
}

/// A sync prefill in flight: what is needed to build the decode request.
struct Pending {
    token: u32,
    body: Vec<u8>,
    top: TopLevel,
    facts: Facts,
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
        async_prefill: Option<u32>,
        response_started: bool,
        body_seen: bool,
    },
    /// A local reply ended the stream.
    Replied,
}

/// One HTTP stream's flow.
pub struct Flow {
    router: Rc<Router>,
    phase: Phase,
    request_id: String,
    path: String,
    authority: String,
    forwarded: Vec<(&'static str, String)>,
    /// The prefill pod of a split request, for the response headers.
    prefill_pod: Option<(String, String)>,
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

fn lossy(v: Option<Vec<u8>>) -> Option<String> {
    v.map(|v| String::from_utf8_lossy(&v).into_owned())
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
        host.send_reply(
            reply.status,
            &[("content-type", "application/json")],
            &reply.body,
        );
        self.phase = Phase::Replied;
        Action::Pause
    }

    pub fn on_request_headers<H: Host>(&mut self, host: &mut H, end_of_stream: bool) -> Action {
        let router = Rc::clone(&self.router);
        let config = &router.config;
        // Whatever happens next, the client never picks the upstream.
        host.set_request_header(&config.routing_header, None);

        self.request_id = lossy(host.request_header("x-request-id")).unwrap_or_default();
        self.path = lossy(host.request_header(":path")).unwrap_or_default();
        let method = lossy(host.request_header(":method")).unwrap_or_default();

        let Some(api) = Api::from_path(&self.path) else {
            return self.forward_unsplit(host);
        };
        if method != "POST" {
            return self.fail(host, ClientError::MethodNotAllowed(method).into());
        }
        if end_of_stream {
            return self.fail(host, crate::body::BodyError::Empty.into());
        }
        if let Some(len) = lossy(host.request_header("content-length")) {
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
        self.authority = lossy(host.request_header(":authority")).unwrap_or_default();
        self.forwarded = FORWARDED_HEADERS
            .iter()
            .filter_map(|name| {
                host.request_header(name)
                    .and_then(|v| String::from_utf8(v).ok())
                    .map(|v| (*name, v))
            })
            .collect();
        self.phase = Phase::Buffering(api);
        // Pausing keeps the header map writable until the decode routing header
        // is known (needs allow_on_headers_stop_iteration in the filter config).
        Action::Pause
    }

    /// Paths the router does not split go to a decode pod it chose.
    fn forward_unsplit<H: Host>(&mut self, host: &mut H) -> Action {
        let router = Rc::clone(&self.router);
        match router.round_robin.any_decode() {
            Some(pod) => {
                host.set_request_header(&router.config.routing_header, Some(&pod.address));
                host.increment(Counter::Unsplit);
                self.phase = Phase::Forwarded {
                    async_prefill: None,
                    response_started: false,
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
                    Ok(action) => action,
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
    ) -> Result<Action, PdError> {
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
        let pair =
            router
                .round_robin
                .pair(model_index, model)
                .ok_or_else(|| PdError::NoEndpoint {
                    model: model.name.clone(),
                })?;

        let request_id = self.request_id.clone();
        let mut entropy = HostEntropy {
            host: &mut *host,
            trt: &router.trt_ids,
        };
        let mut ctx = PdContext {
            facts: &facts,
            body: &body,
            top: &top,
            request_id: &request_id,
            model_connector: model.kv_connector,
            entropy: &mut entropy,
        };
        if !handler.should_split(&ctx, pair.prefill) {
            self.log(
                host,
                Level::Debug,
                &format!(
                    "not split ({} n={}): whole request to {}",
                    handler.name(),
                    facts.n,
                    pair.decode.address
                ),
            );
            host.set_request_header(&config.routing_header, Some(&pair.decode.address));
            host.increment(Counter::Unsplit);
            self.phase = Phase::Forwarded {
                async_prefill: None,
                response_started: false,
                body_seen: false,
            };
            return Ok(Action::Continue);
        }
        let legs = build_legs(handler, &mut ctx, pair.prefill)?;
        let prefill_body = top.render(&body, &legs.prefill);

        let token = self.dispatch_prefill(host, pair.prefill, &prefill_body)?;
        host.increment(Counter::Split);
        self.prefill_pod = Some((pair.prefill.name.clone(), pair.prefill.ip.clone()));
        self.log(
            host,
            Level::Debug,
            &format!(
                "{} {}: prefill {} decode {}",
                handler.name(),
                self.path,
                pair.prefill.address,
                pair.decode.address
            ),
        );

        if handler.is_async() {
            // SGLang: the prefill waits for the decode to register its room, so
            // the decode goes out now and the prefill answer is only watched.
            let decode_body = top.render(&body, &legs.decode);
            self.send_decode(host, body_size, &decode_body, &pair.decode.address)?;
            self.phase = Phase::Forwarded {
                async_prefill: Some(token),
                response_started: false,
                body_seen: false,
            };
            return Ok(Action::Continue);
        }
        self.phase = Phase::AwaitingPrefill(Box::new(Pending {
            token,
            body,
            top,
            facts,
            decode: legs.decode,
            prefill: pair.prefill.clone(),
            decode_pod: pair.decode.clone(),
        }));
        Ok(Action::Pause)
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
                match self.finish_sync(host, *pending, status, body_size) {
                    Ok(()) => {}
                    Err(e) => {
                        if matches!(e, PdError::Prefill(_)) {
                            host.increment(Counter::PrefillFailed);
                        }
                        self.fail(host, e);
                    }
                }
            }
            Phase::Forwarded {
                async_prefill: Some(t),
                response_started,
                body_seen,
            } if t == token => {
                self.phase = Phase::Forwarded {
                    async_prefill: None,
                    response_started,
                    body_seen,
                };
                if let Err(failure) = classify(status, || host.call_response_body(body_size)) {
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
                        // headers this cuts the stream short.
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

    fn finish_sync<H: Host>(
        &mut self,
        host: &mut H,
        p: Pending,
        status: Option<u16>,
        body_size: usize,
    ) -> Result<(), PdError> {
        classify(status, || host.call_response_body(body_size)).map_err(PdError::Prefill)?;
        let answer = host.call_response_body(body_size).unwrap_or_default();
        let answer_top = TopLevel::parse(&answer)
            .map_err(|e| PdError::Prefill(PrefillFailure::BadAnswer(e.describe("the answer"))))?;

        let router = Rc::clone(&self.router);
        let model = router.config.model(&p.facts.model);
        let handler = router
            .registry
            .resolve(model.map(|m| m.engine.as_str()).unwrap_or("default"));
        let request_id = self.request_id.clone();
        let mut entropy = HostEntropy {
            host: &mut *host,
            trt: &router.trt_ids,
        };
        let mut ctx = PdContext {
            facts: &p.facts,
            body: &p.body,
            top: &p.top,
            request_id: &request_id,
            model_connector: model.and_then(|m| m.kv_connector),
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
        let decode_body = p.top.render(&p.body, &decode);
        self.send_decode(host, p.body.len(), &decode_body, &p.decode_pod.address)?;
        self.phase = Phase::Forwarded {
            async_prefill: None,
            response_started: false,
            body_seen: false,
        };
        host.resume_request();
        Ok(())
    }

    pub fn on_response_headers<H: Host>(&mut self, host: &mut H) -> Action {
        if let Phase::Forwarded {
            response_started, ..
        } = &mut self.phase
        {
            *response_started = true;
        }
        // Upstreams must not be able to forge which prefill pod was used.
        let (name, ip) = match &self.prefill_pod {
            Some((n, ip)) => (Some(n.as_str()), Some(ip.as_str())),
            None => (None, None),
        };
        host.set_response_header(PREFILL_POD_HEADER, name);
        host.set_response_header(PREFILL_POD_IP_HEADER, ip);
        Action::Continue
    }

    pub fn on_response_body<H: Host>(&mut self, _host: &mut H, body_size: usize) -> Action {
        if let Phase::Forwarded { body_seen, .. } = &mut self.phase {
            *body_seen |= body_size > 0;
        }
        Action::Continue
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

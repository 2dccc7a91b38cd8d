//! The split plan: everything that turns a client body into a prefill leg
//! and a decode leg, and a prefill answer into the decode body, in one place.
//!
//! A request's path reads in one direction: [`read`] checks the client's
//! body, the router places it (`Router::place`, or a fixed pair in tests),
//! [`build`] turns it into its legs, and [`merge`] turns a prefill answer
//! into the decode body. A retry is another placement and another build.
//! The flow, the golden runner, the fuzz targets of the request path and the
//! request bench all call these and nothing else, so a check added here is
//! golden-tested and fuzzed without anyone remembering to. Pure: the pods
//! and the randomness come from the caller.

use crate::api::{read_fields, Api, ClientFields};
use crate::body::{BodyError, Edit, Edits, LegBody, Members, SourceMismatch};
use crate::calls::BodyKind;
use crate::encoder;
use crate::engine::{
    build_legs, refuse_owned, refused_form_fields, EngineHandler, Merged, PrefillAnswer, Registry,
};
use crate::error::{ClientError, PdError, PrefillFailure};
use crate::fleet::{Connector, Endpoint, EngineKind, Fleet, Model, PrefillPolicy, Scheduling};
use crate::handoff::Legs;
use crate::handoff::{
    AbortCall, Degraded, IdSource, LearnedPods, LegEdits, PdContext, NOTHING_LEARNED,
};
use crate::host::NotSplit;
use crate::reconcile;
use crate::sched::prefix::{block_hashes, PrefixMatch};
use crate::transfer::client_params;
use std::rc::Rc;

/// What a split needs to know of the router.
#[derive(Clone, Copy)]
pub struct SplitContext<'a> {
    pub fleet: &'a Fleet,
    pub registry: &'a Registry,
    /// The global KV connector, for pods and models that name none.
    pub default_connector: Connector,
    pub scheduling: &'a Scheduling,
    /// What the router learned about pods (Mooncake engine ids).
    pub learned: &'a LearnedPods,
    /// TensorRT-LLM's shared key for signed hand-offs, when configured.
    pub trt_auth_key: Option<&'a [u8]>,
}

impl<'a> SplitContext<'a> {
    /// The view of a configuration as it stands, without a router: for
    /// golden fixtures, fuzz targets and benches.
    pub fn of_config(
        config: &'a crate::config::Config,
        fleet: &'a Fleet,
        registry: &'a Registry,
    ) -> SplitContext<'a> {
        SplitContext {
            fleet,
            registry,
            default_connector: config.kv_connector,
            scheduling: &config.scheduling,
            learned: &NOTHING_LEARNED,
            trt_auth_key: None,
        }
    }
}

/// What a model's decider made of a placement (`models[].decider`).
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// `split`, or why the request stays whole (`sched::decider`).
    pub reason: &'static str,
    /// Estimated prompt tokens the decode pod does not hold.
    pub uncached_tokens: u64,
    /// What the decode prefix table knew of the prompt.
    pub decode_prefix: PrefixMatch,
}

/// The pods a request was placed on.
#[derive(Debug, Clone)]
pub enum Placement {
    Split {
        prefill: Rc<Endpoint>,
        decode: Rc<Endpoint>,
        /// The fast path or policy that decided.
        reason: &'static str,
        /// What the prefix table knew of the prompt when it was placed.
        prefix: PrefixMatch,
        /// The decider's decision, when the model has one.
        decided: Option<Box<Decided>>,
    },
    /// A pod that serves both phases: no prefill call.
    Combined {
        pod: Rc<Endpoint>,
        reason: &'static str,
    },
    /// The decider keeps the request whole on its decode pod.
    Unsplit {
        pod: Rc<Endpoint>,
        decided: Box<Decided>,
    },
}

impl Placement {
    /// The first prefill and decode pods of the fleet's first roleset: the
    /// fixed choice golden fixtures, fuzz targets and benches split with.
    pub fn first_pair(fleet: &Fleet) -> Option<Placement> {
        let roleset = fleet.models().first()?.rolesets.first()?;
        Some(Placement::Split {
            prefill: Rc::clone(roleset.prefill.first()?),
            decode: Rc::clone(roleset.decode.first()?),
            reason: "fixed",
            prefix: PrefixMatch::default(),
            decided: None,
        })
    }
}

/// The bytes that identify a prompt for prefix matching, digested.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptKey {
    /// Estimated prompt length (bytes / 4).
    pub tokens: u64,
    /// Chained block hashes (prefix-cache policy only; empty otherwise).
    pub hashes: Vec<u64>,
}

/// A client request, read and checked, ready to be placed.
#[derive(Debug, Clone)]
pub struct SplitRequest {
    pub request_id: String,
    pub body: Vec<u8>,
    pub top: Members,
    pub fields: ClientFields,
    /// The model as the fleet had it when the request arrived (an
    /// adapter's base model).
    pub model: Rc<Model>,
    /// The LoRA adapter the request named, served by `model`'s pods.
    pub adapter: Option<String>,
    pub prompt: PromptKey,
    /// The client's own `kv_transfer_params` members (vLLM), kept on both
    /// legs.
    pub client_params: Option<Vec<(String, String)>>,
    /// The session key of a model with session affinity (`crate::session`),
    /// when the request names a session.
    pub session: Option<u64>,
    /// Next-turn KV reuse: the session's last decode's `kv_transfer_params`
    /// (`crate::reuse`), which this prefill pulls the prefix from.
    pub kv_source: Option<String>,
    /// The distinct media items of a chat request to an E/P/D model
    /// (`models[].ec_connector`), each encoded on an encoder pod before the
    /// prefill; empty otherwise.
    pub media: Vec<String>,
}

/// Why a request on a split path goes to one pod, unsplit.
#[derive(Debug, Clone, PartialEq)]
pub enum UnsplitReason {
    /// A combined pod serves it (the scheduler's reason).
    Combined(&'static str),
    /// The engine does not split this request (vLLM NIXL with `n > 1`).
    Engine,
    /// The answer asked for needs the whole computation on one pod.
    Response,
    /// The model's decider keeps it on its decode pod.
    Decided(Box<Decided>),
}

impl UnsplitReason {
    /// The word stats and logs use for it.
    pub fn not_split(&self) -> NotSplit {
        match self {
            UnsplitReason::Combined(_) => NotSplit::Combined,
            UnsplitReason::Engine => NotSplit::Engine,
            UnsplitReason::Response => NotSplit::Response,
            UnsplitReason::Decided(_) => NotSplit::Decider,
        }
    }
}

/// What to do with a request. One is built per request and moved a few
/// times; boxing a variant would cost an allocation per request instead.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Plan {
    /// Send the client's body unchanged to `pod`.
    Unsplit {
        request: SplitRequest,
        pod: Rc<Endpoint>,
        why: UnsplitReason,
    },
    Split(SplitPlan),
}

/// A request split into its two legs.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    pub request: SplitRequest,
    pub prefill_pod: Rc<Endpoint>,
    pub decode_pod: Rc<Endpoint>,
    pub reason: &'static str,
    pub prefix: PrefixMatch,
    /// The decider's decision (`split`), when the model has one.
    pub decided: Option<Box<Decided>>,
    pub prefill_body: Vec<u8>,
    /// Request headers the prefill call carries besides the flow's own
    /// (a DP rank, a request id both legs share); they replace those.
    pub prefill_headers: Vec<(String, String)>,
    pub decode: DecodeLeg,
    /// Prefill and decode run concurrently (the engine's `concurrent`, AIBrix's `IsAsync`).
    pub concurrent: bool,
    /// What the client's response may need from the prefill's answer.
    pub rewrite: Option<reconcile::RewritePlan>,
    /// How to abort the prefill on its pod if the stream ends first (the
    /// engine's route; none when it has none).
    pub abort: Option<Box<AbortCall>>,
}

/// The decode leg of a split.
#[derive(Debug, Clone)]
pub enum DecodeLeg {
    /// Concurrent hand-offs: the decode body and headers, sent with the prefill.
    Ready {
        body: LegBody,
        headers: Vec<(String, String)>,
    },
    /// Sequential hand-offs: edits the prefill's answer completes.
    AfterPrefill(LegEdits),
}

/// What a prefill answer leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterPrefill {
    /// Send the decode leg; `body` is `None` when it is the client's body as
    /// sent (nothing to copy into Envoy's buffer).
    Decode {
        body: Option<LegBody>,
        /// Request headers to set on the decode (they replace the client's).
        headers: Vec<(String, String)>,
        /// Something the engine usually hands over was missing.
        degraded: Option<Degraded>,
        /// What the prefill's answer says that the decode's answer lacks,
        /// when the plan rewrites it (read from the parse done here).
        report: Option<Box<crate::reconcile::PrefillReport>>,
    },
    /// The prefill's answer already is the client's (TensorRT-LLM finished
    /// in the context phase).
    Reply {
        body: Vec<u8>,
        content_type: &'static str,
    },
}

/// A decode body keeps the client's bytes in Envoy's buffer, its new
/// members in front (`Members::splice_with`), when at least this much of
/// it is left untouched: below it the copy saved is a microsecond or two,
/// and the body keeps the plain layout, the client's members then the
/// hand-off's, that the golden fixtures hold byte for byte. JSON objects are
/// unordered and no key is ever added twice, so engines read the same
/// request either way.
pub const FRONT_LAYOUT_MIN: usize = 4096;

fn internal(e: SourceMismatch) -> PdError {
    PdError::Internal(e.to_string())
}

/// Reads and checks a client body: JSON object, the fields the router reads,
/// a model the fleet serves, no hand-off fields the engine's handler owns;
/// and digests the prompt for placement.
pub fn read(
    view: &SplitContext,
    api: Api,
    request_id: &str,
    body: Vec<u8>,
) -> Result<SplitRequest, PdError> {
    let top = Members::parse(&body)?;
    let mut fields = read_fields(api, &body, &top)?;
    if fields.model.is_empty() {
        fields.model = only_model(view.fleet)?;
    }
    let served = view
        .fleet
        .serve(&fields.model)
        .ok_or_else(|| ClientError::UnknownModel(fields.model.clone()))?;
    let model = Rc::clone(served.model);
    let adapter = served.adapter.map(str::to_owned);
    let handler = view.registry.resolve(&model.engine);
    let client_params = refuse_owned(handler, &body, &top)?;
    let media = read_media(&model, api, &body, &top)?;
    let prompt = prompt_key(
        view.scheduling,
        &model,
        adapter.as_deref(),
        api,
        &body,
        &top,
    );
    Ok(SplitRequest {
        client_params,
        session: None,
        kv_source: None,
        media,
        request_id: request_id.to_owned(),
        body,
        top,
        fields,
        model,
        adapter,
        prompt,
    })
}

/// The media items an E/P/D model's encoders compute for this request
/// (chat only: vLLM's proxy and llm-d's sidecar read `messages`), after
/// refusing an `ec_transfer_params` of the client's own: it names the
/// memory the prefill pulls embeddings from, and only the encoders say that.
/// A model without encoder pods anywhere cannot serve media: 503 at once,
/// before any pod is chosen.
fn read_media(model: &Model, api: Api, body: &[u8], top: &Members) -> Result<Vec<String>, PdError> {
    if model.ec_connector.is_none() {
        return Ok(Vec::new());
    }
    if top.contains(encoder::EC_PARAMS) {
        return Err(ClientError::RouterOwnedKey {
            key: encoder::EC_PARAMS.to_owned(),
            engine: model.engine.clone(),
        }
        .into());
    }
    if api != Api::ChatCompletions {
        return Ok(Vec::new());
    }
    let media = encoder::media_items(body, top)?;
    let can_encode = model
        .rolesets
        .iter()
        .any(|r| !r.encode.is_empty() || r.prefill.iter().any(|p| p.encodes));
    if !media.is_empty() && !can_encode {
        return Err(PdError::NoEncoder {
            model: model.name.clone(),
        });
    }
    Ok(media)
}

/// One encoder request of a split: the pod, its body and its request id.
#[derive(Debug, Clone)]
pub struct EncoderLeg {
    pub pod: Rc<Endpoint>,
    pub body: Vec<u8>,
    pub request_id: Option<String>,
}

/// The encoder requests a split sends before its prefill: one per media
/// item, over the encoder pods of the prefill pod's roleset (they share the
/// EC connector's storage or fabric) that are healthy, by their load
/// (`queue`: a pod's scraped queue, `None` when it is unhealthy; ties in
/// turn from `start`); over all of them when none is healthy (a health mark
/// may be stale: the calls then tell). None when the request has no media
/// or its prefill pod encodes its own (llm-d's `encode-prefill`);
/// `NoEncoder` when its roleset has no encoder pod. A prefill pod in no
/// roleset (a combined pod a picker named) takes any of the model's.
pub fn encoder_legs(
    plan: &SplitPlan,
    start: u64,
    queue: impl Fn(&Endpoint) -> Option<f64>,
) -> Result<Vec<EncoderLeg>, PdError> {
    let request = &plan.request;
    if request.media.is_empty() || plan.prefill_pod.encodes {
        return Ok(Vec::new());
    }
    let rolesets = &request.model.rolesets;
    let encoders: Vec<&Rc<Endpoint>> = match rolesets
        .iter()
        .find(|r| r.prefill.iter().any(|p| p.id == plan.prefill_pod.id))
    {
        Some(r) => r.encode.iter().collect(),
        // A combined pod an endpoint picker named as the prefill (llm-d's
        // `prefill-decode`) is in no roleset: any of the model's.
        None => rolesets.iter().flat_map(|r| r.encode.iter()).collect(),
    };
    if encoders.is_empty() {
        return Err(PdError::NoEncoder {
            model: request.model.name.clone(),
        });
    }
    let up: Vec<(&Rc<Endpoint>, f64)> = encoders
        .iter()
        .filter_map(|e| queue(e).map(|q| (*e, q)))
        .collect();
    let pool: Vec<(&Rc<Endpoint>, f64)> = if up.is_empty() {
        encoders.iter().map(|e| (*e, 0.0)).collect()
    } else {
        up
    };
    legs_over(request, &pool, start)
}

/// The encoder requests of a split whose encoders an endpoint picker chose
/// (llm-d's `x-encoder-hosts-ports`, checked against the fleet): its media
/// items over them in turn from the first, as llm-d's sidecar sends them.
/// The picker's choice stands even for a prefill pod that encodes.
pub fn picked_encoder_legs(
    plan: &SplitPlan,
    encoders: &[Rc<Endpoint>],
) -> Result<Vec<EncoderLeg>, PdError> {
    let pool: Vec<(&Rc<Endpoint>, f64)> = encoders.iter().map(|e| (e, 0.0)).collect();
    legs_over(&plan.request, &pool, 0)
}

/// One encoder request per media item of `request`, over the `pool` of
/// encoders and their queues (`encoder::spread`, ties from `start`).
fn legs_over(
    request: &SplitRequest,
    pool: &[(&Rc<Endpoint>, f64)],
    start: u64,
) -> Result<Vec<EncoderLeg>, PdError> {
    let queues: Vec<f64> = pool.iter().map(|(_, q)| *q).collect();
    let chosen = encoder::spread(request.media.len(), &queues, start);
    request
        .media
        .iter()
        .zip(chosen)
        .enumerate()
        .map(|(i, (item, pod))| {
            Ok(EncoderLeg {
                pod: Rc::clone(
                    pool.get(pod)
                        .map(|(e, _)| *e)
                        .ok_or_else(|| PdError::Internal("an encoder index out of range".into()))?,
                ),
                body: encoder::encoder_body(&request.body, &request.top, item).map_err(internal)?,
                request_id: encoder::encoder_request_id(&request.request_id, i),
            })
        })
        .collect()
}

/// Checks a body that goes whole to one pod unsplit (a call routed by
/// model, or a pass-through): refused when it carries a hand-off field the
/// router owns for the engine of `model`, or, without a model, for any
/// engine the fleet serves (a pass-through lands on a decode pod of any
/// model; fields of engines the fleet lacks reach no pod that obeys them).
/// A JSON body the router cannot read as an object is refused as well:
/// Python's parser accepts more (`NaN`, a byte-order mark, UTF-16) and
/// would find fields the router never saw. Other bodies are not JSON to
/// the engines and pass.
pub fn check_whole(
    view: &SplitContext,
    model: Option<&Model>,
    body: &[u8],
    kind: &BodyKind,
) -> Result<(), PdError> {
    let handlers: Vec<&dyn EngineHandler> = match model {
        Some(m) => vec![view.registry.resolve(&m.engine)],
        None => {
            let mut all: Vec<&dyn EngineHandler> = Vec::new();
            for m in view.fleet.models() {
                let h = view.registry.resolve(&m.engine);
                if !all.iter().any(|a| a.name() == h.name()) {
                    all.push(h);
                }
            }
            all
        }
    };
    match kind {
        BodyKind::Form(boundary) => {
            for h in &handlers {
                let sent = refused_form_fields(*h)
                    .find(|f| !crate::multipart::fields(body, boundary, f, 1).is_empty());
                if let Some(key) = sent {
                    return Err(ClientError::RouterOwnedKey {
                        key: key.to_owned(),
                        engine: h.name().to_owned(),
                    }
                    .into());
                }
            }
            Ok(())
        }
        BodyKind::Other if !opens_object(body) => Ok(()),
        BodyKind::Json | BodyKind::Other => {
            let Some(text) = json_text(body)? else {
                return Ok(());
            };
            let top = match Members::parse(text) {
                Ok(top) => top,
                // A JSON array or scalar: no engine reads a hand-off there.
                Err(BodyError::NotObject) if !opens_object(text) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            for h in handlers {
                refuse_owned(h, text, &top)?;
            }
            Ok(())
        }
    }
}

fn opens_object(body: &[u8]) -> bool {
    body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// The JSON text of a body as Python's `json.loads` reads bytes (what
/// FastAPI, under vLLM and SGLang, parses with): a UTF-8 byte-order mark
/// skipped; UTF-16 and UTF-32 (a zero byte among the first four) refused,
/// as the router reads UTF-8 only. `None`: an empty body, nothing to check.
fn json_text(body: &[u8]) -> Result<Option<&[u8]>, BodyError> {
    let text = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    if text.iter().take(4).any(|&b| b == 0) {
        return Err(BodyError::NotUtf8);
    }
    if text.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    Ok(Some(text))
}

/// The model of a request that names none (vLLM's generate API): the
/// gateway's only model, as a single engine would serve it.
fn only_model(fleet: &Fleet) -> Result<String, ClientError> {
    match fleet.models() {
        [one] => Ok(one.name.clone()),
        many => Err(ClientError::BadField {
            field: "model".into(),
            message: format!("is required: this gateway serves {} models", many.len()),
        }),
    }
}

/// The prompt's length estimate and, for the policies that remember or hash
/// prefixes and for a decider, its block hashes: the API's prompt members
/// (`messages` then `tools`, `prompt`, `input`, ...) as sent. The others
/// need the length alone.
fn prompt_key(
    s: &Scheduling,
    model: &Model,
    adapter: Option<&str>,
    api: Api,
    body: &[u8],
    top: &Members,
) -> PromptKey {
    let parts: Vec<&[u8]> = api
        .prompt_keys()
        .iter()
        .filter_map(|k| top.raw(body, k))
        .collect();
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let hashes = if model.prefill_policy.hashes_prompt() || model.decider.is_some() {
        let blocks = match model.prefill_policy {
            PrefillPolicy::ConsistentHash if model.decider.is_none() => {
                s.consistent_hash_blocks.min(s.prefix_max_blocks)
            }
            _ => s.prefix_max_blocks,
        };
        let seed = model.prefix_seed(adapter);
        let block_bytes = model.block_bytes(s.prefix_block_tokens);
        let cap = block_bytes.saturating_mul(blocks);
        match parts.as_slice() {
            // One part (a completion's prompt): hashed where it lies, as a
            // whole prompt of a long context is up to 512 KB.
            [one] => block_hashes(one, seed, block_bytes, blocks),
            _ => {
                let mut key = Vec::with_capacity(len.min(cap));
                for p in &parts {
                    let room = cap.saturating_sub(key.len());
                    key.extend_from_slice(p.get(..p.len().min(room)).unwrap_or_default());
                }
                block_hashes(&key, seed, block_bytes, blocks)
            }
        }
    } else {
        Vec::new()
    };
    let tokens = match (api, parts.first()) {
        // Token ids are counted, not estimated (read_fields checked them).
        (Api::Generate, Some(ids)) => ids.iter().filter(|&&b| b == b',').count() as u64 + 1,
        _ => model.estimate_tokens(len),
    };
    PromptKey { tokens, hashes }
}

/// What a handler sees of `request`, split with `decode` as its decode pod.
fn handoff_context<'a>(
    view: &SplitContext<'a>,
    request: &'a SplitRequest,
    decode: &'a Endpoint,
    ids: &'a mut dyn IdSource,
) -> PdContext<'a> {
    PdContext {
        fields: &request.fields,
        body: &request.body,
        top: &request.top,
        request_id: &request.request_id,
        model_connector: request.model.kv_connector,
        default_connector: view.default_connector,
        decode_pod: decode,
        learned: view.learned,
        trt_auth_key: view.trt_auth_key,
        trt_token_ids_b64: request.model.trt_token_ids_b64,
        trt_generation_first: request.model.trt_generation_first,
        kv_source: request.kv_source.as_deref(),
        disagg_request_id: None,
        ids,
    }
}

/// Builds the legs of a request read by [`read`] and placed by the router.
pub fn build(
    view: &SplitContext,
    request: SplitRequest,
    placement: Placement,
    ids: &mut dyn IdSource,
) -> Result<Plan, PdError> {
    let (prefill, decode, reason, prefix, decided) = match placement {
        Placement::Combined { pod, reason } => {
            return Ok(Plan::Unsplit {
                request,
                pod,
                why: UnsplitReason::Combined(reason),
            })
        }
        Placement::Unsplit { pod, decided } => {
            return Ok(Plan::Unsplit {
                request,
                pod,
                why: UnsplitReason::Decided(decided),
            })
        }
        Placement::Split {
            prefill,
            decode,
            reason,
            prefix,
            decided,
        } => (prefill, decode, reason, prefix, decided),
    };
    let handler = view.registry.resolve(&request.model.engine);
    let mut ctx = handoff_context(view, &request, &decode, ids);
    if !handler.should_split(&ctx, &prefill) {
        return Ok(Plan::Unsplit {
            request,
            pod: decode,
            why: UnsplitReason::Engine,
        });
    }
    let rewrite = match reconcile::decide(
        request.model.kind,
        &request.fields,
        &request.body,
        &request.top,
    ) {
        reconcile::AnswerNeeds::Unsplit(_) => {
            return Ok(Plan::Unsplit {
                request,
                pod: decode,
                why: UnsplitReason::Response,
            })
        }
        reconcile::AnswerNeeds::Rewrite(plan) => Some(plan),
        reconcile::AnswerNeeds::None => None,
    };
    let rewrite = capture_kv(&request, &ctx, &decode, rewrite);
    let concurrent = handler.concurrent_for(&ctx, &prefill);
    if request.model.kind == EngineKind::Trtllm {
        ctx.disagg_request_id = Some(ctx.ids.disagg_request_id());
    }
    let legs = build_legs(handler, &mut ctx, &prefill)?;
    let abort = handler.prefill_abort(&ctx).map(Box::new);
    let rendered = render_legs(&request, legs, rewrite.as_ref(), concurrent)?;
    Ok(Plan::Split(SplitPlan {
        request,
        prefill_pod: prefill,
        decode_pod: decode,
        reason,
        prefix,
        decided,
        prefill_body: rendered.prefill_body,
        prefill_headers: rendered.prefill_headers,
        decode: rendered.decode,
        concurrent,
        rewrite,
        abort,
    }))
}

/// The rewrite, made to take the decode's `kv_transfer_params` out of its
/// answer when the session's next turn may reuse its KV (`crate::reuse`):
/// a model with `kv_reuse`, a request naming its session and a history
/// the next turn can be checked against, a NIXL decode pod.
fn capture_kv(
    request: &SplitRequest,
    ctx: &PdContext,
    decode: &Endpoint,
    rewrite: Option<reconcile::RewritePlan>,
) -> Option<reconcile::RewritePlan> {
    let capture = request.model.kv_reuse.is_some()
        && request.session.is_some()
        && ctx.connector_for(decode) == Connector::Nixl
        && crate::reuse::History::of(request.fields.api, &request.body, &request.top).is_some();
    if !capture {
        return rewrite;
    }
    let mut plan = rewrite.unwrap_or(reconcile::RewritePlan {
        usage: false,
        logprobs: None,
        stream: request.fields.stream,
        capture_kv: false,
    });
    plan.capture_kv = true;
    Some(plan)
}

/// The legs' edits finished (prompt logprobs left to the prefill, the
/// client's own `kv_transfer_params` members kept) and rendered: the
/// prefill's body and headers, and the decode leg, whole for a concurrent
/// engine or waiting for the prefill's answer.
fn render_legs(
    request: &SplitRequest,
    mut legs: Legs,
    rewrite: Option<&reconcile::RewritePlan>,
    concurrent: bool,
) -> Result<RenderedLegs, PdError> {
    if rewrite.is_some_and(|a| a.logprobs.is_some()) {
        // Asked of the decode, they make it recompute the prompt and ignore
        // the hand-off; the prefill's answer supplies them instead.
        for key in reconcile::PROMPT_LOGPROB_FIELDS {
            if request.top.contains(key) {
                legs.decode.body.remove(key);
            }
        }
    }
    if let Some(kept) = &request.client_params {
        keep_client_params(&mut legs.prefill.body, kept, &[]);
        keep_client_params(&mut legs.decode.body, kept, &[]);
    }
    let prefill_body = request
        .top
        .render(&request.body, &legs.prefill.body)
        .map_err(internal)?;
    let decode_leg = if concurrent {
        DecodeLeg::Ready {
            body: request
                .top
                .splice_with(&request.body, &legs.decode.body, &[], FRONT_LAYOUT_MIN)
                .map_err(internal)?,
            headers: legs.decode.headers,
        }
    } else {
        DecodeLeg::AfterPrefill(legs.decode)
    };
    Ok(RenderedLegs {
        prefill_body,
        prefill_headers: legs.prefill.headers,
        decode: decode_leg,
    })
}

/// A split's legs as they are sent.
struct RenderedLegs {
    prefill_body: Vec<u8>,
    prefill_headers: Vec<(String, String)>,
    decode: DecodeLeg,
}

/// Adds the client's own `kv_transfer_params` members to the one a leg's
/// hand-off writes (`answer`: where a copied value comes from). A leg whose
/// hand-off writes none keeps the client's member as sent.
fn keep_client_params(edits: &mut Edits, kept: &[(String, String)], answer: &[u8]) {
    let current = match edits.get("kv_transfer_params") {
        Some(Edit::Set(v)) => v.to_string(),
        Some(Edit::Copy { span, source_len }) if *source_len == answer.len() => answer
            .get(span.clone())
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default(),
        _ => return,
    };
    if let Some(m) = client_params::merged(&current, kept) {
        edits.set_raw("kv_transfer_params", m);
    }
}

/// Merges a successful prefill answer into the decode leg of a sequential
/// split.
pub fn merge(
    view: &SplitContext,
    ids: &mut dyn IdSource,
    plan: &SplitPlan,
    answer: &[u8],
) -> Result<AfterPrefill, PdError> {
    let DecodeLeg::AfterPrefill(edits) = &plan.decode else {
        return Err(PdError::Internal(
            "a concurrent split has no prefill answer to merge".into(),
        ));
    };
    let answer_top = Members::parse(answer)
        .map_err(|e| PdError::Prefill(PrefillFailure::BadAnswer(e.describe("the answer"))))?;
    let request = &plan.request;
    let handler = view.registry.resolve(&request.model.engine);
    let mut ctx = handoff_context(view, request, &plan.decode_pod, ids);
    let mut decode = edits.clone();
    let merged = handler.merge_prefill_response(
        &mut ctx,
        &PrefillAnswer {
            body: answer,
            top: &answer_top,
        },
        &plan.prefill_pod,
        &mut decode,
    )?;
    if let Some(kept) = &request.client_params {
        keep_client_params(&mut decode.body, kept, answer);
    }
    let degraded = match merged {
        Merged::Answer { body, content_type } => {
            return Ok(AfterPrefill::Reply { body, content_type })
        }
        Merged::Decode(degraded) => degraded,
    };
    // The decode leg is the client's body as sent (default engine, or no
    // hand-off): no copy.
    let body = if decode.body.is_empty() {
        None
    } else {
        Some(
            request
                .top
                .splice_with(&request.body, &decode.body, answer, FRONT_LAYOUT_MIN)
                .map_err(internal)?,
        )
    };
    let report = plan.rewrite.as_ref().map(|a| {
        Box::new(crate::reconcile::PrefillReport::of_parsed(
            a,
            answer,
            &answer_top,
        ))
    });
    Ok(AfterPrefill::Decode {
        body,
        headers: decode.headers,
        degraded,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::FixedIds;

    fn setup(engine: &str) -> (Config, Fleet, Registry) {
        let c = Config::parse(
            format!(
                r#"{{"models":[{{"name":"m","engine":"{engine}","rolesets":[{{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}}]}}]}}"#
            )
            .as_bytes(),
        )
        .expect("config");
        let fleet = c.fleet();
        (c, fleet, Registry::builtin())
    }

    fn ids() -> FixedIds {
        FixedIds::new(vec![7], 1 << 50)
    }

    /// Read, placed on the fleet's first pair, built.
    fn plan(
        view: &SplitContext,
        ids: &mut FixedIds,
        api: Api,
        request_id: &str,
        body: Vec<u8>,
    ) -> Result<Plan, PdError> {
        let request = read(view, api, request_id, body)?;
        let placement = Placement::first_pair(view.fleet).expect("pods");
        build(view, request, placement, ids)
    }

    #[test]
    fn a_vllm_request_is_split_and_merged() {
        let (c, fleet, registry) = setup("vllm");
        let view = SplitContext::of_config(&c, &fleet, &registry);
        let mut p = ids();
        let body = br#"{"model":"m","prompt":"hi","stream":true}"#.to_vec();
        let Plan::Split(plan) = plan(&view, &mut p, Api::Completions, "r", body).expect("plan")
        else {
            panic!("not split")
        };
        assert!(!plan.concurrent);
        let prefill = String::from_utf8(plan.prefill_body.clone()).expect("utf8");
        assert!(prefill.contains(r#""stream":false"#) && prefill.contains("do_remote_decode"));
        let answer = br#"{"kv_transfer_params":{"remote_engine_id":"e"}}"#;
        let after = merge(&view, &mut p, &plan, answer).expect("merge");
        assert_eq!(
            after,
            AfterPrefill::Decode {
                body: Some(LegBody::whole(
                    br#"{"model":"m","prompt":"hi","stream":true,"kv_transfer_params":{"remote_engine_id":"e"}}"#.to_vec(),
                    plan.request.body.len()
                )),
                headers: Vec::new(),
                degraded: None,
                report: None
            }
        );
        let bad = merge(&view, &mut p, &plan, b"[]").expect_err("not an object");
        assert_eq!(bad.reply().status, 502);
    }

    #[test]
    fn encoders_come_from_the_prefill_pods_roleset_or_any_for_a_pod_in_none() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","ec_connector":"nixl",
                "rolesets":[
                  {"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"],"encode":["10.0.0.3:8000"]},
                  {"prefill":["10.0.1.1:8000"],"decode":["10.0.1.2:8000"],"encode":["10.0.1.3:8000"]}],
                "combined":["10.0.2.1:8000"]}]}"#,
        )
        .expect("config");
        let fleet = c.fleet();
        let registry = Registry::builtin();
        let view = SplitContext::of_config(&c, &fleet, &registry);
        let m = fleet.model("m").expect("model");
        let body = br#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}"#;
        let encoder_of = |prefill: &Rc<Endpoint>| {
            let request = read(&view, Api::ChatCompletions, "r", body.to_vec()).expect("read");
            let placement = Placement::Split {
                prefill: Rc::clone(prefill),
                decode: Rc::clone(&m.rolesets[0].decode[0]),
                reason: "fixed",
                prefix: PrefixMatch::default(),
                decided: None,
            };
            let Ok(Plan::Split(plan)) = build(&view, request, placement, &mut ids()) else {
                panic!("not split")
            };
            let legs = encoder_legs(&plan, 0, |_| Some(0.0)).expect("legs");
            assert_eq!(legs.len(), 1);
            legs[0].pod.address.clone()
        };
        assert_eq!(encoder_of(&m.rolesets[0].prefill[0]), "10.0.0.3:8000");
        assert_eq!(encoder_of(&m.rolesets[1].prefill[0]), "10.0.1.3:8000");
        // A combined pod a picker named as the prefill: the model's encoders.
        assert_eq!(encoder_of(&m.combined[0]), "10.0.0.3:8000");
    }

    #[test]
    fn checks_come_before_placement() {
        let (c, fleet, registry) = setup("sglang");
        let view = SplitContext::of_config(&c, &fleet, &registry);
        let mut p = ids();
        let mut status = |body: &[u8]| {
            plan(&view, &mut p, Api::Completions, "r", body.to_vec())
                .map(|_| 200)
                .unwrap_or_else(|e| e.reply().status)
        };
        assert_eq!(status(br#"{"model":"x","prompt":"p"}"#), 404);
        assert_eq!(
            status(br#"{"model":"m","prompt":"p","bootstrap_room":1}"#),
            400
        );
        assert_eq!(status(b"not json"), 400);
        assert_eq!(status(br#"{"model":"m","prompt":"p"}"#), 200);
    }

    #[test]
    fn prompts_are_hashed_only_for_the_prefix_policy() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[]},
                {"name":"n","engine":"vllm","prefill_policy":"random","rolesets":[]}]}"#,
        )
        .expect("config");
        let fleet = c.fleet();
        let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(5000));
        let top = Members::parse(body.as_bytes()).expect("parse");
        let key = |name: &str| {
            let m = fleet.model(name).expect("model");
            prompt_key(
                &c.scheduling,
                m,
                None,
                Api::Completions,
                body.as_bytes(),
                &top,
            )
        };
        // Blocks of 128 tokens, at 4 bytes a token.
        assert_eq!(key("m").hashes.len(), 5002 / 512);
        assert!(key("n").hashes.is_empty());
        assert_eq!(key("n").tokens, 5002u64.div_ceil(4));
    }
}

//! A buffered request on its way: read, placed on pods, built into its
//! legs and sent; a prefill retry comes back through [`Flow::place`].

use super::ids::HostIds;
use super::load::Release;
use super::phase::{Next, PendingPrefill, QueuedRequest, WatchedPrefill};

use super::{Attempt, Flow};
use crate::api::Api;
use crate::error::PdError;
use crate::fleet::Endpoint;
use crate::host::{Counter, Histogram, Host, Level};
use crate::router::if_available::serve_if_available;
use crate::session::{session_id, session_key};
use crate::split::{self, Decided, Plan, SplitRequest, UnsplitReason};
use std::rc::Rc;

impl Flow {
    /// Plans the buffered request and sends it on.
    pub(super) fn split<H: Host>(
        &mut self,
        host: &mut H,
        api: Api,
        body_size: usize,
    ) -> Result<Next, PdError> {
        // A body the host cannot hand over is the router's failure, not the
        // client's.
        self.timing.body_done_us = host.now_us();
        self.trace_start(host);
        let body = self.take_body(host, body_size)?;
        let router = Rc::clone(&self.router);
        let fleet = router.fleet();
        let mut request = split::read(
            &router.view(&fleet, &router.learned()),
            api,
            &self.head.id,
            body,
        )?;
        if let Some(s) = &request.model.session {
            let id = session_id(s, &self.head.session_headers, &request.body, &request.top);
            request.session = id.as_deref().map(session_key);
        }
        self.admit_or_wait(host, request)
    }

    /// Executor mode: the router is about to place a request itself because
    /// the endpoint picker's destination header is missing. A picker that
    /// fails open (ext_proc `failure_mode_allow: true`) or does not run on
    /// the route would otherwise hand every pick to pd-router unseen: count
    /// each such request, and say why once a minute.
    pub(super) fn note_pick_missing<H: Host>(&self, host: &H) {
        if !self.router.config.routing.picker || self.head.picked.is_some() {
            return;
        }
        host.increment(Counter::EppPickMissing);
        if self.router.pick_missing_log_due(host.now_ms()) {
            self.log(
                host,
                Level::Warn,
                "executor mode (\"placement\": \"epp\"): no x-gateway-destination-endpoint from the endpoint picker, so pd-router placed the request itself; the picker did not run on it: is its ext_proc failing open (failure_mode_allow: true) while the picker is unreachable, or missing from this route? (counted in epp_pick_missing; logged at most once a minute)",
            );
        }
    }

    /// Places a request read from the client (again, after a failed
    /// prefill, avoiding the pods it failed on), builds its legs and sends
    /// them.
    pub(super) fn place<H: Host>(
        &mut self,
        host: &mut H,
        request: SplitRequest,
        attempt: Attempt,
    ) -> Result<Next, PdError> {
        let router = Rc::clone(&self.router);
        let fleet = router.fleet();
        let now = host.now_ms();
        // Without host randomness, spread by a weak but varying value rather
        // than failing the request.
        let mut random = |h: &mut H| {
            h.random_u64()
                .unwrap_or_else(|_| now.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        };
        // The picker's choice holds for the first attempt; a retry after
        // a failed prefill is the router's own.
        if attempt.number == 0 && !attempt.resent {
            self.note_pick_missing(host);
        }
        let picked = self.head.picked.filter(|_| attempt.failed_on.is_empty());
        let placement = match picked {
            Some(p) => router.place_picked(&request, &p)?,
            // No retry follows: nothing is sent to a prefill pod.
            None if self.head.prefer_if_available => {
                let placed = router.place(host, &request, &attempt.full, &mut random, now)?;
                serve_if_available(placed, request.prompt.tokens, &request.model.name)?
            }
            None if attempt.full.is_empty() => {
                router.place(host, &request, &attempt.failed_on, &mut random, now)?
            }
            None => {
                let exclude: Vec<_> = attempt
                    .failed_on
                    .iter()
                    .chain(&attempt.full)
                    .copied()
                    .collect();
                router.place(host, &request, &exclude, &mut random, now)?
            }
        };
        let mut request = request;
        if request.kv_source.is_none() && matches!(placement, split::Placement::Split { .. }) {
            request.kv_source = self.take_kv_source(host, &request);
        }
        let mut ids = HostIds {
            router: &router,
            host: &mut *host,
        };
        let plan = split::build(
            &router.view(&fleet, &router.learned()),
            request,
            placement,
            &mut ids,
        )?;
        self.send(host, plan, attempt)
    }

    /// Counts and logs a decider's decision, and remembers the decode pod as
    /// the holder of the prompt (it computes or pulls all of it).
    fn report_decision<H: Host>(
        &self,
        host: &mut H,
        request: &SplitRequest,
        decode: &Endpoint,
        decided: &Decided,
    ) {
        let model = &request.model.name;
        host.count_decision(model, decided.reason);
        host.record(Histogram::UncachedTokens, model, decided.uncached_tokens);
        self.debug(host, || {
            format!(
                "decider: {} for decode {} ({} of {} prompt tokens not on it)",
                decided.reason, decode.address, decided.uncached_tokens, request.prompt.tokens
            )
        });
        let now = host.now_ms();
        let router = Rc::clone(&self.router);
        router.remember_decode(host, request, &decided.decode_prefix, decode.id, now);
    }

    /// Sends a planned request on: the prefill dispatched (and, for
    /// concurrent engines, the decode too), or the whole request to one pod.
    /// Its load is taken first; a request admission control just let in
    /// whose pods another worker filled meanwhile waits again instead
    /// ([`Next::Queue`]), nothing sent.
    fn send<H: Host>(
        &mut self,
        host: &mut H,
        plan: Plan,
        mut attempt: Attempt,
    ) -> Result<Next, PdError> {
        let model = match &plan {
            Plan::Unsplit { request, .. } => &request.model,
            Plan::Split(p) => &p.request.model,
        };
        let model = Rc::clone(model);
        self.timing.model = Some(Rc::clone(&model));
        let router = Rc::clone(&self.router);
        // A split's prefill: the tokens it computes (for the trace) and the
        // work its pod holds for them.
        let (prefill, decode, computes) = match &plan {
            Plan::Unsplit { pod, .. } => (None, Rc::clone(pod), 0),
            Plan::Split(p) => {
                let computes = router.uncached_tokens(&p.request, &p.prefix, p.prefill_pod.id);
                let work = router.prefill_work(&p.request, computes);
                (
                    Some((Rc::clone(&p.prefill_pod), work)),
                    Rc::clone(&p.decode_pod),
                    computes,
                )
            }
        };
        let prefill_held = prefill.as_ref().map(|(p, tokens)| (p, *tokens));
        let admitted = std::mem::take(&mut attempt.admitted);
        if !self.hold(host, model.id, prefill_held, Some(&decode), admitted) {
            let request = match plan {
                Plan::Unsplit { request, .. } => request,
                Plan::Split(p) => p.request,
            };
            let since_ms = host.now_ms();
            return Ok(Next::Queue(Box::new(QueuedRequest { request, since_ms })));
        }
        let plan = match plan {
            Plan::Unsplit { request, pod, why } => {
                self.trace_unsplit(host, &request, &pod, &why);
                return self.send_unsplit(host, &request, &pod, &why);
            }
            Plan::Split(plan) => plan,
        };
        self.trace_split(host, &plan, computes);
        let now = host.now_ms();
        router.remember_prefix(host, &plan.request, &plan.prefix, plan.prefill_pod.id, now);
        if let Some(decided) = &plan.decided {
            self.report_decision(host, &plan.request, &plan.decode_pod, decided);
        }
        self.encode_or_prefill(host, plan, attempt)
    }

    /// Sends a split's prefill (its encoders, if any, answered): the
    /// sequential prefill awaited, or a concurrent one watched while the
    /// decode goes.
    pub(super) fn send_prefill<H: Host>(
        &mut self,
        host: &mut H,
        plan: split::SplitPlan,
        attempt: Attempt,
    ) -> Result<Next, PdError> {
        let token = match self.dispatch_prefill(host, &plan) {
            Ok(t) => t,
            Err(e) => {
                self.release(host, Release::All, None);
                return Err(e);
            }
        };
        self.prefill_left(host);
        // The prefill leg is Envoy's now; a retry builds its own.
        let mut plan = plan;
        plan.prefill_body = Vec::new();
        host.increment(Counter::Split);
        self.prefill_pod = Some((plan.prefill_pod.name.clone(), plan.prefill_pod.ip.clone()));
        self.decode_pod = Some(Rc::clone(&plan.decode_pod));
        if plan.rewrite.as_ref().is_some_and(|r| r.capture_kv) {
            self.note_reuse_turn(&plan.request, &plan.decode_pod);
        }
        self.debug(host, || {
            let (p, d) = (&plan.prefill_pod.address, &plan.decode_pod.address);
            let n = attempt.number + 1;
            format!(
                "{} {}: prefill {p} decode {d} ({}, attempt {n})",
                plan.request.model.engine, self.head.path, plan.reason
            )
        });
        if !plan.concurrent {
            return Ok(Next::AwaitPrefill(Box::new(PendingPrefill {
                token,
                plan,
                attempt,
            })));
        }
        self.send_decode_now(host, &plan, token)
    }

    /// A request to one pod whole: counted and logged by why.
    fn send_unsplit<H: Host>(
        &mut self,
        host: &mut H,
        request: &SplitRequest,
        pod: &Rc<Endpoint>,
        why: &UnsplitReason,
    ) -> Result<Next, PdError> {
        let not_split = why.not_split();
        host.increment(Counter::Unsplit(not_split));
        self.debug(host, || {
            let by = match why {
                UnsplitReason::Combined(policy) => format!(" ({policy})"),
                _ => String::new(),
            };
            format!("not split ({}{by}): {}", not_split.label(), pod.address)
        });
        if let UnsplitReason::Decided(decided) = why {
            self.report_decision(host, request, pod, decided);
        }
        self.forward_unsplit(host, pod)
    }

    /// A concurrent engine's decode, sent while its prefill (`token`) is in
    /// flight. SGLang: the prefill waits for the decode to register its
    /// room, so the decode goes out now and the prefill answer is only
    /// watched.
    fn send_decode_now<H: Host>(
        &mut self,
        host: &mut H,
        plan: &split::SplitPlan,
        token: u32,
    ) -> Result<Next, PdError> {
        if let Err(e) = self.send_concurrent_decode(host, plan) {
            self.release(host, Release::All, None);
            return Err(e);
        }
        self.watch_decode(&plan.prefill_pod, &plan.decode_pod);
        // The prefill's report comes later, if the answer needs them.
        self.response.rewrite = plan
            .rewrite
            .clone()
            .map(|a| crate::reconcile::Rewrite::new(a, None));
        Ok(Next::Upstream(Some(WatchedPrefill {
            token,
            pod: Rc::clone(&plan.prefill_pod),
            abort: plan.abort.clone(),
        })))
    }
}

//! E/P/D: a split's encoder legs, sent before its prefill and awaited
//! (`Phase::Encoding`), then the prefill with what they handed over. Every
//! leg is bounded by the prefill timeout; the first failure answers the
//! client (502 naming the encoder pod), as vLLM's proxy and llm-d's sidecar
//! do. The legs still in flight then answer into the void (Envoy cannot
//! cancel a call).

use super::load::Release;
use super::phase::{Next, PendingEncode};
use super::{Attempt, Flow};
use crate::encoder;
use crate::error::{PdError, PrefillFailure};
use crate::fleet::EcConnector;
use crate::host::{Counter, Host, Level};
use crate::load::Verdict;
use crate::split::{self, EncoderLeg, SplitPlan};
use std::rc::Rc;

impl Flow {
    /// Sends the encoder legs of `plan` and waits for them, or, when it
    /// needs none, sends its prefill at once.
    pub(super) fn encode_or_prefill<H: Host>(
        &mut self,
        host: &mut H,
        plan: SplitPlan,
        attempt: Attempt,
    ) -> Result<Next, PdError> {
        let legs = match self.encoder_legs(host, &plan, &attempt) {
            Ok(legs) => legs,
            Err(e) => {
                self.release(host, Release::All, None);
                return Err(e);
            }
        };
        if legs.is_empty() {
            return self.send_prefill(host, plan, attempt);
        }
        let mut calls = Vec::with_capacity(legs.len());
        for leg in &legs {
            match self.dispatch_encoder(host, leg) {
                Ok(token) => calls.push((token, Rc::clone(&leg.pod))),
                // Calls already sent answer into the void.
                Err(e) => {
                    self.release(host, Release::All, None);
                    return Err(e);
                }
            }
        }
        self.encoders_left(host);
        self.debug(host, || {
            let pods: Vec<&str> = calls.iter().map(|(_, p)| p.address.as_str()).collect();
            format!(
                "{} media items to encoders {pods:?} before prefill {}",
                calls.len(),
                plan.prefill_pod.address
            )
        });
        Ok(Next::AwaitEncode(Box::new(PendingEncode {
            plan,
            attempt,
            params: Vec::with_capacity(calls.len()),
            calls,
        })))
    }

    /// The encoder legs of `plan`: over the picker's encoders (executor
    /// mode), else over the roleset's healthy ones by their scraped queues.
    fn encoder_legs<H: Host>(
        &self,
        host: &mut H,
        plan: &SplitPlan,
        attempt: &Attempt,
    ) -> Result<Vec<EncoderLeg>, PdError> {
        if let Some(picked) = self.picked_encoders(host, plan, attempt) {
            return split::picked_encoder_legs(plan, &picked);
        }
        let start = host.random_u64().unwrap_or_else(|_| host.now_ms());
        let now = host.now_ms();
        let router = &self.router;
        let queue = |pod: &crate::fleet::Endpoint| {
            router
                .is_healthy(&*host, pod, now)
                .then(|| router.scraped_queue(pod, now))
        };
        split::encoder_legs(plan, start, queue)
    }

    /// Sends one encoder leg through the prefill cluster; its call's token.
    fn dispatch_encoder<H: Host>(&self, host: &mut H, leg: &EncoderLeg) -> Result<u32, PdError> {
        let config = &self.router.config;
        let pod = &leg.pod;
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", &self.head.path),
            (":authority", &pod.address),
            ("content-type", "application/json"),
            (&config.routing.header, &pod.address),
        ];
        if let Some(id) = &leg.request_id {
            headers.push(("x-request-id", id));
        }
        let token = host
            .dispatch(
                &config.routing.prefill_cluster,
                &headers,
                &leg.body,
                config.prefill.timeout_ms,
            )
            .map_err(|e| PdError::Encoder {
                pod: pod.name.clone(),
                failure: PrefillFailure::Dispatch(format!(
                    "cluster {:?}: {e}",
                    config.routing.prefill_cluster
                )),
            })?;
        host.increment(Counter::EncoderSent);
        Ok(token)
    }

    /// Executor mode: the encoder pods the endpoint picker chose for this
    /// request's media, those the fleet knows as encoders of its model; for
    /// the first attempt only, as the picker's prefill pod. Addresses it
    /// does not know are refused (said once); none left, or none chosen:
    /// `None`, the router chooses.
    fn picked_encoders<H: Host>(
        &self,
        host: &H,
        plan: &SplitPlan,
        attempt: &Attempt,
    ) -> Option<Vec<Rc<crate::fleet::Endpoint>>> {
        let chosen = &self.head.encoders;
        if chosen.is_empty() || plan.request.media.is_empty() || !attempt.failed_on.is_empty() {
            return None;
        }
        let (known, refused) = self.router.picked_encoders(&plan.request.model, chosen);
        if !refused.is_empty()
            && self
                .router
                .first_time(crate::fleet::PodId(0), "encoder_refused")
        {
            self.log(
                host,
                Level::Warn,
                &format!(
                    "the endpoint picker chose encoders {refused:?} that are no encoder pods of model `{}`: not called (an address the fleet does not know is never dialled; said once)",
                    plan.request.model.name
                ),
            );
        }
        (!known.is_empty()).then_some(known)
    }

    /// An encoder call answered: wait for the rest, or send the prefill
    /// with the encoders' hand-off once all are in, or answer the failure.
    pub(super) fn encoder_answered<H: Host>(
        &mut self,
        host: &mut H,
        mut pending: PendingEncode,
        token: u32,
        status: Option<u16>,
        body_size: usize,
    ) {
        let Some(at) = pending.calls.iter().position(|(t, _)| *t == token) else {
            return;
        };
        let (_, pod) = pending.calls.swap_remove(at);
        let answer = super::prefill::classify(status, || host.call_response_body(body_size))
            .and_then(|()| {
                host.call_response_body(body_size)
                    .map_err(|e| PrefillFailure::BadAnswer(e.to_string()))
            });
        let router = Rc::clone(&self.router);
        let now = host.now_ms();
        let verdict = super::prefill::verdict(
            &answer.as_ref().map(|_| ()).map_err(Clone::clone),
            Verdict::Failed,
        );
        if let Err(e) = router.judge_everywhere(host, &pod, verdict, "encoder", now) {
            self.log(
                host,
                Level::Warn,
                &format!("could not record the encoder's health: {e}"),
            );
        }
        let connector = ec_connector_of(&pending.plan);
        let next = match answer.and_then(|body| {
            encoder::answer_params(connector, &body).map_err(PrefillFailure::BadAnswer)
        }) {
            Err(failure) => {
                host.increment(Counter::EncoderFailed);
                self.release(host, Release::All, None);
                Err(PdError::Encoder {
                    pod: pod.name.clone(),
                    failure,
                })
            }
            Ok(params) => {
                pending.params.push(params);
                if pending.calls.is_empty() {
                    self.encoded(host, pending)
                } else {
                    Ok(Next::AwaitEncode(Box::new(pending)))
                }
            }
        };
        self.resume_after(host, next);
    }

    /// Every encoder answered 200: the prefill leaves, with the merged
    /// `ec_transfer_params` (NIXL).
    fn encoded<H: Host>(&mut self, host: &mut H, pending: PendingEncode) -> Result<Next, PdError> {
        let PendingEncode {
            mut plan,
            attempt,
            params,
            ..
        } = pending;
        let missing = params.iter().filter(|p| p.is_none()).count();
        if missing > 0 && ec_connector_of(&plan) == EcConnector::Nixl {
            self.log(
                host,
                Level::Warn,
                &format!(
                    "{missing} of {} encoder answers carried no ec_transfer_params: the prefill encodes those items itself",
                    params.len()
                ),
            );
        }
        let objects: Vec<String> = params.into_iter().flatten().collect();
        if let Some(merged) = encoder::merge_params(&objects) {
            plan.prefill_body =
                encoder::with_params(&plan.prefill_body, &merged).map_err(PdError::Internal)?;
        }
        self.send_prefill(host, plan, attempt)
    }
}

/// The EC connector of the split's model (a split with media has one).
fn ec_connector_of(plan: &SplitPlan) -> EcConnector {
    plan.request
        .model
        .ec_connector
        .unwrap_or(EcConnector::Example)
}

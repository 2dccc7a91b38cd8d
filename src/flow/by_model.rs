//! Calls the router does not split: those it routes by the model they
//! name (embeddings, tokenize, score, audio transcription, ...), those it
//! passes through to a decode pod of any model, and the gateway's own
//! model list. A body any of them carries is checked as a split body is for
//! the hand-off fields the router owns (`split::check_whole`): the pod it
//! reaches obeys them all the same.

use super::phase::Next;
use super::Flow;
use crate::api::Api;
use crate::calls::{self, BodyKind};
use crate::catalog;
use crate::error::{ClientError, HostError, PdError};
use crate::host::{Action, Counter, Host, Level, NotSplit};
use crate::router::unsplit;
use crate::split;
use std::rc::Rc;

impl Flow {
    /// Sends a buffered call to a decode or combined pod of the model its
    /// body names, by the model's decode policy and in its load; a body
    /// that names none goes where calls without a model go.
    pub(super) fn route_by_model<H: Host>(
        &mut self,
        host: &mut H,
        kind: &BodyKind,
        ask: usize,
    ) -> Result<Next, PdError> {
        let body = self.take_body(host, ask)?;
        let Some(name) = calls::model_named(&body, kind.boundary())? else {
            return self.send_body_to_any_decode(host, kind, &body);
        };
        let router = Rc::clone(&self.router);
        let fleet = router.fleet();
        let served = fleet
            .serve(&name)
            .ok_or_else(|| ClientError::UnknownModel(name.clone()))?;
        let model = Rc::clone(served.model);
        split::check_whole(
            &router.view(&fleet, &router.learned()),
            Some(&model),
            &body,
            kind,
        )?;
        let now = host.now_ms();
        let mut random = |h: &mut H| {
            h.random_u64()
                .unwrap_or_else(|_| now.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        };
        // In executor mode the endpoint picker chose the pod.
        self.note_pick_missing(host);
        let pod = match &self.head.picked {
            Some(picked) => router.picked_decode(&model, picked)?,
            None => router.place_unsplit(host, &model, served.adapter, &mut random, now)?,
        };
        host.increment(Counter::Unsplit(NotSplit::ByModel));
        self.debug(host, || {
            format!(
                "not split (by_model) {} for {name}: {}",
                self.head.path, pod.address
            )
        });
        self.hold(host, model.id, None, Some(&pod), false);
        self.forward_unsplit(host, &pod)
    }

    /// Paths the router does not split go to a healthy decode pod it chose.
    pub(super) fn pass_through<H: Host>(&mut self, host: &mut H) -> Action {
        let next = self.send_to_any_decode(host);
        self.act(host, next)
    }

    /// Points the request at the next healthy decode pod of any model, in
    /// turn: calls that name no model. Such calls hold no load: the router
    /// cannot tell a `/health` from a generation.
    fn send_to_any_decode<H: Host>(&mut self, host: &mut H) -> Result<Next, PdError> {
        let router = Rc::clone(&self.router);
        let now = host.now_ms();
        let pods = unsplit::decode_pods(&router.fleet());
        let turn = router.next_unsplit_turn();
        let pod = unsplit::next_decode(&pods, turn, |e| router.is_healthy(&*host, e, now))
            .ok_or_else(|| PdError::NoEndpoint {
                model: "(any)".into(),
            })?;
        host.set_request_header(&router.config.routing.header, Some(&pod.address))?;
        host.increment(Counter::Unsplit(NotSplit::Path));
        self.debug(host, || {
            format!("not split (path) {}: {}", self.head.path, pod.address)
        });
        self.decode_pod = Some(Rc::clone(pod));
        Ok(Next::Upstream(None))
    }

    /// A call with a body that names no model: checked, then to a decode
    /// pod of any model.
    pub(super) fn pass_through_body<H: Host>(
        &mut self,
        host: &mut H,
        kind: &BodyKind,
        ask: usize,
    ) -> Result<Next, PdError> {
        let body = self.take_body(host, ask)?;
        self.send_body_to_any_decode(host, kind, &body)
    }

    fn send_body_to_any_decode<H: Host>(
        &mut self,
        host: &mut H,
        kind: &BodyKind,
        body: &[u8],
    ) -> Result<Next, PdError> {
        let router = Rc::clone(&self.router);
        let fleet = router.fleet();
        split::check_whole(&router.view(&fleet, &router.learned()), None, body, kind)?;
        self.send_to_any_decode(host)
    }

    /// The buffered body, at most `ask` bytes of it; one over
    /// `max_body_bytes` is refused (the count trailers end a body with is
    /// only known once it is read).
    pub(super) fn take_body<H: Host>(&self, host: &H, ask: usize) -> Result<Vec<u8>, PdError> {
        let body = host.request_body(ask)?;
        let limit = self.router.config.max_body_bytes;
        if body.len() > limit {
            return Err(ClientError::TooLarge { limit }.into());
        }
        Ok(body)
    }

    /// A split path the client spelled another way (`/V1/chat/completions/`,
    /// `//v1/chat/completions`, an escaped slash) goes on as the path it
    /// was read as, its query kept, so both legs reach the endpoint the
    /// router split for, whatever the engine makes of the variant.
    pub(super) fn canonical_path<H: Host>(
        &mut self,
        host: &mut H,
        api: Api,
    ) -> Result<(), HostError> {
        let (path, query) = match self.head.path.find(['?', '#']) {
            Some(i) => self.head.path.split_at(i),
            None => (self.head.path.as_str(), ""),
        };
        if path == api.path() {
            return Ok(());
        }
        let canonical = format!("{}{query}", api.path());
        host.set_request_header(":path", Some(&canonical))?;
        self.debug(host, || format!("{} read as {canonical}", self.head.path));
        self.head.path = canonical;
        Ok(())
    }

    /// Answers `GET /v1/models` (`id`: `None`) or `GET /v1/models/{id}`
    /// from the fleet, with no upstream call.
    pub(super) fn reply_models<H: Host>(&mut self, host: &mut H, id: Option<&str>) -> Action {
        let created = host.now_ms() / 1000;
        let fleet = self.router.fleet();
        let body = match id {
            None => catalog::list(&fleet, created),
            Some(id) => match catalog::card(&fleet, id, created) {
                Some(card) => card,
                None => return self.fail(host, ClientError::UnknownModel(id.to_owned()).into()),
            },
        };
        host.increment(Counter::ModelsListed);
        host.count_reply(200);
        let sent = host.send_reply(200, &[("content-type", "application/json")], &body);
        if let Err(e) = sent {
            self.log(
                host,
                Level::Error,
                &format!("could not send the model list: {e}"),
            );
        }
        self.act(host, Ok(Next::Replied))
    }
}

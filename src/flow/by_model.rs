//! Calls the router does not split but routes by the model they name
//! (embeddings, tokenize, score, audio transcription, ...), and the
//! gateway's own model list.

use super::{Flow, Phase, Sent};
use crate::calls;
use crate::catalog;
use crate::error::{ClientError, PdError};
use crate::host::{Action, Counter, Host, Level};
use std::rc::Rc;

impl Flow {
    /// Sends a buffered call to a decode or combined pod of the model its
    /// body names, by the model's decode policy and in its load; a body
    /// that names none goes where calls without a model go.
    pub(super) fn route_by_model<H: Host>(
        &mut self,
        host: &mut H,
        boundary: Option<&str>,
        body_size: usize,
    ) -> Result<Sent, PdError> {
        let body = host.request_body(body_size)?;
        let Some(name) = calls::model_named(&body, boundary)? else {
            self.send_to_any_decode(host)?;
            return Ok(Sent::Upstream);
        };
        let router = Rc::clone(&self.router);
        let fleet = router.fleet();
        let served = fleet
            .serve(&name)
            .ok_or_else(|| ClientError::UnknownModel(name.clone()))?;
        let model = Rc::clone(served.model);
        let now = host.now_ms();
        let mut random = |h: &mut H| {
            h.random_u64()
                .unwrap_or_else(|_| now.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        };
        // In executor mode the endpoint picker chose the pod.
        let pod = match &self.head.picked {
            Some(picked) => router.picked_decode(&model, picked)?,
            None => router.place_unsplit(host, &model, served.adapter, &mut random, now)?,
        };
        host.increment(Counter::Unsplit);
        self.debug(host, || {
            format!("{} for {name}: {}", self.head.path, pod.address)
        });
        self.forward_unsplit(host, model.id, &pod)
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
        self.phase = Phase::Replied;
        Action::Pause
    }
}

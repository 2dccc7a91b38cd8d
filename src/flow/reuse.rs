//! Next-turn KV reuse in the flow ([`crate::reuse`]): the session's handle
//! taken out when its request is placed and sent with the prefill; the
//! decode's new handle kept when its answer ends well.

use super::Flow;
use crate::fleet::{Endpoint, Model};
use crate::host::{Counter, Host, Level};
use crate::reuse::{Handle, History};
use crate::split::SplitRequest;
use std::rc::Rc;

/// A split whose decode may leave a handle for the session's next turn.
#[derive(Debug)]
pub(super) struct ReuseTurn {
    model: Rc<Model>,
    session: u64,
    history: History,
    decode: Rc<Endpoint>,
}

impl Flow {
    /// The session's handle for `request`, taken out of the table (a
    /// handle's blocks serve one read), if its decode pod is still the
    /// model's and the request extends the turn that made it.
    pub(super) fn take_kv_source<H: Host>(
        &self,
        host: &mut H,
        request: &SplitRequest,
    ) -> Option<String> {
        let reuse = request.model.kv_reuse?;
        let session = request.session?;
        let now = host.now_ms();
        let handle = self
            .router
            .kv_handles(&request.model, reuse)
            .take(host, session, now)?;
        let fresh = request.model.pods.contains(&handle.pod)
            && handle
                .history
                .extended_by(request.fields.api, &request.body, &request.top);
        if !fresh {
            host.increment(Counter::KvReuseStale);
            return None;
        }
        host.increment(Counter::KvReuseSent);
        Some(handle.params)
    }

    /// Remembers a split that may leave a handle: its rewrite takes the
    /// decode's params out of the answer.
    pub(super) fn note_reuse_turn(&mut self, request: &SplitRequest, decode: &Rc<Endpoint>) {
        let (Some(_), Some(session)) = (request.model.kv_reuse, request.session) else {
            return;
        };
        let Some(history) = History::of(request.fields.api, &request.body, &request.top) else {
            return;
        };
        self.reuse = Some(ReuseTurn {
            model: Rc::clone(&request.model),
            session,
            history,
            decode: Rc::clone(decode),
        });
    }

    /// The stream ended: a decode that answered in full (2xx, a choice
    /// finished with `stop` or `length`) and named its blocks leaves the
    /// session's next turn a handle, its `remote_host` the pod's address
    /// (vLLM reports its side-channel host, `localhost` by default, as
    /// vLLM's own proxy also corrects).
    pub(super) fn keep_kv_handle<H: Host>(&mut self, host: &mut H) {
        let Some(turn) = self.reuse.take() else {
            return;
        };
        let Some(reuse) = turn.model.kv_reuse else {
            return;
        };
        let taken = self
            .response
            .rewrite
            .as_ref()
            .and_then(|rw| rw.captured())
            .filter(|t| t.finished && self.response.ended);
        let Some(params) = taken.and_then(|t| with_host(&t.params, &turn.decode.ip)) else {
            return;
        };
        let handle = Handle {
            session: turn.session,
            pod: turn.decode.id,
            deadline_ms: host.now_ms().saturating_add(reuse.ttl_ms),
            history: turn.history,
            params,
        };
        if let Err(e) = self
            .router
            .kv_handles(&turn.model, reuse)
            .keep(host, handle)
        {
            self.log(
                host,
                Level::Warn,
                &format!("next-turn KV handle not kept: {e}"),
            );
        }
    }
}

/// `params` with `remote_host` set to `ip`; `None` when they do not name
/// blocks to read.
fn with_host(params: &[u8], ip: &str) -> Option<String> {
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(params).ok()?;
    let names_blocks = v
        .get("remote_block_ids")
        .and_then(|b| b.as_array())
        .is_some_and(|b| !b.is_empty());
    if !names_blocks || v.get("do_remote_decode") != Some(&true.into()) {
        return None;
    }
    v.insert("remote_host".into(), ip.into());
    serde_json::to_string(&v).ok()
}

#[cfg(test)]
mod tests {
    use super::with_host;

    #[test]
    fn a_handle_names_the_pod_and_its_blocks() {
        let p = br#"{"do_remote_decode":true,"remote_block_ids":[[3]],"remote_host":"localhost","remote_port":5600}"#;
        let h = with_host(p, "10.0.0.9").expect("handle");
        assert!(h.contains(r#""remote_host":"10.0.0.9""#) && h.contains(r#""remote_port":5600"#));
        assert_eq!(
            with_host(br#"{"do_remote_decode":true,"remote_block_ids":[]}"#, "h"),
            None
        );
        assert_eq!(
            with_host(
                br#"{"do_remote_decode":false,"remote_block_ids":[[1]]}"#,
                "h"
            ),
            None
        );
    }
}

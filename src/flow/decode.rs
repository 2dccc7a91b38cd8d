//! Pointing the paused request at its decode pod.

use super::phase::Next;
use super::Flow;
use crate::body::LegBody;
use crate::error::PdError;
use crate::fleet::Endpoint;
use crate::host::Host;
use crate::split::{DecodeLeg, SplitPlan};
use std::rc::Rc;

/// Sets the hand-off's own request headers on the paused request (before
/// the routing header, which nothing may override).
pub(super) fn set_headers<H: Host>(
    host: &mut H,
    headers: &[(String, String)],
) -> Result<(), PdError> {
    for (name, value) in headers {
        host.set_request_header(name, Some(value))?;
    }
    Ok(())
}

impl Flow {
    pub(super) fn send_concurrent_decode<H: Host>(
        &self,
        host: &mut H,
        plan: &SplitPlan,
    ) -> Result<(), PdError> {
        let DecodeLeg::Ready { body, headers } = &plan.decode else {
            return Err(PdError::Internal(
                "a concurrent split without a decode body".into(),
            ));
        };
        set_headers(host, headers)?;
        self.send_decode(host, body, &plan.decode_pod.address)
    }

    /// Sends the client's request unchanged to one pod (a combined pod, or
    /// the decode pod of a request that is not split), whose load the
    /// caller took.
    pub(super) fn forward_unsplit<H: Host>(
        &mut self,
        host: &mut H,
        pod: &Rc<Endpoint>,
    ) -> Result<Next, PdError> {
        host.set_request_header(&self.router.config.routing.header, Some(&pod.address))?;
        self.decode_pod = Some(Rc::clone(pod));
        self.trace_decode(host, &pod.name, false);
        Ok(Next::Upstream(None))
    }

    /// Points the paused request at the decode pod with its new body.
    pub(super) fn send_decode<H: Host>(
        &self,
        host: &mut H,
        body: &LegBody,
        decode_address: &str,
    ) -> Result<(), PdError> {
        host.replace_request_front(body.replaced, &body.head)?;
        // Envoy does not fix content-length after a body change; a stale one
        // corrupts the upstream connection.
        host.set_request_header("content-length", Some(&body.len().to_string()))?;
        if self.head.chunked {
            host.set_request_header("transfer-encoding", None)?;
        }
        host.set_request_header(&self.router.config.routing.header, Some(decode_address))?;
        if let Some(pod) = &self.decode_pod {
            self.trace_decode(host, &pod.name, true);
        }
        Ok(())
    }
}

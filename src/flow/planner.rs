//! The router's scheduler as the split plan sees it.

use crate::engine::Entropy;
use crate::error::PdError;
use crate::fleet::PodId;
use crate::host::Host;
use crate::router::Router;
use crate::split::{Placement, Planner, SplitRequest};

/// The flow's planner: the router's scheduler over this VM's shared data,
/// with the host's randomness.
pub(super) struct FlowPlanner<'a, H: Host> {
    pub router: &'a Router,
    pub host: &'a mut H,
    pub failed_on: &'a [PodId],
}

impl<H: Host> Entropy for FlowPlanner<'_, H> {
    fn random_u64(&mut self) -> Result<u64, String> {
        self.host.random_u64()
    }
    fn disagg_request_id(&mut self) -> i64 {
        self.router.next_disagg_id(self.host.now_ms())
    }
}

impl<H: Host> Planner for FlowPlanner<'_, H> {
    fn place(&mut self, request: &SplitRequest) -> Result<Placement, PdError> {
        let now = self.host.now_ms();
        // Without host randomness, spread by a weak but varying value rather
        // than failing the request.
        let mut random = |h: &mut H| {
            h.random_u64()
                .unwrap_or_else(|_| now.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        };
        self.router
            .place(&mut *self.host, request, self.failed_on, &mut random, now)
    }
    fn entropy(&mut self) -> &mut dyn Entropy {
        self
    }
}

//! The randomness and TensorRT-LLM ids a split draws on, from the host.

use crate::handoff::IdSource;
use crate::host::Host;
use crate::router::Router;

/// The host's randomness and this VM's disagg id generator.
pub(super) struct HostIds<'a, H: Host> {
    pub router: &'a Router,
    pub host: &'a mut H,
}

impl<H: Host> IdSource for HostIds<'_, H> {
    fn random_u64(&mut self) -> Result<u64, String> {
        self.host.random_u64()
    }
    fn disagg_request_id(&mut self) -> i64 {
        self.router.next_disagg_id(self.host.now_ms())
    }
}

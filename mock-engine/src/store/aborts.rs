//! SGLang's `POST /abort_request`: the request ids a router aborted, which
//! a prefill waiting for its decode watches so it stops holding its KV.

use std::collections::HashSet;
use tokio::sync::watch;

pub struct Aborts(watch::Sender<HashSet<String>>);

impl Default for Aborts {
    fn default() -> Self {
        Aborts(watch::Sender::new(HashSet::new()))
    }
}

impl Aborts {
    /// Aborts `rid` (a request not seen yet is aborted when it comes).
    pub fn abort(&self, rid: &str) {
        self.0.send_modify(|s| {
            s.insert(rid.to_owned());
        });
    }

    /// Resolves once `rid` is aborted.
    pub async fn wait(&self, rid: &str) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|s| s.contains(rid)).await;
    }
}

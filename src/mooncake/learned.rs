//! The VM's copy of the learned engine ids, refreshed from shared data.

use super::ids::{decode, EngineIds};
use crate::fleet::{Connector, Endpoint, EngineKind, Fleet};
use crate::handoff::LearnedPods;
use crate::pods::SharedStore;
use std::cell::RefCell;
use std::rc::Rc;

/// What this VM learned of the pods so far; each split takes a snapshot.
#[derive(Default)]
pub struct Learned(RefCell<Rc<LearnedPods>>);

impl Learned {
    /// A snapshot, for one split.
    pub fn snapshot(&self) -> Rc<LearnedPods> {
        Rc::clone(&self.0.borrow())
    }

    /// Replaces the engine ids.
    pub fn set(&self, engines: EngineIds) {
        *self.0.borrow_mut() = Rc::new(LearnedPods {
            said: engines.into_iter().collect(),
        });
    }

    /// Reads the engine ids afresh from shared data under `key` (a
    /// placement that found a prefill pod not ready: another VM may have
    /// learned its ids since this VM's last tick). True when they changed.
    pub fn reread<S: SharedStore + ?Sized>(&self, store: &S, key: &str) -> bool {
        let (bytes, _) = store.shared_get(key);
        let Some(bytes) = bytes else {
            return false;
        };
        let engines = decode(&bytes);
        let same = self.0.borrow().said.len() == engines.len()
            && engines
                .iter()
                .all(|(k, v)| self.0.borrow().said.get(k) == Some(v));
        if same {
            return false;
        }
        self.set(engines);
        true
    }

    /// The engine ids this VM knows.
    pub fn known(&self) -> EngineIds {
        self.0.borrow().said.clone().into_iter().collect()
    }
}

/// What a prefill pod is asked about itself before it takes prefills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// vLLM Mooncake: its engine ids, `GET /query` on its bootstrap port.
    MooncakeQuery,
    /// TensorRT-LLM generation-first: the context server's
    /// `disaggregated_params`, `GET /server_info` on its own port.
    TrtServerInfo,
}

/// A prefill pod to ask, and what.
#[derive(Debug, Clone)]
pub struct AskedPod {
    pub pod: Rc<Endpoint>,
    pub ask: Ask,
}

/// The prefill pods of `fleet` whose hand-off needs what they say
/// (`global`: the connector of pods and models that name none). A pod is
/// asked once, for the first model that needs it.
pub fn prefill_pods(fleet: &Fleet, global: Connector) -> Vec<AskedPod> {
    let mut out: Vec<AskedPod> = Vec::new();
    for m in fleet.models().iter() {
        for e in m.rolesets.iter().flat_map(|r| r.prefill.iter()) {
            let ask = match m.kind {
                EngineKind::Vllm if e.connector(m.kv_connector, global) == Connector::Mooncake => {
                    Ask::MooncakeQuery
                }
                EngineKind::Trtllm if m.trt_generation_first => Ask::TrtServerInfo,
                _ => continue,
            };
            if !out.iter().any(|o| o.pod.id == e.id) {
                out.push(AskedPod {
                    pod: Rc::clone(e),
                    ask,
                });
            }
        }
    }
    out
}

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
            mooncake: engines.into_iter().collect(),
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
        let same = self.0.borrow().mooncake.len() == engines.len()
            && engines
                .iter()
                .all(|(k, v)| self.0.borrow().mooncake.get(k) == Some(v));
        if same {
            return false;
        }
        self.set(engines);
        true
    }

    /// The engine ids this VM knows.
    pub fn known(&self) -> EngineIds {
        self.0.borrow().mooncake.clone().into_iter().collect()
    }
}

/// The prefill pods of `fleet` whose hand-off needs their engine ids
/// (`global`: the connector of pods and models that name none).
pub fn prefill_pods(fleet: &Fleet, global: Connector) -> Vec<Rc<Endpoint>> {
    let mut out: Vec<Rc<Endpoint>> = Vec::new();
    for m in fleet.models().iter().filter(|m| m.kind == EngineKind::Vllm) {
        for e in m.rolesets.iter().flat_map(|r| r.prefill.iter()) {
            if e.connector(m.kv_connector, global) == Connector::Mooncake
                && !out.iter().any(|o| o.id == e.id)
            {
                out.push(Rc::clone(e));
            }
        }
    }
    out
}

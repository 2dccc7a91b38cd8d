//! Round-robin turns: over each model's prefill pods, each roleset's decode
//! pods, and the pods of requests that are not split. Per VM: the turns
//! spread one VM's requests; other VMs keep their own.

use crate::fleet::{Model, ModelId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

#[derive(Default)]
pub struct Turns {
    prefill: RefCell<HashMap<ModelId, u64>>,
    /// By model and roleset name.
    decode: RefCell<HashMap<(ModelId, String), u64>>,
    unsplit: Cell<u64>,
}

impl Turns {
    /// The next turn over `model`'s prefill pods.
    pub fn next_prefill(&self, model: ModelId) -> u64 {
        let mut turns = self.prefill.borrow_mut();
        let t = turns.entry(model).or_insert(0);
        let v = *t;
        *t = v.wrapping_add(1);
        v
    }

    /// The next turn over the decode pods of `model`'s roleset `roleset`.
    pub fn next_decode(&self, model: &Model, roleset: usize) -> u64 {
        let name = model.rolesets.get(roleset).map_or("", |r| r.name.as_str());
        let mut turns = self.decode.borrow_mut();
        let t = turns.entry((model.id, name.to_owned())).or_insert(0);
        let v = *t;
        *t = v.wrapping_add(1);
        v
    }

    /// The turn of the next request that is not split.
    pub fn next_unsplit(&self) -> u64 {
        let t = self.unsplit.get();
        self.unsplit.set(t.wrapping_add(1));
        t
    }
}

//! What a VM copies of the shared tables once per tick rather than per
//! request: the scraped metrics (they change only as often as they are
//! scraped) and each model's failing prefill/decode pairs (a pair is
//! avoided within a tick of the failure that starts it).

use crate::fleet::{Fleet, ModelId, PodId};
use crate::load::PairTable;
use crate::pods::{decode_scraped, ScrapedTable, SharedKeys, SharedStore};
use std::cell::{Ref, RefCell};
use std::collections::HashMap;

#[derive(Default)]
pub struct TickCopies {
    scraped: RefCell<ScrapedTable>,
    pairs: RefCell<HashMap<ModelId, PairTable>>,
}

impl TickCopies {
    /// Copies the shared tables of `fleet`'s models from `store`.
    pub fn refresh<S: SharedStore + ?Sized>(&self, store: &S, keys: &SharedKeys, fleet: &Fleet) {
        let (bytes, _) = store.shared_get(&keys.scraped());
        *self.scraped.borrow_mut() = decode_scraped(bytes.as_deref());
        let pairs = fleet
            .models()
            .iter()
            .filter_map(|m| {
                let (bytes, _) = store.shared_get(&keys.pairs(m.id));
                bytes.map(|b| (m.id, PairTable::decode(Some(&b))))
            })
            .collect();
        *self.pairs.borrow_mut() = pairs;
    }

    /// The scraped metrics as copied.
    pub fn scraped(&self) -> Ref<'_, ScrapedTable> {
        self.scraped.borrow()
    }

    /// `model`'s failing pairs as copied.
    pub fn pairs(&self, model: ModelId) -> PairTable {
        self.pairs.borrow().get(&model).cloned().unwrap_or_default()
    }

    /// Whether the copy knows the pair as failing.
    pub fn pair_failing(&self, model: ModelId, prefill: PodId, decode: PodId) -> bool {
        self.pairs
            .borrow()
            .get(&model)
            .is_some_and(|t| t.get(prefill, decode) != Default::default())
    }
}

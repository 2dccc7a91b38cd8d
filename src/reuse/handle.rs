//! A session's handle to its last decode's KV, and the bounded table in
//! shared data that keeps it: one slot per session (by its key modulo
//! `max_entries`), taken out when used, since the blocks serve one read.

use super::history::History;
use crate::fleet::{ModelId, PodId};
use crate::pods::{cas_update, SharedKeys, SharedStore};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Where a session's last decode left its KV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    pub session: u64,
    pub pod: PodId,
    /// The router's clock, Unix milliseconds: past it the handle is not
    /// sent (the decode pod's own deadline is on its clock, not ours).
    pub deadline_ms: u64,
    pub history: History,
    /// The decode's `kv_transfer_params`, its `remote_host` already the
    /// decode pod's address.
    pub params: String,
}

#[derive(Serialize, Deserialize)]
struct Stored<'a> {
    s: u64,
    p: u64,
    d: u64,
    hl: usize,
    hh: u64,
    #[serde(borrow)]
    k: &'a RawValue,
}

fn encode(h: &Option<Handle>) -> Vec<u8> {
    let Some(h) = h else { return Vec::new() };
    let Ok(k) = serde_json::from_str::<&RawValue>(&h.params) else {
        return Vec::new();
    };
    serde_json::to_vec(&Stored {
        s: h.session,
        p: h.pod.0,
        d: h.deadline_ms,
        hl: h.history.len,
        hh: h.history.hash,
        k,
    })
    .unwrap_or_default()
}

fn decode(bytes: Option<&[u8]>) -> Option<Handle> {
    let s: Stored = serde_json::from_slice(bytes?).ok()?;
    Some(Handle {
        session: s.s,
        pod: PodId(s.p),
        deadline_ms: s.d,
        history: History {
            len: s.hl,
            hash: s.hh,
        },
        params: s.k.get().to_owned(),
    })
}

/// A model's handles in shared data.
pub struct HandleStore<'a> {
    pub keys: &'a SharedKeys,
    pub model: ModelId,
    pub max_entries: u32,
}

impl HandleStore<'_> {
    fn slot(&self, session: u64) -> u32 {
        (session % u64::from(self.max_entries.max(1))) as u32
    }

    /// Keeps `handle`, replacing whatever its slot held.
    pub fn keep<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        handle: Handle,
    ) -> Result<(), String> {
        let key = self.keys.reuse_slot(self.model, self.slot(handle.session));
        let mut handle = Some(handle);
        cas_update(store, &key, decode, encode, |h| *h = handle.take()).map(|_| ())
    }

    /// Takes `session`'s handle out, if its slot holds one for it that has
    /// not run out at `now_ms`: no other request can send it after this.
    pub fn take<S: SharedStore + ?Sized>(
        &self,
        store: &mut S,
        session: u64,
        now_ms: u64,
    ) -> Option<Handle> {
        let key = self.keys.reuse_slot(self.model, self.slot(session));
        if store.shared_get(&key).0.is_none_or(|b| b.is_empty()) {
            return None;
        }
        let mut taken = None;
        cas_update(store, &key, decode, encode, |h| {
            taken = None;
            if h.as_ref().is_some_and(|h| h.session == session) {
                taken = h.take();
            }
        })
        .ok()?;
        taken.filter(|h| now_ms < h.deadline_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::MemoryStore;

    fn handle(session: u64, deadline_ms: u64) -> Handle {
        Handle {
            session,
            pod: PodId(7),
            deadline_ms,
            history: History { len: 3, hash: 9 },
            params: r#"{"remote_block_ids":[[1,2]],"remote_host":"10.0.0.2"}"#.into(),
        }
    }

    fn table(keys: &SharedKeys) -> HandleStore<'_> {
        HandleStore {
            keys,
            model: ModelId(1),
            max_entries: 16,
        }
    }

    #[test]
    fn a_handle_is_taken_once_by_its_session_before_its_deadline() {
        let keys = SharedKeys::new("f");
        let t = table(&keys);
        let mut store = MemoryStore::default();
        t.keep(&mut store, handle(5, 1_000)).expect("kept");
        assert_eq!(
            t.take(&mut store, 21, 0),
            None,
            "same slot, another session"
        );
        assert_eq!(t.take(&mut store, 5, 0), Some(handle(5, 1_000)));
        assert_eq!(t.take(&mut store, 5, 0), None, "single use");
        t.keep(&mut store, handle(5, 1_000)).expect("kept");
        assert_eq!(t.take(&mut store, 5, 1_000), None, "run out");
    }

    #[test]
    fn a_colliding_session_evicts_the_older_handle() {
        let keys = SharedKeys::new("f");
        let t = table(&keys);
        let mut store = MemoryStore::default();
        t.keep(&mut store, handle(5, 1_000)).expect("kept");
        t.keep(&mut store, handle(21, 1_000)).expect("kept");
        assert_eq!(t.take(&mut store, 5, 0), None);
        assert_eq!(t.take(&mut store, 21, 0), Some(handle(21, 1_000)));
    }
}

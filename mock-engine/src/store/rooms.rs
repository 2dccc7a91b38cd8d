//! SGLang's rooms, as data: the decode registers a room, the prefill waits
//! for that registration and then marks the room transferred, and the
//! decode collects what the prefill left (see `bootstrap.rs` for the HTTP
//! side). Both legs must be in flight at the same time, as in SGLang: a
//! prefill whose room the decode never registers times out.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::lock;

/// What the prefill leaves for a room: its prompt hash, the dp rank that
/// holds the KV and its cached token count (SGLang's metadata buffer
/// carries `req.cached_tokens` to the decode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub prompt_hash: String,
    pub dp_rank: u64,
    pub cached_tokens: u64,
}

#[derive(Clone, Default)]
struct RoomStatus {
    registered: bool,
    /// What the prefill that handled the room left, once it has.
    transferred: Option<Transfer>,
    /// The decode has collected the transfer (its GET /wait was answered).
    collected: bool,
}

/// Rooms by id. A watch channel per room lets any number of waiters see
/// changes without missing one that happened before they started waiting.
#[derive(Default)]
pub struct Rooms {
    map: Mutex<HashMap<u64, Arc<watch::Sender<RoomStatus>>>>,
}

/// Why a decode's wait for a room's transfer ended without it.
pub enum WaitError {
    NotRegistered,
    Timeout,
}

impl Rooms {
    fn entry(&self, room: u64) -> Arc<watch::Sender<RoomStatus>> {
        lock(&self.map)
            .entry(room)
            .or_insert_with(|| Arc::new(watch::Sender::new(RoomStatus::default())))
            .clone()
    }

    /// Decode side. A second registration of a live room is refused: two
    /// requests sharing a room would swap KV in a real deployment.
    pub fn register(&self, room: u64) -> bool {
        self.entry(room).send_if_modified(|s| {
            if s.registered {
                false
            } else {
                s.registered = true;
                true
            }
        })
    }

    /// Prefill side: waits until the decode registered `room`.
    pub async fn await_registered(&self, room: u64, deadline: Instant) -> bool {
        let tx = self.entry(room);
        let mut rx = tx.subscribe();
        tokio::time::timeout_at(deadline, rx.wait_for(|s| s.registered))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Prefill side. The returned future resolves once the decode has
    /// collected the transfer (it holds the room, which the collection
    /// removes from the map).
    pub fn mark_transferred(
        &self,
        room: u64,
        transfer: Transfer,
    ) -> impl Future<Output = ()> + Send + 'static {
        let tx = self.entry(room);
        let mut rx = tx.subscribe();
        tx.send_modify(|s| s.transferred = Some(transfer));
        async move {
            let _ = rx.wait_for(|s| s.collected).await;
        }
    }

    /// Decode side (via GET /wait): what the prefill left once it has
    /// transferred `room`. The room is then freed, single-consumer.
    pub async fn await_transferred(
        &self,
        room: u64,
        timeout: Duration,
    ) -> Result<Transfer, WaitError> {
        let tx = lock(&self.map)
            .get(&room)
            .cloned()
            .ok_or(WaitError::NotRegistered)?;
        if !tx.borrow().registered {
            return Err(WaitError::NotRegistered);
        }
        let mut rx = tx.subscribe();
        let transfer =
            match tokio::time::timeout(timeout, rx.wait_for(|s| s.transferred.is_some())).await {
                Ok(Ok(status)) => status.transferred.clone(),
                _ => return Err(WaitError::Timeout),
            };
        let Some(transfer) = transfer else {
            return Err(WaitError::Timeout);
        };
        lock(&self.map).remove(&room);
        tx.send_modify(|s| s.collected = true);
        Ok(transfer)
    }
}

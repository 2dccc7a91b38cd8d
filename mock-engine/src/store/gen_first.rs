//! TensorRT-LLM's generation-first rendezvous, as data: the context server
//! holds a `schedule_style: 1` context request until the generation server
//! asks for its KV (TensorRT-LLM's `DISAGG_CONTEXT_WAIT_SCHEDULER` state),
//! and the generation server waits for the context's KV. Each side waits
//! on the other, so both legs must be in flight at once: a router that
//! awaits the context answer before sending the generation leg leaves the
//! context waiting until its timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::lock;

struct Meeting<T> {
    /// The generation server asked for this context's KV.
    asked: bool,
    /// What the context left (`T`: the side channel's context entry), once
    /// it has run.
    ctx: Option<Arc<T>>,
}

impl<T> Default for Meeting<T> {
    fn default() -> Self {
        Meeting {
            asked: false,
            ctx: None,
        }
    }
}

/// Meetings by disagg request id.
pub struct GenFirst<T> {
    map: Mutex<HashMap<u64, Arc<watch::Sender<Meeting<T>>>>>,
}

impl<T> Default for GenFirst<T> {
    fn default() -> Self {
        GenFirst {
            map: Mutex::default(),
        }
    }
}

/// Why a generation server's ask took nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum AskMiss {
    /// Another generation request already asked for this id.
    Taken,
    /// The context never ran within the wait.
    Timeout,
}

impl<T> GenFirst<T> {
    fn entry(&self, id: u64) -> Arc<watch::Sender<Meeting<T>>> {
        lock(&self.map)
            .entry(id)
            .or_insert_with(|| Arc::new(watch::Sender::new(Meeting::default())))
            .clone()
    }

    /// Context side: waits until the generation server asked for `id`.
    pub async fn await_asked(&self, id: u64, deadline: Instant) -> bool {
        let tx = self.entry(id);
        let mut rx = tx.subscribe();
        let met = tokio::time::timeout_at(deadline, rx.wait_for(|m| m.asked))
            .await
            .is_ok_and(|r| r.is_ok());
        if !met {
            lock(&self.map).remove(&id);
        }
        met
    }

    /// Context side: the KV for `id` is ready. False when nobody waits for
    /// it any more (the generation gave up) or it was already left.
    pub fn leave(&self, id: u64, ctx: T) -> bool {
        let Some(tx) = lock(&self.map).get(&id).cloned() else {
            return false;
        };
        tx.send_if_modified(|m| {
            if m.ctx.is_some() {
                return false;
            }
            m.ctx = Some(Arc::new(ctx));
            true
        })
    }

    /// Generation side: asks for `id`'s KV and waits up to `wait` for the
    /// context to leave it; single-consumer.
    pub async fn ask(&self, id: u64, wait: Duration) -> Result<Arc<T>, AskMiss> {
        let tx = self.entry(id);
        let first = tx.send_if_modified(|m| !std::mem::replace(&mut m.asked, true));
        if !first {
            return Err(AskMiss::Taken);
        }
        let mut rx = tx.subscribe();
        let got = match tokio::time::timeout(wait, rx.wait_for(|m| m.ctx.is_some())).await {
            Ok(Ok(m)) => m.ctx.clone(),
            _ => None,
        };
        lock(&self.map).remove(&id);
        got.ok_or(AskMiss::Timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Vec<u64> {
        vec![1, 2]
    }

    #[tokio::test]
    async fn each_side_waits_for_the_other() {
        let g = Arc::new(GenFirst::default());
        let gen = {
            let g = Arc::clone(&g);
            tokio::spawn(async move { g.ask(7, Duration::from_secs(5)).await })
        };
        assert!(
            g.await_asked(7, Instant::now() + Duration::from_secs(5))
                .await
        );
        assert!(g.leave(7, ctx()));
        let got = gen.await.expect("joined").expect("the KV");
        assert_eq!(*got, vec![1, 2]);
        assert!(!g.leave(7, ctx()), "collected: nobody waits");
    }

    #[tokio::test]
    async fn a_context_alone_times_out_and_a_second_ask_is_refused() {
        let g = GenFirst::<()>::default();
        assert!(
            !g.await_asked(9, Instant::now() + Duration::from_millis(20))
                .await
        );
        let first = g.ask(3, Duration::from_millis(20));
        let second = g.ask(3, Duration::from_millis(20));
        let (a, b) = tokio::join!(first, second);
        assert_eq!(a.err(), Some(AskMiss::Timeout));
        assert_eq!(b.err(), Some(AskMiss::Taken));
    }
}

//! KV "offered" by one leg and taken by the other, keyed by a string, when
//! either may come first: vLLM Mooncake (the prefill offers under
//! engine id + transfer_id, the decode pulls), NIXL push (the prefill's
//! finished blocks wait for the decode's registration under the request id)
//! and P2P NCCL (the prefill puts the KV on the decode under the request id).
//!
//! Single consumer, as real KV blocks are freed once read. An offer that
//! nobody takes expires after `ttl` (the engines' lease on held blocks).
//! Plain data: the engines offer and take, the side channel and the zmq
//! listener serve it over HTTP.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::lock;

/// What the offering leg leaves for the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    /// Hash of the prompt the prefill computed (the decode compares).
    pub prompt_hash: String,
    /// P2P NCCL: the sender's ZMQ address as it said it (`ip:port`).
    pub sender: Option<String>,
}

pub struct Offers {
    ttl: Duration,
    map: Mutex<HashMap<String, (Instant, Kv)>>,
    /// Keys a consumer that must be the only one is waiting under (NIXL
    /// push registrations).
    registered: Mutex<HashSet<String>>,
    /// Bumped on every offer, so waiters look again.
    changed: watch::Sender<u64>,
}

impl Offers {
    pub fn new(ttl: Duration) -> Self {
        Offers {
            ttl,
            map: Mutex::new(HashMap::new()),
            registered: Mutex::new(HashSet::new()),
            changed: watch::Sender::new(0),
        }
    }

    /// Offers `kv` under `key`; false (and nothing changes) while an offer
    /// under that key is still waiting: two requests sharing a key would
    /// swap KV in a real deployment.
    pub fn offer(&self, key: String, kv: Kv) -> bool {
        let now = Instant::now();
        {
            let mut map = lock(&self.map);
            map.retain(|_, (at, _)| now.duration_since(*at) < self.ttl);
            if map.contains_key(&key) {
                return false;
            }
            map.insert(key, (now, kv));
        }
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        true
    }

    /// Registers the only consumer of `key` (vLLM NIXL push: a decode's
    /// registration of its blocks with the prefill, keyed by request id):
    /// `None` while another registration under `key` is in flight, since a
    /// real prefill would push one request's KV into the other's blocks.
    /// The key is free again when the returned guard drops.
    pub fn register(&self, key: &str) -> Option<Registration<'_>> {
        lock(&self.registered)
            .insert(key.to_owned())
            .then(|| Registration {
                offers: self,
                key: key.to_owned(),
            })
    }

    /// Takes the offer under `key`, or else the first whose key `alt`
    /// accepts, waiting for one until `timeout`.
    pub async fn take(
        &self,
        key: &str,
        alt: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Option<Kv> {
        let deadline = Instant::now() + timeout;
        // Subscribed before looking, so an offer made in between is seen.
        let mut rx = self.changed.subscribe();
        loop {
            {
                let mut map = lock(&self.map);
                let found = if map.contains_key(key) {
                    Some(key.to_string())
                } else {
                    map.keys().find(|k| alt(k)).cloned()
                };
                if let Some((_, kv)) = found.and_then(|k| map.remove(&k)) {
                    return Some(kv);
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                // Timed out (the sender lives as long as `self`).
                _ => return None,
            }
        }
    }
}

/// A consumer registered under a key (see [`Offers::register`]).
pub struct Registration<'a> {
    offers: &'a Offers,
    key: String,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        lock(&self.offers.registered).remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn kv(h: &str) -> Kv {
        Kv {
            prompt_hash: h.into(),
            sender: None,
        }
    }

    #[test]
    fn one_registration_per_key_at_a_time() {
        let o = Offers::new(Duration::from_secs(5));
        let first = o.register("r");
        assert!(first.is_some());
        assert!(
            o.register("r").is_none(),
            "a second one while the first waits"
        );
        assert!(o.register("s").is_some(), "other keys are free");
        drop(first);
        assert!(
            o.register("r").is_some(),
            "free again once the first is done"
        );
    }

    #[tokio::test]
    async fn offer_then_take_once() {
        let o = Offers::new(Duration::from_secs(60));
        assert!(o.offer("a".into(), kv("1")));
        assert!(!o.offer("a".into(), kv("2")), "a live key is refused");
        let none = |_: &str| false;
        assert_eq!(o.take("a", none, Duration::ZERO).await, Some(kv("1")));
        assert_eq!(o.take("a", none, Duration::from_millis(10)).await, None);
        assert!(o.offer("a".into(), kv("3")), "free again once taken");
    }

    #[tokio::test]
    async fn take_waits_for_a_later_offer() {
        let o = Arc::new(Offers::new(Duration::from_secs(60)));
        let o2 = o.clone();
        let waiter =
            tokio::spawn(async move { o2.take("k", |_| false, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(o.offer("other".into(), kv("x")));
        assert!(o.offer("k".into(), kv("y")));
        assert_eq!(waiter.await.unwrap(), Some(kv("y")));
    }

    #[tokio::test]
    async fn alt_matches_and_expiry() {
        let o = Offers::new(Duration::from_secs(60));
        assert!(o.offer("k-1a2b3c4d".into(), kv("s")));
        let got = o.take("k", |c| c.starts_with("k-"), Duration::ZERO).await;
        assert_eq!(got, Some(kv("s")));
        let o = Offers::new(Duration::ZERO);
        assert!(o.offer("a".into(), kv("1")));
        // Expired offers are dropped by the next offer.
        assert!(o.offer("a".into(), kv("2")));
    }
}

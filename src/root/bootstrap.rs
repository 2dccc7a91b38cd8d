//! Learning vLLM Mooncake prefill pods' engine ids: the lease holder asks
//! each pod's bootstrap server (`GET /query`) and shares the answers; every
//! VM copies them into its router each tick. The schedule and the shared
//! record are [`crate::mooncake::ids`].

use super::host::RootHost;
use crate::fleet::PodId;
use crate::host::Level;
use crate::mooncake::ids::{self as bootstrap, EngineIds, QuerySchedule};
use crate::pods::{cas_update, lease};
use crate::router::Router;
use crate::transfer::parse_query;
use std::collections::HashMap;

/// Renewed each tick (at most a second apart) by its holder.
const LEASE_MS: u64 = 3_000;

/// A `/query` answer is a few hundred bytes per rank.
const MAX_QUERY_BYTES: usize = 256 * 1024;

#[derive(Default)]
pub struct Bootstrap {
    schedule: QuerySchedule,
    /// Call token → the pod asked.
    calls: HashMap<u32, PodId>,
    /// The CAS of the shared ids last copied into the router.
    seen_cas: Option<u32>,
    /// Whether each pod's last ask worked, so a log line marks each change.
    last_ok: HashMap<PodId, bool>,
}

impl Bootstrap {
    pub fn owns(&self, token: u32) -> bool {
        self.calls.contains_key(&token)
    }

    /// Every VM: copies the shared ids into the router when they changed.
    pub fn refresh<H: RootHost>(&mut self, host: &H, router: &Router) {
        let (bytes, cas) = host.shared_get(&router.keys().mooncake_engines());
        if cas == self.seen_cas {
            return;
        }
        self.seen_cas = cas;
        router.set_mooncake_engines(bytes.map(|b| bootstrap::decode(&b)).unwrap_or_default());
    }

    /// Asks the pods that are due, if this VM holds the lease to.
    pub fn ask<H: RootHost>(&mut self, host: &mut H, router: &Router, vm_id: u64, now: u64) {
        let pods = router.mooncake_prefill_pods();
        if pods.is_empty()
            || !lease::try_hold(host, &router.keys().bootstrap_lease(), vm_id, now, LEASE_MS)
        {
            return;
        }
        let ids: Vec<PodId> = pods.iter().map(|p| p.id).collect();
        let known = router.mooncake_engines_known();
        let config = &router.config;
        for id in self.schedule.due(&ids, &known, now) {
            let Some(pod) = pods.iter().find(|p| p.id == id) else {
                continue;
            };
            let target = if pod.ip.contains(':') {
                format!("[{}]:{}", pod.ip, pod.bootstrap_port)
            } else {
                format!("{}:{}", pod.ip, pod.bootstrap_port)
            };
            let headers = [
                (":method", "GET"),
                (":path", "/query"),
                (":authority", target.as_str()),
                (config.routing.header.as_str(), target.as_str()),
            ];
            let timeout = config.scrape.timeout_ms.max(1);
            match host.dispatch(&config.scrape.cluster, &headers, timeout) {
                Ok(token) => {
                    self.calls.insert(token, id);
                }
                Err(e) => {
                    self.schedule.not_sent(id);
                    if router.first_time(id, "mooncake_query_dispatch") {
                        host.log(
                            Level::Warn,
                            &format!(
                                "pd-router: could not ask Mooncake bootstrap server {target} of pod {} through cluster {:?}: {}",
                                pod.name, config.scrape.cluster, e.status
                            ),
                        );
                    }
                }
            }
        }
    }

    /// A `/query` answer, or its failure.
    pub fn on_answer<H: RootHost>(
        &mut self,
        host: &mut H,
        router: &Router,
        token: u32,
        status: Option<u16>,
        body_size: usize,
    ) {
        let Some(id) = self.calls.remove(&token) else {
            return;
        };
        self.schedule.answered(id);
        let answer = match status {
            Some(200) => parse_query(&host.call_answer_body(body_size, MAX_QUERY_BYTES)),
            Some(s) => Err(format!("status {s}")),
            None => Err("no answer".to_owned()),
        };
        let prefills = router.mooncake_prefill_pods();
        let pods: Vec<PodId> = prefills.iter().map(|p| p.id).collect();
        let name = prefills
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.name.clone())
            .unwrap_or_default();
        self.report(host, id, &name, &answer);
        let key = router.keys().mooncake_engines();
        let written = cas_update(
            host,
            &key,
            |b| b.map(bootstrap::decode).unwrap_or_default(),
            bootstrap::encode,
            |ids: &mut EngineIds| {
                bootstrap::apply(ids, &pods, id, answer.clone());
            },
        );
        match written {
            Ok(ids) => router.set_mooncake_engines(ids),
            Err(e) => host.log(
                Level::Error,
                &format!("pd-router: could not share Mooncake engine ids: {e}"),
            ),
        }
    }

    /// One log line per change of a pod's state.
    fn report<H: RootHost>(
        &mut self,
        host: &H,
        id: PodId,
        name: &str,
        answer: &Result<Vec<String>, String>,
    ) {
        let ok = answer.is_ok();
        if self.last_ok.insert(id, ok) == Some(ok) {
            return;
        }
        match answer {
            Ok(engines) => host.log(
                Level::Info,
                &format!(
                    "pd-router: Mooncake prefill pod {name} serves engine ids {engines:?}; it takes prefills"
                ),
            ),
            Err(why) => host.log(
                Level::Warn,
                &format!(
                    "pd-router: Mooncake prefill pod {name}: bootstrap GET /query failed ({why}); no prefills go to it until it answers"
                ),
            ),
        }
    }
}

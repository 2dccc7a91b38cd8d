//! Learning what prefill pods say about themselves: vLLM Mooncake pods'
//! engine ids (`GET /query` on the bootstrap server) and TensorRT-LLM
//! generation-first context servers' `disaggregated_params` (`GET
//! /server_info`). The lease holder asks and shares the answers; every VM
//! copies them into its router each tick. The schedule and the shared
//! record are [`crate::mooncake::ids`].

use super::host::RootHost;
use crate::engine::parse_server_info;
use crate::fleet::PodId;
use crate::host::Level;
use crate::mooncake::ids::{self as bootstrap, EngineIds, QuerySchedule};
use crate::mooncake::{Ask, AskedPod};
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
        router.set_learned(bytes.map(|b| bootstrap::decode(&b)).unwrap_or_default());
    }

    /// Asks the pods that are due, if this VM holds the lease to.
    pub fn ask<H: RootHost>(&mut self, host: &mut H, router: &Router, vm_id: u64, now: u64) {
        let asked = router.asked_prefill_pods();
        if asked.is_empty()
            || !lease::try_hold(host, &router.keys().bootstrap_lease(), vm_id, now, LEASE_MS)
        {
            return;
        }
        let ids: Vec<PodId> = asked.iter().map(|p| p.pod.id).collect();
        let known = router.learned_known();
        let config = &router.config;
        for id in self.schedule.due(&ids, &known, now) {
            let Some(AskedPod { pod, ask }) = asked.iter().find(|p| p.pod.id == id) else {
                continue;
            };
            let (target, path) = match ask {
                Ask::MooncakeQuery if pod.ip.contains(':') => {
                    (format!("[{}]:{}", pod.ip, pod.bootstrap_port), "/query")
                }
                Ask::MooncakeQuery => (format!("{}:{}", pod.ip, pod.bootstrap_port), "/query"),
                Ask::TrtServerInfo => (pod.address.clone(), "/server_info"),
            };
            let headers = [
                (":method", "GET"),
                (":path", path),
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
                                "pd-router: could not ask {target}{path} of prefill pod {} through cluster {:?}: {}",
                                pod.name, config.scrape.cluster, e.status
                            ),
                        );
                    }
                }
            }
        }
    }

    /// A `/query` or `/server_info` answer, or its failure.
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
        let asked = router.asked_prefill_pods();
        let pods: Vec<PodId> = asked.iter().map(|p| p.pod.id).collect();
        let this = asked.iter().find(|p| p.pod.id == id);
        let ask = this.map_or(Ask::MooncakeQuery, |p| p.ask);
        let answer = match status {
            Some(200) => {
                let body = host.call_answer_body(body_size, MAX_QUERY_BYTES);
                match ask {
                    Ask::MooncakeQuery => parse_query(&body),
                    Ask::TrtServerInfo => parse_server_info(&body),
                }
            }
            Some(s) => Err(format!("status {s}")),
            None => Err("no answer".to_owned()),
        };
        let name = this.map(|p| p.pod.name.clone()).unwrap_or_default();
        self.report(host, id, &name, ask, &answer);
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
            Ok(ids) => router.set_learned(ids),
            Err(e) => host.log(
                Level::Error,
                &format!("pd-router: could not share what prefill pods said: {e}"),
            ),
        }
    }

    /// One log line per change of a pod's state.
    fn report<H: RootHost>(
        &mut self,
        host: &H,
        id: PodId,
        name: &str,
        ask: Ask,
        answer: &Result<Vec<String>, String>,
    ) {
        let ok = answer.is_ok();
        if self.last_ok.insert(id, ok) == Some(ok) {
            return;
        }
        match (ask, answer) {
            (Ask::TrtServerInfo, Ok(said)) => host.log(
                Level::Info,
                &format!(
                    "pd-router: TensorRT-LLM context server {name} says {}; it takes generation-first prefills",
                    said.first().map_or("", String::as_str)
                ),
            ),
            (Ask::TrtServerInfo, Err(why)) => host.log(
                Level::Warn,
                &format!(
                    "pd-router: TensorRT-LLM context server {name}: GET /server_info failed ({why}); no generation-first prefills go to it until it answers"
                ),
            ),
            (Ask::MooncakeQuery, Ok(engines)) => host.log(
                Level::Info,
                &format!(
                    "pd-router: Mooncake prefill pod {name} serves engine ids {engines:?}; it takes prefills"
                ),
            ),
            (Ask::MooncakeQuery, Err(why)) => host.log(
                Level::Warn,
                &format!(
                    "pd-router: Mooncake prefill pod {name}: bootstrap GET /query failed ({why}); no prefills go to it until it answers"
                ),
            ),
        }
    }
}

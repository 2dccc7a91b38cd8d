//! One LIST of pods, page by page: what to ask next, and what an answer
//! means. Pure: the shell sends the requests and hands the answers in.

use super::kube::{DiscoveredPod, KubeDiscovery, Skipped};
use super::pod::{read_page_as, Reader};
use crate::error::upstream_message;
use std::fmt;

/// More pages than this in one list is a server that never stops paging.
const MAX_PAGES: usize = 10_000;
/// A `continue` token that expired mid-list restarts the list this often.
const MAX_RESTARTS: u32 = 2;

/// Why a list did not produce a pod set. The kinds are what is logged once
/// per change of state; the message says more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFailure {
    /// No answer: reset, refused, timed out.
    Unreachable(String),
    /// 401: the token is missing, wrong or expired.
    Unauthorized(String),
    /// 403: the service account may not list pods there.
    Forbidden(String),
    /// 429: the API server asks to come back later.
    Throttled(String),
    /// Any other non-200 status.
    Status(u16, String),
    /// 200, but not a PodList.
    Unparsable(String),
    /// Pages kept coming, or expired continue tokens kept restarting it.
    Runaway(String),
}

impl ListFailure {
    /// A short name of the kind, for "state changed" log lines.
    pub fn kind(&self) -> &'static str {
        match self {
            ListFailure::Unreachable(_) => "unreachable",
            ListFailure::Unauthorized(_) => "unauthorized",
            ListFailure::Forbidden(_) => "forbidden",
            ListFailure::Throttled(_) => "throttled",
            ListFailure::Status(..) => "error status",
            ListFailure::Unparsable(_) => "unparsable answer",
            ListFailure::Runaway(_) => "runaway list",
        }
    }
}

impl fmt::Display for ListFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListFailure::Unreachable(m) => write!(f, "the API server did not answer: {m}"),
            ListFailure::Unauthorized(m) => write!(
                f,
                "401 Unauthorized ({m}): check the token in the VM environment variable named by discovery.kubernetes.token_env"
            ),
            ListFailure::Forbidden(m) => write!(
                f,
                "403 Forbidden ({m}): the service account's Role lacks a verb discovery uses (list and watch on pods, get on inferencepools, list on modeladapters: deploy/values/rbac.yaml)"
            ),
            ListFailure::Throttled(m) => write!(f, "429 Too Many Requests: {m}"),
            ListFailure::Status(s, m) => write!(f, "status {s}: {m}"),
            ListFailure::Unparsable(m) => write!(f, "the answer is unusable: {m}"),
            ListFailure::Runaway(m) => f.write_str(m),
        }
    }
}

/// What an answer other than a 200 means (`status` `None`: reset before
/// any header).
pub fn failure(status: Option<u16>, body: &[u8]) -> ListFailure {
    let message = || upstream_message(body);
    match status {
        None => ListFailure::Unreachable("connection reset".into()),
        Some(401) => ListFailure::Unauthorized(message()),
        Some(403) => ListFailure::Forbidden(message()),
        Some(429) => ListFailure::Throttled(message()),
        Some(504) => ListFailure::Unreachable("timed out".into()),
        Some(503) => {
            let m = message();
            // Envoy's own reply when it could not reach the API server.
            if m.starts_with("upstream connect error") || m.starts_with("no healthy upstream") {
                ListFailure::Unreachable(m)
            } else {
                ListFailure::Status(503, m)
            }
        }
        Some(s) => ListFailure::Status(s, message()),
    }
}

/// A complete list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listed {
    /// Sorted, so every VM builds the same fleet from the same list.
    pub pods: Vec<DiscoveredPod>,
    pub skipped: Vec<(String, Skipped)>,
    pub pages: usize,
    /// The list's `metadata.resourceVersion` (of its last page): where a
    /// watch continues it.
    pub resource_version: Option<String>,
}

/// What to do after an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Ask for this path next.
    Fetch(String),
    Done(Listed),
    Failed(ListFailure),
}

/// One list in progress.
#[derive(Debug, Clone)]
pub struct ListRun {
    listed: Listed,
    restarts: u32,
}

impl ListRun {
    /// Starts a list; returns the first page's path.
    pub fn start(cfg: &KubeDiscovery) -> (ListRun, String) {
        let run = ListRun {
            listed: Listed::default(),
            restarts: 0,
        };
        (run, cfg.list_path(None))
    }

    /// Takes one answer (`status` `None`: reset before any header).
    pub fn on_answer(&mut self, cfg: &KubeDiscovery, status: Option<u16>, body: &[u8]) -> Step {
        match status {
            Some(200) => self.on_page(cfg, body),
            Some(410) if self.restarts < MAX_RESTARTS => {
                // The continue token expired: a list stitched from two
                // snapshots could split a roleset, so start over.
                self.restarts += 1;
                self.listed = Listed::default();
                Step::Fetch(cfg.list_path(None))
            }
            Some(410) => Step::Failed(ListFailure::Runaway(
                "continue tokens kept expiring; the list restarted too often".into(),
            )),
            other => Step::Failed(failure(other, body)),
        }
    }

    fn on_page(&mut self, cfg: &KubeDiscovery, body: &[u8]) -> Step {
        let page = match read_page_as(body, &Reader::of(cfg)) {
            Ok(p) => p,
            Err(e) => return Step::Failed(ListFailure::Unparsable(e)),
        };
        self.listed.pages += 1;
        if page.resource_version.is_some() {
            self.listed.resource_version = page.resource_version;
        }
        self.listed.pods.extend(page.pods);
        self.listed.skipped.extend(page.skipped);
        match page.next {
            Some(_) if self.listed.pages >= MAX_PAGES => Step::Failed(ListFailure::Runaway(
                format!("more than {MAX_PAGES} pages; raise discovery.kubernetes.page_size"),
            )),
            Some(token) => Step::Fetch(cfg.list_path(Some(&token))),
            None => {
                let mut listed = std::mem::take(&mut self.listed);
                listed.pods.sort();
                // Two entries for one pod (a list that overlapped itself):
                // keep one.
                listed
                    .pods
                    .dedup_by(|a, b| a.name == b.name && a.address == b.address);
                Step::Done(listed)
            }
        }
    }
}

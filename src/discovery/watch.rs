//! Bounded watches: after one LIST, the pod set is kept current by watches
//! from the list's resourceVersion, each closed by the API server after
//! `timeoutSeconds` (a `dispatch_http_call` delivers only complete
//! answers, so a watch without an end would never be read). Each answer is
//! a stream of JSON lines, one event each (`ADDED`, `MODIFIED`, `DELETED`,
//! `BOOKMARK`, `ERROR`), applied in order. Pure: the shell sends the
//! requests and hands the answers in.

use super::kube::DiscoveredPod;
use super::lister::{failure, ListFailure, Listed};
use super::pod::{read_pod, Pod, Reader};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The pod set a watch keeps current, and where the next watch starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Watched {
    /// Routable endpoints by their pod's name (qualified by namespace when
    /// every namespace is watched): one, or one per InferencePool port. A
    /// plain list searched by name: a window brings few events, and a map
    /// type of its own would cost the module kilobytes it has not got
    /// (deploy/envoy ships it in a ConfigMap, under 1 MiB).
    pods: Vec<(String, Vec<DiscoveredPod>)>,
    resource_version: String,
}

/// What a watch answer means.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchOutcome {
    /// Its events are applied; watch again from the new resourceVersion.
    Applied { events: usize },
    /// The resourceVersion is too old (410, as an HTTP status or an ERROR
    /// event inside a 200): list again.
    Relist(String),
    /// Nothing applied; watch again from the same resourceVersion.
    Failed(ListFailure),
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// The `Status` an ERROR event carries.
#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

/// A BOOKMARK's object: the kind's fields empty but the resourceVersion.
#[derive(Deserialize)]
struct Bookmark {
    metadata: BookmarkMeta,
}

#[derive(Deserialize)]
struct BookmarkMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

/// An event read, before it is applied.
enum Change {
    Upsert(String, Vec<DiscoveredPod>),
    Delete(String),
}

impl Watched {
    /// The set a complete list gives, or `None` when the list carried no
    /// resourceVersion to watch from.
    pub fn from_list(listed: &Listed) -> Option<Watched> {
        let resource_version = listed.resource_version.clone()?;
        // Grouped by pod. A linear search (quadratic in the pods of one
        // list, a few milliseconds at thousands): a list is rare in watch
        // mode, and a sort or a map of its own would cost the module
        // kilobytes it has not got.
        let mut pods: Vec<(String, Vec<DiscoveredPod>)> = Vec::new();
        for p in &listed.pods {
            match pods.iter_mut().rev().find(|(name, _)| name == p.object()) {
                Some((_, endpoints)) => endpoints.push(p.clone()),
                None => pods.push((p.object().to_owned(), vec![p.clone()])),
            }
        }
        Some(Watched {
            pods,
            resource_version,
        })
    }

    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// The routable pods, sorted as a list's are.
    pub fn pods(&self) -> Vec<DiscoveredPod> {
        let mut pods: Vec<DiscoveredPod> = self
            .pods
            .iter()
            .flat_map(|(_, e)| e.iter().cloned())
            .collect();
        pods.sort();
        pods
    }

    /// Takes one watch answer (`status` `None`: reset before any header),
    /// reading its pods as `reader` says.
    pub fn on_answer(&mut self, status: Option<u16>, body: &[u8], reader: &Reader) -> WatchOutcome {
        match status {
            Some(200) => self.on_events(body, reader),
            Some(410) => WatchOutcome::Relist(format!(
                "410 Gone: {}",
                crate::error::upstream_message(body)
            )),
            other => WatchOutcome::Failed(failure(other, body)),
        }
    }

    /// Reads every event first and applies them only if all read: a body
    /// that is cut or garbled changes nothing, and the next watch from the
    /// same resourceVersion gets the same events again.
    fn on_events(&mut self, body: &[u8], reader: &Reader) -> WatchOutcome {
        let mut changes = Vec::new();
        let mut resource_version = None;
        for (i, line) in body.split(|b| *b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let event: Event = match serde_json::from_slice(line) {
                Ok(e) => e,
                Err(e) => return unparsable(i, &e.to_string()),
            };
            match event.kind.as_str() {
                "ERROR" => return error_event(event.object),
                // Only a resourceVersion: the object has no name.
                "BOOKMARK" => {
                    match serde_json::from_slice::<Bookmark>(event.object.get().as_bytes()) {
                        Ok(b) => resource_version = Some(b.metadata.resource_version),
                        Err(e) => return unparsable(i, &format!("BOOKMARK object: {e}")),
                    }
                    continue;
                }
                _ => {}
            }
            let pod: Pod = match serde_json::from_slice(event.object.get().as_bytes()) {
                Ok(p) => p,
                Err(e) => return unparsable(i, &format!("{} object: {e}", event.kind)),
            };
            if let Some(rv) = pod.resource_version() {
                resource_version = Some(rv.to_owned());
            }
            match event.kind.as_str() {
                "ADDED" | "MODIFIED" => {
                    let (name, read) = read_pod(&pod, reader);
                    changes.push(Change::Upsert(name, read.unwrap_or_default()));
                }
                "DELETED" => changes.push(Change::Delete(read_pod(&pod, reader).0)),
                other => return unparsable(i, &format!("unknown event type {other:?}")),
            }
        }
        let events = changes.len();
        for change in changes {
            match change {
                Change::Upsert(name, endpoints) if !endpoints.is_empty() => {
                    match self.pods.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, e)) => *e = endpoints,
                        None => self.pods.push((name, endpoints)),
                    }
                }
                Change::Upsert(name, _) | Change::Delete(name) => {
                    self.pods.retain(|(n, _)| *n != name);
                }
            }
        }
        if let Some(rv) = resource_version {
            self.resource_version = rv;
        }
        WatchOutcome::Applied { events }
    }
}

fn unparsable(line: usize, why: &str) -> WatchOutcome {
    WatchOutcome::Failed(ListFailure::Unparsable(format!(
        "watch event {}: {why}",
        line + 1
    )))
}

/// An ERROR event: 410 (reason Expired or Gone) means the resourceVersion
/// is older than the API server's history; anything else is a failure.
fn error_event(object: &RawValue) -> WatchOutcome {
    let status: Status = serde_json::from_slice(object.get().as_bytes()).unwrap_or(Status {
        code: 0,
        reason: String::new(),
        message: object.get().chars().take(200).collect(),
    });
    let said = format!("{} {}: {}", status.code, status.reason, status.message);
    if status.code == 410 {
        WatchOutcome::Relist(said)
    } else {
        WatchOutcome::Failed(ListFailure::Status(status.code, said))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::lister::{ListRun, Step};
    use crate::discovery::KubeDiscovery;

    fn plain() -> Reader {
        Reader::default()
    }
    use serde_json::{json, Value};

    fn cfg() -> KubeDiscovery {
        serde_json::from_value(json!({"cluster": "kube_api"})).expect("defaults")
    }

    fn pod(name: &str, ip: &str, rv: &str, ready: bool) -> Value {
        json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "llm", "resourceVersion": rv,
                         "labels": {"model.aibrix.ai/name": "m", "role-name": "decode"}},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        })
    }

    fn events(list: &[(&str, Value)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (kind, object) in list {
            out.extend(serde_json::to_vec(&json!({"type": kind, "object": object})).expect("json"));
            out.push(b'\n');
        }
        out
    }

    /// A list of `a` and `b` at resourceVersion 100, as a watch starts.
    fn listed() -> Watched {
        let c = cfg();
        let (mut run, _) = ListRun::start(&c);
        let mut a = pod("a", "10.0.0.1", "90", true);
        let mut b = pod("b", "10.0.0.2", "95", true);
        for p in [&mut a, &mut b] {
            p.as_object_mut().map(|o| o.remove("kind"));
        }
        let body = serde_json::to_vec(&json!({"kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "100"}, "items": [a, b]}))
        .expect("json");
        let Step::Done(listed) = run.on_answer(&c, Some(200), &body) else {
            panic!("one page")
        };
        assert_eq!(listed.resource_version.as_deref(), Some("100"));
        Watched::from_list(&listed).expect("a resourceVersion")
    }

    fn names(w: &Watched) -> Vec<(String, String)> {
        w.pods()
            .into_iter()
            .map(|p| (p.name, p.address.to_string()))
            .collect()
    }

    #[test]
    fn events_apply_in_order_and_move_the_resource_version() {
        let mut w = listed();
        let body = events(&[
            ("ADDED", pod("c", "10.0.0.3", "101", true)),
            // Re-created at a new address under its name.
            ("MODIFIED", pod("a", "10.0.0.9", "102", true)),
            // Turned unready: out of the set, though not deleted.
            ("MODIFIED", pod("b", "10.0.0.2", "103", false)),
            ("DELETED", pod("c", "10.0.0.3", "104", true)),
            (
                "BOOKMARK",
                json!({"kind": "Pod", "apiVersion": "v1",
                                "metadata": {"resourceVersion": "110"}}),
            ),
        ]);
        assert_eq!(
            w.on_answer(Some(200), &body, &plain()),
            WatchOutcome::Applied { events: 4 }
        );
        assert_eq!(names(&w), [("a".to_owned(), "10.0.0.9:8000".to_owned())]);
        assert_eq!(w.resource_version(), "110", "the bookmark's");
        // An empty window (no bookmark either) changes nothing.
        assert_eq!(
            w.on_answer(Some(200), b"", &plain()),
            WatchOutcome::Applied { events: 0 }
        );
        assert_eq!(w.resource_version(), "110");
    }

    #[test]
    fn an_expired_resource_version_asks_for_a_list() {
        let mut w = listed();
        let body = events(&[
            ("ADDED", pod("c", "10.0.0.3", "101", true)),
            (
                "ERROR",
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "too old resource version: 100 (150)",
                "reason": "Expired", "code": 410}),
            ),
        ]);
        let WatchOutcome::Relist(why) = w.on_answer(Some(200), &body, &plain()) else {
            panic!("relist")
        };
        assert!(why.contains("too old resource version"), "{why}");
        assert!(matches!(
            w.on_answer(
                Some(410),
                br#"{"kind":"Status","code":410,"reason":"Gone"}"#,
                &plain()
            ),
            WatchOutcome::Relist(_)
        ));
    }

    #[test]
    fn a_broken_answer_changes_nothing() {
        let mut w = listed();
        let before = w.clone();
        let mut body = events(&[("DELETED", pod("a", "10.0.0.1", "101", true))]);
        body.extend_from_slice(b"{\"type\":\"ADDED\",\"object\":{\"metadata\":");
        assert!(matches!(
            w.on_answer(Some(200), &body, &plain()),
            WatchOutcome::Failed(ListFailure::Unparsable(_))
        ));
        let other = events(&[(
            "ERROR",
            json!({"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd"}),
        )]);
        assert!(matches!(
            w.on_answer(Some(200), &other, &plain()),
            WatchOutcome::Failed(ListFailure::Status(500, _))
        ));
        assert!(matches!(
            w.on_answer(None, b"", &plain()),
            WatchOutcome::Failed(ListFailure::Unreachable(_))
        ));
        assert!(matches!(
            w.on_answer(Some(403), b"{}", &plain()),
            WatchOutcome::Failed(ListFailure::Forbidden(_))
        ));
        assert_eq!(w, before, "nothing applied, same resourceVersion");
    }

    #[test]
    fn names_carry_the_namespace_when_every_namespace_is_watched() {
        let mut w = listed();
        let body = events(&[("ADDED", pod("c", "10.0.0.3", "101", true))]);
        let qualified = Reader {
            qualify: true,
            ..Reader::default()
        };
        let _ = w.on_answer(Some(200), &body, &qualified);
        assert!(names(&w).iter().any(|(n, _)| n == "llm/c"));
    }
}

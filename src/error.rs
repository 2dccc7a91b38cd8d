//! Every error the filter can answer with, and the one place that turns an
//! error into an HTTP status and an OpenAI-style body.

use crate::body::{push_json_str, BodyError};
use std::fmt;

/// A request the client got wrong: always a 4xx.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    Body(BodyError),
    BadField {
        field: String,
        message: String,
    },
    DuplicateKey(String),
    /// A key the router writes for this engine (hand-off data) was supplied.
    RouterOwnedKey {
        key: String,
        engine: String,
    },
    UnknownModel(String),
    TooLarge {
        limit: usize,
    },
    MethodNotAllowed(String),
    /// The engine cannot serve this request shape disaggregated.
    Unsupported(String),
    /// `Prefer: if-available` asked for a decode pod holding the prompt's
    /// KV, and the router knows of none.
    NotCached(String),
}

/// Why a prefill leg failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefillFailure {
    /// The prefill rejected the request (4xx): the client's fault, relayed.
    Rejected { status: u16, message: String },
    /// Envoy could not connect to the prefill pod (its synthetic 503:
    /// refused, connect timeout, no healthy upstream).
    Unreachable(String),
    /// Envoy's own circuit breaker on the prefill cluster refused the call
    /// (`reset reason: overflow`): the gateway's limit, not the pod's doing.
    Overflow,
    /// The connection closed before any response header (`reset reason:
    /// connection termination`): what a pod that dies mid-request and a
    /// pooled keep-alive connection the pod closed as the call went out
    /// both look like.
    Terminated(String),
    /// The prefill answered 5xx.
    ServerError { status: u16, message: String },
    /// No answer within `prefill_timeout_ms`, or the prefill answered 504.
    Timeout,
    /// The connection was reset before any response header.
    Reset,
    /// The answer is not what the engine's contract says.
    BadAnswer(String),
    /// Envoy refused to send the call (unknown cluster, bad headers).
    Dispatch(String),
}

/// An engine handler's or KV agent's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// The engine cannot serve this request disaggregated (answered 400).
    Unsupported(String),
    /// The prefill answer breaks the engine's contract (answered 502).
    BadPrefillAnswer(String),
    /// The pod cannot take this hand-off yet (answered 503).
    NotReady(String),
    /// The router could not provide what the handler needed (answered 500).
    Internal(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Unsupported(m)
            | EngineError::BadPrefillAnswer(m)
            | EngineError::NotReady(m)
            | EngineError::Internal(m) => f.write_str(m),
        }
    }
}

impl From<EngineError> for PdError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Unsupported(m) => PdError::Client(ClientError::Unsupported(m)),
            EngineError::BadPrefillAnswer(m) => PdError::Prefill(PrefillFailure::BadAnswer(m)),
            EngineError::NotReady(m) => PdError::Unavailable(m),
            EngineError::Internal(m) => PdError::Internal(m),
        }
    }
}

/// A host call that failed: what was attempted and Envoy's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub status: String,
}

impl HostError {
    pub fn new(call: &'static str, status: impl fmt::Debug) -> HostError {
        HostError {
            call,
            status: format!("{status:?}"),
        }
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed ({})", self.call, self.status)
    }
}

impl From<HostError> for PdError {
    fn from(e: HostError) -> Self {
        PdError::Internal(e.to_string())
    }
}

/// Everything that ends a request with a local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PdError {
    Client(ClientError),
    NoEndpoint {
        model: String,
    },
    /// Pods are configured but none can take the request now.
    Unavailable(String),
    Prefill(PrefillFailure),
    /// An asynchronous prefill (its decode already sent) failed.
    ConcurrentPrefill(PrefillFailure),
    Internal(String),
    /// A request with media for an E/P/D model that has no encoder pod
    /// where it was placed, and whose prefill pod does not encode.
    NoEncoder {
        model: String,
    },
    /// An encoder leg failed: the prefill never left.
    Encoder {
        pod: String,
        failure: PrefillFailure,
    },
    /// Admission control did not let the request in (the model was
    /// saturated): 429 or 503, with `retry-after` in seconds.
    Dropped {
        why: Dropped,
        model: String,
        retry_after_s: u64,
    },
}

impl From<ClientError> for PdError {
    fn from(e: ClientError) -> Self {
        PdError::Client(e)
    }
}

impl From<BodyError> for PdError {
    fn from(e: BodyError) -> Self {
        PdError::Client(ClientError::Body(e))
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Body(e) => e.fmt(f),
            ClientError::BadField { field, message } => write!(f, "`{field}` {message}"),
            ClientError::DuplicateKey(k) => write!(
                f,
                "`{k}` appears more than once in the request body; send it once"
            ),
            ClientError::RouterOwnedKey { key, engine } => write!(
                f,
                "`{key}` is set by the router for {engine} prefill/decode disaggregation; remove it from the request"
            ),
            ClientError::UnknownModel(m) => {
                write!(f, "The model `{m}` does not exist or is not served by this router")
            }
            ClientError::TooLarge { limit } => {
                write!(f, "request body exceeds the router's limit of {limit} bytes")
            }
            ClientError::MethodNotAllowed(m) => {
                write!(f, "method {m} is not allowed here; use POST")
            }
            ClientError::Unsupported(m) | ClientError::NotCached(m) => f.write_str(m),
        }
    }
}

impl fmt::Display for PrefillFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefillFailure::Rejected { message, .. } => f.write_str(message),
            PrefillFailure::ServerError { status, message } if message.is_empty() => {
                write!(f, "prefill failed with status {status}")
            }
            PrefillFailure::ServerError { status, message } => {
                write!(f, "prefill failed with status {status}: {message}")
            }
            PrefillFailure::Unreachable(m) => write!(f, "prefill pod unreachable: {m}"),
            PrefillFailure::Overflow => f.write_str(
                "the gateway's own limit on concurrent prefill calls was reached (Envoy's circuit breaker on the prefill cluster); the pod is not at fault: retry later",
            ),
            PrefillFailure::Terminated(m) => {
                write!(f, "prefill connection closed before it answered: {m}")
            }
            PrefillFailure::Timeout => f.write_str("prefill timed out"),
            PrefillFailure::Reset => f.write_str("prefill connection was reset before it answered"),
            PrefillFailure::BadAnswer(m) => write!(f, "prefill answer is unusable: {m}"),
            PrefillFailure::Dispatch(m) => write!(f, "could not send the prefill request: {m}"),
        }
    }
}

impl fmt::Display for PdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PdError::Client(e) => e.fmt(f),
            PdError::NoEndpoint { model } => write!(
                f,
                "no prefill/decode endpoint pair is available for model `{model}`"
            ),
            PdError::Unavailable(m) => f.write_str(m),
            PdError::Prefill(e) => e.fmt(f),
            PdError::ConcurrentPrefill(PrefillFailure::Timeout) => {
                f.write_str("prefill failed with status 504 (timed out); the decode was abandoned")
            }
            PdError::ConcurrentPrefill(PrefillFailure::Reset) => {
                f.write_str("prefill failed (connection reset); the decode was abandoned")
            }
            PdError::ConcurrentPrefill(PrefillFailure::Rejected { status, message })
            | PdError::ConcurrentPrefill(PrefillFailure::ServerError { status, message }) => {
                write!(
                    f,
                    "prefill failed with status {status}; the decode was abandoned: {message}"
                )
            }
            PdError::ConcurrentPrefill(e) => write!(f, "{e}; the decode was abandoned"),
            PdError::Internal(m) => write!(f, "internal router error: {m}"),
            PdError::NoEncoder { model } => write!(
                f,
                "model `{model}` encodes media on encoder pods (ec_connector), and none serves the roleset this request was placed on; add `encode` pods to its rolesets, or send the request without media"
            ),
            PdError::Encoder { pod, failure } => {
                let what = failure.to_string();
                let what = what.strip_prefix("prefill ").unwrap_or(&what);
                write!(f, "encoder pod {pod} failed: {what}")
            }
            PdError::Dropped {
                why: Dropped::Shed,
                model,
                retry_after_s,
            } => write!(
                f,
                "model `{model}` is at capacity and this request's objective has a negative priority; retry after {retry_after_s} s"
            ),
            PdError::Dropped {
                why: Dropped::Expired,
                model,
                retry_after_s,
            } => write!(
                f,
                "model `{model}` stayed at capacity for as long as a request may wait (admission.queue_ttl_ms); retry after {retry_after_s} s"
            ),
            PdError::Dropped {
                why: Dropped::QueueFull,
                model,
                retry_after_s,
            } => write!(
                f,
                "model `{model}` is at capacity and the gateway's queue is full (admission.max_queued); retry after {retry_after_s} s"
            ),
        }
    }
}

/// A local reply: status and OpenAI-style JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// Headers besides `content-type` (a dropped request's reason and
    /// `retry-after`).
    pub headers: Vec<(&'static str, String)>,
}

impl PdError {
    /// HTTP status, OpenAI error `type` and machine-readable `code`.
    pub fn classify(&self) -> (u16, &'static str, &'static str) {
        use ClientError as C;
        use PrefillFailure as P;
        match self {
            PdError::Client(C::Body(_)) => (400, "invalid_request_error", "invalid_body"),
            PdError::Client(C::BadField { .. }) => (400, "invalid_request_error", "invalid_field"),
            PdError::Client(C::DuplicateKey(_)) => (400, "invalid_request_error", "duplicate_key"),
            PdError::Client(C::RouterOwnedKey { .. }) => {
                (400, "invalid_request_error", "router_owned_field")
            }
            PdError::Client(C::Unsupported(_)) => (400, "invalid_request_error", "unsupported"),
            PdError::Client(C::NotCached(_)) => {
                (412, "invalid_request_error", "kv_cache_unavailable")
            }
            PdError::Client(C::UnknownModel(_)) => {
                (404, "invalid_request_error", "model_not_found")
            }
            PdError::Client(C::MethodNotAllowed(_)) => {
                (405, "invalid_request_error", "method_not_allowed")
            }
            PdError::Client(C::TooLarge { .. }) => (413, "invalid_request_error", "body_too_large"),
            PdError::NoEndpoint { .. } => (503, "service_unavailable", "no_endpoint"),
            PdError::Unavailable(_) => (503, "service_unavailable", "no_healthy_endpoint"),
            PdError::Prefill(P::Rejected { status, .. }) => {
                (*status, "invalid_request_error", "prefill_rejected")
            }
            PdError::Prefill(P::Timeout) => (504, "upstream_error", "prefill_timeout"),
            PdError::Prefill(P::Overflow) | PdError::ConcurrentPrefill(P::Overflow) => {
                (503, "service_unavailable", "gateway_overloaded")
            }
            PdError::Prefill(_) => (502, "upstream_error", "prefill_failed"),
            PdError::ConcurrentPrefill(_) => (502, "upstream_error", "prefill_failed"),
            PdError::Internal(_) => (500, "internal_error", "internal_error"),
            PdError::NoEncoder { .. } => (503, "service_unavailable", "no_encoder"),
            PdError::Encoder { .. } => (502, "upstream_error", "encoder_failed"),
            PdError::Dropped { why, .. } => match why {
                Dropped::Shed => (429, "rate_limit_error", "model_saturated"),
                Dropped::Expired => (429, "rate_limit_error", "queue_timeout"),
                Dropped::QueueFull => (503, "service_unavailable", "queue_full"),
            },
        }
    }

    /// The local reply for this error.
    pub fn reply(&self) -> Reply {
        let (status, kind, code) = self.classify();
        let headers = match self {
            PdError::Dropped {
                why, retry_after_s, ..
            } => vec![
                (DROPPED_REASON_HEADER, why.reason().to_owned()),
                ("retry-after", retry_after_s.to_string()),
            ],
            // Envoy's breaker frees as calls end: a second is plenty.
            PdError::Prefill(PrefillFailure::Overflow)
            | PdError::ConcurrentPrefill(PrefillFailure::Overflow) => {
                vec![("retry-after", "1".to_owned())]
            }
            _ => Vec::new(),
        };
        Reply {
            status,
            body: error_body(&self.to_string(), kind, code),
            headers,
        }
    }
}

/// `{"error":{"message":..,"type":..,"param":null,"code":..}}`
pub fn error_body(message: &str, kind: &str, code: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 96);
    out.extend_from_slice(b"{\"error\":{\"message\":");
    push_json_str(&mut out, message);
    out.extend_from_slice(b",\"type\":");
    push_json_str(&mut out, kind);
    out.extend_from_slice(b",\"param\":null,\"code\":");
    push_json_str(&mut out, code);
    out.extend_from_slice(b"}}");
    out
}

/// What Envoy's own 503 for a call it could not complete says. Envoy
/// answers `upstream connect error or disconnect/reset before headers.
/// reset reason: <reason>` (observed in Envoy 1.40: `overflow` for its own
/// circuit breaker, with `x-envoy-overloaded: true`; `connection
/// termination` for a connection closed before any answer, FIN or RST
/// alike; `remote connection failure` for a refused connection, older
/// releases `connection failure, transport failure reason: ...`), or `no
/// healthy upstream`. Only the reason tells the gateway's own limit, and a
/// keep-alive race, from a pod that cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvoyFailure {
    /// The cluster's circuit breaker refused the call: it never left Envoy.
    Overflow,
    /// The connection closed before any response header: a pooled
    /// keep-alive connection the pod closed as the call went out, or a pod
    /// that died mid-request.
    Terminated,
    /// Refused, timed out connecting, or no host: the pod cannot be reached.
    Unreachable,
}

/// Envoy's failure in a 503's `message` (see [`upstream_message`]), or
/// `None` when the 503 is the upstream's own.
pub fn envoy_failure(message: &str) -> Option<EnvoyFailure> {
    if message.starts_with("no healthy upstream") {
        return Some(EnvoyFailure::Unreachable);
    }
    if !message.starts_with("upstream connect error") {
        return None;
    }
    let reason = message
        .split_once("reset reason: ")
        .map_or("", |(_, r)| r.split(',').next().unwrap_or(r).trim());
    Some(match reason {
        "overflow" => EnvoyFailure::Overflow,
        "connection termination" => EnvoyFailure::Terminated,
        _ => EnvoyFailure::Unreachable,
    })
}

/// The human message in an engine's error body: OpenAI's `error.message`,
/// vLLM's older top-level `message`, FastAPI's `detail`, or the raw text.
pub fn upstream_message(body: &[u8]) -> String {
    const MAX: usize = 1000;
    let from_json = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let pick = |v: &serde_json::Value| match v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Null => None,
                other => Some(other.to_string()),
            };
            v.get("error")
                .and_then(|e| {
                    e.get("message")
                        .and_then(pick)
                        .or_else(|| e.as_str().map(str::to_owned))
                })
                .or_else(|| v.get("message").and_then(pick))
                .or_else(|| v.get("detail").and_then(pick))
        });
    let mut msg = from_json.unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    if msg.len() > MAX {
        let mut cut = MAX;
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.truncate(cut);
        msg.push('…');
    }
    msg
}

/// Why a request was not admitted: the value of `x-pd-dropped-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// The model is saturated and the request's priority is negative (429).
    Shed,
    /// It waited `queue_ttl_ms` without a free pod (429).
    Expired,
    /// `max_queued` requests were already waiting (503).
    QueueFull,
}

impl Dropped {
    /// The `x-pd-dropped-reason` header value.
    pub fn reason(self) -> &'static str {
        match self {
            Dropped::Shed => "saturated",
            Dropped::Expired => "queue_ttl",
            Dropped::QueueFull => "queue_full",
        }
    }
}

/// The header naming why a request was dropped.
pub const DROPPED_REASON_HEADER: &str = "x-pd-dropped-reason";

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(e: &PdError) -> (u16, serde_json::Value) {
        let r = e.reply();
        (
            r.status,
            serde_json::from_slice(&r.body).expect("json body"),
        )
    }

    #[test]
    fn statuses_follow_the_contract() {
        let cases: Vec<(PdError, u16)> = vec![
            (BodyError::NotObject.into(), 400),
            (ClientError::UnknownModel("x".into()).into(), 404),
            (ClientError::TooLarge { limit: 10 }.into(), 413),
            (ClientError::MethodNotAllowed("GET".into()).into(), 405),
            (PdError::NoEndpoint { model: "m".into() }, 503),
            (
                PdError::Prefill(PrefillFailure::ServerError {
                    status: 500,
                    message: String::new(),
                }),
                502,
            ),
            (PdError::Prefill(PrefillFailure::Reset), 502),
            (PdError::Prefill(PrefillFailure::BadAnswer("x".into())), 502),
            (PdError::Prefill(PrefillFailure::Timeout), 504),
            (
                PdError::Prefill(PrefillFailure::Rejected {
                    status: 429,
                    message: "slow down".into(),
                }),
                429,
            ),
            (PdError::ConcurrentPrefill(PrefillFailure::Timeout), 502),
            (PdError::Internal("x".into()), 500),
        ];
        for (e, status) in cases {
            let (s, v) = parsed(&e);
            assert_eq!(s, status, "{e}");
            assert!(v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()));
            assert!(v["error"]["type"].is_string());
            assert!(v["error"]["code"].is_string());
        }
    }

    #[test]
    fn async_failures_name_the_prefill_status() {
        let e = PdError::ConcurrentPrefill(PrefillFailure::ServerError {
            status: 503,
            message: "overloaded".into(),
        });
        assert_eq!(
            e.to_string(),
            "prefill failed with status 503; the decode was abandoned: overloaded"
        );
    }

    #[test]
    fn upstream_messages_are_found_in_common_shapes() {
        assert_eq!(
            upstream_message(br#"{"error":{"message":"too long"}}"#),
            "too long"
        );
        assert_eq!(
            upstream_message(br#"{"object":"error","message":"bad"}"#),
            "bad"
        );
        assert_eq!(upstream_message(br#"{"detail":"nope"}"#), "nope");
        assert_eq!(upstream_message(b"  plain text \n"), "plain text");
        let long = "é".repeat(2000);
        assert!(upstream_message(long.as_bytes()).chars().count() <= 1001);
    }
}

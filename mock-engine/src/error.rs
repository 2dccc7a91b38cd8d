//! Failures a handler can answer with, rendered as OpenAI-style error bodies.

use axum::http::StatusCode;

/// A failed POST /v1/*. The message is the part after the
/// `mock <engine> <role>: ` prefix, which the dispatcher adds.
#[derive(Debug)]
pub struct Fail {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// The message is sent as it is, without the `mock <engine> <role>: `
    /// prefix: an engine's own error text that tests may match exactly.
    pub verbatim: bool,
}

impl Fail {
    /// The router broke the engine's contract: 422 so tests see it plainly.
    pub fn contract(message: impl Into<String>) -> Self {
        Fail::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "mock_contract_violation",
            message,
        )
    }

    /// The peer never did its part in time (as a real engine would time out).
    pub fn timeout(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::INTERNAL_SERVER_ERROR, "mock_timeout", message)
    }

    /// A KV transfer that failed at run time (peer unreachable, unknown
    /// engine, handshake refused): vLLM's `kv_load_failure_policy` "fail"
    /// ends such a request with an error, a 500.
    pub fn kv_load(message: impl Into<String>) -> Self {
        Fail::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "mock_kv_load_failure",
            message,
        )
    }

    /// What the real engine refuses as a bad request (400), not a PD break.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// The mock itself is misconfigured; never the router's fault.
    pub fn internal(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::INTERNAL_SERVER_ERROR, "mock_internal", message)
    }

    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Fail {
            status,
            kind,
            message: message.into(),
            verbatim: false,
        }
    }

    /// Sends the message without the mock's prefix.
    pub fn verbatim(mut self) -> Self {
        self.verbatim = true;
        self
    }
}

pub type Checked<T> = Result<T, Fail>;

/// `{"error":{"message":..,"type":..,"code":N}}` as OpenAI-compatible servers send.
pub fn error_body(status: StatusCode, kind: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "error": {"message": message, "type": kind, "code": status.as_u16()}
    })
}

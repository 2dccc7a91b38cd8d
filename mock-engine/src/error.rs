//! Failures a handler can answer with, rendered as OpenAI-style error bodies.

use axum::http::StatusCode;

/// A failed POST /v1/*. The message is the part after the
/// `mock <engine> <role>: ` prefix, which the dispatcher adds.
#[derive(Debug)]
pub struct Fail {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl Fail {
    /// The router broke the engine's contract: 422 so tests see it plainly.
    pub fn contract(message: impl Into<String>) -> Self {
        Fail {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            kind: "mock_contract_violation",
            message: message.into(),
        }
    }

    /// The peer never did its part in time (as a real engine would time out).
    pub fn timeout(message: impl Into<String>) -> Self {
        Fail {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "mock_timeout",
            message: message.into(),
        }
    }

    /// The mock itself is misconfigured; never the router's fault.
    pub fn internal(message: impl Into<String>) -> Self {
        Fail {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "mock_internal",
            message: message.into(),
        }
    }
}

pub type Checked<T> = Result<T, Fail>;

/// `{"error":{"message":..,"type":..,"code":N}}` as OpenAI-compatible servers send.
pub fn error_body(status: StatusCode, kind: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "error": {"message": message, "type": kind, "code": status.as_u16()}
    })
}

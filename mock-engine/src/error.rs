//! Failures a handler can answer with, rendered as OpenAI-style error bodies.

use axum::http::StatusCode;

/// A failed API POST. The message is the part after the
/// `mock <engine> <role>: ` prefix, which the dispatcher adds.
#[derive(Debug)]
pub struct Fail {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// The message is sent as it is, without the `mock <engine> <role>: `
    /// prefix: an engine's own error text that tests may match exactly.
    pub verbatim: bool,
    /// The request member at fault, as vLLM's `param` (`"model"`).
    pub param: Option<&'static str>,
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

    /// vLLM 0.34's `_check_model`: a model that is neither the served one
    /// nor one of its LoRA adapters. `served` names the model (its alias).
    pub fn unknown_model(named: &str, served: &str) -> Self {
        let mut fail = Fail::new(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The model `{named}` does not exist. Valid aliases: {served}."),
        )
        .verbatim();
        fail.param = Some("model");
        fail
    }

    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Fail {
            status,
            kind,
            message: message.into(),
            verbatim: false,
            param: None,
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
    ErrorShape::OpenAi.body(status, kind, message, None)
}

/// How a path writes its error answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"error":{"message","type","code"[,"param"]}}`: OpenAI's, vLLM's.
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`: Anthropic's, which
    /// vLLM's and SGLang's `/v1/messages` translate every error into.
    Anthropic,
}

impl ErrorShape {
    pub fn body(
        self,
        status: StatusCode,
        kind: &str,
        message: &str,
        param: Option<&str>,
    ) -> serde_json::Value {
        match self {
            ErrorShape::OpenAi => {
                let mut error = serde_json::json!(
                    {"message": message, "type": kind, "code": status.as_u16()}
                );
                if let (Some(param), Some(e)) = (param, error.as_object_mut()) {
                    e.insert("param".into(), param.into());
                }
                serde_json::json!({ "error": error })
            }
            ErrorShape::Anthropic => serde_json::json!({
                "type": "error",
                "error": {"type": anthropic_type(status, kind), "message": message},
            }),
        }
    }
}

/// Anthropic's `error.type`: the mock's own kinds (`mock_...`) stay, so a
/// test still tells a contract break from an engine error; an engine's
/// error is named by its status as vLLM's `translate_error_type` does.
fn anthropic_type(status: StatusCode, kind: &str) -> &str {
    if kind.starts_with("mock_") {
        return kind;
    }
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_as_vllm_and_anthropic_write_it() {
        let f = Fail::unknown_model("x", "m");
        let body = ErrorShape::OpenAi.body(f.status, f.kind, &f.message, f.param);
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "The model `x` does not exist. Valid aliases: m.",
                "type": "NotFoundError", "param": "model", "code": 404}})
        );
        let body = ErrorShape::Anthropic.body(f.status, f.kind, &f.message, f.param);
        assert_eq!(
            body,
            serde_json::json!({"type": "error", "error": {"type": "not_found_error",
                "message": "The model `x` does not exist. Valid aliases: m."}})
        );
        let c = Fail::contract("no");
        let body = ErrorShape::Anthropic.body(c.status, c.kind, "no", None);
        assert_eq!(body["error"]["type"], "mock_contract_violation");
        let body = ErrorShape::Anthropic.body(StatusCode::BAD_GATEWAY, "x", "no", None);
        assert_eq!(body["error"]["type"], "api_error");
    }
}

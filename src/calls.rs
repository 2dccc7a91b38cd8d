//! What a request is, from its method and path: a call the router splits,
//! the gateway's model list, a call that names its model in its body
//! (embeddings, tokenize, score, audio, ...), or one it passes through; and
//! which model such a body names.

use crate::api::{percent_decode, Api};
use crate::body::Members;
use crate::error::ClientError;
use crate::multipart;

/// How the router handles a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A path the router splits (any method: only POST is served).
    Split(Api),
    /// `GET /v1/models`: answered by the gateway.
    ListModels,
    /// `GET /v1/models/{id}`: answered by the gateway.
    ShowModel(String),
    /// Any other POST with a body: routed by the model it names.
    ByModel,
    /// Another method with a body: to a decode pod of any model, once the
    /// body is read and holds no hand-off field the router owns.
    PassThroughBody,
    /// Everything else without a body (`/health`, `/metrics`, a POST
    /// without a body): to a decode pod of any model, not buffered.
    PassThrough,
}

/// How an engine reads a body it is sent whole, by its `content-type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyKind {
    /// A multipart form with this boundary.
    Form(String),
    /// JSON: `application/json`, a `+json` type, or no `content-type` at
    /// all (FastAPI, which vLLM and SGLang serve with, parses a body
    /// without one as JSON).
    Json,
    /// Anything else: the engines' JSON APIs do not parse it as JSON.
    Other,
}

impl BodyKind {
    /// The kind a `content-type` header value (or its absence) declares.
    pub fn of(content_type: Option<&str>) -> BodyKind {
        let Some(t) = content_type else {
            return BodyKind::Json;
        };
        if let Some(b) = multipart::boundary(t) {
            return BodyKind::Form(b.to_owned());
        }
        let media = t.split(';').next().unwrap_or(t).trim().to_ascii_lowercase();
        let subtype = media.split_once('/').map_or("", |(_, s)| s);
        if media.is_empty() || subtype == "json" || subtype.ends_with("+json") {
            BodyKind::Json
        } else {
            BodyKind::Other
        }
    }

    /// The multipart boundary, for a form.
    pub fn boundary(&self) -> Option<&str> {
        match self {
            BodyKind::Form(b) => Some(b),
            _ => None,
        }
    }
}

const MODELS: &str = "/v1/models";

impl Call {
    /// The call `method` on `path` makes; `has_body`: the headers did not
    /// end the stream.
    pub fn of(method: &[u8], path: &str, has_body: bool) -> Call {
        if let Some(api) = Api::from_path(path) {
            return Call::Split(api);
        }
        let path = path.split(['?', '#']).next().unwrap_or(path);
        match method {
            b"GET" if path == MODELS || path == "/v1/models/" => Call::ListModels,
            b"GET" => match path.strip_prefix("/v1/models/") {
                Some(id) => Call::ShowModel(percent_decode(id)),
                None => Call::PassThrough,
            },
            b"POST" if has_body => Call::ByModel,
            _ if has_body => Call::PassThroughBody,
            _ => Call::PassThrough,
        }
    }
}

/// The model a body names: the `model` member of a JSON object, or the
/// `model` field of a multipart form delimited by `boundary`. `None`
/// when it names none or the body is neither: such a call keeps the
/// router's choice for calls without a model. A body naming the model
/// twice (two JSON `model` members, two `model` form fields) is refused:
/// the router and the engine could each read a different one.
pub fn model_named(body: &[u8], boundary: Option<&str>) -> Result<Option<String>, ClientError> {
    if let Some(b) = boundary {
        let named = multipart::fields(body, b, "model", 2);
        if named.len() > 1 {
            return Err(ClientError::DuplicateKey("model".into()));
        }
        let value = named
            .first()
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::trim)
            .filter(|v| !v.is_empty());
        return Ok(value.map(str::to_owned));
    }
    let starts_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if !starts_object {
        return Ok(None);
    }
    let Ok(top) = Members::parse(body) else {
        return Ok(None);
    };
    if top.first_duplicate(&["model"]).is_some() {
        return Err(ClientError::DuplicateKey("model".into()));
    }
    Ok(top
        .raw_non_null(body, "model")
        .and_then(|raw| serde_json::from_slice::<String>(raw).ok())
        .filter(|m| !m.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_by_method_and_path() {
        assert_eq!(
            Call::of(b"POST", "/v1/messages", true),
            Call::Split(Api::Messages)
        );
        assert_eq!(
            Call::of(b"GET", "/v1/chat/completions", false),
            Call::Split(Api::ChatCompletions),
            "the flow refuses the method"
        );
        assert_eq!(Call::of(b"GET", "/v1/models?x=1", false), Call::ListModels);
        assert_eq!(
            Call::of(b"GET", "/v1/models/Qwen%2FQwen3-8B", false),
            Call::ShowModel("Qwen/Qwen3-8B".into())
        );
        assert_eq!(
            Call::of(b"GET", "/v1/models/org/m", false),
            Call::ShowModel("org/m".into())
        );
        assert_eq!(Call::of(b"POST", "/v1/models", true), Call::ByModel);
        assert_eq!(Call::of(b"POST", "/v1/embeddings", true), Call::ByModel);
        assert_eq!(Call::of(b"POST", "/tokenize", false), Call::PassThrough);
        assert_eq!(Call::of(b"GET", "/health", false), Call::PassThrough);
        assert_eq!(Call::of(b"PUT", "/x", true), Call::PassThroughBody);
        assert_eq!(
            Call::of(b"POST", "/V1/Chat//Completions%2F", true),
            Call::Split(Api::ChatCompletions)
        );
    }

    #[test]
    fn body_kinds_by_content_type() {
        assert_eq!(BodyKind::of(None), BodyKind::Json);
        assert_eq!(
            BodyKind::of(Some("Application/JSON; charset=utf-8")),
            BodyKind::Json
        );
        assert_eq!(
            BodyKind::of(Some("application/merge-patch+json")),
            BodyKind::Json
        );
        assert_eq!(BodyKind::of(Some("text/plain")), BodyKind::Other);
        assert_eq!(
            BodyKind::of(Some("multipart/form-data; boundary=xy")),
            BodyKind::Form("xy".into())
        );
        assert_eq!(BodyKind::of(Some("multipart/form-data")), BodyKind::Other);
    }

    #[test]
    fn the_model_of_json_and_multipart_bodies() {
        let json = |b: &str| model_named(b.as_bytes(), None);
        assert_eq!(json(r#" {"input":"x","model":"m"}"#), Ok(Some("m".into())));
        assert_eq!(json(r#"{"input":"x"}"#), Ok(None));
        assert_eq!(json(r#"{"model":7}"#), Ok(None), "the engine refuses it");
        assert_eq!(json(r#"{"model":""}"#), Ok(None));
        assert_eq!(json("[1]"), Ok(None));
        assert_eq!(json("{not json"), Ok(None));
        assert_eq!(
            json(r#"{"model":"a","model":"b"}"#),
            Err(ClientError::DuplicateKey("model".into()))
        );
        let form =
            b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n whisper \r\n--b--";
        assert_eq!(model_named(form, Some("b")), Ok(Some("whisper".into())));
        assert_eq!(model_named(form, Some("c")), Ok(None));
        let twice = b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\na\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nb\r\n--b--";
        assert_eq!(
            model_named(twice, Some("b")),
            Err(ClientError::DuplicateKey("model".into())),
            "the engine may read the other one"
        );
    }
}

//! Why a body could not be read as a JSON object.

use std::fmt;

/// Why a body could not be read as a JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// The bytes are not UTF-8 (JSON text must be).
    NotUtf8,
    /// The body is empty or only whitespace.
    Empty,
    /// Valid or not, the top level is not an object.
    NotObject,
    /// The JSON is malformed; the text is serde_json's, with line and column.
    Invalid(String),
}

impl BodyError {
    /// The message, about `subject` ("request body", "the answer", ...).
    pub fn describe(&self, subject: &str) -> String {
        match self {
            BodyError::NotUtf8 => format!("{subject} is not valid UTF-8"),
            BodyError::Empty => format!("{subject} is empty; expected a JSON object"),
            BodyError::NotObject => format!("{subject} must be a JSON object"),
            BodyError::Invalid(e) => format!("{subject} is not valid JSON: {e}"),
        }
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe("request body"))
    }
}

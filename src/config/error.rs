//! A configuration error: the JSON path of the field and what is wrong.

use std::fmt;

/// A configuration error: the JSON path of the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() || self.path == "." {
            write!(f, "pd-router configuration: {}", self.message)
        } else {
            write!(
                f,
                "pd-router configuration: {}: {}",
                self.path, self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
}

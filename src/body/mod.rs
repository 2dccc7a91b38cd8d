//! Top-level editing of a JSON object without touching the bytes the router
//! does not own.
//!
//! Engines cache KV by prompt tokens, and the tokens come from the exact text of
//! `messages`, `tools` and `prompt`. Re-serialising a body reorders keys, changes
//! whitespace and rounds integers above 2^53, all of which break prefix-cache hits
//! or corrupt ids. So a body is parsed once into the byte spans of its top-level
//! members, and a new body is produced by splicing: kept members are copied
//! verbatim, edited members get a new value in place, new members are appended
//! (or, for a decode body whose long tail no edit touches, put in front, so
//! Envoy keeps that tail in its own buffer: [`Members::splice_with`]).

mod blocks;
mod edits;
mod error;
mod key;
mod members;
mod scan;
mod splice;

pub use edits::{json_string, push_json_str, Edit, Edits};
pub use error::BodyError;
pub use members::Members;
pub use splice::{LegBody, SourceMismatch};

#[cfg(test)]
mod tests;

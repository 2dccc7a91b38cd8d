//! pd-router: prefill/decode disaggregation routing for LLM inference engines,
//! as an Envoy proxy-wasm filter.
//!
//! Layers: pure modules ([`body`], [`api`], [`config`], [`engine`],
//! [`transfer`], [`trt_id`], [`select`], [`error`]) compute; [`flow`] decides,
//! per request, against the [`host::Host`] trait; the `shell` (wasm only) is
//! the one place that talks to Envoy.

pub mod api;
pub mod body;
pub mod config;
pub mod engine;
pub mod error;
pub mod flow;
pub mod host;
pub mod metrics;
pub mod sched;
pub mod scrape;
pub mod select;
pub mod transfer;
pub mod trt_id;

#[cfg(target_arch = "wasm32")]
mod shell;

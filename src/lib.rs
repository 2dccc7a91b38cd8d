//! pd-router: prefill/decode disaggregation routing for LLM inference engines,
//! as an Envoy proxy-wasm filter.
//!
//! Layers, leaves first: [`fleet`] (the shared vocabulary: pods, rolesets,
//! models, connector and policy names), [`codec`] and [`body`] (bytes);
//! pure modules that compute ([`api`], [`config`], [`engine`], [`transfer`],
//! [`sched`], [`pods`], [`metrics`], [`scrape`], [`trt_id`], [`router::unsplit`],
//! [`error`]); [`split`], the one plan every test, fuzzer and bench runs;
//! [`router`], the per-VM state; [`flow`], which decides per request against
//! the [`host::Host`] trait; and the `shell` (wasm only), the one place that
//! talks to Envoy.

pub mod answer;
pub mod api;
pub mod body;
pub mod codec;
pub mod config;
pub mod discovery;
pub mod engine;
pub mod error;
pub mod fleet;
pub mod flow;
pub mod handoff;
pub mod host;
pub mod hostwire;
pub mod inline_str;
pub mod metrics;
pub mod pods;
pub mod root;
pub mod router;
pub mod sched;
pub mod scrape;
pub mod split;
pub mod stat_names;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transfer;
pub mod trt_id;

#[cfg(target_arch = "wasm32")]
mod shell;

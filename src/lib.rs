//! pd-router: prefill/decode disaggregation routing for LLM inference engines,
//! as an Envoy proxy-wasm filter.
//!
//! Layers, leaves first (docs/architecture.md draws them):
//! - vocabulary and bytes: [`fleet`] (pods, rolesets, models, engine kinds,
//!   connector and policy names), [`codec`], [`body`], [`hostwire`];
//! - pure modules that compute: [`api`], [`config`], [`engine`] and
//!   [`transfer`] (the hand-offs, with [`handoff`] their shared words),
//!   [`reconcile`] (the client's response as one engine would give it),
//!   [`sched`], [`pods`], [`scrape`], [`discovery`], [`trt_id`], [`error`];
//! - [`split`]: read, build and merge, the steps every test, fuzzer and
//!   bench runs;
//! - [`router`]: the per-VM state, which places requests;
//! - [`flow`] (per request, against [`host::Host`]) and [`root`] (per VM,
//!   against [`root::RootHost`]);
//! - the `shell` (wasm only), the one place that talks to Envoy.

pub mod admission;
pub mod api;
pub mod body;
pub mod calls;
pub mod catalog;
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
pub mod load;
pub mod mooncake;
pub mod multipart;
pub mod pods;
pub mod reconcile;
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

//! pd-router: prefill/decode disaggregation routing for LLM inference engines,
//! as an Envoy proxy-wasm filter.
//!
//! Layers, lowest first (docs/architecture.md draws them; tests/layout.rs
//! holds them):
//! - words and bytes: [`fleet`] (pods, rolesets, models, engine kinds,
//!   connector and policy names), [`codec`], [`body`], [`api`], [`error`],
//!   [`hostwire`] and the other leaves;
//! - state the VMs share: [`pods`] (keys, slots, leases, scraped metrics),
//!   [`load`] (load and health), [`scrape`];
//! - pure features, each with its state, logic and tests: [`sched`],
//!   [`admission`], [`mooncake`], [`discovery`], [`engine`] and
//!   [`transfer`] (the hand-offs, with [`handoff`] their shared words),
//!   [`reconcile`] (the client's response as one engine would give it),
//!   [`config`];
//! - [`split`]: read, build and merge, the steps every test, fuzzer and
//!   bench runs, and [`host`], what the flow needs of Envoy;
//! - [`router`]: the VM's state and the parts it owns, which places requests;
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
pub mod encoder;
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
pub mod reuse;
pub mod root;
pub mod router;
pub mod sched;
pub mod scrape;
pub mod session;
pub mod split;
pub mod stat_names;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;
pub mod transfer;
pub mod trt_id;

#[cfg(target_arch = "wasm32")]
mod shell;

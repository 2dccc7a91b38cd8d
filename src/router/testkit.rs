//! What the router's tests and its features' tests build a router and
//! its requests with.

use super::Router;
use crate::api::Api;
use crate::config::Config;
use crate::error::PdError;
use crate::fleet::PodId;
use crate::pods::MemoryStore;
use crate::split::{self, Placement, SplitRequest};

pub(crate) fn router(json: &str) -> Router {
    Router::new(Config::parse(json.as_bytes()).expect("config"), 0).expect("router")
}

pub(crate) fn request(r: &Router, model: &str, prompt: &str) -> SplitRequest {
    let body = format!(r#"{{"model":"{model}","prompt":"{prompt}"}}"#).into_bytes();
    let fleet = r.fleet();
    split::read(&r.view(&fleet, &r.learned()), Api::Completions, "r", body).expect("read")
}

pub(crate) fn place(
    r: &Router,
    store: &mut MemoryStore,
    req: &SplitRequest,
    exclude: &[PodId],
) -> Result<Placement, PdError> {
    let mut draw = 0u64;
    let mut random = |_: &mut MemoryStore| {
        draw += 1;
        draw
    };
    r.place(store, req, exclude, &mut random, 1_000)
}

pub(crate) fn prefill_of(p: &Placement) -> String {
    match p {
        Placement::Split { prefill, .. } => prefill.address.clone(),
        Placement::Combined { pod, .. } => format!("combined {}", pod.address),
        Placement::Unsplit { pod, .. } => format!("unsplit {}", pod.address),
    }
}

/// A vLLM pod of model `m` as discovery reports it, at `ip`:8000.
pub(crate) fn discovered_pod(
    name: &str,
    ip: &str,
    role: crate::discovery::PodRole,
) -> crate::discovery::DiscoveredPod {
    crate::discovery::DiscoveredPod {
        model: "m".into(),
        name: name.into(),
        address: format!("{ip}:8000").parse().expect("addr"),
        engine: "vllm".into(),
        role,
        roleset: String::new(),
        kv_connector: None,
        bootstrap_port: 8998,
        dp_size: 1,
        kv_port: 14579,
        nixl_push: None,
        object: String::new(),
    }
}

/// Model `m` on prefill pods p0, p1 and decode pods d0, d1, with the
/// discovered `adapters`, each loaded on the pods it names.
pub(crate) fn adapter_fleet(r: &Router, adapters: &[(&str, &[&str])]) {
    use crate::discovery::{build_fleet, DiscoveredAdapter, PodRole};
    let pod = discovered_pod;
    let pods = [
        pod("p0", "10.0.0.1", PodRole::Prefill),
        pod("p1", "10.0.0.2", PodRole::Prefill),
        pod("d0", "10.0.1.1", PodRole::Decode),
        pod("d1", "10.0.1.2", PodRole::Decode),
    ];
    let adapters: Vec<DiscoveredAdapter> = adapters
        .iter()
        .map(|(name, instances)| DiscoveredAdapter {
            name: (*name).into(),
            base: Some("m".into()),
            instances: instances.iter().map(|i| i.to_string()).collect(),
        })
        .collect();
    r.set_fleet(build_fleet(&r.config.models, &pods, &adapters).0);
}

/// Model `m`: two vLLM prefill pods and one decode pod.
pub(crate) const TWO_PREFILLS: &str = r#"{"models":[{"name":"m","engine":"vllm","rolesets":[
    {"prefill":["10.0.0.1:1","10.0.0.2:1"],"decode":["10.0.1.1:1"]}]}]}"#;

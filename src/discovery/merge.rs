//! The fleet from the configuration's models and the discovered pods.
//!
//! A discovered pod joins the configured model of its name, whose policies
//! and static pods it keeps; a model only discovery knows gets the engine of
//! its pods and the default policies. Pods pair within their roleset;
//! prefill or decode pods that name no roleset pair with each other (a
//! Deployment per role has no roleset label, and pairing them is what such
//! a deployment means; AIBrix would skip them). Pods without a role serve
//! both phases, as combined pods.

use super::kube::{DiscoveredPod, PodRole};
use crate::fleet::{
    Connector, DecodePolicy, Endpoint, Fleet, Model, ModelSettings, PrefillPolicy, RolesetPods,
    DEFAULT_BYTES_PER_TOKEN,
};
use std::collections::BTreeMap;

/// The roleset of discovered pods that name none.
pub const UNNAMED_ROLESET: &str = "default";

/// A discovered pod left out of the fleet, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unused {
    pub pod: String,
    pub why: String,
}

/// Builds the fleet; also returns the pods it could not use.
pub fn build_fleet(configured: &[Model], pods: &[DiscoveredPod]) -> (Fleet, Vec<Unused>) {
    let mut by_model: BTreeMap<&str, Vec<&DiscoveredPod>> = BTreeMap::new();
    for p in pods {
        by_model.entry(p.model.as_str()).or_default().push(p);
    }
    let mut unused = Vec::new();
    let mut models = Vec::with_capacity(configured.len() + by_model.len());
    for m in configured {
        let found = by_model.remove(m.name.as_str()).unwrap_or_default();
        models.push(with_pods(m, &found, &mut unused));
    }
    for (name, found) in by_model {
        let Some(first) = found.first() else { continue };
        let base = Model::new(
            ModelSettings {
                name: name.to_owned(),
                engine: first.engine.clone(),
                kv_connector: None,
                prefill_policy: PrefillPolicy::default(),
                decode_policy: DecodePolicy::default(),
                trt_token_ids_b64: false,
                decider: None,
                bytes_per_token: DEFAULT_BYTES_PER_TOKEN,
                adapters: Vec::new(),
            },
            Vec::new(),
            Vec::new(),
        );
        models.push(with_pods(&base, &found, &mut unused));
    }
    (Fleet::new(models), unused)
}

fn endpoint(p: &DiscoveredPod, unused: &mut Vec<Unused>) -> Endpoint {
    let mut e = Endpoint::new(p.address, Some(p.name.clone()));
    e.bootstrap_port = p.bootstrap_port;
    e.dp_size = p.dp_size;
    e.kv_port = p.kv_port;
    e.nixl_push = p.nixl_push.clone();
    e.kv_connector = match p.kv_connector.as_deref() {
        None | Some("") => None,
        Some(name) => {
            let c = Connector::from_name(name);
            if c.is_none() {
                unused.push(Unused {
                    pod: p.name.clone(),
                    why: format!(
                        "kv-connector-type {name:?} is not supported (known: {}); the model's connector is used",
                        Connector::NAMES.join(", ")
                    ),
                });
            }
            c
        }
    };
    e
}

/// `model` (its settings and static pods) with `found` added.
fn with_pods(model: &Model, found: &[&DiscoveredPod], unused: &mut Vec<Unused>) -> Model {
    let static_pods = |list: &[std::rc::Rc<Endpoint>]| -> Vec<Endpoint> {
        list.iter().map(|e| (**e).clone()).collect()
    };
    let mut rolesets: Vec<RolesetPods> = model
        .rolesets
        .iter()
        .map(|r| RolesetPods {
            name: r.name.clone(),
            prefill: static_pods(&r.prefill),
            decode: static_pods(&r.decode),
            prompt_tokens: r.prompt_tokens,
        })
        .collect();
    let mut combined = static_pods(&model.combined);
    let mut discovered: BTreeMap<&str, RolesetPods> = BTreeMap::new();
    for p in found {
        if p.engine != model.engine {
            unused.push(Unused {
                pod: p.name.clone(),
                why: format!(
                    "engine {:?} differs from model {:?}'s {:?}",
                    p.engine, model.name, model.engine
                ),
            });
            continue;
        }
        let e = endpoint(p, unused);
        let roleset = if p.roleset.is_empty() {
            UNNAMED_ROLESET
        } else {
            p.roleset.as_str()
        };
        let slot = discovered.entry(roleset).or_insert_with(|| RolesetPods {
            name: roleset.to_owned(),
            ..RolesetPods::default()
        });
        match p.role {
            PodRole::Prefill => slot.prefill.push(e),
            PodRole::Decode => slot.decode.push(e),
            PodRole::Both => combined.push(e),
        }
    }
    rolesets.extend(
        discovered
            .into_values()
            .filter(|r| !r.prefill.is_empty() || !r.decode.is_empty()),
    );
    Model::new(model.settings(), rolesets, combined)
}

//! The fleet from the configuration's models and the discovered pods.
//!
//! A discovered pod joins the configured model of its name, whose policies
//! and static pods it keeps; a model only discovery knows gets the engine of
//! its pods and the default policies. Pods pair within their roleset;
//! prefill or decode pods that name no roleset pair with each other (a
//! Deployment per role has no roleset label, and pairing them is what such
//! a deployment means; AIBrix would skip them). Pods without a role serve
//! both phases, as combined pods.
//!
//! A discovered LoRA adapter joins the model of the pods its
//! `status.instances` name (or its `spec.baseModel`, which also decides
//! when they are pods of several models), served on those pods only.

use super::adapter::DiscoveredAdapter;
use super::kube::{DiscoveredPod, PodRole};
use crate::fleet::{
    Connector, DecodePolicy, Endpoint, Fleet, Model, ModelSettings, PodId, PrefillPolicy,
    RolesetPods, DEFAULT_BYTES_PER_TOKEN,
};
use std::collections::BTreeMap;

/// The roleset of discovered pods that name none.
pub const UNNAMED_ROLESET: &str = "default";

/// A discovered pod or adapter left out of the fleet, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unused {
    /// `pod <name>` or `adapter <name>`.
    pub what: String,
    pub why: String,
}

fn unused_pod(p: &DiscoveredPod, why: String) -> Unused {
    Unused {
        what: format!("pod {}", p.name),
        why,
    }
}

/// Builds the fleet; also returns the pods and adapters it could not use.
pub fn build_fleet(
    configured: &[Model],
    pods: &[DiscoveredPod],
    adapters: &[DiscoveredAdapter],
) -> (Fleet, Vec<Unused>) {
    let mut by_model: BTreeMap<&str, Vec<&DiscoveredPod>> = BTreeMap::new();
    for p in pods {
        by_model.entry(p.model.as_str()).or_default().push(p);
    }
    let mut unused = Vec::new();
    // Each adapter with its base model.
    let mut based: Vec<(&str, &DiscoveredAdapter)> = Vec::with_capacity(adapters.len());
    for a in adapters {
        match base_of(a, pods, configured) {
            Ok(base) => based.push((base, a)),
            Err(why) => unused.push(Unused {
                what: format!("adapter {}", a.name),
                why,
            }),
        }
    }
    let mut models = Vec::with_capacity(configured.len() + by_model.len());
    for m in configured {
        let pods = by_model.remove(m.name.as_str()).unwrap_or_default();
        models.push(with_pods(m, &pods, &based, &mut unused));
    }
    for (name, pods) in by_model {
        let Some(first) = pods.first() else { continue };
        let base = Model::new(
            ModelSettings {
                name: name.to_owned(),
                engine: first.engine.clone(),
                kv_connector: None,
                prefill_policy: PrefillPolicy::default(),
                decode_policy: DecodePolicy::default(),
                trt_token_ids_b64: false,
                trt_generation_first: false,
                decider: None,
                session: None,
                kv_reuse: None,
                bytes_per_token: DEFAULT_BYTES_PER_TOKEN,
                adapters: Vec::new(),
                ec_connector: None,
            },
            Vec::new(),
            Vec::new(),
        );
        models.push(with_pods(&base, &pods, &based, &mut unused));
    }
    (Fleet::new(models), unused)
}

/// The model an adapter belongs to: its `spec.baseModel` when that is a
/// configured or discovered model, else the one model of its instance
/// pods. One whose pods have all left keeps its base model (a 503 until it
/// is loaded again); with neither it serves nothing.
fn base_of<'a>(
    a: &'a DiscoveredAdapter,
    pods: &'a [DiscoveredPod],
    configured: &[Model],
) -> Result<&'a str, String> {
    let is_model = |name: &str| {
        configured.iter().any(|m| m.name == name) || pods.iter().any(|p| p.model == name)
    };
    if is_model(&a.name) {
        return Err("its name is a model's".into());
    }
    let mut on: Vec<&str> = Vec::new();
    for p in pods
        .iter()
        .filter(|p| a.instances.iter().any(|i| i == p.object()))
    {
        if !on.contains(&p.model.as_str()) {
            on.push(&p.model);
        }
    }
    match (a.base.as_deref(), &on[..]) {
        (Some(b), _) if is_model(b) => Ok(b),
        (_, [one]) => Ok(one),
        (_, []) => Err("no pod its status.instances names is discovered".into()),
        _ => Err(format!(
            "its instances serve models {}; spec.baseModel must name one",
            on.join(", ")
        )),
    }
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
                unused.push(unused_pod(
                    p,
                    format!(
                        "kv-connector-type {name:?} is not supported (known: {}); the model's connector is used",
                        Connector::NAMES.join(", ")
                    ),
                ));
            }
            c
        }
    };
    e
}

/// A discovered endpoint in its roleset's list for its role, or among the
/// combined pods.
fn place(role: PodRole, mut e: Endpoint, slot: &mut RolesetPods, combined: &mut Vec<Endpoint>) {
    match role {
        PodRole::Prefill => slot.prefill.push(e),
        PodRole::EncodePrefill => {
            e.encodes = true;
            slot.prefill.push(e);
        }
        PodRole::Encode => slot.encode.push(e),
        PodRole::Decode => slot.decode.push(e),
        PodRole::Both => combined.push(e),
        PodRole::PrefillDecode => {
            e.prefill_when_picked = true;
            combined.push(e);
        }
        PodRole::EncodePrefillDecode => {
            e.prefill_when_picked = true;
            e.encodes = true;
            combined.push(e);
        }
    }
}

/// `model` (its settings and static pods) with the pods `found` and the
/// adapters `based` on it added.
fn with_pods(
    model: &Model,
    found: &[&DiscoveredPod],
    based: &[(&str, &DiscoveredAdapter)],
    unused: &mut Vec<Unused>,
) -> Model {
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
            encode: static_pods(&r.encode),
            prompt_tokens: r.prompt_tokens,
        })
        .collect();
    let mut combined = static_pods(&model.combined);
    let mut discovered: BTreeMap<&str, RolesetPods> = BTreeMap::new();
    // The endpoints of each Kubernetes pod, for the adapters' instances.
    let mut of_pod: Vec<(&str, PodId)> = Vec::new();
    for p in found {
        if p.engine != model.engine {
            let why = format!(
                "engine {:?} differs from model {:?}'s {:?}",
                p.engine, model.name, model.engine
            );
            unused.push(unused_pod(p, why));
            continue;
        }
        let e = endpoint(p, unused);
        of_pod.push((p.object(), e.id));
        let roleset = if p.roleset.is_empty() {
            UNNAMED_ROLESET
        } else {
            p.roleset.as_str()
        };
        let slot = discovered.entry(roleset).or_insert_with(|| RolesetPods {
            name: roleset.to_owned(),
            ..RolesetPods::default()
        });
        place(p.role, e, slot, &mut combined);
    }
    rolesets.extend(
        discovered
            .into_values()
            .filter(|r| !r.prefill.is_empty() || !r.decode.is_empty() || !r.encode.is_empty()),
    );
    let mut settings = model.settings();
    // A name discovery gives another model is that model's.
    settings
        .adapters
        .retain(|n| !based.iter().any(|(b, a)| a.name == *n && *b != model.name));
    let mut adapter_pods = model.adapter_pods.clone();
    for (_, a) in based.iter().filter(|(b, _)| *b == model.name) {
        if !settings.adapters.contains(&a.name) {
            settings.adapters.push(a.name.clone());
        }
        let on = of_pod
            .iter()
            .filter(|(pod, _)| a.instances.iter().any(|i| i == pod));
        adapter_pods.push((a.name.clone(), on.map(|(_, id)| *id).collect()));
    }
    let mut built = Model::new(settings, rolesets, combined);
    built.adapter_pods = adapter_pods;
    built
}

//! The shared vocabulary of routing: pods and their identities, endpoints,
//! rolesets, models, KV connector names, policy names and scheduling knobs.
//!
//! A leaf module: it imports nothing else of pd-router's, so configuration,
//! discovery, scheduling, engines and the flow all speak it without cycles.
//! A [`Fleet`] is one version of "the models and their pods"; the router
//! swaps in a new one when its pod set changes, while requests in flight keep
//! the version (and the `Rc`s) they were placed with.

mod connector;
mod ec_connector;
mod engine_kind;
mod id;
mod policy;

pub use connector::Connector;
pub use ec_connector::EcConnector;
pub use engine_kind::EngineKind;
pub use id::{fnv1a, fnv1a_extend, ModelId, PodId};
pub use policy::{
    Decider, DecodePolicy, KvReuse, PrefillPolicy, Scheduling, SessionAffinity, TokenRange,
};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;

/// Default SGLang bootstrap port, as in SGLang's `--disaggregation-bootstrap-port`
/// (and vLLM Mooncake's `VLLM_MOONCAKE_BOOTSTRAP_PORT`).
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;
/// vLLM P2P NCCL's default `kv_port`.
pub const DEFAULT_KV_PORT: u16 = 14579;
/// About four bytes a token for English BPE vocabularies.
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;
/// vLLM NIXL's default `VLLM_NIXL_SIDE_CHANNEL_PORT`.
pub const DEFAULT_NIXL_SIDE_CHANNEL_PORT: u16 = 5600;

/// Where a vLLM NIXL push decode finds a prefill pod's KV (vLLM's push
/// mode takes these from configuration, not from the prefill's answer).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct NixlPeer {
    /// The prefill's `kv_transfer_config.engine_id` (with `_dp<r>` under DP).
    pub engine_id: String,
    /// `VLLM_NIXL_SIDE_CHANNEL_HOST`; the pod IP when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_channel_host: Option<String>,
    pub side_channel_port: u16,
    pub tp_size: u32,
    pub pp_size: u32,
}

/// One engine pod as a model's roleset (or combined list) names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub id: PodId,
    /// This pod's index in its model's [`Model::pods`]: where its state sits
    /// in the per-request arrays the scheduler works on. Meaningful only
    /// within one fleet; never stored.
    pub slot: usize,
    /// `IP:port` as the routing header wants it (IPv6 in brackets).
    pub address: String,
    /// The IP alone: SGLang's `bootstrap_host`, AIBrix's `remote_host` rewrite.
    pub ip: String,
    pub name: String,
    pub bootstrap_port: u16,
    pub kv_connector: Option<Connector>,
    /// Prompt lengths a combined pod takes (`None`: any).
    pub prompt_tokens: Option<TokenRange>,
    /// Data-parallel ranks the pod serves (SGLang's `dp_size`); 1: none.
    pub dp_size: u32,
    /// vLLM P2P NCCL: the pod's ZMQ port (`kv_transfer_config.kv_port`).
    pub kv_port: u16,
    /// vLLM NIXL push: the prefill's side channel, as configured.
    pub nixl_push: Option<NixlPeer>,
    /// A combined pod labelled for both phases (llm-d's `prefill-decode`):
    /// an endpoint picker may name it as a split's prefill pod, as llm-d's
    /// prefill filter accepts it. pd-router's own placement never does.
    pub prefill_when_picked: bool,
    /// A prefill pod that encodes its own media (llm-d's `encode-prefill`):
    /// a request placed on it needs no encoder leg.
    pub encodes: bool,
}

impl Endpoint {
    /// A pod at `addr`, named `name` (default: its address).
    pub fn new(addr: SocketAddr, name: Option<String>) -> Endpoint {
        let address = addr.to_string();
        let name = name.unwrap_or_else(|| address.clone());
        Endpoint {
            id: PodId::of(&name, &address),
            slot: 0,
            ip: addr.ip().to_string(),
            address,
            name,
            bootstrap_port: DEFAULT_BOOTSTRAP_PORT,
            kv_connector: None,
            prompt_tokens: None,
            dp_size: 1,
            kv_port: DEFAULT_KV_PORT,
            nixl_push: None,
            prefill_when_picked: false,
            encodes: false,
        }
    }

    /// The vLLM KV connector this pod hands off with: its own, else its
    /// model's, else the router's global one (AIBrix's pod label, then
    /// `SetConnectorTypeFunc`). The one place this precedence is written.
    pub fn connector(&self, model: Option<Connector>, global: Connector) -> Connector {
        self.kv_connector.or(model).unwrap_or(global)
    }
}

/// Prefill and decode pods that belong together (AIBrix's roleset: pods of one
/// roleset share a KV-transfer fabric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roleset {
    pub name: String,
    pub prefill: Vec<Rc<Endpoint>>,
    pub decode: Vec<Rc<Endpoint>>,
    /// Encoder pods (E/P/D): they compute the media embeddings this
    /// roleset's prefill pods read through the model's EC connector.
    pub encode: Vec<Rc<Endpoint>>,
    /// Prompt lengths this roleset takes (`None`: any).
    pub prompt_tokens: Option<TokenRange>,
}

impl Roleset {
    /// Only a roleset with both roles can serve a split request.
    pub fn is_eligible(&self) -> bool {
        !self.prefill.is_empty() && !self.decode.is_empty()
    }
}

/// A roleset's pods before they join a model.
#[derive(Debug, Clone, Default)]
pub struct RolesetPods {
    pub name: String,
    pub prefill: Vec<Endpoint>,
    pub decode: Vec<Endpoint>,
    pub encode: Vec<Endpoint>,
    pub prompt_tokens: Option<TokenRange>,
}

/// How a model is served, whatever its pods.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSettings {
    pub name: String,
    /// Free text: unknown engines get the default handler.
    pub engine: String,
    pub kv_connector: Option<Connector>,
    pub prefill_policy: PrefillPolicy,
    pub decode_policy: DecodePolicy,
    /// TensorRT-LLM chat: the context phase answers the prompt's ids as one
    /// base64 string (`gen_tokids_ctxbytes` in TensorRT-LLM's orchestrator).
    pub trt_token_ids_b64: bool,
    /// TensorRT-LLM `schedule_style: generation_first`: both legs at once,
    /// the generation naming the context server (`GET /server_info`).
    pub trt_generation_first: bool,
    /// When a request goes unsplit to its decode pod (none: always split).
    pub decider: Option<Decider>,
    /// Session affinity (none: off).
    pub session: Option<SessionAffinity>,
    /// Next-turn KV reuse (none: off).
    pub kv_reuse: Option<KvReuse>,
    /// Bytes per token of this model's prompts, for length estimates.
    pub bytes_per_token: f64,
    /// LoRA adapters its pods serve besides the base weights: requests name
    /// them as their `model`.
    pub adapters: Vec<String>,
    /// vLLM E/P/D: how encoder output reaches the prefill (none: no encoder
    /// leg, media goes to the prefill as sent).
    pub ec_connector: Option<EcConnector>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub id: ModelId,
    pub name: String,
    /// The engine as configured (the registry resolves handlers by it).
    pub engine: String,
    /// What that name means to pd-router.
    pub kind: EngineKind,
    pub kv_connector: Option<Connector>,
    pub prefill_policy: PrefillPolicy,
    pub decode_policy: DecodePolicy,
    pub trt_token_ids_b64: bool,
    pub trt_generation_first: bool,
    pub decider: Option<Decider>,
    pub session: Option<SessionAffinity>,
    pub kv_reuse: Option<KvReuse>,
    pub bytes_per_token: f64,
    pub adapters: Vec<String>,
    pub ec_connector: Option<EcConnector>,
    /// The pods that serve an adapter, for those discovery says are loaded
    /// on some pods only (AIBrix's `ModelAdapter` `status.instances`); an
    /// adapter not here is served by every pod of the model.
    pub adapter_pods: Vec<(String, Vec<PodId>)>,
    pub rolesets: Vec<Roleset>,
    /// Pods that serve both phases: no prefill call.
    pub combined: Vec<Rc<Endpoint>>,
    /// The model's distinct pods, in order of first mention; an endpoint's
    /// `slot` indexes this.
    pub pods: Vec<PodId>,
}

impl Model {
    /// Assembles a model, giving each endpoint its slot.
    pub fn new(
        settings: ModelSettings,
        rolesets: Vec<RolesetPods>,
        combined: Vec<Endpoint>,
    ) -> Model {
        let mut pods: Vec<PodId> = Vec::new();
        let mut place = |mut e: Endpoint| {
            e.slot = match pods.iter().position(|p| *p == e.id) {
                Some(i) => i,
                None => {
                    pods.push(e.id);
                    pods.len() - 1
                }
            };
            Rc::new(e)
        };
        let rolesets = rolesets
            .into_iter()
            .map(|r| Roleset {
                name: r.name,
                prefill: r.prefill.into_iter().map(&mut place).collect(),
                decode: r.decode.into_iter().map(&mut place).collect(),
                encode: r.encode.into_iter().map(&mut place).collect(),
                prompt_tokens: r.prompt_tokens,
            })
            .collect();
        let combined = combined.into_iter().map(&mut place).collect();
        Model {
            id: ModelId::of(&settings.name),
            name: settings.name,
            kind: EngineKind::of(&settings.engine),
            engine: settings.engine,
            kv_connector: settings.kv_connector,
            prefill_policy: settings.prefill_policy,
            decode_policy: settings.decode_policy,
            trt_token_ids_b64: settings.trt_token_ids_b64,
            trt_generation_first: settings.trt_generation_first,
            decider: settings.decider,
            session: settings.session,
            kv_reuse: settings.kv_reuse,
            bytes_per_token: settings.bytes_per_token,
            adapters: settings.adapters,
            ec_connector: settings.ec_connector,
            adapter_pods: Vec::new(),
            rolesets,
            combined,
            pods,
        }
    }

    /// Whether any roleset or combined pod declares a prompt-length bucket.
    pub fn uses_buckets(&self) -> bool {
        self.rolesets.iter().any(|r| r.prompt_tokens.is_some())
            || self.combined.iter().any(|c| c.prompt_tokens.is_some())
    }

    /// Every endpoint of the model, each pod once.
    pub fn endpoints(&self) -> Vec<&Rc<Endpoint>> {
        let mut seen = vec![false; self.pods.len()];
        self.rolesets
            .iter()
            .flat_map(|r| r.prefill.iter().chain(&r.decode).chain(&r.encode))
            .chain(self.combined.iter())
            .filter(|e| match seen.get_mut(e.slot) {
                Some(s) if !*s => {
                    *s = true;
                    true
                }
                _ => false,
            })
            .collect()
    }

    /// The model's settings, e.g. to serve discovered pods the same way.
    pub fn settings(&self) -> ModelSettings {
        ModelSettings {
            name: self.name.clone(),
            engine: self.engine.clone(),
            kv_connector: self.kv_connector,
            prefill_policy: self.prefill_policy,
            decode_policy: self.decode_policy,
            trt_token_ids_b64: self.trt_token_ids_b64,
            trt_generation_first: self.trt_generation_first,
            decider: self.decider,
            session: self.session.clone(),
            kv_reuse: self.kv_reuse,
            bytes_per_token: self.bytes_per_token,
            adapters: self.adapters.clone(),
            ec_connector: self.ec_connector,
        }
    }

    /// The seed of this model's prefix hashes for requests naming `adapter`
    /// (or the base weights): different weights leave different KV, so an
    /// adapter's prompts never match the base model's cache or another's.
    pub fn prefix_seed(&self, adapter: Option<&str>) -> u64 {
        match adapter {
            None => self.id.0,
            Some(a) => xxhash_rust::xxh64::xxh64(a.as_bytes(), self.id.0),
        }
    }

    /// Whether `pod` serves requests naming `adapter` (or the base weights).
    pub fn serves(&self, adapter: Option<&str>, pod: PodId) -> bool {
        let on = adapter.and_then(|a| self.adapter_pods.iter().find(|(n, _)| n == a));
        on.is_none_or(|(_, pods)| pods.contains(&pod))
    }

    /// Whether a request can be placed at all: a roleset with both roles,
    /// or a pod that serves both phases.
    pub fn is_routable(&self) -> bool {
        !self.combined.is_empty()
            || self
                .rolesets
                .iter()
                .any(|r| !r.prefill.is_empty() && !r.decode.is_empty())
    }

    /// Estimated tokens in `bytes` bytes of this model's prompts (the router
    /// does not tokenize).
    pub fn estimate_tokens(&self, bytes: usize) -> u64 {
        (bytes as f64 / self.bytes_per_token()).ceil() as u64
    }

    fn bytes_per_token(&self) -> f64 {
        if self.bytes_per_token > 0.0 {
            self.bytes_per_token
        } else {
            DEFAULT_BYTES_PER_TOKEN
        }
    }

    /// Prompt bytes per prefix-cache block: `tokens` estimated tokens.
    pub fn block_bytes(&self, tokens: usize) -> usize {
        ((tokens as f64 * self.bytes_per_token()).round() as usize).max(1)
    }
}

/// The models and their pods, as known now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet {
    models: Vec<Rc<Model>>,
    by_name: HashMap<String, usize>,
    /// Adapter name → the index of its base model.
    adapters: HashMap<String, usize>,
}

/// What a request's `model` names: a model, or one of its LoRA adapters
/// (placed on the base model's pods, in its load).
#[derive(Debug, Clone, Copy)]
pub struct Served<'a> {
    pub model: &'a Rc<Model>,
    pub adapter: Option<&'a str>,
}

impl Fleet {
    /// A fleet of `models`; of two models with one name the first is kept
    /// (configuration and discovery refuse or merge duplicates before). An
    /// adapter name that is also a model's, or an earlier adapter's, is
    /// dropped: a name means one set of weights.
    pub fn new(models: Vec<Model>) -> Fleet {
        let mut fleet = Fleet::default();
        for m in models {
            if !fleet.by_name.contains_key(&m.name) {
                fleet.by_name.insert(m.name.clone(), fleet.models.len());
                fleet.models.push(Rc::new(m));
            }
        }
        for (i, m) in fleet.models.iter().enumerate() {
            for a in &m.adapters {
                if !fleet.by_name.contains_key(a) && !fleet.adapters.contains_key(a) {
                    fleet.adapters.insert(a.clone(), i);
                }
            }
        }
        fleet
    }

    /// The model named `name`, exactly as the client spelt it.
    pub fn model(&self, name: &str) -> Option<&Rc<Model>> {
        self.by_name.get(name).and_then(|i| self.models.get(*i))
    }

    /// What `name` names: a model, or an adapter of one.
    pub fn serve(&self, name: &str) -> Option<Served<'_>> {
        if let Some(model) = self.model(name) {
            return Some(Served {
                model,
                adapter: None,
            });
        }
        let (adapter, i) = self.adapters.get_key_value(name)?;
        Some(Served {
            model: self.models.get(*i)?,
            adapter: Some(adapter.as_str()),
        })
    }

    pub fn models(&self) -> &[Rc<Model>] {
        &self.models
    }

    /// Every distinct pod, in order of first mention: the pods to scrape and
    /// to publish gauges for.
    pub fn pods(&self) -> Vec<Rc<Endpoint>> {
        let mut seen = std::collections::HashSet::new();
        self.models
            .iter()
            .flat_map(|m| m.endpoints())
            .filter(|e| seen.insert(e.id))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(addr: &str) -> Endpoint {
        Endpoint::new(addr.parse().expect("addr"), None)
    }

    fn settings(name: &str) -> ModelSettings {
        ModelSettings {
            name: name.into(),
            engine: "vllm".into(),
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
        }
    }

    #[test]
    fn adapters_name_their_base_model_and_never_shadow_a_model() {
        let with = |name: &str, adapters: &[&str]| {
            let mut s = settings(name);
            s.adapters = adapters.iter().map(|a| a.to_string()).collect();
            Model::new(s, Vec::new(), vec![ep("10.0.0.1:1")])
        };
        let f = Fleet::new(vec![
            with("base", &["sql", "b"]),
            with("b", &["chat", "sql"]),
        ]);
        let sql = f.serve("sql").expect("adapter");
        assert_eq!(
            (sql.model.name.as_str(), sql.adapter),
            ("base", Some("sql"))
        );
        let b = f.serve("b").expect("model");
        assert_eq!(
            (b.model.name.as_str(), b.adapter),
            ("b", None),
            "a model wins"
        );
        assert_eq!(f.serve("chat").expect("adapter").model.name, "b");
        assert!(f.serve("nope").is_none());
        let base = f.model("base").expect("base");
        assert_ne!(base.prefix_seed(Some("sql")), base.prefix_seed(None));
        assert_ne!(base.prefix_seed(Some("sql")), base.prefix_seed(Some("b")));
    }

    #[test]
    fn slots_index_distinct_pods_in_order_of_first_mention() {
        let m = Model::new(
            settings("m"),
            vec![
                RolesetPods {
                    name: "a".into(),
                    prefill: vec![ep("10.0.0.1:1")],
                    decode: vec![ep("10.0.0.2:1")],
                    encode: Vec::new(),
                    prompt_tokens: None,
                },
                RolesetPods {
                    name: "b".into(),
                    prefill: vec![ep("10.0.0.2:1")],
                    decode: vec![ep("10.0.0.3:1")],
                    encode: Vec::new(),
                    prompt_tokens: None,
                },
            ],
            vec![ep("10.0.0.1:1")],
        );
        assert_eq!(m.pods.len(), 3);
        let slots: Vec<usize> = m
            .rolesets
            .iter()
            .flat_map(|r| r.prefill.iter().chain(&r.decode))
            .map(|e| e.slot)
            .collect();
        assert_eq!(slots, vec![0, 1, 1, 2]);
        assert_eq!(m.combined[0].slot, 0);
        assert_eq!(m.endpoints().len(), 3);
    }

    #[test]
    fn fleet_lists_each_pod_once_across_models() {
        let one = |name: &str, addr: &str| {
            Model::new(
                settings(name),
                vec![RolesetPods {
                    name: "rs0".into(),
                    decode: vec![ep(addr)],
                    ..Default::default()
                }],
                Vec::new(),
            )
        };
        let f = Fleet::new(vec![
            one("a", "10.0.0.1:1"),
            one("b", "10.0.0.1:1"),
            one("a", "10.0.0.9:1"),
        ]);
        assert_eq!(
            f.models().len(),
            2,
            "the first of two models named a is kept"
        );
        assert_eq!(f.pods().len(), 1);
        assert!(f.model("b").is_some() && f.model("c").is_none());
    }
}

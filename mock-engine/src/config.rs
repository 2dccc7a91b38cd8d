//! What one pod is: its engine, role and connector, the faults it injects
//! and the load it reports, as [`Config`]. Plain data at the bottom of the
//! crate, so the state, the engines and the servers read it without
//! depending on how the command line spelt it (see `cli.rs`). The enums
//! still derive clap's `ValueEnum`: their flag values are their own names.

use std::net::SocketAddr;
use std::time::Duration;

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    Vllm,
    Sglang,
    Trtllm,
    /// A plain OpenAI server: no KV hand-off
    Default,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Trtllm => "trtllm",
            Engine::Default => "default",
        }
    }
}

/// Whose OpenAI answer shapes a pod copies: usage details, echo,
/// logprobs. The default mock answers as vLLM does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    Vllm,
    Sglang,
    /// TensorRT-LLM: usage without details, no echo or logprobs (as before).
    Trtllm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Prefill,
    Decode,
    /// vllm only: an E/P/D encoder (`--ec-connector`): encodes the one media
    /// item of a request and hands it to the prefill
    Encode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Encode => "encode",
        }
    }
}

/// vLLM's encoder-cache connectors (E/P/D), as the mock plays them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EcConnector {
    /// ECExampleConnector: the encoder writes each item's output to a
    /// directory the prefill shares (`--ec-storage`), named by its hash
    Example,
    /// The encoder answers `ec_transfer_params` keyed by the item's hash;
    /// the prefill pulls from the encoder's side channel
    Nixl,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Connector {
    /// The decode pulls the KV from the prefill's side channel
    Nixl,
    /// As nixl, for this mock
    Shfs,
    /// The decode gets the whole prefill answer as `disagg_prefill_resp`
    Neuron,
    /// MooncakeConnector: the decode finds the prefill engine on its
    /// bootstrap server (`GET /query`) and pulls the KV by `transfer_id`
    Mooncake,
    /// NixlPushConnector: the legs pair by request id, the decode's
    /// `kv_transfer_params` come from configuration
    #[value(name = "nixl_push", alias = "nixl-push")]
    NixlPush,
    /// P2pNcclConnector (legacy): both addresses travel in the request id
    #[value(name = "p2p_nccl", alias = "p2p-nccl")]
    P2pNccl,
}

/// Which engine's metric names `/metrics` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MetricsFormat {
    Vllm,
    Sglang,
}

/// Load the pod reports on `/metrics` on top of what it really does; set by
/// the `--report-*` flags, changed at run time by `POST /debug/load`.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Load {
    /// Added to the real in-flight POST count.
    pub running: f64,
    pub waiting: f64,
    /// Fraction in [0, 1].
    pub kv_usage: f64,
    /// Tokens/s (SGLang's `gen_throughput`; vLLM exports no such gauge).
    pub gen_throughput: f64,
    /// `/metrics` answers 500.
    pub metrics_fail: bool,
}

/// Checks one reported value: finite and non-negative, and at most 1 when it
/// is a `fraction` (KV usage). Shared by the flags and `POST /debug/load`.
pub fn check_load_value(what: &str, v: f64, fraction: bool) -> Result<f64, String> {
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{what} must be a finite number >= 0, got {v}"));
    }
    if fraction && v > 1.0 {
        return Err(format!("{what} must be in [0, 1], got {v}"));
    }
    Ok(v)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Status(u16),
    Delay(Duration),
    Garbage,
    NoKvParams,
    /// TRT-LLM context: leave out the top-level `prompt_token_ids` (older
    /// releases' chat endpoint does not echo them).
    NoTokenIds,
    /// TRT-LLM context: leave out `disaggregated_params`.
    NoDisaggParams,
    Hang,
    /// Read the request, then drop the connection (TCP RST), nothing sent.
    Reset,
    /// 200 with the full answer's `content-length`, half the body, then close.
    Truncate,
    /// SGLang prefill: hand the KV over as usual, wait until the decode has
    /// collected it and then this long, then answer 500.
    FailAfterTransfer(Duration),
    /// The other faults apply only after this many API POSTs (POST /v1/*,
    /// `/inference/v1/generate`, `/tokenize`, ...).
    /// Parsed only; [`Config::fail_after`] holds it afterwards.
    FailAfter(u64),
    /// vLLM decode: a hand-off from the prefill pod of this name fails (500,
    /// as vLLM's `kv_load_failure_policy` "fail" answers a pull that broke);
    /// others work.
    FailFrom(String),
    /// TRT-LLM generation-first context: wait until the generation server
    /// asks for the KV, then answer 500 without leaving it (a context that
    /// failed after its generation leg left).
    FailWhenAsked,
    /// Answer 200 with a stream whose first event is an error, as vLLM and
    /// SGLang report a KV transfer that failed on a streamed request.
    ErrorEvent,
}

/// The wait of the `fail-after-transfer` fault among `faults`, if any.
pub fn fail_after_transfer(faults: &[Fault]) -> Option<Duration> {
    faults.iter().find_map(|f| match f {
        Fault::FailAfterTransfer(d) => Some(*d),
        _ => None,
    })
}

/// A LoRA adapter the pod serves by name besides its model (vLLM's
/// `--lora-modules name=path`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adapter {
    pub name: String,
    /// Where its weights are: `root` on `/v1/models`.
    pub path: String,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub engine: Engine,
    pub role: Role,
    pub name: String,
    /// The served model id (`--model`, default `mock-model`).
    pub model: String,
    /// `--lora`: adapters served by name besides `model`.
    pub adapters: Vec<Adapter>,
    /// `--model` was given: a request naming any other model than `model`
    /// or one of `adapters` is a 404, as vLLM answers it. Off, any name is
    /// served (the mocks' behaviour before models were checked).
    pub enforce_model: bool,
    pub listen: SocketAddr,
    pub connector: Connector,
    pub bootstrap_listen: SocketAddr,
    pub side_listen: SocketAddr,
    /// vllm p2p_nccl: the "ZMQ" listener (plain HTTP in the mock).
    pub zmq_listen: SocketAddr,
    pub advertise_host: Option<String>,
    /// Data-parallel size: sglang (both roles), vllm mooncake prefill.
    pub dp_size: u64,
    /// vllm mooncake prefill: `GET /query` answers 503 this long after start.
    pub query_unavailable: Duration,
    /// vllm nixl_push prefill: its engine id (default: the pod name).
    pub engine_id: String,
    /// trtllm generation: the `internal_request_auth_key` that signs
    /// `x-trtllm-disagg-auth`; none: no check (TensorRT-LLM only warns).
    pub auth_key: Option<String>,
    /// trtllm context: `ctx_info_endpoint` is a list of two endpoints.
    pub ctx_endpoint_list: bool,
    /// The faults to apply (never a `FailAfter`): to every API POST, or,
    /// with `fail_after`, to those after the first N. `--fault fail-after:N`
    /// alone means `status:500` here.
    pub faults: Vec<Fault>,
    /// `--fault fail-after:N`: the first N API POSTs get no fault at all.
    pub fail_after: Option<u64>,
    pub allow_recompute: bool,
    /// vLLM NIXL `bidirectional_kv_xfer` (`engines/bidirectional.rs`).
    pub bidirectional: bool,
    pub bootstrap_timeout: Duration,
    pub stream_delay: Duration,
    pub allow_remote_peers: bool,
    pub metrics_format: MetricsFormat,
    /// Initial reported load (see [`Load`]).
    pub load: Load,
    /// Prefill role: accept what a real engine accepts (any `max_tokens`,
    /// streaming, `min_tokens` up to `max_tokens`) instead of the strict
    /// prefill-leg rules; for routers that send the client's knobs as they
    /// are (sglang-router, vllm-router). Off by default.
    pub lenient_prefill: bool,
    /// No access log on stderr and no `/debug/requests` record: for load
    /// tests, where both cost CPU and the record grows without bound.
    pub quiet: bool,
    /// The pod's own prefix-cache hits for any prompt (clamped to the
    /// prompt's tokens): what it reports as `cached_tokens` when it computed
    /// the prompt itself.
    pub cached_tokens: u64,
    /// vLLM >= 0.31: a prefill writes `remote_prefill_cached_tokens` into
    /// its `kv_transfer_params`, a decode reports it. Off
    /// (`--no-remote-cached-field`): vLLM < 0.31, neither.
    pub remote_cached_field: bool,
    /// vLLM `--enable-prompt-tokens-details`; off
    /// (`--no-prompt-tokens-details`): `"prompt_tokens_details": null`.
    pub prompt_tokens_details: bool,
    /// SGLang `--enable-cache-report`: `prompt_tokens_details.cached_tokens`.
    pub enable_cache_report: bool,
    /// SGLang decode: the pre-fix double count (SGLang issue 25972), the
    /// prefill's cached count plus the whole prompt.
    pub double_count_cached: bool,
    /// vLLM E/P/D: the encoder's connector (encode role), or the one a
    /// prefill consumes encoder output with; none: the prefill encodes
    /// its media itself.
    pub ec_connector: Option<EcConnector>,
    /// `ec_connector` example: the storage encoders and prefills share.
    pub ec_storage: Option<std::path::PathBuf>,
}

impl Config {
    /// Whose answer shapes the pod copies.
    pub fn flavor(&self) -> Flavor {
        match self.engine {
            Engine::Vllm | Engine::Default => Flavor::Vllm,
            Engine::Sglang => Flavor::Sglang,
            Engine::Trtllm => Flavor::Trtllm,
        }
    }

    /// vLLM prefill with a pull-based connector serves KV over the side channel.
    pub fn vllm_pull_connector(&self) -> bool {
        self.engine == Engine::Vllm && matches!(self.connector, Connector::Nixl | Connector::Shfs)
    }

    /// vLLM with the given connector.
    pub fn vllm(&self, connector: Connector) -> bool {
        self.engine == Engine::Vllm && self.connector == connector
    }

    pub fn needs_side_channel(&self) -> bool {
        if self.role == Role::Encode {
            return self.ec_connector == Some(EcConnector::Nixl);
        }
        // A bidirectional decode serves its blocks to the next prefill.
        (self.role == Role::Decode && self.bidirectional && self.vllm(Connector::Nixl))
            || self.role == Role::Prefill
                && (self.vllm_pull_connector()
                    || self.vllm(Connector::Mooncake)
                    || self.vllm(Connector::NixlPush)
                    || self.engine == Engine::Trtllm)
    }

    pub fn needs_bootstrap(&self) -> bool {
        self.role == Role::Prefill
            && (self.engine == Engine::Sglang || self.vllm(Connector::Mooncake))
    }

    /// vLLM P2P NCCL pods, both roles, have a "ZMQ" listener.
    pub fn needs_zmq(&self) -> bool {
        self.vllm(Connector::P2pNccl)
    }

    /// Whether `POST /v1/responses` is served: vLLM (not neuron) and default.
    pub fn serves_responses(&self) -> bool {
        match self.engine {
            Engine::Vllm => self.connector != Connector::Neuron,
            Engine::Default => true,
            Engine::Sglang | Engine::Trtllm => false,
        }
    }

    /// Whether `POST /v1/messages` (Anthropic's Messages API) is split
    /// here: vLLM (not neuron, whose decode takes an OpenAI prefill answer)
    /// and SGLang.
    pub fn serves_messages(&self) -> bool {
        match self.engine {
            Engine::Vllm => self.connector != Connector::Neuron,
            Engine::Sglang => true,
            Engine::Default | Engine::Trtllm => false,
        }
    }

    /// Whether vLLM's token-in `POST /inference/v1/generate` is served:
    /// vLLM (not neuron) only; SGLang has no such path.
    pub fn serves_generate(&self) -> bool {
        self.engine == Engine::Vllm && self.connector != Connector::Neuron
    }

    /// Whether the calls no router splits (embeddings, tokenize, score,
    /// audio, ...) are served: the pods that answer as vLLM does.
    pub fn serves_unsplit(&self) -> bool {
        self.flavor() == Flavor::Vllm
    }

    /// Whether a request naming `model` is served here: always without
    /// `--model`; else the model or one of its adapters.
    pub fn serves_model(&self, model: &str) -> bool {
        !self.enforce_model || model == self.model || self.adapter(model).is_some()
    }

    /// The adapter called `name`, if the pod serves one.
    pub fn adapter(&self, name: &str) -> Option<&Adapter> {
        self.adapters.iter().find(|a| a.name == name)
    }

    /// A `--dp-size` applies: sglang, and the vllm mooncake prefill.
    pub fn dp_size_applies(&self) -> bool {
        self.engine == Engine::Sglang
            || (self.vllm(Connector::Mooncake) && self.role == Role::Prefill)
    }

    /// `--advertise-host` applies: the vllm prefills that tell where their
    /// side channel is.
    pub fn advertise_host_applies(&self) -> bool {
        self.role == Role::Prefill
            && (self.vllm_pull_connector()
                || self.vllm(Connector::Mooncake)
                || self.vllm(Connector::NixlPush))
    }

    /// `--fault no-kv-params` applies: the vllm prefills whose answer
    /// carries `kv_transfer_params`.
    pub fn no_kv_params_applies(&self) -> bool {
        self.role == Role::Prefill && (self.vllm_pull_connector() || self.vllm(Connector::NixlPush))
    }

    pub fn has_fault(&self, fault: &Fault) -> bool {
        self.faults.contains(fault)
    }

    /// The wait of a `fail-after-transfer` fault, if one is configured.
    pub fn fail_after_transfer(&self) -> Option<Duration> {
        fail_after_transfer(&self.faults)
    }

    /// The faults for the API POST numbered `seq` (0-based, in order of
    /// arrival).
    pub fn faults_for(&self, seq: u64) -> &[Fault] {
        match self.fail_after {
            Some(n) if seq < n => &[],
            _ => &self.faults,
        }
    }
}

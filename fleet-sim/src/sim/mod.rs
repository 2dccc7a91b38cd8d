//! A fleet of simulated GPU pods in one process (`mock-engine sim`), each on
//! its own port and speaking the wire contract the enforcing mocks speak
//! (vLLM NIXL or SGLang bootstrap), modelling what a router's choice
//! changes: a KV cache per pod with LRU eviction, prefill time that grows
//! with the tokens not cached, decode steps that slow with the batch, a
//! waiting queue when the KV cache is full, and KV transfers that take
//! their bytes' time. Every duration is divided by the time scale, so an
//! hour of traffic replays in minutes (bench/README.md, "Fleet simulation").
//!
//! Layers: [`text`] (prompts from trace block ids and back), [`model`]
//! (step and transfer times), [`cache`] (a pod's blocks), [`engine`] (the
//! scheduler), [`nic`] (transfers sharing the pods' NICs), then [`pod`]
//! (driving an engine in real time), [`fleet`] (what pods share), [`serve`] (one request's life) and [`http`] (the
//! API).

pub mod cache;
pub mod engine;
pub mod fleet;
pub mod http;
pub mod model;
pub mod nic;
pub mod pod;
pub mod serve;
pub mod text;

use clap::Parser;
use engine::EngineConfig;
use fleet::{Flavor, Fleet};
use model::Gpu;
use pod::{Clock, Pod, Role};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// `mock-engine sim`: simulated pods, one port each.
#[derive(Parser, Debug)]
#[command(name = "mock-engine sim")]
pub struct SimArgs {
    /// The wire contract: vllm (NIXL, pull) or sglang (bootstrap rooms)
    #[arg(long, default_value = "vllm")]
    pub engine: String,
    /// Prefill pods
    #[arg(long, default_value_t = 8)]
    pub prefill: usize,
    /// Decode pods
    #[arg(long, default_value_t = 4)]
    pub decode: usize,
    /// Address the pods listen on (each on a port of its own, chosen by the
    /// system)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// SGLang: the prefill pods' bootstrap ports start here (named in
    /// requests, not served)
    #[arg(long, default_value_t = 18998)]
    pub bootstrap_port: u16,
    /// Modelled seconds per real second
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// KV cache per pod, in trace blocks of 512 tokens (default: 440,000
    /// tokens, an H100 80 GB with an 8B model)
    #[arg(long)]
    pub kv_blocks: Option<usize>,
    /// Blocks each pod's prefix cache keeps in all, GPU and a host-memory
    /// tier (default: --kv-blocks, no tier)
    #[arg(long)]
    pub cache_blocks: Option<usize>,
    /// Host tier to GPU, GB/s: a hit in the host tier waits for its reload
    /// at this rate (default 25: about 40 % of PCIe Gen5 x16's 64 GB/s per
    /// direction, the model's assumption)
    #[arg(long, default_value_t = 25.0)]
    pub host_gbs: f64,
    /// Bytes of prompt text per token (the replayer's --bytes-per-token)
    #[arg(long, default_value_t = 4)]
    pub bytes_per_token: usize,
    /// The replayer's --seed (its prompts' filler)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The model the pods serve
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// vLLM NIXL's kv_lease_duration, modelled seconds
    #[arg(long, default_value_t = 30.0)]
    pub lease_s: f64,
    /// vLLM NIXL's bidirectional transfer: each decode pod keeps a finished
    /// request's KV (held, taking KV room) for this many modelled seconds
    /// (vLLM's decoder_kv_blocks_ttl, 480) or until the next turn's prefill
    /// pulls it, and names it in its answer's kv_transfer_params; off by
    /// default
    #[arg(long)]
    pub decoder_kv_ttl_s: Option<f64>,
    /// A stream sends what was generated at most this often (real ms),
    /// after its first token
    #[arg(long, default_value_t = 25)]
    pub flush_ms: u64,
}

fn flavor(name: &str) -> Result<Flavor, String> {
    match name {
        "vllm" => Ok(Flavor::Vllm),
        "sglang" => Ok(Flavor::Sglang),
        other => Err(format!("unknown engine {other:?}: vllm or sglang")),
    }
}

/// Binds every pod, prints one JSON line naming them, and serves until the
/// process is stopped.
pub async fn run(args: SimArgs) -> Result<(), String> {
    let flavor = flavor(&args.engine)?;
    if [args.time_scale, args.host_gbs]
        .iter()
        .any(|v| v.is_nan() || *v <= 0.0)
    {
        return Err("--time-scale and --host-gbs must be above 0".into());
    }
    if args.bytes_per_token == 0 {
        return Err("--bytes-per-token must be at least 1".into());
    }
    if let Some(ttl) = args.decoder_kv_ttl_s {
        if flavor != Flavor::Vllm || ttl.is_nan() || ttl <= 0.0 {
            return Err("--decoder-kv-ttl-s: above 0, and vLLM NIXL's (--engine vllm)".into());
        }
    }
    let clock = Clock::new(args.time_scale);
    let gpu = Gpu {
        host_bytes_per_s: args.host_gbs * 1e9,
        ..Gpu::default()
    };
    let kv_blocks = args.kv_blocks.unwrap_or(EngineConfig::default().kv_blocks);
    let config = EngineConfig {
        gpu,
        kv_blocks,
        cache_blocks: args.cache_blocks.unwrap_or(kv_blocks).max(kv_blocks),
        ..EngineConfig::default()
    };
    let roles = (0..args.prefill)
        .map(|i| (Role::Prefill, i))
        .chain((0..args.decode).map(|i| (Role::Decode, i)));
    let mut pods = Vec::new();
    let mut listeners = Vec::new();
    for (index, (role, i)) in roles.enumerate() {
        let listener = TcpListener::bind(SocketAddr::new(args.host, 0))
            .await
            .map_err(|e| format!("cannot bind a pod on {}: {e}", args.host))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("cannot read a pod's address: {e}"))?
            .port();
        let bootstrap = args.bootstrap_port.saturating_add(i as u16);
        let name = format!("{}-{i}", role.name());
        let addr = (args.host.to_string(), port, bootstrap);
        pods.push(Pod::new(index, name, role, addr, config, clock));
        listeners.push(listener);
    }
    let flush = Duration::from_millis(args.flush_ms);
    let mut fleet = Fleet::new(
        flavor,
        args.model,
        pods.clone(),
        gpu,
        args.lease_s,
        flush,
        text::Shape {
            bytes_per_token: args.bytes_per_token,
            seed: args.seed,
        },
    );
    fleet.decoder_kv_ttl_s = args.decoder_kv_ttl_s;
    let fleet = Arc::new(fleet);
    for (pod, listener) in pods.iter().zip(listeners) {
        tokio::spawn(Arc::clone(pod).drive());
        let app = http::router(http::App {
            fleet: Arc::clone(&fleet),
            pod: Arc::clone(pod),
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
    }
    let describe = |role: Role| -> Vec<serde_json::Value> {
        pods.iter()
            .filter(|p| p.role == role)
            .map(|p| {
                serde_json::json!({"name": p.name, "address": p.address(),
                    "bootstrap_port": p.bootstrap_port})
            })
            .collect()
    };
    println!(
        "{}",
        serde_json::json!({"ready": true, "engine": args.engine, "time_scale": args.time_scale,
            "kv_blocks": config.kv_blocks, "cache_blocks": config.cache_blocks,
            "host_gbs": args.host_gbs, "decoder_kv_ttl_s": args.decoder_kv_ttl_s, "bytes_per_token": args.bytes_per_token, "seed": args.seed,
            "prefill": describe(Role::Prefill), "decode": describe(Role::Decode)})
    );
    std::future::pending::<()>().await;
    Ok(())
}

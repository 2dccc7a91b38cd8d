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
//! API); [`kv_events`] keys the caches' changes as llm-d's picker keys
//! prompts (`--kv-events`).

pub mod cache;
pub mod engine;
pub mod fleet;
pub mod http;
pub mod kv_events;
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
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
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
    /// Each pod on an address of its own instead, all on one port (as a
    /// Kubernetes pool's pods are: one target port, the pod's IP): pod i
    /// (prefill pods first, then decode) on this IPv4 address plus i, e.g.
    /// 127.0.0.2, 127.0.0.3, ... (every 127/8 address is loopback on Linux)
    #[arg(long, conflicts_with = "host")]
    pub host_range: Option<Ipv4Addr>,
    /// The port every pod listens on with --host-range (0: one the system
    /// chooses, free on every pod's address); without --host-range only 0
    /// (each pod on a port of its own)
    #[arg(long, default_value_t = 0)]
    pub port: u16,
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
    /// Each pod publishes vLLM's KV events for its cache (blocks stored and
    /// removed, keyed as llm-d's precise prefix scorer keys them), read at
    /// `/sim/kv_events` (kv_events.rs); the tokenizer they assume at
    /// `/sim/kv_events/tokenizer.json`
    #[arg(long)]
    pub kv_events: bool,
}

fn flavor(name: &str) -> Result<Flavor, String> {
    match name {
        "vllm" => Ok(Flavor::Vllm),
        "sglang" => Ok(Flavor::Sglang),
        other => Err(format!("unknown engine {other:?}: vllm or sglang")),
    }
}

/// Each pod's address, in pod order (prefill pods, then decode): `--host`
/// for all, or with `--host-range` the range's first address plus the pod's
/// index.
pub fn pod_hosts(args: &SimArgs) -> Result<Vec<IpAddr>, String> {
    let n = args.prefill + args.decode;
    let Some(first) = args.host_range else {
        if args.port != 0 && n > 1 {
            return Err("--port: every pod on one address needs a port of its own; \
                        give each pod an address of its own with --host-range"
                .into());
        }
        return Ok(vec![args.host; n]);
    };
    let base = u32::from(first);
    (0..n)
        .map(|i| {
            u32::try_from(i)
                .ok()
                .and_then(|i| base.checked_add(i))
                .map(|a| IpAddr::V4(Ipv4Addr::from(a)))
                .ok_or_else(|| format!("--host-range {first}: {n} pods run past 255.255.255.255"))
        })
        .collect()
}

/// One listener per address in `hosts`, each on `port`; `port` 0: each on a
/// port the system chooses when the addresses are all one, else one port
/// the system chose for the first and free on every other (tried again on
/// another when one is taken).
pub async fn bind_pods(hosts: &[IpAddr], port: u16) -> Result<Vec<TcpListener>, String> {
    let bind = |host: IpAddr, port: u16| async move {
        TcpListener::bind(SocketAddr::new(host, port))
            .await
            .map_err(|e| format!("cannot bind a pod on {host}:{port}: {e}"))
    };
    let distinct = hosts.windows(2).any(|w| w.first() != w.last());
    if port != 0 || !distinct {
        let mut listeners = Vec::with_capacity(hosts.len());
        for &h in hosts {
            listeners.push(bind(h, port).await?);
        }
        return Ok(listeners);
    }
    let mut last = String::new();
    for _ in 0..50 {
        let Some(&first) = hosts.first() else {
            return Ok(Vec::new());
        };
        let l0 = bind(first, 0).await?;
        let chosen = l0
            .local_addr()
            .map_err(|e| format!("cannot read a pod's address: {e}"))?
            .port();
        let mut listeners = vec![l0];
        for &h in hosts.iter().skip(1) {
            match bind(h, chosen).await {
                Ok(l) => listeners.push(l),
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
        if listeners.len() == hosts.len() {
            return Ok(listeners);
        }
    }
    Err(format!("no port free on every pod's address: {last}"))
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
    let hosts = pod_hosts(&args)?;
    let listeners = bind_pods(&hosts, args.port).await?;
    let mut pods = Vec::new();
    for (index, ((role, i), listener)) in roles.zip(&listeners).enumerate() {
        let local = listener
            .local_addr()
            .map_err(|e| format!("cannot read a pod's address: {e}"))?;
        let bootstrap = args.bootstrap_port.saturating_add(i as u16);
        let name = format!("{}-{i}", role.name());
        let addr = (local.ip().to_string(), local.port(), bootstrap);
        pods.push(Pod::new(index, name, role, addr, config, clock));
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
    if args.kv_events {
        fleet.publish_kv_events();
    }
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
            "host_gbs": args.host_gbs, "decoder_kv_ttl_s": args.decoder_kv_ttl_s, "kv_events": args.kv_events, "bytes_per_token": args.bytes_per_token, "seed": args.seed,
            "prefill": describe(Role::Prefill), "decode": describe(Role::Decode)})
    );
    std::future::pending::<()>().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> SimArgs {
        let argv = ["sim", "--prefill", "2", "--decode", "2"];
        SimArgs::try_parse_from(argv.iter().chain(extra)).unwrap()
    }

    #[test]
    fn by_default_every_pod_is_on_the_host_each_on_a_port_of_its_own() {
        let a = args(&[]);
        let hosts = pod_hosts(&a).unwrap();
        assert_eq!(hosts, vec![IpAddr::from([127, 0, 0, 1]); 4]);
        assert_eq!(a.port, 0);
        // One port for several pods on one address cannot be.
        assert!(pod_hosts(&args(&["--port", "8000"])).is_err());
        let one =
            SimArgs::try_parse_from(["sim", "--prefill", "1", "--decode", "0", "--port", "8000"]);
        assert_eq!(pod_hosts(&one.unwrap()).unwrap().len(), 1);
    }

    #[test]
    fn a_host_range_gives_pod_i_the_first_address_plus_i() {
        let hosts = pod_hosts(&args(&["--host-range", "127.0.0.254", "--port", "8000"])).unwrap();
        let want: Vec<IpAddr> = [
            [127, 0, 0, 254],
            [127, 0, 0, 255],
            [127, 0, 1, 0],
            [127, 0, 1, 1],
        ]
        .into_iter()
        .map(IpAddr::from)
        .collect();
        assert_eq!(hosts, want);
        assert!(pod_hosts(&args(&["--host-range", "255.255.255.254"])).is_err());
        // Either one address for all, or a range.
        assert!(SimArgs::try_parse_from([
            "sim",
            "--host",
            "127.0.0.1",
            "--host-range",
            "127.0.0.2"
        ])
        .is_err());
    }

    #[tokio::test]
    async fn pods_with_addresses_of_their_own_share_one_port() {
        let hosts = pod_hosts(&args(&["--host-range", "127.0.0.2"])).unwrap();
        let listeners = bind_pods(&hosts, 0).await.unwrap();
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let port = addrs[0].port();
        assert_ne!(port, 0);
        for (i, a) in addrs.iter().enumerate() {
            assert_eq!(
                *a,
                SocketAddr::new(IpAddr::from([127, 0, 0, 2 + i as u8]), port)
            );
        }
        // Each answers on its own address: a connection to pod 2 reaches
        // pod 2's listener.
        let dial = tokio::net::TcpStream::connect(addrs[2]);
        let (dialed, accepted) = tokio::join!(dial, listeners[2].accept());
        assert_eq!(dialed.unwrap().peer_addr().unwrap(), addrs[2]);
        assert_eq!(accepted.unwrap().0.local_addr().unwrap(), addrs[2]);
    }
}

//! mock-engine: impersonates one vLLM / SGLang / TensorRT-LLM pod in the
//! prefill or decode role and enforces that engine's prefill/decode contract,
//! so end-to-end tests of the router fail when the router is wrong.
//!
//! The files form layers, each importing only from those below it (the
//! layout test, tests/layout.rs, fails on an import cycle), so an engine's
//! contract can change without touching what it stands on:
//!
//! 1. Domain types and helpers that import nothing of the crate: `config`,
//!    `error`, `peer`, `disagg_auth`, `responses`, `conn`, `sse`,
//!    `token_in`, `multipart`, `leg` (what an engine's leg hands the
//!    answer); on them `request` (a body's members), `params` (the
//!    sampling knobs), `models` (the served model and adapters), `usage`,
//!    `look`, `anthropic`, `logprobs` and `metrics`.
//! 2. `store`: what one leg leaves for the other, as data.
//! 3. `state`: one pod's config, counters and stores, shared by handlers.
//! 4. The answers, as JSON or SSE: `completion` (chat and completions),
//!    then `answer` (every API's answer from what the leg produced).
//! 5. `engines`: each engine's contract and its side of the hand-off;
//!    `unsplit`: the calls no router splits (embeddings, tokenize, ...).
//! 6. The HTTP servers: `server` (the main API), `sidechannel`,
//!    `bootstrap` and `zmq`.
//! 7. `cli` and this file: the flags, the listeners, the runtime; the
//!    `sim` and `replay` subcommands run the fleet-sim crate.

mod answer;
mod anthropic;
mod bootstrap;
mod cli;
mod completion;
mod config;
mod conn;
mod disagg_auth;
mod engines;
#[cfg(test)]
mod epd_tests;
mod error;
#[cfg(test)]
mod gateway_tests;
mod leg;
mod logprobs;
mod look;
mod metrics;
mod models;
mod multipart;
mod params;
#[cfg(test)]
mod pd_tests;
mod peer;
mod request;
mod responses;
mod server;
mod sidechannel;
mod sse;
mod state;
mod store;
mod token_in;
mod unsplit;
mod usage;
mod zmq;

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::state::{AppState, Bound};

async fn bind(what: &str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), String> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot bind {what} on {addr}: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read {what} address: {e}"))?;
    Ok((listener, local))
}

async fn serve(listener: TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router).await
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn run(config: Config) -> Result<(), String> {
    let (http, http_addr) = bind("http", config.listen).await?;
    let side = if config.needs_side_channel() {
        Some(bind("side channel", config.side_listen).await?)
    } else {
        None
    };
    let boot = if config.needs_bootstrap() {
        Some(bind("bootstrap server", config.bootstrap_listen).await?)
    } else {
        None
    };
    let zmq = if config.needs_zmq() {
        Some(bind("zmq listener", config.zmq_listen).await?)
    } else {
        None
    };
    let bound = Bound {
        http: http_addr,
        side: side.as_ref().map(|(_, a)| *a),
        bootstrap: boot.as_ref().map(|(_, a)| *a),
        zmq: zmq.as_ref().map(|(_, a)| *a),
    };
    let peers = peer::Peers::new(config.allow_remote_peers)
        .map_err(|e| format!("cannot build HTTP client: {e}"))?;
    let state = Arc::new(AppState::new(config, bound, peers));

    let mut servers = tokio::task::JoinSet::new();
    // The main server's connections can be dropped by a fault (see conn.rs).
    let main = server::main_router(state.clone())
        .into_make_service_with_connect_info::<conn::ConnHandle>();
    servers.spawn(async move { axum::serve(conn::CtlListener(http), main).await });
    if let Some((listener, _)) = side {
        let router =
            server::with_access_log(sidechannel::router(state.clone()), state.clone(), "side");
        servers.spawn(serve(listener, router));
    }
    if let Some((listener, _)) = boot {
        let router =
            server::with_access_log(bootstrap::router(state.clone()), state.clone(), "bootstrap");
        servers.spawn(serve(listener, router));
    }
    if let Some((listener, _)) = zmq {
        let router = server::with_access_log(zmq::router(state.clone()), state.clone(), "zmq");
        servers.spawn(serve(listener, router));
    }

    // Only after every listener is bound: tests wait for this line.
    let port = |a: Option<SocketAddr>| a.map_or("null".to_string(), |a| a.port().to_string());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "READY {{\"http\":{},\"bootstrap\":{},\"side\":{},\"zmq\":{}}}",
        bound.http.port(),
        port(bound.bootstrap),
        port(bound.side),
        port(bound.zmq)
    )
    .and_then(|_| out.flush())
    .map_err(|e| format!("cannot write READY: {e}"))?;
    drop(out);

    tokio::select! {
        _ = shutdown_signal() => Ok(()),
        Some(done) = servers.join_next() => match done {
            Ok(Ok(())) => Err("a server stopped unexpectedly".to_string()),
            Ok(Err(e)) => Err(format!("server error: {e}")),
            Err(e) => Err(format!("server task failed: {e}")),
        },
    }
    // Returning drops the runtime, which cancels in-flight requests: a
    // hanging (fault) or streaming request must not keep the pod alive.
}

/// `mock-engine sim ...` and `mock-engine replay ...` (the fleet benchmark's
/// simulated pods and trace replayer, the fleet-sim crate).
fn subcommand() -> Option<ExitCode> {
    use clap::Parser;
    let mut args = std::env::args_os();
    let first = args.nth(1)?;
    let rest = || {
        std::iter::once(format!("mock-engine {}", first.to_string_lossy()).into())
            .chain(std::env::args_os().skip(2))
    };
    let run: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>> =
        match first.to_str()? {
            "sim" => {
                let a = fleet_sim::sim::SimArgs::parse_from(rest());
                Box::pin(fleet_sim::sim::run(a))
            }
            "replay" => {
                let a = fleet_sim::replay::ReplayArgs::parse_from(rest());
                Box::pin(fleet_sim::replay::run(a))
            }
            _ => return None,
        };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mock-engine: cannot start runtime: {e}");
            return Some(ExitCode::FAILURE);
        }
    };
    let result = runtime.block_on(run);
    runtime.shutdown_background();
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock-engine: {e}");
            ExitCode::FAILURE
        }
    })
}

fn main() -> ExitCode {
    if let Some(code) = subcommand() {
        return code;
    }
    let config = cli::parse(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mock-engine: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(config));
    // Don't wait for hung handlers (fault "hang") on the way out.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock-engine: {e}");
            ExitCode::FAILURE
        }
    }
}

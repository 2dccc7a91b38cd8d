//! loadgen: a small closed-loop HTTP/1.1 load generator for the end-to-end
//! benchmark (`bench/run.py`).
//!
//! `--concurrency` workers, each with its own keep-alive connection, POST
//! one body file to one URL back to back. After `--warmup` seconds a
//! measured window opens; it closes after `--duration` seconds or once
//! `--requests` answers completed inside it. Only answers that complete
//! inside the window count. With `--cpu-pid` the CPU time (utime + stime
//! from /proc/PID/stat) that process used during the window is reported,
//! read at the window's edges, so CPU per request is window CPU / window
//! requests. One JSON line on stdout.
//!
//! Single-threaded on purpose (tokio current_thread): the benchmark pins it
//! to one core, with the mock engines.

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::builder::RangedU64ValueParser;
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Linux's USER_HZ: /proc/PID/stat counts CPU time in 1/100 s on every
/// architecture the ABI defines it for.
const USER_HZ: f64 = 100.0;

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// A closed-loop HTTP/1.1 load generator for the end-to-end benchmark
/// (bench/run.py).
#[derive(Parser, Debug)]
// A repeated flag takes its last value, so a caller can append an override
// to a shared flag set.
#[command(
    name = "loadgen",
    args_override_self = true,
    after_help = "Output: one JSON line {completed, errors, elapsed_s, rps, p50_ms, p99_ms, ...}"
)]
struct Cli {
    /// Target to POST to, http://HOST:PORT/PATH
    #[arg(long, value_name = "URL", value_parser = parse_url)]
    url: Target,

    /// File whose bytes every request sends
    #[arg(long, value_name = "FILE")]
    body: PathBuf,

    /// Workers, one keep-alive connection each
    #[arg(long, value_name = "N", default_value = "1",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    concurrency: usize,

    /// Length of the measured window, in seconds
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    duration: Duration,

    /// Close the window after N counted answers (--duration still bounds it)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    requests: Option<u64>,

    /// Unmeasured load before the window, in seconds
    #[arg(long, value_name = "SECS", default_value = "0.5", value_parser = parse_secs)]
    warmup: Duration,

    /// Report this process's CPU time over the window
    #[arg(long, value_name = "PID")]
    cpu_pid: Option<u32>,

    /// Timeout of each request, in seconds
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    timeout: Duration,

    /// Extra request header (repeatable)
    #[arg(long = "header", value_name = "K: V", value_parser = parse_header)]
    headers: Vec<(HeaderName, HeaderValue)>,

    /// Allow a non-loopback target (off: refused)
    #[arg(long)]
    allow_remote: bool,
}

/// `--url`, split and resolved.
#[derive(Clone, Debug)]
struct Target {
    host: String,
    addr: SocketAddr,
    path: String,
}

fn parse_url(url: &str) -> Result<Target, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or("must start with http://")?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host:?} has no address"))?;
    Ok(Target {
        host: host.to_string(),
        addr,
        path: path.to_string(),
    })
}

fn parse_secs(v: &str) -> Result<Duration, String> {
    let secs: f64 = v
        .parse()
        .map_err(|e| format!("not a number of seconds: {e}"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| format!("not a duration: {e}"))
}

fn parse_header(v: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (k, val) = v.split_once(':').ok_or("expected 'K: V'")?;
    let name = HeaderName::from_bytes(k.trim().as_bytes())
        .map_err(|e| format!("header name {k:?}: {e}"))?;
    let value =
        HeaderValue::from_str(val.trim()).map_err(|e| format!("header value {val:?}: {e}"))?;
    Ok((name, value))
}

struct Args {
    host: String,
    addr: SocketAddr,
    path: String,
    body: Bytes,
    concurrency: usize,
    duration: Duration,
    requests: Option<u64>,
    warmup: Duration,
    cpu_pid: Option<u32>,
    timeout: Duration,
    headers: Vec<(HeaderName, HeaderValue)>,
}

/// Parses a full command line, program name first, and reads the body.
fn parse_args<I, T>(argv: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(argv)?;
    let Target { host, addr, path } = cli.url;
    if !cli.allow_remote && !is_loopback(addr.ip()) {
        return Err(Cli::command().error(
            ErrorKind::ValueValidation,
            format!(
                "--url: {addr} is not a loopback address (pass --allow-remote to load it anyway)"
            ),
        ));
    }
    let body = std::fs::read(&cli.body).map_err(|e| {
        Cli::command().error(ErrorKind::Io, format!("--body {}: {e}", cli.body.display()))
    })?;
    Ok(Args {
        host,
        addr,
        path,
        body: Bytes::from(body),
        concurrency: cli.concurrency,
        duration: cli.duration,
        requests: cli.requests,
        warmup: cli.warmup,
        cpu_pid: cli.cpu_pid,
        timeout: cli.timeout,
        headers: cli.headers,
    })
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start
    // after the last ')'. Then state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Busy and total ticks of each CPU, from /proc/stat.
fn core_ticks() -> Vec<(u64, u64)> {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return Vec::new();
    };
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            let total: u64 = v.iter().take(8).sum();
            // idle + iowait
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            (total - idle, total)
        })
        .collect()
}

#[derive(Clone, Copy)]
struct Edge {
    at: Instant,
    cpu: Option<u64>,
}

struct Shared {
    phase: AtomicU8,
    completed: AtomicU64,
    errors: AtomicU64,
    target: Option<u64>,
    cpu_pid: Option<u32>,
    latencies_us: Mutex<Vec<u32>>,
    first_error: Mutex<Option<String>>,
    end: Mutex<Option<Edge>>,
    closed: Notify,
}

impl Shared {
    fn edge(&self) -> Edge {
        Edge {
            at: Instant::now(),
            cpu: self.cpu_pid.and_then(cpu_ticks),
        }
    }

    /// Ends the measured window once, recording its edge.
    fn close(&self) {
        if self
            .phase
            .compare_exchange(MEASURE, STOP, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let edge = self.edge();
            *lock(&self.end) = Some(edge);
            self.closed.notify_one();
        }
    }

    fn error(&self, what: String) {
        if self.phase.load(Ordering::SeqCst) != MEASURE {
            return;
        }
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = lock(&self.first_error);
        if first.is_none() {
            *first = Some(what);
        }
    }

    fn success(&self, latency: Duration) {
        if self.phase.load(Ordering::SeqCst) != MEASURE {
            return;
        }
        lock(&self.latencies_us).push(latency.as_micros().min(u128::from(u32::MAX)) as u32);
        let n = self.completed.fetch_add(1, Ordering::Relaxed) + 1;
        if self.target.is_some_and(|t| n >= t) {
            self.close();
        }
    }
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake {addr}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// A poisoned lock only means a worker panicked mid-update; the counts
/// stay usable, so the report still comes out.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn snippet(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body.get(..300).unwrap_or(body));
    s.replace('\n', " ")
}

async fn worker(args: Arc<Args>, shared: Arc<Shared>) {
    let mut conn: Option<SendRequest<Full<Bytes>>> = None;
    while shared.phase.load(Ordering::SeqCst) != STOP {
        let sender = match conn.as_mut() {
            Some(s) => s,
            None => match connect(args.addr).await {
                Ok(s) => conn.insert(s),
                Err(e) => {
                    shared.error(e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        if sender.ready().await.is_err() {
            conn = None;
            continue;
        }
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(args.path.as_str())
            .header(HOST, args.host.as_str())
            .header(CONTENT_TYPE, "application/json");
        for (k, v) in &args.headers {
            req = req.header(k, v);
        }
        let req = match req.body(Full::new(args.body.clone())) {
            Ok(r) => r,
            Err(e) => {
                shared.error(format!("request: {e}"));
                return;
            }
        };
        let start = Instant::now();
        let exchange = async {
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, body))
        };
        match tokio::time::timeout(args.timeout, exchange).await {
            Ok(Ok((StatusCode::OK, _))) => shared.success(start.elapsed()),
            Ok(Ok((status, body))) => {
                shared.error(format!("status {}: {}", status.as_u16(), snippet(&body)))
            }
            Ok(Err(e)) => {
                conn = None;
                shared.error(format!("http: {e}"));
            }
            Err(_) => {
                conn = None;
                shared.error(format!("timeout after {:?}", args.timeout));
            }
        }
    }
}

fn percentile(sorted: &[u32], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let i = rank.clamp(1, sorted.len()) - 1;
    sorted.get(i).map(|v| f64::from(*v) / 1000.0)
}

fn json_num(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.3}"),
        _ => "null".to_string(),
    }
}

async fn run(args: Args) -> String {
    let args = Arc::new(args);
    let shared = Arc::new(Shared {
        phase: AtomicU8::new(WARMUP),
        completed: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        target: args.requests,
        cpu_pid: args.cpu_pid,
        latencies_us: Mutex::new(Vec::with_capacity(1 << 16)),
        first_error: Mutex::new(None),
        end: Mutex::new(None),
        closed: Notify::new(),
    });
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        workers.spawn(worker(args.clone(), shared.clone()));
    }
    tokio::time::sleep(args.warmup).await;

    let cores0 = core_ticks();
    let start = shared.edge();
    shared.phase.store(MEASURE, Ordering::SeqCst);
    if args.requests.is_some() {
        // The window closes at the Nth answer, or at --duration as a bound.
        let _ = tokio::time::timeout(args.duration, shared.closed.notified()).await;
    } else {
        tokio::time::sleep(args.duration).await;
    }
    shared.close();
    let end = lock(&shared.end).unwrap_or_else(|| shared.edge());
    let cores1 = core_ticks();
    workers.abort_all();

    let elapsed = end.at.duration_since(start.at).as_secs_f64();
    let completed = shared.completed.load(Ordering::Relaxed);
    let errors = shared.errors.load(Ordering::Relaxed);
    let mut lat = std::mem::take(&mut *lock(&shared.latencies_us));
    lat.sort_unstable();
    let cpu_s = match (start.cpu, end.cpu) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / USER_HZ),
        _ => None,
    };
    let cpu_us_per_req = cpu_s
        .filter(|_| completed > 0)
        .map(|c| c * 1e6 / completed as f64);
    let core_busy: Vec<String> = cores0
        .iter()
        .zip(&cores1)
        .map(|((b0, t0), (b1, t1))| {
            let total = t1.saturating_sub(*t0);
            if total == 0 {
                "null".to_string()
            } else {
                format!("{:.3}", b1.saturating_sub(*b0) as f64 / total as f64)
            }
        })
        .collect();
    let first_error = lock(&shared.first_error)
        .clone()
        .map(|e| serde_json::Value::String(e).to_string())
        .unwrap_or_else(|| "null".to_string());
    format!(
        "{{\"completed\":{completed},\"errors\":{errors},\"elapsed_s\":{},\"rps\":{},\
         \"p50_ms\":{},\"p99_ms\":{},\"cpu_s\":{},\"cpu_us_per_req\":{},\
         \"concurrency\":{},\"body_bytes\":{},\"core_busy\":[{}],\"first_error\":{first_error}}}",
        json_num(Some(elapsed)),
        json_num(Some(if elapsed > 0.0 {
            completed as f64 / elapsed
        } else {
            0.0
        })),
        json_num(percentile(&lat, 50.0)),
        json_num(percentile(&lat, 99.0)),
        json_num(cpu_s),
        json_num(cpu_us_per_req),
        args.concurrency,
        args.body.len(),
        core_busy.join(","),
    )
}

fn main() -> ExitCode {
    let args = parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let line = runtime.block_on(run(args));
    // Workers still waiting on answers are not waited for.
    runtime.shutdown_background();
    println!("{line}");
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body file of its own per test: tests run in parallel.
    fn body_file(test: &str) -> PathBuf {
        let name = format!("loadgen-{test}-{}.json", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, b"{}").expect("write body");
        path
    }

    fn line(s: &str) -> Result<Args, clap::Error> {
        parse_args(std::iter::once("loadgen").chain(s.split_whitespace()))
    }

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The command line bench/run.py runs (`run_cell`), with the values it
    /// passes: Python prints floats with a decimal point.
    #[test]
    fn bench_command_line_parses() {
        let body = body_file("bench");
        let a = line(&format!(
            "--url http://127.0.0.1:8080/v1/chat/completions --body {} --concurrency 16 \
             --duration 2.0 --warmup 0.3 --cpu-pid 4242 --timeout 30",
            body.display()
        ))
        .expect("valid");
        assert_eq!(a.host, "127.0.0.1:8080");
        assert_eq!(a.addr, SocketAddr::from(([127, 0, 0, 1], 8080)));
        assert_eq!(a.path, "/v1/chat/completions");
        assert_eq!(&a.body[..], b"{}");
        assert_eq!(a.concurrency, 16);
        assert_eq!(a.duration, Duration::from_secs(2));
        assert_eq!(a.warmup, Duration::from_millis(300));
        assert_eq!(a.cpu_pid, Some(4242));
        assert_eq!(a.timeout, Duration::from_secs(30));
        assert_eq!(a.requests, None);
        let _ = std::fs::remove_file(&body);
    }

    #[test]
    fn defaults_and_other_flags() {
        let body = body_file("defaults");
        let b = body.display();
        let a = line(&format!("--url http://[::1]:9 --body {b}")).expect("valid");
        assert_eq!(a.path, "/");
        assert_eq!(a.concurrency, 1);
        assert_eq!(a.duration, Duration::from_secs(5));
        assert_eq!(a.warmup, Duration::from_millis(500));
        assert_eq!(a.timeout, Duration::from_secs(30));
        assert_eq!(a.cpu_pid, None);
        assert!(a.headers.is_empty());

        let a = line(&format!(
            "--url http://127.0.0.1:9/x --body {b} --requests 100 --header x-a:1 \
             --header x-b:two --concurrency 2 --concurrency 3"
        ))
        .expect("valid");
        assert_eq!(a.requests, Some(100));
        assert_eq!(a.concurrency, 3);
        let headers: Vec<_> = a
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(headers, [("x-a", "1"), ("x-b", "two")]);

        // Not loopback: refused without --allow-remote; nothing is sent either way.
        let remote = format!("--url http://192.0.2.1:80/ --body {b}");
        assert!(line(&remote).is_err());
        assert!(line(&format!("{remote} --allow-remote")).is_ok());
        let _ = std::fs::remove_file(&body);
    }

    #[test]
    fn rejects_bad_input() {
        let body = body_file("bad");
        let b = body.display();
        let kind = |s: &str| line(s).err().map(|e| e.kind());
        assert_eq!(
            kind(&format!("--body {b}")),
            Some(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind("--url http://127.0.0.1:9/"),
            Some(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind("--url http://127.0.0.1:9/ --body /nonexistent/body.json"),
            Some(ErrorKind::Io)
        );
        for bad in [
            "--url https://127.0.0.1:9/",
            "--url 127.0.0.1:9",
            "--url http://127.0.0.1/",
            "--concurrency 0",
            "--concurrency x",
            "--requests 0",
            "--duration -1",
            "--duration x",
            "--warmup inf",
            "--timeout 1e30",
            "--cpu-pid -3",
            "--header novalue",
            "--header bad\u{0}name:1",
        ] {
            let l = format!("--url http://127.0.0.1:9/ --body {b} {bad}");
            assert!(line(&l).is_err(), "{bad}");
        }
        assert_eq!(kind("--help"), Some(ErrorKind::DisplayHelp));
        let _ = std::fs::remove_file(&body);
    }
}

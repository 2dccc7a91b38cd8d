//! Command-line parsing. Hand-written rather than clap: the surface is small
//! and the mock should build fast on a shared 2-core machine.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Vllm,
    Sglang,
    Trtllm,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Prefill,
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connector {
    Nixl,
    Shfs,
    Neuron,
}

/// Which engine's metric names `/metrics` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    Hang,
    /// Read the request, then drop the connection (TCP RST), nothing sent.
    Reset,
    /// 200 with the full answer's `content-length`, half the body, then close.
    Truncate,
    /// SGLang prefill: hand the KV over as usual, wait until the decode has
    /// collected it and then this long, then answer 500.
    FailAfterTransfer(Duration),
    /// The other faults apply only after this many POST /v1/* requests.
    /// Parsed only; [`Config::fail_after`] holds it afterwards.
    FailAfter(u64),
}

/// The wait of the `fail-after-transfer` fault among `faults`, if any.
pub fn fail_after_transfer(faults: &[Fault]) -> Option<Duration> {
    faults.iter().find_map(|f| match f {
        Fault::FailAfterTransfer(d) => Some(*d),
        _ => None,
    })
}

#[derive(Clone, Debug)]
pub struct Config {
    pub engine: Engine,
    pub role: Role,
    pub name: String,
    pub model: String,
    pub listen: SocketAddr,
    pub connector: Connector,
    pub bootstrap_listen: SocketAddr,
    pub side_listen: SocketAddr,
    pub advertise_host: Option<String>,
    /// The faults to apply (never a `FailAfter`): to every POST /v1/*, or,
    /// with `fail_after`, to those after the first N. `--fault fail-after:N`
    /// alone means `status:500` here.
    pub faults: Vec<Fault>,
    /// `--fault fail-after:N`: the first N POST /v1/* get no fault at all.
    pub fail_after: Option<u64>,
    pub allow_recompute: bool,
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
}

impl Config {
    /// vLLM prefill with a pull-based connector serves KV over the side channel.
    pub fn vllm_pull_connector(&self) -> bool {
        self.engine == Engine::Vllm && matches!(self.connector, Connector::Nixl | Connector::Shfs)
    }

    pub fn needs_side_channel(&self) -> bool {
        self.role == Role::Prefill && (self.vllm_pull_connector() || self.engine == Engine::Trtllm)
    }

    pub fn needs_bootstrap(&self) -> bool {
        self.role == Role::Prefill && self.engine == Engine::Sglang
    }

    pub fn has_fault(&self, fault: &Fault) -> bool {
        self.faults.contains(fault)
    }

    /// The wait of a `fail-after-transfer` fault, if one is configured.
    pub fn fail_after_transfer(&self) -> Option<Duration> {
        fail_after_transfer(&self.faults)
    }

    /// The faults for the POST /v1/* numbered `seq` (0-based, in order of
    /// arrival).
    pub fn faults_for(&self, seq: u64) -> &[Fault] {
        match self.fail_after {
            Some(n) if seq < n => &[],
            _ => &self.faults,
        }
    }
}

#[derive(Debug)]
pub struct CliError(pub String);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub const USAGE: &str = "\
usage: mock-engine --engine vllm|sglang|trtllm|default --role prefill|decode
  [--name NAME] [--model MODEL] [--listen ADDR]
  [--connector nixl|shfs|neuron] [--bootstrap-listen ADDR] [--side-listen ADDR]
  [--advertise-host HOST] [--fault SPEC]... [--allow-recompute]
  [--bootstrap-timeout-ms N] [--stream-delay-ms N] [--allow-remote-peers]
  [--metrics-format vllm|sglang] [--report-running N] [--report-waiting N]
  [--report-kv-usage F] [--report-gen-throughput N] [--metrics-fail]
  [--lenient-prefill] [--quiet]
fault SPEC: status:N | delay:MS | garbage | no-kv-params | hang | reset | truncate
  | fail-after-transfer[:MS] | fail-after:N";

/// How long `fail-after-transfer` waits, once the decode has collected the
/// KV, before answering 500: time for the decode's answer to get going.
pub const DEFAULT_FAIL_AFTER_TRANSFER: Duration = Duration::from_millis(100);

fn err(msg: impl Into<String>) -> CliError {
    CliError(msg.into())
}

fn parse_addr(flag: &str, v: &str) -> Result<SocketAddr, CliError> {
    v.parse()
        .map_err(|e| err(format!("{flag}: invalid socket address {v:?}: {e}")))
}

fn parse_ms(flag: &str, v: &str) -> Result<Duration, CliError> {
    v.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| err(format!("{flag}: invalid milliseconds {v:?}: {e}")))
}

fn parse_load(flag: &str, v: &str, fraction: bool) -> Result<f64, CliError> {
    let n: f64 = v
        .parse()
        .map_err(|e| err(format!("{flag}: invalid number {v:?}: {e}")))?;
    check_load_value(flag, n, fraction).map_err(err)
}

fn parse_fault(v: &str) -> Result<Fault, CliError> {
    match v {
        "garbage" => return Ok(Fault::Garbage),
        "no-kv-params" => return Ok(Fault::NoKvParams),
        "hang" => return Ok(Fault::Hang),
        "reset" => return Ok(Fault::Reset),
        "truncate" => return Ok(Fault::Truncate),
        "fail-after-transfer" => return Ok(Fault::FailAfterTransfer(DEFAULT_FAIL_AFTER_TRANSFER)),
        _ => {}
    }
    if let Some(ms) = v.strip_prefix("fail-after-transfer:") {
        return Ok(Fault::FailAfterTransfer(parse_ms(
            "--fault fail-after-transfer",
            ms,
        )?));
    }
    if let Some(n) = v.strip_prefix("fail-after:") {
        return n
            .parse::<u64>()
            .map(Fault::FailAfter)
            .map_err(|e| err(format!("--fault fail-after: invalid count {n:?}: {e}")));
    }
    if let Some(n) = v.strip_prefix("status:") {
        let code: u16 = n
            .parse()
            .map_err(|e| err(format!("--fault {v}: invalid status: {e}")))?;
        if !(100..=599).contains(&code) {
            return Err(err(format!("--fault {v}: status must be in 100..=599")));
        }
        return Ok(Fault::Status(code));
    }
    if let Some(ms) = v.strip_prefix("delay:") {
        return Ok(Fault::Delay(parse_ms("--fault delay", ms)?));
    }
    Err(err(format!("--fault: unknown spec {v:?}")))
}

pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Config, CliError> {
    let loopback_any: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut engine = None;
    let mut role = None;
    let mut name = "mock".to_string();
    let mut model = "mock-model".to_string();
    let mut listen = loopback_any;
    let mut connector = None;
    let mut bootstrap_listen = None;
    let mut side_listen = None;
    let mut advertise_host = None;
    let mut faults = Vec::new();
    let mut allow_recompute = false;
    let mut bootstrap_timeout = Duration::from_millis(10_000);
    let mut stream_delay = Duration::from_millis(2);
    let mut allow_remote_peers = false;
    let mut metrics_format = MetricsFormat::Vllm;
    let mut load = Load::default();
    let mut lenient_prefill = false;
    let mut quiet = false;

    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        // Accept both `--flag value` and `--flag=value`.
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (flag, None),
        };
        let is_switch = matches!(
            flag.as_str(),
            "--allow-recompute"
                | "--allow-remote-peers"
                | "--metrics-fail"
                | "--lenient-prefill"
                | "--quiet"
                | "--help"
                | "-h"
        );
        let value = if is_switch {
            if inline.is_some() {
                return Err(err(format!("{flag} takes no value")));
            }
            String::new()
        } else {
            match inline.or_else(|| it.next()) {
                Some(v) => v,
                None => return Err(err(format!("{flag} needs a value"))),
            }
        };
        match flag.as_str() {
            "--help" | "-h" => return Err(err(USAGE)),
            "--engine" => {
                engine = Some(match value.as_str() {
                    "vllm" => Engine::Vllm,
                    "sglang" => Engine::Sglang,
                    "trtllm" => Engine::Trtllm,
                    "default" => Engine::Default,
                    other => return Err(err(format!("--engine: unknown engine {other:?}"))),
                })
            }
            "--role" => {
                role = Some(match value.as_str() {
                    "prefill" => Role::Prefill,
                    "decode" => Role::Decode,
                    other => return Err(err(format!("--role: unknown role {other:?}"))),
                })
            }
            "--name" => name = value,
            "--model" => model = value,
            "--listen" => listen = parse_addr("--listen", &value)?,
            "--connector" => {
                connector = Some(match value.as_str() {
                    "nixl" => Connector::Nixl,
                    "shfs" => Connector::Shfs,
                    "neuron" => Connector::Neuron,
                    other => return Err(err(format!("--connector: unknown connector {other:?}"))),
                })
            }
            "--bootstrap-listen" => {
                bootstrap_listen = Some(parse_addr("--bootstrap-listen", &value)?)
            }
            "--side-listen" => side_listen = Some(parse_addr("--side-listen", &value)?),
            "--advertise-host" => advertise_host = Some(value),
            "--fault" => faults.push(parse_fault(&value)?),
            "--allow-recompute" => allow_recompute = true,
            "--allow-remote-peers" => allow_remote_peers = true,
            "--bootstrap-timeout-ms" => {
                bootstrap_timeout = parse_ms("--bootstrap-timeout-ms", &value)?
            }
            "--stream-delay-ms" => stream_delay = parse_ms("--stream-delay-ms", &value)?,
            "--metrics-format" => {
                metrics_format = match value.as_str() {
                    "vllm" => MetricsFormat::Vllm,
                    "sglang" => MetricsFormat::Sglang,
                    other => {
                        return Err(err(format!(
                            "--metrics-format: unknown format {other:?} (vllm|sglang)"
                        )))
                    }
                }
            }
            "--report-running" => load.running = parse_load("--report-running", &value, false)?,
            "--report-waiting" => load.waiting = parse_load("--report-waiting", &value, false)?,
            "--report-kv-usage" => load.kv_usage = parse_load("--report-kv-usage", &value, true)?,
            "--report-gen-throughput" => {
                load.gen_throughput = parse_load("--report-gen-throughput", &value, false)?
            }
            "--metrics-fail" => load.metrics_fail = true,
            "--lenient-prefill" => lenient_prefill = true,
            "--quiet" => quiet = true,
            other => return Err(err(format!("unknown flag {other:?}\n{USAGE}"))),
        }
    }

    let mut fail_after = None;
    for f in &faults {
        if let Fault::FailAfter(n) = f {
            if fail_after.replace(*n).is_some() {
                return Err(err("--fault fail-after:N given twice"));
            }
        }
    }
    faults.retain(|f| !matches!(f, Fault::FailAfter(_)));
    if fail_after.is_some() && faults.is_empty() {
        faults.push(Fault::Status(500));
    }

    let engine = engine.ok_or_else(|| err(format!("--engine is required\n{USAGE}")))?;
    let role = role.ok_or_else(|| err(format!("--role is required\n{USAGE}")))?;
    let config = Config {
        engine,
        role,
        name,
        model,
        listen,
        connector: connector.unwrap_or(Connector::Nixl),
        bootstrap_listen: bootstrap_listen.unwrap_or(loopback_any),
        side_listen: side_listen.unwrap_or(loopback_any),
        advertise_host,
        faults,
        fail_after,
        allow_recompute,
        bootstrap_timeout,
        stream_delay,
        allow_remote_peers,
        metrics_format,
        load,
        lenient_prefill,
        quiet,
    };

    // Flags that do not apply are ignored rather than fatal, so a test harness
    // can pass one flag set to every pod; the warning still shows the mistake.
    let mut ignored = Vec::new();
    if connector.is_some() && engine != Engine::Vllm {
        ignored.push("--connector (vllm only)");
    }
    if bootstrap_listen.is_some() && !config.needs_bootstrap() {
        ignored.push("--bootstrap-listen (sglang prefill only)");
    }
    if side_listen.is_some() && !config.needs_side_channel() {
        ignored.push("--side-listen (vllm nixl/shfs prefill and trtllm prefill only)");
    }
    if config.advertise_host.is_some() && !(config.vllm_pull_connector() && role == Role::Prefill) {
        ignored.push("--advertise-host (vllm nixl/shfs prefill only)");
    }
    if lenient_prefill && role != Role::Prefill {
        ignored.push("--lenient-prefill (prefill only)");
    }
    if allow_recompute && !(engine == Engine::Vllm && role == Role::Decode) {
        ignored.push("--allow-recompute (vllm decode only)");
    }
    if config.has_fault(&Fault::NoKvParams)
        && !(config.vllm_pull_connector() && role == Role::Prefill)
    {
        ignored.push("--fault no-kv-params (vllm nixl/shfs prefill only)");
    }
    if config.fail_after_transfer().is_some()
        && !(engine == Engine::Sglang && role == Role::Prefill)
    {
        ignored.push("--fault fail-after-transfer (sglang prefill only)");
    }
    for flag in ignored {
        eprintln!("mock-engine: warning: ignoring {flag}");
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn parses_full_command_line() {
        let c = parse(args(
            "--engine vllm --role prefill --name p0 --connector=shfs --fault status:503 \
             --fault delay:20 --advertise-host 192.0.2.1 --bootstrap-timeout-ms 500",
        ))
        .expect("valid");
        assert_eq!(c.engine, Engine::Vllm);
        assert_eq!(c.connector, Connector::Shfs);
        assert_eq!(
            c.faults,
            vec![Fault::Status(503), Fault::Delay(Duration::from_millis(20))]
        );
        assert_eq!(c.advertise_host.as_deref(), Some("192.0.2.1"));
        assert_eq!(c.bootstrap_timeout, Duration::from_millis(500));
        assert!(c.needs_side_channel());
    }

    #[test]
    fn rejects_bad_input() {
        assert!(parse(args("--engine vllm")).is_err());
        assert!(parse(args("--engine foo --role decode")).is_err());
        assert!(parse(args("--engine vllm --role decode --fault status:42")).is_err());
        assert!(parse(args("--engine vllm --role decode --listen")).is_err());
    }

    #[test]
    fn parses_new_faults() {
        let c = parse(args(
            "--engine sglang --role prefill --fault reset --fault=truncate \
             --fault fail-after-transfer",
        ))
        .expect("valid");
        assert_eq!(
            c.faults,
            vec![
                Fault::Reset,
                Fault::Truncate,
                Fault::FailAfterTransfer(DEFAULT_FAIL_AFTER_TRANSFER)
            ]
        );
        assert_eq!(c.fail_after_transfer(), Some(DEFAULT_FAIL_AFTER_TRANSFER));
        let c = parse(args(
            "--engine sglang --role prefill --fault fail-after-transfer:0",
        ))
        .expect("valid");
        assert_eq!(c.fail_after_transfer(), Some(Duration::ZERO));
        assert_eq!(c.fail_after, None);
        assert_eq!(c.faults_for(0), c.faults.as_slice());

        // Alone, fail-after:N means status:500 after N requests.
        let c = parse(args("--engine default --role decode --fault fail-after:2")).expect("valid");
        assert_eq!(c.fail_after, Some(2));
        assert_eq!(c.faults, vec![Fault::Status(500)]);
        assert!(c.faults_for(0).is_empty());
        assert!(c.faults_for(1).is_empty());
        assert_eq!(c.faults_for(2), [Fault::Status(500)]);
        assert_eq!(c.faults_for(100), [Fault::Status(500)]);

        // With other faults, it delays them, wherever it is on the line.
        let c = parse(args(
            "--engine default --role decode --fault reset --fault fail-after:1 --fault delay:5",
        ))
        .expect("valid");
        assert_eq!(
            c.faults,
            vec![Fault::Reset, Fault::Delay(Duration::from_millis(5))]
        );
        assert!(c.faults_for(0).is_empty());
        assert_eq!(c.faults_for(1), c.faults.as_slice());

        let c = parse(args("--engine default --role decode --fault fail-after:0")).expect("valid");
        assert_eq!(c.faults_for(0), [Fault::Status(500)]);

        for bad in [
            "--fault fail-after:",
            "--fault fail-after:-1",
            "--fault fail-after:x",
            "--fault fail-after:1 --fault fail-after:2",
            "--fault fail-after-transfer:x",
            "--fault fail-after-transfer:",
            "--fault resets",
        ] {
            let line = format!("--engine vllm --role decode {bad}");
            assert!(parse(args(&line)).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_bench_switches() {
        let c = parse(args(
            "--engine sglang --role prefill --lenient-prefill --quiet",
        ))
        .expect("valid");
        assert!(c.lenient_prefill);
        assert!(c.quiet);
        assert!(parse(args("--engine sglang --role prefill --lenient-prefill=1")).is_err());
        assert!(parse(args("--engine sglang --role prefill --quiet=yes")).is_err());
    }

    #[test]
    fn parses_load_reporting() {
        let c = parse(args("--engine vllm --role decode")).expect("valid");
        assert_eq!(c.metrics_format, MetricsFormat::Vllm);
        assert_eq!(c.load, Load::default());
        assert!(!c.lenient_prefill);
        assert!(!c.quiet);
        let c = parse(args(
            "--engine sglang --role decode --metrics-format sglang --report-running 2.5 \
             --report-waiting=7 --report-kv-usage 0.75 --report-gen-throughput 120 --metrics-fail",
        ))
        .expect("valid");
        assert_eq!(c.metrics_format, MetricsFormat::Sglang);
        assert_eq!(
            c.load,
            Load {
                running: 2.5,
                waiting: 7.0,
                kv_usage: 0.75,
                gen_throughput: 120.0,
                metrics_fail: true,
            }
        );
        for bad in [
            "--metrics-format prom",
            "--report-kv-usage 1.5",
            "--report-kv-usage -0.1",
            "--report-running -1",
            "--report-waiting NaN",
            "--report-running inf",
            "--report-running x",
            "--metrics-fail=yes",
        ] {
            let line = format!("--engine vllm --role decode {bad}");
            assert!(parse(args(&line)).is_err(), "{bad}");
        }
    }
}

//! Command-line flags (clap) and the [`Config`] they become: the top of
//! the crate with `main.rs`, so only the entry point knows the flags'
//! spelling, defaults and "ignoring" warnings.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use crate::config::{
    check_load_value, Adapter, Config, Connector, EcConnector, Engine, Fault, Flavor, Load,
    MetricsFormat, Role,
};

/// The served model id without `--model`.
const DEFAULT_MODEL: &str = "mock-model";

/// How long `fail-after-transfer` waits, once the decode has collected the
/// KV, before answering 500: time for the decode's answer to get going.
pub const DEFAULT_FAIL_AFTER_TRANSFER: Duration = Duration::from_millis(100);

const AFTER_HELP: &str = "\
Fault SPEC (API POSTs only: POST /v1/*, /inference/v1/generate, /tokenize, ...;
--fault may be repeated):
  status:N                  answer N (100..=599)
  delay:MS                  sleep MS ms first (several add up)
  garbage                   answer 200 with a body that is not JSON
  no-kv-params              vllm nixl/shfs/nixl_push prefill: leave out
                            kv_transfer_params
  no-token-ids              trtllm context: leave out prompt_token_ids
  no-disagg-params          trtllm context: leave out disaggregated_params
  hang                      never answer
  reset                     drop the connection (TCP RST), nothing sent
  truncate                  send half the body of a 2xx answer, then close
                            (vllm mooncake/nixl_push/p2p_nccl prefill: the
                            KV is then never offered or sent)
  fail-after-transfer[:MS]  sglang prefill: hand the KV over, wait until the
                            decode collected it and MS ms more (default 100),
                            then answer 500
  fail-when-asked           trtllm generation-first context: wait until the
                            generation server asks for the KV, then answer
                            500 without it
  fail-after:N              the other faults apply from request N+1 on (alone:
                            status:500); at most one
  fail-from:NAME            vllm decode: a hand-off whose kv_transfer_params
                            name the prefill pod NAME fails with 500 (KV
                            transfer failed); others work
  error-event               answer 200 with a stream whose first event is an
                            error (a failed KV transfer on a streamed request)

Flags that do not apply to the chosen engine and role are ignored with a
warning, so one flag set can be passed to every pod.";

/// Impersonates one vLLM / SGLang / TensorRT-LLM pod in the prefill or
/// decode role and enforces that engine's prefill/decode contract.
#[derive(Parser, Debug)]
// A repeated flag takes its last value, so a harness can append an override
// to a shared flag set.
#[command(name = "mock-engine", args_override_self = true, after_help = AFTER_HELP)]
struct Cli {
    /// Engine whose contract to enforce
    #[arg(long, value_enum)]
    engine: Engine,

    /// Role of this pod
    #[arg(long, value_enum)]
    role: Role,

    /// Pod name, in ids, logs and x-mock-pod
    #[arg(long, default_value = "mock")]
    name: String,

    /// Served model id; given, a request naming another model (not one of
    /// the --lora adapters) is a 404 [default: mock-model, any name served]
    #[arg(long, value_parser = parse_non_empty)]
    model: Option<String>,

    /// A LoRA adapter served by name besides the model (vLLM's
    /// --lora-modules name=path); may be repeated
    #[arg(long = "lora", value_name = "NAME[=PATH]", value_parser = parse_adapter)]
    adapters: Vec<Adapter>,

    /// Main HTTP listen address
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,

    // The options without a clap default: whether they were given decides
    // the "ignoring" warnings.
    /// vllm only: KV connector [default: nixl]
    #[arg(long, value_enum)]
    connector: Option<Connector>,

    /// sglang prefill, vllm mooncake prefill: bootstrap server listen address
    /// [default: 127.0.0.1:0]
    #[arg(long, value_name = "ADDR")]
    bootstrap_listen: Option<SocketAddr>,

    /// vllm nixl/shfs/mooncake/nixl_push prefill, trtllm prefill:
    /// side-channel listen address [default: 127.0.0.1:0]
    #[arg(long, value_name = "ADDR")]
    side_listen: Option<SocketAddr>,

    /// vllm p2p_nccl (both roles): "ZMQ" listener address, plain HTTP in the
    /// mock [default: 127.0.0.1:0]
    #[arg(long, value_name = "ADDR")]
    zmq_listen: Option<SocketAddr>,

    /// vllm nixl/shfs/nixl_push prefill: remote_host written in
    /// kv_transfer_params; vllm mooncake prefill: host of the worker_addr on
    /// /query
    #[arg(long, value_name = "HOST")]
    advertise_host: Option<String>,

    /// sglang (both roles), vllm mooncake prefill: data-parallel size
    /// [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    dp_size: Option<u64>,

    /// vllm mooncake prefill: GET /query answers 503 for this long after
    /// start, in ms [default: 0]
    #[arg(long = "query-unavailable-ms", value_name = "MS", value_parser = parse_ms)]
    query_unavailable: Option<Duration>,

    /// vllm nixl_push prefill: engine id (the decode's remote_engine_id)
    /// [default: the pod name]
    #[arg(long, value_name = "ID", value_parser = parse_non_empty)]
    engine_id: Option<String>,

    /// trtllm decode: internal_request_auth_key; the generation request's
    /// x-trtllm-disagg-auth must sign encoded_opaque_state and
    /// ctx_info_endpoint with it [default: none, no check]
    #[arg(long, value_name = "KEY", value_parser = parse_non_empty)]
    auth_key: Option<String>,

    /// trtllm prefill: ctx_info_endpoint is a list of two endpoints, the
    /// first one the real one
    #[arg(long)]
    ctx_endpoint_list: bool,

    /// Fault to inject (see Fault SPEC below)
    #[arg(long = "fault", value_name = "SPEC", value_parser = parse_fault)]
    faults: Vec<Fault>,

    /// vllm decode: accept a request without a KV hand-off (x-mock-kv: recomputed)
    #[arg(long)]
    allow_recompute: bool,

    /// vllm nixl: vLLM's `bidirectional_kv_xfer` (a decode keeps a finished
    /// request's blocks for the session's next prefill, which reads them)
    #[arg(long)]
    bidirectional: bool,

    /// How long sglang waits for its peer, a trtllm decode for the context
    /// pull and a vllm mooncake/nixl_push/p2p_nccl decode for the KV, in ms
    #[arg(
        long = "bootstrap-timeout-ms",
        value_name = "MS",
        default_value = "10000",
        value_parser = parse_ms
    )]
    bootstrap_timeout: Duration,

    /// Delay between SSE events, in ms
    #[arg(
        long = "stream-delay-ms",
        value_name = "MS",
        default_value = "2",
        value_parser = parse_ms
    )]
    stream_delay: Duration,

    /// Let the mock dial non-loopback peers (off: such a peer fails like an unreachable one)
    #[arg(long)]
    allow_remote_peers: bool,

    /// Metric names on /metrics, whatever --engine
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = MetricsFormat::Vllm)]
    metrics_format: MetricsFormat,

    // allow_negative_numbers: "-1" is then refused by the range check, with
    // its reason, instead of being taken for an unknown flag.
    /// Added to the real in-flight count on /metrics
    #[arg(long, value_name = "N", default_value = "0", value_parser = parse_amount, allow_negative_numbers = true)]
    report_running: f64,

    /// Reported queued requests
    #[arg(long, value_name = "N", default_value = "0", value_parser = parse_amount, allow_negative_numbers = true)]
    report_waiting: f64,

    /// Reported KV-cache usage, a fraction in [0, 1]
    #[arg(long, value_name = "F", default_value = "0", value_parser = parse_fraction, allow_negative_numbers = true)]
    report_kv_usage: f64,

    /// Reported tokens/s (sglang metrics format only)
    #[arg(long, value_name = "N", default_value = "0", value_parser = parse_amount, allow_negative_numbers = true)]
    report_gen_throughput: f64,

    /// /metrics answers 500
    #[arg(long)]
    metrics_fail: bool,

    /// Prefill: accept what a real engine accepts instead of the strict prefill-leg rules
    #[arg(long)]
    lenient_prefill: bool,

    /// No access log on stderr and no /debug/requests record (for load tests)
    #[arg(long)]
    quiet: bool,

    /// vllm, sglang, default: the pod's own prefix-cache hits for any prompt,
    /// clamped to its prompt tokens (usage cached_tokens) [default: 0]
    #[arg(long, value_name = "N")]
    cached_tokens: Option<u64>,

    /// vllm: as vLLM < 0.31, a prefill writes no remote_prefill_cached_tokens
    /// into kv_transfer_params and a decode ignores it
    #[arg(long)]
    no_remote_cached_field: bool,

    /// vllm, default: as vLLM without --enable-prompt-tokens-details,
    /// "prompt_tokens_details": null
    #[arg(long)]
    no_prompt_tokens_details: bool,

    /// sglang: SGLang's --enable-cache-report, usage carries
    /// prompt_tokens_details.cached_tokens
    #[arg(long)]
    enable_cache_report: bool,

    /// sglang decode: report the prefill's cached count plus the whole prompt
    /// (the double count of SGLang issue 25972)
    #[arg(long)]
    double_count_cached: bool,

    /// vllm encode role: the EC connector it hands its output over with;
    /// vllm prefill: consume encoder output (each media item of a request
    /// must have been encoded) [encode role default: example]
    #[arg(long, value_enum)]
    ec_connector: Option<EcConnector>,

    /// vllm encode and prefill with --ec-connector example: the directory
    /// they share (ECExampleConnector's shared_storage_path)
    #[arg(long, value_name = "DIR")]
    ec_storage: Option<std::path::PathBuf>,
}

fn parse_ms(v: &str) -> Result<Duration, String> {
    v.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| format!("not a number of milliseconds: {e}"))
}

fn parse_non_empty(v: &str) -> Result<String, String> {
    if v.is_empty() {
        Err("must not be empty".to_string())
    } else {
        Ok(v.to_string())
    }
}

/// `NAME` or `NAME=PATH`; without a path the name stands for it.
fn parse_adapter(v: &str) -> Result<Adapter, String> {
    let (name, path) = v.split_once('=').unwrap_or((v, v));
    if name.is_empty() || path.is_empty() {
        return Err("NAME[=PATH]: neither may be empty".to_string());
    }
    Ok(Adapter {
        name: name.to_string(),
        path: path.to_string(),
    })
}

fn parse_number(v: &str, fraction: bool) -> Result<f64, String> {
    let n: f64 = v.parse().map_err(|e| format!("not a number: {e}"))?;
    check_load_value("the value", n, fraction)
}

fn parse_amount(v: &str) -> Result<f64, String> {
    parse_number(v, false)
}

fn parse_fraction(v: &str) -> Result<f64, String> {
    parse_number(v, true)
}

fn parse_fault(v: &str) -> Result<Fault, String> {
    match v {
        "garbage" => return Ok(Fault::Garbage),
        "no-kv-params" => return Ok(Fault::NoKvParams),
        "no-token-ids" => return Ok(Fault::NoTokenIds),
        "no-disagg-params" => return Ok(Fault::NoDisaggParams),
        "hang" => return Ok(Fault::Hang),
        "reset" => return Ok(Fault::Reset),
        "truncate" => return Ok(Fault::Truncate),
        "error-event" => return Ok(Fault::ErrorEvent),
        "fail-when-asked" => return Ok(Fault::FailWhenAsked),
        "fail-after-transfer" => return Ok(Fault::FailAfterTransfer(DEFAULT_FAIL_AFTER_TRANSFER)),
        _ => {}
    }
    if let Some(ms) = v.strip_prefix("fail-after-transfer:") {
        return parse_ms(ms)
            .map(Fault::FailAfterTransfer)
            .map_err(|e| format!("fail-after-transfer:MS: {e}"));
    }
    if let Some(name) = v.strip_prefix("fail-from:") {
        if name.is_empty() {
            return Err("fail-from:NAME: NAME is a prefill pod's --name".to_string());
        }
        return Ok(Fault::FailFrom(name.to_owned()));
    }
    if let Some(n) = v.strip_prefix("fail-after:") {
        return n
            .parse::<u64>()
            .map(Fault::FailAfter)
            .map_err(|e| format!("fail-after:N: not a count: {e}"));
    }
    if let Some(n) = v.strip_prefix("status:") {
        let code: u16 = n
            .parse()
            .map_err(|e| format!("status:N: not a status: {e}"))?;
        if !(100..=599).contains(&code) {
            return Err("status:N: N must be in 100..=599".to_string());
        }
        return Ok(Fault::Status(code));
    }
    if let Some(ms) = v.strip_prefix("delay:") {
        return parse_ms(ms)
            .map(Fault::Delay)
            .map_err(|e| format!("delay:MS: {e}"));
    }
    Err("unknown fault (see Fault SPEC in --help)".to_string())
}

/// The E/P/D flags that cannot work: an encoder of another engine than
/// vLLM, or a shared-storage connector without its directory.
fn check_epd(config: &Config) -> Result<(), clap::Error> {
    let bad = |m: &str| Err(Cli::command().error(ErrorKind::ArgumentConflict, m));
    if config.role == Role::Encode && config.engine != Engine::Vllm {
        return bad("--role encode is vLLM's E/P/D encoder: --engine vllm only");
    }
    let uses_ec = config.engine == Engine::Vllm && config.role != Role::Decode;
    if uses_ec && config.ec_connector == Some(EcConnector::Example) && config.ec_storage.is_none() {
        return bad("--ec-connector example needs --ec-storage DIR (the encoders' and prefills' shared directory)");
    }
    Ok(())
}

/// Parses a full command line, program name first. On `--help` or a bad
/// flag the error is clap's: `Error::exit` prints it and exits 0 or 2.
pub fn parse<I, T>(args: I) -> Result<Config, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Cli::try_parse_from(args)?.into_config()
}

impl Cli {
    fn into_config(mut self) -> Result<Config, clap::Error> {
        let (faults, fail_after) = split_fail_after(std::mem::take(&mut self.faults))?;
        let config = self.config(faults, fail_after);
        check_epd(&config)?;
        // Flags that do not apply are ignored rather than fatal, so a test
        // harness can pass one flag set to every pod; the warning still
        // shows the mistake.
        let mut ignored = self.ignored_handoff_flags(&config);
        ignored.extend(self.ignored_fault_and_usage_flags(&config));
        for flag in ignored {
            eprintln!("mock-engine: warning: ignoring {flag}");
        }
        Ok(config)
    }

    /// The flags' values, with the defaults of the options that have none
    /// in clap (see the comment above `connector`).
    fn config(&self, faults: Vec<Fault>, fail_after: Option<u64>) -> Config {
        let loopback_any = SocketAddr::from(([127, 0, 0, 1], 0));
        Config {
            engine: self.engine,
            role: self.role,
            name: self.name.clone(),
            model: self
                .model
                .clone()
                .unwrap_or_else(|| DEFAULT_MODEL.to_string()),
            adapters: self.adapters.clone(),
            enforce_model: self.model.is_some(),
            listen: self.listen,
            connector: self.connector.unwrap_or(Connector::Nixl),
            bootstrap_listen: self.bootstrap_listen.unwrap_or(loopback_any),
            side_listen: self.side_listen.unwrap_or(loopback_any),
            zmq_listen: self.zmq_listen.unwrap_or(loopback_any),
            advertise_host: self.advertise_host.clone(),
            dp_size: self.dp_size.unwrap_or(1),
            query_unavailable: self.query_unavailable.unwrap_or(Duration::ZERO),
            engine_id: self.engine_id.clone().unwrap_or_else(|| self.name.clone()),
            auth_key: self.auth_key.clone(),
            ctx_endpoint_list: self.ctx_endpoint_list,
            faults,
            fail_after,
            allow_recompute: self.allow_recompute,
            bidirectional: self.bidirectional,
            bootstrap_timeout: self.bootstrap_timeout,
            stream_delay: self.stream_delay,
            allow_remote_peers: self.allow_remote_peers,
            metrics_format: self.metrics_format,
            load: Load {
                running: self.report_running,
                waiting: self.report_waiting,
                kv_usage: self.report_kv_usage,
                gen_throughput: self.report_gen_throughput,
                metrics_fail: self.metrics_fail,
            },
            lenient_prefill: self.lenient_prefill,
            quiet: self.quiet,
            cached_tokens: self.cached_tokens.unwrap_or(0),
            remote_cached_field: !self.no_remote_cached_field,
            prompt_tokens_details: !self.no_prompt_tokens_details,
            enable_cache_report: self.enable_cache_report,
            double_count_cached: self.double_count_cached,
            ec_connector: match (self.role, self.ec_connector) {
                (Role::Encode, None) => Some(EcConnector::Example),
                (_, c) => c,
            },
            ec_storage: self.ec_storage.clone(),
        }
    }

    /// The listener, hand-off and role flags given where they do not apply.
    fn ignored_handoff_flags(&self, config: &Config) -> Vec<&'static str> {
        let (engine, role) = (config.engine, config.role);
        let mooncake_prefill = config.vllm(Connector::Mooncake) && role == Role::Prefill;
        let push_prefill = config.vllm(Connector::NixlPush) && role == Role::Prefill;
        [
            (
                self.connector.is_some() && engine != Engine::Vllm,
                "--connector (vllm only)",
            ),
            (
                self.bootstrap_listen.is_some() && !config.needs_bootstrap(),
                "--bootstrap-listen (sglang prefill and vllm mooncake prefill only)",
            ),
            (
                self.side_listen.is_some() && !config.needs_side_channel(),
                "--side-listen (vllm nixl/shfs/mooncake/nixl_push prefill and trtllm prefill only)",
            ),
            (
                self.zmq_listen.is_some() && !config.needs_zmq(),
                "--zmq-listen (vllm p2p_nccl only)",
            ),
            (
                config.advertise_host.is_some() && !config.advertise_host_applies(),
                "--advertise-host (vllm nixl/shfs/mooncake/nixl_push prefill only)",
            ),
            (
                self.dp_size.is_some() && !config.dp_size_applies(),
                "--dp-size (sglang and vllm mooncake prefill only)",
            ),
            (
                self.query_unavailable.is_some() && !mooncake_prefill,
                "--query-unavailable-ms (vllm mooncake prefill only)",
            ),
            (
                self.engine_id.is_some() && !push_prefill,
                "--engine-id (vllm nixl_push prefill only)",
            ),
            (
                config.auth_key.is_some() && !(engine == Engine::Trtllm && role == Role::Decode),
                "--auth-key (trtllm decode only)",
            ),
            (
                config.ctx_endpoint_list && !(engine == Engine::Trtllm && role == Role::Prefill),
                "--ctx-endpoint-list (trtllm prefill only)",
            ),
            (
                config.lenient_prefill && role != Role::Prefill,
                "--lenient-prefill (prefill only)",
            ),
            (
                config.allow_recompute && !(engine == Engine::Vllm && role == Role::Decode),
                "--allow-recompute (vllm decode only)",
            ),
            (
                self.ec_connector.is_some() && !(engine == Engine::Vllm && role != Role::Decode),
                "--ec-connector (vllm encode and prefill only)",
            ),
        ]
        .into_iter()
        .filter_map(|(ignored, flag)| ignored.then_some(flag))
        .collect()
    }

    /// The fault and usage flags given where they do not apply.
    fn ignored_fault_and_usage_flags(&self, config: &Config) -> Vec<&'static str> {
        let (engine, role) = (config.engine, config.role);
        let trtllm_prefill = engine == Engine::Trtllm && role == Role::Prefill;
        [
            (
                config.has_fault(&Fault::NoKvParams) && !config.no_kv_params_applies(),
                "--fault no-kv-params (vllm nixl/shfs/nixl_push prefill only)",
            ),
            (
                config.has_fault(&Fault::NoTokenIds) && !trtllm_prefill,
                "--fault no-token-ids (trtllm prefill only)",
            ),
            (
                config.has_fault(&Fault::NoDisaggParams) && !trtllm_prefill,
                "--fault no-disagg-params (trtllm prefill only)",
            ),
            (
                config.has_fault(&Fault::FailWhenAsked) && !trtllm_prefill,
                "--fault fail-when-asked (trtllm prefill only)",
            ),
            (
                config.fail_after_transfer().is_some()
                    && !(engine == Engine::Sglang && role == Role::Prefill),
                "--fault fail-after-transfer (sglang prefill only)",
            ),
            (
                self.cached_tokens.is_some() && engine == Engine::Trtllm,
                "--cached-tokens (vllm, sglang and default only)",
            ),
            (
                self.no_remote_cached_field && engine != Engine::Vllm,
                "--no-remote-cached-field (vllm only)",
            ),
            (
                self.no_prompt_tokens_details && config.flavor() != Flavor::Vllm,
                "--no-prompt-tokens-details (vllm and default only)",
            ),
            (
                self.enable_cache_report && engine != Engine::Sglang,
                "--enable-cache-report (sglang only)",
            ),
            (
                self.double_count_cached && !(engine == Engine::Sglang && role == Role::Decode),
                "--double-count-cached (sglang decode only)",
            ),
        ]
        .into_iter()
        .filter_map(|(ignored, flag)| ignored.then_some(flag))
        .collect()
    }
}

/// `--fault fail-after:N` taken out of the faults: given at most once, and
/// alone it means `status:500`.
fn split_fail_after(mut faults: Vec<Fault>) -> Result<(Vec<Fault>, Option<u64>), clap::Error> {
    let mut fail_after = None;
    for f in &faults {
        if let Fault::FailAfter(n) = f {
            if fail_after.replace(*n).is_some() {
                return Err(Cli::command().error(
                    ErrorKind::ArgumentConflict,
                    "--fault fail-after:N given twice",
                ));
            }
        }
    }
    faults.retain(|f| !matches!(f, Fault::FailAfter(_)));
    if fail_after.is_some() && faults.is_empty() {
        faults.push(Fault::Status(500));
    }
    Ok((faults, fail_after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(s: &str) -> Result<Config, clap::Error> {
        parse(std::iter::once("mock-engine").chain(s.split_whitespace()))
    }

    /// The flags `s` gives where they do not apply, as the warnings name them.
    fn ignored(s: &str) -> Vec<&'static str> {
        let mut cli =
            Cli::try_parse_from(std::iter::once("mock-engine").chain(s.split_whitespace()))
                .expect("valid");
        let (faults, fail_after) =
            split_fail_after(std::mem::take(&mut cli.faults)).expect("valid");
        let config = cli.config(faults, fail_after);
        let mut out = cli.ignored_handoff_flags(&config);
        out.extend(cli.ignored_fault_and_usage_flags(&config));
        out
    }

    #[test]
    fn flags_that_do_not_apply_are_named() {
        assert!(
            ignored("--engine vllm --role prefill --connector mooncake --dp-size 2").is_empty()
        );
        let names: Vec<&str> = ignored(
            "--engine trtllm --role decode --connector nixl --dp-size 2 --lenient-prefill \
             --fault no-token-ids --enable-cache-report",
        )
        .iter()
        .map(|w| w.split(' ').next().unwrap_or_default())
        .collect();
        assert_eq!(
            names,
            [
                "--connector",
                "--dp-size",
                "--lenient-prefill",
                "--fault",
                "--enable-cache-report"
            ]
        );
    }

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_full_command_line() {
        let c = line(
            "--engine vllm --role prefill --name p0 --connector=shfs --fault status:503 \
             --fault delay:20 --advertise-host 192.0.2.1 --bootstrap-timeout-ms 500",
        )
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
    fn model_and_adapters() {
        let c =
            line("--engine vllm --role decode --model base --lora a --lora=b=/w/b").expect("valid");
        assert_eq!(c.model, "base");
        assert!(c.enforce_model);
        let adapter = |name: &str, path: &str| Adapter {
            name: name.into(),
            path: path.into(),
        };
        assert_eq!(c.adapters, [adapter("a", "a"), adapter("b", "/w/b")]);
        assert!(c.serves_model("base") && c.serves_model("a") && c.serves_model("b"));
        assert!(!c.serves_model("c") && !c.serves_model("/w/b"));
        // Adapters without --model are listed, nothing is enforced.
        let c = line("--engine vllm --role decode --lora a").expect("valid");
        assert!(!c.enforce_model && c.serves_model("c"));
        for bad in ["--model=", "--lora=", "--lora =x", "--lora x="] {
            assert!(
                line(&format!("--engine vllm --role decode {bad}")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn defaults() {
        let c = line("--engine vllm --role decode").expect("valid");
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        assert_eq!(c.name, "mock");
        assert_eq!(c.model, "mock-model");
        assert!(!c.enforce_model && c.adapters.is_empty());
        assert!(c.serves_model("anything"));
        assert_eq!(c.listen, any);
        assert_eq!(c.connector, Connector::Nixl);
        assert_eq!(c.bootstrap_listen, any);
        assert_eq!(c.side_listen, any);
        assert_eq!(c.advertise_host, None);
        assert!(c.faults.is_empty());
        assert_eq!(c.fail_after, None);
        assert!(!c.allow_recompute);
        assert_eq!(c.bootstrap_timeout, Duration::from_millis(10_000));
        assert_eq!(c.stream_delay, Duration::from_millis(2));
        assert!(!c.allow_remote_peers);
        assert_eq!(c.zmq_listen, any);
        assert_eq!(c.dp_size, 1);
        assert_eq!(c.query_unavailable, Duration::ZERO);
        assert_eq!(c.engine_id, "mock");
        assert_eq!(c.auth_key, None);
        assert!(!c.ctx_endpoint_list);
        assert!(!c.needs_zmq());
    }

    #[test]
    fn parses_the_new_handoff_modes() {
        let c = line(
            "--engine vllm --role prefill --connector mooncake --dp-size 4 \
             --query-unavailable-ms 300 --bootstrap-listen 127.0.0.1:18998",
        )
        .expect("valid");
        assert_eq!(c.connector, Connector::Mooncake);
        assert_eq!(c.dp_size, 4);
        assert_eq!(c.query_unavailable, Duration::from_millis(300));
        assert!(c.needs_bootstrap() && c.needs_side_channel() && !c.needs_zmq());
        assert!(c.serves_responses());

        let c = line("--engine vllm --role prefill --connector nixl_push --name p --engine-id e1")
            .expect("valid");
        assert_eq!(c.connector, Connector::NixlPush);
        assert_eq!(c.engine_id, "e1");
        assert!(c.needs_side_channel() && !c.needs_bootstrap());
        let c = line("--engine vllm --role prefill --connector nixl-push --name p").expect("alias");
        assert_eq!(c.engine_id, "p", "the pod name by default");

        for role in ["prefill", "decode"] {
            let c = line(&format!(
                "--engine vllm --role {role} --connector p2p_nccl --zmq-listen 127.0.0.1:14579"
            ))
            .expect("valid");
            assert_eq!(c.connector, Connector::P2pNccl);
            assert!(c.needs_zmq() && !c.needs_side_channel() && !c.needs_bootstrap());
            assert_eq!(c.zmq_listen, SocketAddr::from(([127, 0, 0, 1], 14579)));
        }
        assert!(line("--engine vllm --role decode --connector p2p-nccl").is_ok());

        let c = line("--engine trtllm --role decode --auth-key k").expect("valid");
        assert_eq!(c.auth_key.as_deref(), Some("k"));
        let c = line("--engine trtllm --role prefill --ctx-endpoint-list").expect("valid");
        assert!(c.ctx_endpoint_list && !c.serves_responses());

        let c = line("--engine sglang --role decode --dp-size 2").expect("valid");
        assert_eq!(c.dp_size, 2);
        assert!(!c.serves_responses());
        assert!(!line("--engine vllm --role decode --connector neuron")
            .expect("valid")
            .serves_responses());
        assert!(line("--engine default --role decode")
            .expect("valid")
            .serves_responses());

        for bad in [
            "--dp-size 0",
            "--dp-size 1025",
            "--dp-size -1",
            "--dp-size x",
            "--query-unavailable-ms x",
            "--engine-id=",
            "--auth-key=",
            "--connector p2p",
            "--zmq-listen localhost:1",
            "--ctx-endpoint-list=1",
        ] {
            assert!(
                line(&format!("--engine vllm --role decode {bad}")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn epd_roles_and_their_connectors() {
        let c = line("--engine vllm --role encode --ec-storage /tmp/x").expect("valid");
        assert_eq!(c.ec_connector, Some(EcConnector::Example), "the default");
        assert!(!c.needs_side_channel());
        let c = line("--engine vllm --role encode --ec-connector nixl").expect("valid");
        assert!(c.needs_side_channel(), "prefills pull from it");
        let c = line("--engine vllm --role prefill").expect("valid");
        assert_eq!(c.ec_connector, None, "a prefill encodes its own media");
        let kind = |s: &str| line(s).expect_err(s).kind();
        assert_eq!(
            kind("--engine sglang --role encode"),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            kind("--engine vllm --role encode"),
            ErrorKind::ArgumentConflict,
            "example without its shared directory"
        );
        assert_eq!(
            kind("--engine vllm --role prefill --ec-connector example"),
            ErrorKind::ArgumentConflict
        );
    }

    #[test]
    fn rejects_bad_input() {
        let kind = |s: &str| line(s).expect_err(s).kind();
        assert_eq!(kind("--engine vllm"), ErrorKind::MissingRequiredArgument);
        assert_eq!(kind("--engine foo --role decode"), ErrorKind::InvalidValue);
        assert_eq!(
            kind("--engine vllm --role decode --fault status:42"),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            kind("--engine vllm --role decode --listen"),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            kind("--engine vllm --role decode --listen localhost:1"),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            kind("--engine vllm --role decode --stream-delay-ms 1.5"),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            kind("--engine vllm --role decode --nope"),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            kind("--engine vllm --role decode stray"),
            ErrorKind::UnknownArgument
        );
        assert_eq!(kind("--help"), ErrorKind::DisplayHelp);
        assert_eq!(kind("-h"), ErrorKind::DisplayHelp);
    }

    #[test]
    fn a_repeated_flag_takes_the_last_value() {
        let c =
            line("--engine vllm --role decode --name a --name b --engine sglang --quiet --quiet")
                .expect("valid");
        assert_eq!(c.name, "b");
        assert_eq!(c.engine, Engine::Sglang);
        assert!(c.quiet);
    }

    #[test]
    fn parses_new_faults() {
        let c = line(
            "--engine sglang --role prefill --fault reset --fault=truncate \
             --fault fail-after-transfer",
        )
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
        let c =
            line("--engine sglang --role prefill --fault fail-after-transfer:0").expect("valid");
        assert_eq!(c.fail_after_transfer(), Some(Duration::ZERO));
        assert_eq!(c.fail_after, None);
        assert_eq!(c.faults_for(0), c.faults.as_slice());

        // Alone, fail-after:N means status:500 after N requests.
        let c = line("--engine default --role decode --fault fail-after:2").expect("valid");
        assert_eq!(c.fail_after, Some(2));
        assert_eq!(c.faults, vec![Fault::Status(500)]);
        assert!(c.faults_for(0).is_empty());
        assert!(c.faults_for(1).is_empty());
        assert_eq!(c.faults_for(2), [Fault::Status(500)]);
        assert_eq!(c.faults_for(100), [Fault::Status(500)]);

        // With other faults, it delays them, wherever it is on the line.
        let c = line(
            "--engine default --role decode --fault reset --fault fail-after:1 --fault delay:5",
        )
        .expect("valid");
        assert_eq!(
            c.faults,
            vec![Fault::Reset, Fault::Delay(Duration::from_millis(5))]
        );
        assert!(c.faults_for(0).is_empty());
        assert_eq!(c.faults_for(1), c.faults.as_slice());

        let c = line("--engine default --role decode --fault fail-after:0").expect("valid");
        assert_eq!(c.faults_for(0), [Fault::Status(500)]);

        for bad in [
            "--fault fail-after:",
            "--fault fail-after:-1",
            "--fault fail-after:x",
            "--fault fail-after:1 --fault fail-after:2",
            "--fault fail-after-transfer:x",
            "--fault fail-after-transfer:",
            "--fault resets",
            "--fault delay:-5",
            "--fault status:600",
            "--fault status:abc",
        ] {
            let line_ = format!("--engine vllm --role decode {bad}");
            assert!(line(&line_).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_usage_flags() {
        let c = line("--engine vllm --role decode").expect("valid");
        assert_eq!(c.cached_tokens, 0);
        assert!(c.remote_cached_field && c.prompt_tokens_details);
        assert!(!c.enable_cache_report && !c.double_count_cached);
        assert_eq!(c.flavor(), Flavor::Vllm);
        let c = line(
            "--engine vllm --role prefill --cached-tokens 12 --no-remote-cached-field \
             --no-prompt-tokens-details",
        )
        .expect("valid");
        assert_eq!(c.cached_tokens, 12);
        assert!(!c.remote_cached_field && !c.prompt_tokens_details);
        let c = line(
            "--engine sglang --role decode --cached-tokens=3 --enable-cache-report \
             --double-count-cached",
        )
        .expect("valid");
        assert_eq!(c.cached_tokens, 3);
        assert!(c.enable_cache_report && c.double_count_cached);
        assert_eq!(c.flavor(), Flavor::Sglang);
        assert_eq!(
            line("--engine default --role decode")
                .expect("valid")
                .flavor(),
            Flavor::Vllm
        );
        assert_eq!(
            line("--engine trtllm --role decode")
                .expect("valid")
                .flavor(),
            Flavor::Trtllm
        );
        for bad in [
            "--cached-tokens -1",
            "--cached-tokens x",
            "--cached-tokens 1.5",
            "--enable-cache-report=1",
        ] {
            assert!(
                line(&format!("--engine vllm --role decode {bad}")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn parses_bench_switches() {
        let c = line("--engine sglang --role prefill --lenient-prefill --quiet").expect("valid");
        assert!(c.lenient_prefill);
        assert!(c.quiet);
        assert!(line("--engine sglang --role prefill --lenient-prefill=1").is_err());
        assert!(line("--engine sglang --role prefill --quiet=yes").is_err());
        assert!(line("--engine sglang --role prefill --quiet=true").is_err());
    }

    #[test]
    fn parses_load_reporting() {
        let c = line("--engine vllm --role decode").expect("valid");
        assert_eq!(c.metrics_format, MetricsFormat::Vllm);
        assert_eq!(c.load, Load::default());
        assert!(!c.lenient_prefill);
        assert!(!c.quiet);
        let c = line(
            "--engine sglang --role decode --metrics-format sglang --report-running 2.5 \
             --report-waiting=7 --report-kv-usage 0.75 --report-gen-throughput 120 --metrics-fail",
        )
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
            let line_ = format!("--engine vllm --role decode {bad}");
            let e = line(&line_).expect_err(bad);
            assert_eq!(
                e.kind() == ErrorKind::ValueValidation,
                !bad.starts_with("--metrics-"),
                "{bad}: {e}"
            );
        }
    }

    /// Every mock-engine command line that tests/e2e/*.rs (after the
    /// harness's `--name`), bench/run.py and scripts/demo.sh run, with the
    /// values they pass: a flag dropped or renamed here breaks them.
    #[test]
    fn every_flag_in_use_parses() {
        let e2e = "--name n";
        let bench = "--name n --model bench-model --quiet";
        let mut lines = Vec::new();
        for engine in ["vllm", "sglang", "trtllm", "default"] {
            for role in ["prefill", "decode"] {
                lines.push(format!("{e2e} --engine {engine} --role {role}"));
                lines.push(format!("{bench} --engine {engine} --role {role}"));
            }
        }
        for connector in ["nixl", "shfs", "neuron"] {
            for role in ["prefill", "decode"] {
                lines.push(format!(
                    "{e2e} --engine vllm --role {role} --connector {connector}"
                ));
            }
        }
        for fault in [
            "status:400",
            "status:429",
            "status:500",
            "status:503",
            "garbage",
            "truncate",
            "reset",
            "hang",
            "delay:400",
            "delay:600",
            "delay:5000",
        ] {
            for role in ["prefill", "decode"] {
                lines.push(format!(
                    "{e2e} --engine default --role {role} --fault {fault}"
                ));
            }
        }
        lines.extend(
            [
                // tests/e2e
                "--name n --engine vllm --role prefill --fault delay:600",
                "--name n --engine vllm --role prefill --connector shfs --advertise-host 192.0.2.1",
                "--name n --engine vllm --role prefill --connector nixl --advertise-host 192.0.2.1",
                "--name n --engine vllm --role prefill --connector nixl --fault no-kv-params",
                "--name n --engine vllm --role prefill --fault no-kv-params",
                "--name n --engine vllm --role decode --connector nixl --allow-recompute",
                "--name n --engine vllm --role decode --allow-recompute",
                "--name n --engine sglang --role prefill --bootstrap-timeout-ms 3000",
                "--name n --engine sglang --role prefill --fault status:500",
                "--name n --engine sglang --role decode --bootstrap-timeout-ms 30000",
                "--name n --engine sglang --role prefill --fault fail-after-transfer",
                "--name n --engine sglang --role decode --stream-delay-ms 30",
                "--name n --engine vllm --role decode --connector nixl --stream-delay-ms 150",
                "--name n --engine vllm --role decode --stream-delay-ms 100",
                "--name n --engine vllm --role decode --stream-delay-ms 20",
                "--name n --engine default --role prefill --listen 127.0.0.1:45678",
                "--name n --engine vllm --role decode --model m --lora a --lora b=/w/b",
                // bench/run.py
                "--name n --model bench-model --quiet --engine vllm --role prefill --connector nixl \
                 --lenient-prefill",
                "--name n --model bench-model --quiet --engine sglang --role prefill --lenient-prefill",
                // scripts/demo.sh
                "--name n --engine vllm --role prefill --listen 127.0.0.1:8100 --model demo/vllm",
                "--name n --engine vllm --role decode --listen 127.0.0.1:8200 --model demo/vllm",
                "--name n --engine sglang --role prefill --listen 127.0.0.1:8101 \
                 --bootstrap-listen 127.0.0.1:18998 --model demo/sglang",
                "--name n --engine sglang --role decode --listen 127.0.0.1:8201 --model demo/sglang",
                "--name n --engine trtllm --role prefill --listen 127.0.0.1:8102 --model demo/trtllm",
                "--name n --engine trtllm --role decode --listen 127.0.0.1:8202 --model demo/trtllm",
            ]
            .map(str::to_string),
        );
        for l in &lines {
            if let Err(e) = line(l) {
                panic!("{l}: {e}");
            }
        }
        let c = line(
            "--name s --engine sglang --role prefill --listen 127.0.0.1:8101 \
             --bootstrap-listen 127.0.0.1:18998 --model demo/sglang --quiet --lenient-prefill",
        )
        .expect("valid");
        assert_eq!(c.name, "s");
        assert_eq!(c.model, "demo/sglang");
        assert_eq!(c.listen, SocketAddr::from(([127, 0, 0, 1], 8101)));
        assert_eq!(
            c.bootstrap_listen,
            SocketAddr::from(([127, 0, 0, 1], 18998))
        );
        assert!(c.quiet && c.lenient_prefill);
    }
}

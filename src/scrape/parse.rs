//! Load signals of one engine pod, read from its Prometheus `/metrics` page.
//!
//! Load-aware routing needs a handful of numbers per pod (requests running and
//! queued, KV-cache usage, a few counters), while a vLLM or SGLang page carries
//! hundreds of series, mostly histogram buckets. The parser is hand-written
//! rather than a Prometheus crate because it runs inside the Envoy wasm sandbox
//! on every scrape of every pod: it walks the text once, rejects a line on its
//! metric name before looking at the labels, never allocates, and treats
//! whatever it cannot read (a sidecar's HTML error page, a truncated body, a
//! future format) as "not exported" instead of failing the scrape or panicking.
//!
//! Accepted: the Prometheus text format 0.0.4 and its OpenMetrics cousin —
//! `# HELP`/`# TYPE`/`# EOF` comments, blank lines, CRLF, label values with
//! `\\`, `\"`, `\n` escapes (and commas or braces inside the quotes), optional
//! timestamps, OpenMetrics exemplars (`# {...} v`), and the Prometheus 3
//! quoted-name form `{"vllm:num_requests_running",model_name="m"} 3`.

/// Load signals one engine pod exports. `None` = not exported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineMetrics {
    /// Requests running (in the engine's batch).
    pub running: Option<f64>,
    /// Requests queued, waiting to be scheduled.
    pub waiting: Option<f64>,
    /// KV-cache usage as a fraction in [0, 1].
    pub kv_usage: Option<f64>,
    /// Counter of generated tokens.
    pub generation_tokens_total: Option<f64>,
    /// Counter of finished requests.
    pub requests_finished_total: Option<f64>,
    /// Generation throughput in tokens/s, if the engine exports such a gauge.
    pub gen_throughput: Option<f64>,
}

/// Lines longer than this are skipped unread: no engine writes one, and a
/// page that does is not worth the time of a worker thread.
const MAX_LINE: usize = 64 * 1024;

/// Which [`EngineMetrics`] field a series feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    Running,
    Waiting,
    /// vLLM ≥ 0.9 `kv_cache_usage_perc`, SGLang `token_usage`.
    KvUsage,
    /// vLLM's older `gpu_cache_usage_perc`, used only when the newer is absent.
    KvUsageLegacy,
    GenerationTokens,
    RequestsFinished,
    GenThroughput,
}

const SIGNALS: usize = 7;

impl Signal {
    fn index(self) -> usize {
        self as usize
    }
}

/// Exact sample names (counters with their `_total` suffix, as exposed).
/// `_created` series, histogram buckets and everything else never match.
const METRICS: &[(&str, Signal)] = &[
    // vLLM (v0 `vllm/engine/metrics.py`, v1 `vllm/v1/metrics/loggers.py`).
    ("vllm:num_requests_running", Signal::Running),
    ("vllm:num_requests_waiting", Signal::Waiting),
    ("vllm:kv_cache_usage_perc", Signal::KvUsage),
    ("vllm:gpu_cache_usage_perc", Signal::KvUsageLegacy),
    ("vllm:generation_tokens_total", Signal::GenerationTokens),
    ("vllm:request_success_total", Signal::RequestsFinished),
    (
        "vllm:avg_generation_throughput_toks_per_s",
        Signal::GenThroughput,
    ),
    // SGLang (`python/sglang/srt/metrics/collector.py`).
    ("sglang:num_running_reqs", Signal::Running),
    ("sglang:num_queue_reqs", Signal::Waiting),
    ("sglang:token_usage", Signal::KvUsage),
    ("sglang:generation_tokens_total", Signal::GenerationTokens),
    ("sglang:num_requests_total", Signal::RequestsFinished),
    ("sglang:gen_throughput", Signal::GenThroughput),
];

/// Labels that name the model a series belongs to.
const MODEL_LABELS: &[&str] = &["model_name", "model"];

/// Sum and count of the matching samples of one signal.
#[derive(Clone, Copy, Default)]
struct Acc {
    sum: f64,
    n: u64,
}

impl Acc {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.n = self.n.saturating_add(1);
    }

    fn sum(self) -> Option<f64> {
        (self.n > 0 && self.sum.is_finite()).then_some(self.sum)
    }

    fn mean(self) -> Option<f64> {
        self.sum().map(|s| s / self.n as f64)
    }
}

/// Parses Prometheus text exposition. When `model` is Some, series that carry a
/// `model_name` (vLLM) or `model_name`/`model` label for a different model are
/// ignored; series without such a label count. Values of several matching series
/// of one metric are summed (e.g. vllm:request_success_total has one series per
/// finished_reason). Never panics, whatever the input.
///
/// Exception to the sum: KV-cache usage is a fraction per engine, so several
/// series (vLLM data-parallel `engine="0"`, `engine="1"`, SGLang `dp_rank`)
/// are averaged, then clamped into [0, 1]; `vllm:kv_cache_usage_perc` wins
/// over the deprecated `vllm:gpu_cache_usage_perc` when both are exported.
/// Samples that are NaN, ±Inf or negative (none of these signals can be) are
/// ignored, as are lines over 64 KiB and lines that do not parse.
pub fn parse_engine_metrics(text: &str, model: Option<&str>) -> EngineMetrics {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut acc = [Acc::default(); SIGNALS];
    for line in text.split('\n') {
        if line.len() > MAX_LINE {
            continue;
        }
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some((signal, value)) = parse_line(line, model) {
            if let Some(a) = acc.get_mut(signal.index()) {
                a.add(value);
            }
        }
    }
    let get = |s: Signal| acc.get(s.index()).copied().unwrap_or_default();
    EngineMetrics {
        running: get(Signal::Running).sum(),
        waiting: get(Signal::Waiting).sum(),
        kv_usage: get(Signal::KvUsage)
            .mean()
            .or_else(|| get(Signal::KvUsageLegacy).mean())
            .map(|v| v.clamp(0.0, 1.0)),
        generation_tokens_total: get(Signal::GenerationTokens).sum(),
        requests_finished_total: get(Signal::RequestsFinished).sum(),
        gen_throughput: get(Signal::GenThroughput).sum(),
    }
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while b.get(i).copied().is_some_and(is_space) {
        i += 1;
    }
    i
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_char(b: u8) -> bool {
    is_name_start(b) || b.is_ascii_digit()
}

/// The signal a metric name feeds; `raw` may carry label-value escapes (the
/// quoted-name form), compared as their unescaped text.
fn lookup(raw: &str) -> Option<Signal> {
    METRICS
        .iter()
        .find(|(name, _)| unescaped_eq(raw, name))
        .map(|&(_, s)| s)
}

/// Whether the escaped label value `raw` (the bytes between the quotes)
/// denotes exactly `want`. Like Prometheus, only `\\`, `\"` and `\n` are
/// escapes; any other backslash stands for itself.
fn unescaped_eq(raw: &str, want: &str) -> bool {
    let mut want = want.bytes();
    let mut raw = raw.bytes().peekable();
    while let Some(b) = raw.next() {
        let c = if b == b'\\' {
            match raw.peek().copied() {
                Some(e @ (b'\\' | b'"')) => {
                    raw.next();
                    e
                }
                Some(b'n') => {
                    raw.next();
                    b'\n'
                }
                _ => b'\\',
            }
        } else {
            b
        };
        if want.next() != Some(c) {
            return false;
        }
    }
    want.next().is_none()
}

/// The escaped contents of the quoted string opening at `line[start]` (a
/// `"`), and the index just past its closing quote. None if unterminated.
fn quoted(line: &str, start: usize) -> Option<(&str, usize)> {
    let b = line.as_bytes();
    let mut i = start + 1;
    loop {
        match *b.get(i)? {
            b'"' => return Some((line.get(start + 1..i)?, i + 1)),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// Reads one sample line: the signal it feeds and its value, or None for a
/// comment, a blank line, a series we do not read, another model's series,
/// an unusable value, or anything malformed.
fn parse_line(line: &str, model: Option<&str>) -> Option<(Signal, f64)> {
    let b = line.as_bytes();
    let i = skip_space(b, 0);
    match b.get(i) {
        None | Some(b'#') => return None,
        _ => {}
    }
    let (mut signal, i) = bare_name(line, i)?;
    let i = skip_space(b, i);
    let i = if b.get(i) == Some(&b'{') {
        labels(line, i + 1, model, &mut signal)?
    } else {
        i
    };
    let value = sample_value(line.get(i..)?)?;
    Some((signal?, value))
}

/// The bare metric name starting at `i`, if any: its signal (`None` when
/// the name is absent, as in the quoted-name form) and the index after it.
/// Unknown names end the line before any label is read.
fn bare_name(line: &str, start: usize) -> Option<(Option<Signal>, usize)> {
    let b = line.as_bytes();
    let mut i = start;
    while b.get(i).copied().is_some_and(is_name_char) {
        i += 1;
    }
    if i == start {
        return Some((None, i));
    }
    if !b.get(start).copied().is_some_and(is_name_start) {
        return None;
    }
    Some((Some(lookup(line.get(start..i)?)?), i))
}

/// Reads the label set after its `{` (at `i`), rejecting another model's
/// series; a quoted metric name inside the braces sets `signal`. Returns the
/// index after the `}`.
fn labels(
    line: &str,
    mut i: usize,
    model: Option<&str>,
    signal: &mut Option<Signal>,
) -> Option<usize> {
    let b = line.as_bytes();
    loop {
        i = skip_space(b, i);
        if *b.get(i)? == b'}' {
            return Some(i + 1);
        }
        let (name, quoted_name, next) = label_name(line, i)?;
        i = skip_space(b, next);
        if *b.get(i)? == b'=' {
            i = skip_space(b, i + 1);
            if *b.get(i)? != b'"' {
                return None;
            }
            let (value, next) = quoted(line, i)?;
            i = next;
            if let Some(want) = model {
                if MODEL_LABELS.iter().any(|l| unescaped_eq(name, l)) && !unescaped_eq(value, want)
                {
                    return None;
                }
            }
        } else if quoted_name && signal.is_none() {
            // `{"metric:name", ...}`: the metric name inside the braces.
            *signal = Some(lookup(name)?);
        } else {
            return None;
        }
        i = skip_space(b, i);
        match *b.get(i)? {
            b',' => i += 1,
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// A label name at `i`: bare, or quoted (Prometheus 3 UTF-8 names). Returns
/// the raw name, whether it was quoted, and the index after it.
fn label_name(line: &str, i: usize) -> Option<(&str, bool, usize)> {
    let b = line.as_bytes();
    if *b.get(i)? == b'"' {
        let (raw, next) = quoted(line, i)?;
        return Some((raw, true, next));
    }
    let mut end = i;
    while b.get(end).copied().is_some_and(is_name_char) {
        end += 1;
    }
    if end == i || b.get(i).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    Some((line.get(i..end)?, false, end))
}

/// The value after the labels, then an optional timestamp, then an
/// optional exemplar.
fn sample_value(rest: &str) -> Option<f64> {
    let mut tokens = rest.split(is_space_char).filter(|t| !t.is_empty());
    let value: f64 = tokens.next()?.parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    match tokens.next() {
        None => {}
        Some(t) if t.starts_with('#') => {}
        Some(timestamp) => {
            timestamp.parse::<f64>().ok()?;
            match tokens.next() {
                None => {}
                Some(t) if t.starts_with('#') => {}
                Some(_) => return None,
            }
        }
    }
    Some(value)
}

fn is_space_char(c: char) -> bool {
    c == ' ' || c == '\t'
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

    /// vLLM v1 (0.10-style) with two data-parallel engines, `_created`
    /// series, histograms, both KV-usage names, and a second model's series
    /// (as on an aggregated page).
    const VLLM_V1: &str = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3.0
vllm:num_requests_running{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 2.0
vllm:num_requests_running{engine=\"0\",model_name=\"other/model\"} 40.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1.0
vllm:num_requests_waiting{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0
vllm:num_requests_waiting{engine=\"0\",model_name=\"other/model\"} 9.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.9
vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.9
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.5
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.25
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"other/model\"} 1.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 12000.0
vllm:generation_tokens_total{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3456.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1.7286e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 100.0
vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 20.0
vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0
vllm:request_success_total{engine=\"1\",finished_reason=\"stop\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 5.0
vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"other/model\"} 777.0
vllm:request_success_created{engine=\"0\",finished_reason=\"stop\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1.7286e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 125.0
vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 125.0
vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 7.25
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation=\"0\"} 12345.0
";

    /// vLLM v0 (0.5-style): one model, no `_created`, only the old KV name,
    /// and the average-throughput gauges.
    const VLLM_V0: &str = "\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name=\"mistral-7b\"} 7.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name=\"mistral-7b\"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name=\"mistral-7b\"} 4.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name=\"mistral-7b\"} 0.8125
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name=\"mistral-7b\"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name=\"mistral-7b\"} 98765.0
# HELP vllm:avg_generation_throughput_toks_per_s Average generation throughput in tokens/s.
# TYPE vllm:avg_generation_throughput_toks_per_s gauge
vllm:avg_generation_throughput_toks_per_s{model_name=\"mistral-7b\"} 512.5
# HELP vllm:avg_prompt_throughput_toks_per_s Average prefill throughput in tokens/s.
# TYPE vllm:avg_prompt_throughput_toks_per_s gauge
vllm:avg_prompt_throughput_toks_per_s{model_name=\"mistral-7b\"} 2048.0
";

    /// SGLang: scheduler gauges carry engine_type/tp_rank/pp_rank (and
    /// dp_rank with data parallelism), tokenizer counters only model_name.
    const SGLANG: &str = "\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank=\"0\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 6.0
sglang:num_running_reqs{dp_rank=\"1\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 4.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{dp_rank=\"0\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 31337.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank=\"0\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 0.3
sglang:token_usage{dp_rank=\"1\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 0.1
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{dp_rank=\"0\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 800.5
sglang:gen_throughput{dp_rank=\"1\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 199.5
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank=\"0\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 2.0
sglang:num_queue_reqs{dp_rank=\"1\",engine_type=\"unified\",model_name=\"qwen/qwen2.5-7b\",pp_rank=\"0\",tp_rank=\"0\"} 1.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name=\"qwen/qwen2.5-7b\"} 500000.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name=\"qwen/qwen2.5-7b\"} 250000.0
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name=\"qwen/qwen2.5-7b\"} 1000.0
sglang:num_requests_created{model_name=\"qwen/qwen2.5-7b\"} 1.7286e+09
# HELP sglang:num_aborted_requests_total Number of requests aborted.
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{model_name=\"qwen/qwen2.5-7b\"} 3.0
";

    fn approx(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn vllm_v1_sums_engines_and_filters_model() {
        let m = parse_engine_metrics(VLLM_V1, Some(MODEL));
        assert_eq!(m.running, Some(5.0));
        assert_eq!(m.waiting, Some(1.0));
        // Newer name wins over the deprecated one; engines are averaged.
        assert!(approx(m.kv_usage, 0.375), "{m:?}");
        assert_eq!(m.generation_tokens_total, Some(15456.0));
        // stop + length + abort on engine 0, stop on engine 1; not `_created`.
        assert_eq!(m.requests_finished_total, Some(125.0));
        assert_eq!(m.gen_throughput, None);
    }

    #[test]
    fn vllm_v1_without_model_counts_every_series() {
        let m = parse_engine_metrics(VLLM_V1, None);
        assert_eq!(m.running, Some(45.0));
        assert_eq!(m.waiting, Some(10.0));
        assert!(approx(m.kv_usage, (0.5 + 0.25 + 1.0) / 3.0), "{m:?}");
        assert_eq!(m.requests_finished_total, Some(902.0));
    }

    #[test]
    fn unknown_model_sees_nothing() {
        let m = parse_engine_metrics(VLLM_V1, Some("nope"));
        assert_eq!(m, EngineMetrics::default());
    }

    #[test]
    fn vllm_v0_legacy_names() {
        let m = parse_engine_metrics(VLLM_V0, Some("mistral-7b"));
        assert_eq!(
            m,
            EngineMetrics {
                running: Some(7.0),
                waiting: Some(4.0),
                kv_usage: Some(0.8125),
                generation_tokens_total: Some(98765.0),
                requests_finished_total: None,
                gen_throughput: Some(512.5),
            }
        );
    }

    #[test]
    fn sglang_sample() {
        let m = parse_engine_metrics(SGLANG, Some("qwen/qwen2.5-7b"));
        assert_eq!(m.running, Some(10.0));
        assert_eq!(m.waiting, Some(3.0));
        assert!(approx(m.kv_usage, 0.2), "{m:?}");
        assert_eq!(m.gen_throughput, Some(1000.0));
        assert_eq!(m.generation_tokens_total, Some(250000.0));
        assert_eq!(m.requests_finished_total, Some(1000.0));
        assert_eq!(
            parse_engine_metrics(SGLANG, Some("qwen")),
            EngineMetrics::default()
        );
    }

    #[test]
    fn missing_metrics_are_none() {
        assert_eq!(parse_engine_metrics("", None), EngineMetrics::default());
        assert_eq!(
            parse_engine_metrics("# HELP x y\n# TYPE x gauge\nx 1\n\n# EOF\n", None),
            EngineMetrics::default()
        );
        let m = parse_engine_metrics("vllm:num_requests_waiting 0\n", Some(MODEL));
        assert_eq!(
            m,
            EngineMetrics {
                waiting: Some(0.0),
                ..EngineMetrics::default()
            }
        );
    }

    #[test]
    fn series_without_model_label_count() {
        let text = "vllm:num_requests_running 2\n\
                    vllm:num_requests_running{engine=\"1\"} 3\n\
                    vllm:num_requests_running{model_name=\"b\"} 100\n\
                    vllm:num_requests_running{model=\"b\"} 1000\n\
                    vllm:num_requests_running{model=\"a\"} 5\n\
                    vllm:num_requests_running{model=\"a\",model_name=\"b\"} 10000\n";
        assert_eq!(parse_engine_metrics(text, Some("a")).running, Some(10.0));
        assert_eq!(parse_engine_metrics(text, Some("b")).running, Some(1105.0));
        assert_eq!(parse_engine_metrics(text, None).running, Some(11110.0));
    }

    #[test]
    fn escaped_label_values() {
        // Model name `we"ird\model,{x}=1` plus a newline, escaped.
        let text = r#"vllm:num_requests_running{model_name="we\"ird\\model,{x}=1\n",engine="0"} 4
vllm:num_requests_running{engine="a,b=\"c\"}",model_name="we\"ird\\model,{x}=1\n"} 1
vllm:num_requests_running{model_name="we\"ird\\model,{x}=1"} 100
vllm:num_requests_running{model_name="plain"} 1000
vllm:num_requests_waiting{path="C:\temp\\x",model_name="plain"} 2
"#;
        let weird = "we\"ird\\model,{x}=1\n";
        let m = parse_engine_metrics(text, Some(weird));
        assert_eq!(m.running, Some(5.0));
        assert_eq!(m.waiting, None);
        let m = parse_engine_metrics(text, Some("plain"));
        assert_eq!(m.running, Some(1000.0));
        // An unknown escape (`\t`) is kept literally, not a parse error.
        assert_eq!(m.waiting, Some(2.0));
        assert!(unescaped_eq(r"C:\temp\\x", "C:\\temp\\x"));
        assert!(!unescaped_eq(r"a\", "a"));
        assert!(unescaped_eq(r"a\", "a\\"));
    }

    #[test]
    fn special_values_timestamps_and_line_ends() {
        let text = "vllm:num_requests_running{model_name=\"m\"} 3 1718000000000\r\n\
                    vllm:num_requests_running{model_name=\"m\"} NaN\r\n\
                    vllm:num_requests_running{model_name=\"m\"} +Inf\r\n\
                    vllm:num_requests_waiting{model_name=\"m\"} -Inf\r\n\
                    vllm:num_requests_waiting{model_name=\"m\"} -1\r\n\
                    \t  vllm:generation_tokens_total{model_name=\"m\"}  1e3 \t 1718000000.5 \r\n\
                    vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\"} 7 # {trace_id=\"abc\"} 1.0 1718000000\r\n\
                    vllm:request_success_total{finished_reason=\"length\",model_name=\"m\",} 1\r\n\
                    vllm:kv_cache_usage_perc { model_name = \"m\" } 1.5\r\n";
        let m = parse_engine_metrics(text, Some("m"));
        assert_eq!(
            m,
            EngineMetrics {
                running: Some(3.0),
                waiting: None,
                kv_usage: Some(1.0),
                generation_tokens_total: Some(1000.0),
                requests_finished_total: Some(8.0),
                gen_throughput: None,
            }
        );
    }

    #[test]
    fn quoted_metric_names() {
        let text = "{\"vllm:num_requests_running\",model_name=\"m\"} 4\n\
                    {\"vllm:num_requests_waiting\"} 2\n\
                    {\"no:such_metric\",model_name=\"m\"} 99\n\
                    vllm:num_requests_running{\"vllm:num_requests_running\"} 50\n\
                    {\"model_name\"=\"m\",\"sglang:token_usage\"} 0.5\n";
        let m = parse_engine_metrics(text, Some("m"));
        assert_eq!(m.running, Some(4.0));
        assert_eq!(m.waiting, Some(2.0));
        assert_eq!(m.kv_usage, Some(0.5));
    }

    #[test]
    fn garbage_is_skipped() {
        let long_label = "x".repeat(MAX_LINE);
        let text = format!(
            "<html><body>502 Bad Gateway</body></html>\n\
             vllm:num_requests_running{{model_name=\"m\" 5\n\
             vllm:num_requests_running{{model_name=\"m\"}} five\n\
             vllm:num_requests_running{{model_name=\"m\"}} 5 6 7\n\
             vllm:num_requests_running{{model_name=m}} 5\n\
             vllm:num_requests_running{{1abel=\"x\"}} 5\n\
             vllm:num_requests_running{{model_name=\"m\"}}\n\
             vllm:num_requests_running{{model_name=\"m\"\n\
             vllm:num_requests_running{{model_name=\"m\"}} 5 notatimestamp\n\
             vllm:num_requests_running{{a=\"b\"}}{{c=\"d\"}} 5\n\
             vllm:num_requests_running{{\"quoted\"}} 5\n\
             9vllm:num_requests_running 5\n\
             vllm:num_requests_runningX 5\n\
             vllm:num_requests_running{{long=\"{long_label}\"}} 5\n\
             {{}} 5\n\
             }} 5\n\
             \u{0}\u{1}\u{7f}\u{fffd}\u{1F600}\n\
             vllm:num_requests_running{{model_name=\"m\"}} 1\n\
             vllm:num_requests_waiting{{model_name=\"m\"}} 0x10\n"
        );
        let m = parse_engine_metrics(&text, Some("m"));
        assert_eq!(
            m,
            EngineMetrics {
                running: Some(1.0),
                ..EngineMetrics::default()
            }
        );
    }

    #[test]
    fn long_lines_are_skipped_but_the_rest_is_read() {
        let long = format!(
            "vllm:num_requests_running{{model_name=\"m\",pad=\"{}\"}} 7\n",
            "p".repeat(MAX_LINE)
        );
        let text = format!("{long}vllm:num_requests_waiting 3\n{long}");
        let m = parse_engine_metrics(&text, Some("m"));
        assert_eq!(m.running, None);
        assert_eq!(m.waiting, Some(3.0));
        // Exactly at the limit is still read.
        let pad = MAX_LINE - "sglang:num_running_reqs{p=\"\"} 1".len();
        let at_limit = format!("sglang:num_running_reqs{{p=\"{}\"}} 1", "p".repeat(pad));
        assert_eq!(at_limit.len(), MAX_LINE);
        assert_eq!(parse_engine_metrics(&at_limit, None).running, Some(1.0));
    }

    #[test]
    fn byte_order_mark_and_no_trailing_newline() {
        let m = parse_engine_metrics("\u{feff}sglang:num_queue_reqs 8", None);
        assert_eq!(m.waiting, Some(8.0));
    }

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn check_invariants(m: &EngineMetrics) {
        for v in [
            m.running,
            m.waiting,
            m.kv_usage,
            m.generation_tokens_total,
            m.requests_finished_total,
            m.gen_throughput,
        ]
        .into_iter()
        .flatten()
        {
            assert!(v.is_finite() && v >= 0.0, "{m:?}");
        }
        if let Some(kv) = m.kv_usage {
            assert!((0.0..=1.0).contains(&kv), "{m:?}");
        }
    }

    fn parse_all(text: &str) {
        for model in [None, Some(MODEL), Some("qwen/qwen2.5-7b"), Some("")] {
            check_invariants(&parse_engine_metrics(text, model));
        }
    }

    #[test]
    fn never_panics_on_truncations() {
        let sample = format!("{VLLM_V1}{SGLANG}{VLLM_V0}");
        for end in 0..=sample.len() {
            if let Some(prefix) = sample.get(..end) {
                check_invariants(&parse_engine_metrics(prefix, Some(MODEL)));
            }
            if let Some(suffix) = sample.get(end..) {
                check_invariants(&parse_engine_metrics(suffix, None));
            }
        }
    }

    #[test]
    fn never_panics_on_random_mutations() {
        const TOKENS: &[&str] = &[
            "{",
            "}",
            "\"",
            "\\",
            ",",
            "=",
            " ",
            "\t",
            "\n",
            "\r",
            "\r\n",
            "#",
            "NaN",
            "+Inf",
            "-Inf",
            "1e308",
            "-0",
            "_created",
            "vllm:num_requests_running",
            "sglang:token_usage",
            "model_name",
            "\u{feff}",
            "\u{e9}",
            "\u{1F600}",
            "\\\"",
            "\\\\",
            "\\n",
        ];
        let sample = format!("{VLLM_V1}{SGLANG}{VLLM_V0}");
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        for round in 0..3000 {
            let mut bytes = sample.as_bytes().to_vec();
            if round % 3 == 0 {
                let end = rng.below(bytes.len() + 1);
                bytes.truncate(end);
            }
            for _ in 0..1 + rng.below(12) {
                if bytes.is_empty() {
                    break;
                }
                let at = rng.below(bytes.len());
                match rng.below(4) {
                    0 => bytes[at] = rng.next() as u8,
                    1 => {
                        bytes.remove(at);
                    }
                    2 => {
                        let t = TOKENS[rng.below(TOKENS.len())];
                        bytes.splice(at..at, t.bytes());
                    }
                    _ => {
                        let len = rng.below(64).min(bytes.len() - at);
                        let copy: Vec<u8> = bytes[at..at + len].to_vec();
                        let to = rng.below(bytes.len());
                        bytes.splice(to..to, copy);
                    }
                }
            }
            parse_all(&String::from_utf8_lossy(&bytes));
        }
        // Pure noise, and noise made of the tokens above.
        for _ in 0..300 {
            let len = rng.below(4096);
            let noise: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            parse_all(&String::from_utf8_lossy(&noise));
            let mut text = String::new();
            for _ in 0..rng.below(200) {
                text.push_str(TOKENS[rng.below(TOKENS.len())]);
            }
            parse_all(&text);
        }
    }

    #[test]
    fn huge_sums_overflow_to_absent_not_infinity() {
        let text = "vllm:generation_tokens_total 1e308\nvllm:generation_tokens_total 1e308\n";
        assert_eq!(
            parse_engine_metrics(text, None).generation_tokens_total,
            None
        );
    }
}

//! The `/metrics` page a router scrapes for load: Prometheus text with
//! vLLM's or SGLang's metric names and labels. Apart from the handler (in
//! `server.rs`) so the page's exact bytes can be built and tested from a
//! snapshot alone.

use crate::config::{Load, MetricsFormat};

/// Prometheus label values escape backslash, quote and newline.
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What `/metrics` shows at one instant.
#[derive(Clone, Copy, Debug)]
pub struct Snapshot {
    pub in_flight: u64,
    pub generated_tokens: u64,
    pub finished: u64,
    pub load: Load,
}

/// One metric family: HELP, TYPE and a single sample.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    labels: String,
    value: f64,
}

impl Family {
    fn gauge(name: &'static str, help: &'static str, labels: &str, value: f64) -> Family {
        Family {
            name,
            kind: "gauge",
            help,
            labels: labels.to_owned(),
            value,
        }
    }

    fn counter(name: &'static str, help: &'static str, labels: &str, value: f64) -> Family {
        Family {
            kind: "counter",
            ..Family::gauge(name, help, labels, value)
        }
    }

    fn write(&self, out: &mut String) {
        use std::fmt::Write as _;
        let Family {
            name,
            kind,
            help,
            labels,
            value,
        } = self;
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {value:?}\n"
        );
    }
}

/// The Prometheus text page, with vLLM's or SGLang's metric names and labels.
/// Running = real in-flight POSTs + reported extra; the other gauges are the
/// reported values; counters count what the pod really did.
pub fn render_metrics(format: MetricsFormat, model: &str, s: Snapshot) -> String {
    let model = label_value(model);
    let running = s.in_flight as f64 + s.load.running;
    let families = match format {
        MetricsFormat::Vllm => vllm_families(&model, s, running),
        MetricsFormat::Sglang => sglang_families(&model, s, running),
    };
    let mut out = String::with_capacity(2048);
    for f in &families {
        f.write(&mut out);
    }
    out
}

/// vLLM's names, every family labelled with the model.
fn vllm_families(model: &str, s: Snapshot, running: f64) -> Vec<Family> {
    let l = format!("{{model_name=\"{model}\"}}");
    vec![
        Family::gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            &l,
            running,
        ),
        Family::gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            &l,
            s.load.waiting,
        ),
        Family::gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            &l,
            s.load.kv_usage,
        ),
        // vLLM's info gauges, labels only: the Inference Extension's
        // endpoint picker (GIE v1.5.0's vLLM metrics mapping) reads both on
        // every scrape and logs an error for each one missing. No adapters
        // are served; the cache shape is a small GPU's.
        Family::gauge(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            "{max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}",
            0.0,
        ),
        Family::gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig.",
            "{block_size=\"16\",num_gpu_blocks=\"8192\"}",
            1.0,
        ),
        Family::counter(
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            &l,
            s.generated_tokens as f64,
        ),
        Family::counter(
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            &format!("{{finished_reason=\"length\",model_name=\"{model}\"}}"),
            s.finished as f64,
        ),
    ]
}

/// SGLang's names: scheduler gauges carry the rank labels, tokenizer
/// counters only the model, as in sglang/srt/metrics/collector.py.
fn sglang_families(model: &str, s: Snapshot, running: f64) -> Vec<Family> {
    let sched =
        format!("{{model_name=\"{model}\",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"}}");
    let l = format!("{{model_name=\"{model}\"}}");
    vec![
        Family::gauge(
            "sglang:num_running_reqs",
            "The number of running requests.",
            &sched,
            running,
        ),
        Family::gauge(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            &sched,
            s.load.waiting,
        ),
        Family::gauge(
            "sglang:token_usage",
            "The token usage.",
            &sched,
            s.load.kv_usage,
        ),
        Family::gauge(
            "sglang:gen_throughput",
            "The generation throughput (token/s).",
            &sched,
            s.load.gen_throughput,
        ),
        Family::counter(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            &l,
            s.generated_tokens as f64,
        ),
        Family::counter(
            "sglang:num_requests_total",
            "Number of requests processed.",
            &l,
            s.finished as f64,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(in_flight: u64, load: Load) -> Snapshot {
        Snapshot {
            in_flight,
            generated_tokens: 42,
            finished: 3,
            load,
        }
    }

    /// Sample lines (not comments) of a page, as `name{labels} value`.
    fn samples(page: &str) -> Vec<&str> {
        page.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn vllm_page() {
        let load = Load {
            running: 2.5,
            waiting: 4.0,
            kv_usage: 0.75,
            gen_throughput: 99.0,
            metrics_fail: false,
        };
        let page = render_metrics(MetricsFormat::Vllm, "m\"x", snapshot(1, load));
        assert_eq!(
            samples(&page),
            [
                r#"vllm:num_requests_running{model_name="m\"x"} 3.5"#,
                r#"vllm:num_requests_waiting{model_name="m\"x"} 4.0"#,
                r#"vllm:kv_cache_usage_perc{model_name="m\"x"} 0.75"#,
                r#"vllm:lora_requests_info{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""} 0.0"#,
                r#"vllm:cache_config_info{block_size="16",num_gpu_blocks="8192"} 1.0"#,
                r#"vllm:generation_tokens_total{model_name="m\"x"} 42.0"#,
                r#"vllm:request_success_total{finished_reason="length",model_name="m\"x"} 3.0"#,
            ]
        );
        assert!(page.contains("# TYPE vllm:request_success_total counter\n"));
        assert!(page.ends_with('\n'));
    }

    #[test]
    fn sglang_page() {
        let page = render_metrics(MetricsFormat::Sglang, "m", snapshot(0, Load::default()));
        let sched = r#"{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"}"#;
        assert_eq!(
            samples(&page),
            [
                format!("sglang:num_running_reqs{sched} 0.0"),
                format!("sglang:num_queue_reqs{sched} 0.0"),
                format!("sglang:token_usage{sched} 0.0"),
                format!("sglang:gen_throughput{sched} 0.0"),
                r#"sglang:generation_tokens_total{model_name="m"} 42.0"#.to_string(),
                r#"sglang:num_requests_total{model_name="m"} 3.0"#.to_string(),
            ]
        );
    }
}

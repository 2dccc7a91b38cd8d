//! `parse_engine_metrics` on arbitrary text, without and with a model filter.
//!
//! Checks: nothing panics; every value found is finite and >= 0, and KV-cache
//! usage is in [0, 1].
#![no_main]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use libfuzzer_sys::fuzz_target;
use pd_router::scrape::{parse_engine_metrics, EngineMetrics};

fn check(m: &EngineMetrics, model: Option<&str>) {
    let fields = [
        ("running", m.running),
        ("waiting", m.waiting),
        ("kv_usage", m.kv_usage),
        ("generation_tokens_total", m.generation_tokens_total),
        ("requests_finished_total", m.requests_finished_total),
        ("gen_throughput", m.gen_throughput),
    ];
    for (name, v) in fields {
        if let Some(v) = v {
            assert!(v.is_finite() && v >= 0.0, "{name} = {v} (model {model:?})");
        }
    }
    if let Some(v) = m.kv_usage {
        assert!((0.0..=1.0).contains(&v), "kv_usage = {v} (model {model:?})");
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for model in [None, Some("m")] {
        check(&parse_engine_metrics(&text, model), model);
    }
});

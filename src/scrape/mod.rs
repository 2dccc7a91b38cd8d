//! Scraping pods' `/metrics`: [`parse`] reads the page, this file turns its
//! counters into rates (one VM scrapes, holding a [`crate::pods::lease`]).

pub mod parse;

use crate::pods::PodMetrics;
pub use parse::{parse_engine_metrics, EngineMetrics};

/// The last counter readings of one pod, to turn counters into rates.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Previous {
    pub at_ms: u64,
    pub generation_tokens_total: Option<f64>,
    pub requests_finished_total: Option<f64>,
}

fn rate(now: Option<f64>, then: Option<f64>, dt_s: f64) -> Option<f64> {
    let (now, then) = (now?, then?);
    // A counter that went down was reset (engine restart): no rate this time.
    (dt_s > 0.0 && now >= then).then(|| (now - then) / dt_s)
}

/// The load signals of one scrape, with rates from the previous one.
pub fn observe(prev: &Previous, now_ms: u64, m: &EngineMetrics) -> (PodMetrics, Previous) {
    let dt_s = now_ms.saturating_sub(prev.at_ms) as f64 / 1000.0;
    let dt_s = if prev.at_ms == 0 { 0.0 } else { dt_s };
    let gen_rate = rate(
        m.generation_tokens_total,
        prev.generation_tokens_total,
        dt_s,
    );
    let metrics = PodMetrics {
        running: m.running.unwrap_or(0.0),
        // Filled in by the scraper, which knows this Envoy's own load.
        own_running: 0.0,
        own_prefills: 0.0,
        waiting: m.waiting.unwrap_or(0.0),
        kv_usage: m.kv_usage,
        // An engine's own throughput gauge beats a rate over one interval.
        gen_throughput: m.gen_throughput.or(gen_rate),
        drain_rate: rate(
            m.requests_finished_total,
            prev.requests_finished_total,
            dt_s,
        ),
    };
    let next = Previous {
        at_ms: now_ms,
        generation_tokens_total: m.generation_tokens_total,
        requests_finished_total: m.requests_finished_total,
    };
    (metrics, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_become_rates() {
        let m = |gen: f64, fin: f64| EngineMetrics {
            running: Some(3.0),
            generation_tokens_total: Some(gen),
            requests_finished_total: Some(fin),
            ..Default::default()
        };
        let (first, prev) = observe(&Previous::default(), 10_000, &m(100.0, 10.0));
        assert_eq!(first.gen_throughput, None, "no rate from a single reading");
        assert_eq!(first.running, 3.0);
        let (second, prev) = observe(&prev, 12_000, &m(500.0, 14.0));
        assert_eq!(second.gen_throughput, Some(200.0));
        assert_eq!(second.drain_rate, Some(2.0));
        let (reset, _) = observe(&prev, 13_000, &m(5.0, 1.0));
        assert_eq!(reset.gen_throughput, None, "a counter reset gives no rate");
        let gauge = EngineMetrics {
            gen_throughput: Some(42.0),
            ..m(900.0, 20.0)
        };
        assert_eq!(observe(&prev, 13_000, &gauge).0.gen_throughput, Some(42.0));
    }
}

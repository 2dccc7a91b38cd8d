//! What `tracing` configures.

use serde::Deserialize;

/// `tracing`: spans per request, sent over OTLP/HTTP to a collector behind
/// an Envoy cluster. Off when absent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Tracing {
    /// The Envoy cluster of the OpenTelemetry collector (required).
    pub cluster: String,
    /// The `:authority` of the export calls; default: the cluster's name.
    pub authority: Option<String>,
    /// OTLP/HTTP's traces path.
    pub path: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Spans a VM keeps unsent at most; beyond, new spans are dropped and
    /// counted (`spans_dropped`).
    pub max_buffered_spans: usize,
    /// Spans per export call at most.
    pub max_batch_spans: usize,
    /// How long an export call may take.
    pub timeout_ms: u64,
    /// Of requests that come without a `traceparent`, the share traced
    /// (a client's sampled flag decides for its own requests).
    pub sample_ratio: f64,
}

impl Default for Tracing {
    fn default() -> Self {
        Tracing {
            cluster: String::new(),
            authority: None,
            path: "/v1/traces".into(),
            service_name: "pd-router".into(),
            max_buffered_spans: 4096,
            max_batch_spans: 512,
            timeout_ms: 5_000,
            sample_ratio: 1.0,
        }
    }
}

impl Tracing {
    /// The first setting that cannot work: its field (under `tracing.`) and
    /// why.
    pub fn problem(&self) -> Option<(&'static str, &'static str)> {
        if self.cluster.is_empty() {
            return Some((
                "cluster",
                "is required: the Envoy cluster of the OpenTelemetry collector",
            ));
        }
        if !self.path.starts_with('/') {
            return Some(("path", "must start with '/' (OTLP/HTTP's is /v1/traces)"));
        }
        if self.max_buffered_spans == 0 {
            return Some(("max_buffered_spans", "must be greater than 0"));
        }
        if self.max_batch_spans == 0 {
            return Some(("max_batch_spans", "must be greater than 0"));
        }
        if self.timeout_ms == 0 {
            return Some(("timeout_ms", "must be greater than 0"));
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Some(("sample_ratio", "must be from 0 to 1"));
        }
        None
    }

    /// The export calls' `:authority`.
    pub fn authority(&self) -> &str {
        self.authority.as_deref().unwrap_or(&self.cluster)
    }
}

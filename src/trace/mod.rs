//! Spans for each request's legs, exported over OTLP/HTTP: the router's
//! decision, the prefill leg and the decode's hand-off, children of one
//! span for the request, which is itself a child of the client's W3C
//! `traceparent` when it sent one. Each leg's request carries a
//! `traceparent` naming that leg's span, so the engines' own spans nest
//! under it.
//!
//! Pure parts only: the trace context ([`context`]), spans ([`span`]), the
//! bounded buffer a VM's requests fill and its root context empties
//! ([`buffer`]), the OTLP JSON of a batch ([`otlp`]) and the settings
//! ([`settings`]). The flow records spans (`flow/trace.rs`); the root's
//! tick exports them (`root/export.rs`).

pub mod buffer;
pub mod context;
pub mod otlp;
pub mod settings;
pub mod span;

pub use buffer::SpanBuffer;
pub use context::TraceContext;
pub use settings::Tracing;
pub use span::{AttrValue, Span, SpanKind};

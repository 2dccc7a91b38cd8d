//! The VM's finished spans waiting for the root's export, when tracing is
//! configured.

use crate::trace::{Span, SpanBuffer, Tracing};
use std::cell::RefCell;

/// A VM's span buffer: filled by its streams, emptied by its root.
#[derive(Debug)]
pub struct Spans(Option<RefCell<SpanBuffer>>);

impl Spans {
    pub fn new(tracing: Option<&Tracing>) -> Spans {
        Spans(tracing.map(|t| RefCell::new(SpanBuffer::new(t.max_buffered_spans))))
    }

    /// Keeps a request's spans for export; how many did not fit.
    pub fn record(&self, spans: Vec<Span>) -> usize {
        match &self.0 {
            Some(b) => b.borrow_mut().push(spans),
            None => 0,
        }
    }

    /// Up to `n` spans to export, the oldest first.
    pub fn take(&self, n: usize) -> Vec<Span> {
        self.0
            .as_ref()
            .map_or_else(Vec::new, |b| b.borrow_mut().take(n))
    }

    /// Spans waiting.
    pub fn waiting(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.borrow().len())
    }
}

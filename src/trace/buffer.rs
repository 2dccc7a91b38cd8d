//! The spans a VM's requests finished and its root context has not sent
//! yet, bounded: when full, new spans are dropped (and counted by the
//! caller), never the process's memory grown.

use super::span::Span;
use std::collections::VecDeque;

#[derive(Debug)]
pub struct SpanBuffer {
    spans: VecDeque<Span>,
    max: usize,
}

impl SpanBuffer {
    pub fn new(max: usize) -> SpanBuffer {
        SpanBuffer {
            spans: VecDeque::new(),
            max,
        }
    }

    /// Adds `spans`, as many as there is room for; returns how many were
    /// dropped.
    pub fn push(&mut self, spans: impl IntoIterator<Item = Span>) -> usize {
        let mut dropped = 0;
        for s in spans {
            if self.spans.len() < self.max {
                self.spans.push_back(s);
            } else {
                dropped += 1;
            }
        }
        dropped
    }

    /// Up to `n` of the oldest spans, taken out.
    pub fn take(&mut self, n: usize) -> Vec<Span> {
        let n = n.min(self.spans.len());
        self.spans.drain(..n).collect()
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::SpanKind;

    fn span(n: u8) -> Span {
        Span {
            trace_id: [n; 16],
            span_id: [n; 8],
            parent: None,
            name: "s",
            kind: SpanKind::Internal,
            start_us: 0,
            end_us: 1,
            attributes: Vec::new(),
            error: None,
        }
    }

    #[test]
    fn a_full_buffer_drops_new_spans_and_says_how_many() {
        let mut b = SpanBuffer::new(3);
        assert_eq!(b.push([span(1), span(2)]), 0);
        assert_eq!(b.push([span(3), span(4), span(5)]), 2);
        assert_eq!(b.len(), 3);
        let first = b.take(2);
        assert_eq!(
            first.iter().map(|s| s.span_id[0]).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(b.push([span(6)]), 0);
        assert_eq!(b.take(10).len(), 2);
        assert!(b.is_empty());
    }
}

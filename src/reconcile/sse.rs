//! Server-sent events, one at a time: a stream is cut at the blank lines
//! that end events (`\n\n`, `\r\n\r\n` or `\r\r`, as the SSE spec allows),
//! whatever the network chunks were; at most the one unfinished event is
//! held between chunks.

/// The byte length of the first complete event in `buf` (its terminator
/// included), if there is one: the first empty line ends it.
pub fn next_event(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    let mut i = 0;
    while let Some(&b) = buf.get(i) {
        if b != b'\n' && b != b'\r' {
            i += 1;
            continue;
        }
        let end = match (b, buf.get(i + 1)) {
            (b'\r', Some(b'\n')) => i + 2,
            // A CR at the end may be the first half of a CRLF.
            (b'\r', None) => return None,
            _ => i + 1,
        };
        if i == line_start {
            return Some(end);
        }
        line_start = end;
        i = end;
    }
    None
}

/// The span of the event's one `data:` payload (after `data:` and one
/// optional space, up to its line end); `None` for events without data or
/// with several data lines (passed on as they are).
pub fn data_span(event: &[u8]) -> Option<std::ops::Range<usize>> {
    let mut found = None;
    let mut start = 0;
    while start < event.len() {
        let rest = event.get(start..)?;
        let len = rest
            .iter()
            .position(|b| *b == b'\n' || *b == b'\r')
            .unwrap_or(rest.len());
        let line = rest.get(..len)?;
        if let Some(payload) = line.strip_prefix(b"data:") {
            if found.is_some() {
                return None;
            }
            let skip = usize::from(payload.first() == Some(&b' '));
            found = Some(start + 5 + skip..start + len);
        }
        // Past the line and its terminator (CRLF counts once).
        let mut next = start + len;
        if event.get(next) == Some(&b'\r') {
            next += 1;
        }
        if event.get(next) == Some(&b'\n') {
            next += 1;
        }
        if next == start + len {
            break;
        }
        start = next;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_blank_lines_of_any_style() {
        assert_eq!(next_event(b"data: a\n\ndata: b"), Some(9));
        assert_eq!(next_event(b"data: a\r\n\r\nx"), Some(11));
        assert_eq!(next_event(b"data: a\r\rx"), Some(9));
        assert_eq!(next_event(b"data: a\r\r"), None, "the CR may start a CRLF");
        assert_eq!(next_event(b"data: a\r\r\n"), Some(10));
        assert_eq!(next_event(b"data: a\n\r\nx"), Some(10));
        assert_eq!(next_event(b"data: a\n"), None);
        assert_eq!(next_event(b"data: a\r"), None);
        assert_eq!(next_event(b""), None);
    }

    #[test]
    fn the_data_payload_is_found_in_any_line_style() {
        let ev = b"event: response.completed\ndata: {\"a\":1}\n\n";
        let s = data_span(ev).unwrap();
        assert_eq!(&ev[s], b"{\"a\":1}");
        let ev = b"data:{\"a\":1}\r\n\r\n";
        assert_eq!(&ev[data_span(ev).unwrap()], b"{\"a\":1}");
        assert_eq!(data_span(b"data: a\ndata: b\n\n"), None, "two data lines");
        assert_eq!(data_span(b": comment\n\n"), None);
    }
}

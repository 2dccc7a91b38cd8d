//! `multipart/form-data` bodies (RFC 7578, RFC 2046 section 5.1), read by
//! hand: the audio endpoints need only each part's name and bytes, and a
//! few lines keep axum's `multipart` feature (and its parser's crates) out
//! of the tree. The mock reads what the OpenAI SDKs (httpx, requests) and
//! curl send: CRLF line breaks, a `Content-Disposition: form-data;
//! name="..."` header per part.

/// One part: its form field name, file name if any, and content.
#[derive(Debug, PartialEq, Eq)]
pub struct Part<'a> {
    pub name: String,
    pub filename: Option<String>,
    pub body: &'a [u8],
}

/// The `boundary` parameter of a `multipart/form-data` content type;
/// `None` for any other type or a missing or malformed boundary.
pub fn boundary(content_type: &str) -> Option<String> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params_of(params)
        .into_iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v)
        // RFC 2046: 1 to 70 characters.
        .filter(|b| !b.is_empty() && b.len() <= 70)
}

/// Every part of `body`, in order; `Err` says what is malformed.
pub fn parts<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, String> {
    let first = format!("--{boundary}");
    let next = format!("\r\n--{boundary}");
    // The first delimiter starts the body or a line after a preamble.
    let at = if body.starts_with(first.as_bytes()) {
        0
    } else {
        find(body, next.as_bytes()).ok_or("no boundary delimiter")? + 2
    };
    let mut rest = body.get(at + first.len()..).unwrap_or_default();
    let mut out = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            // The close delimiter: whatever follows is the epilogue.
            return Ok(out);
        }
        // Transport padding, then the delimiter line's CRLF.
        let pad = rest
            .iter()
            .take_while(|b| **b == b' ' || **b == b'\t')
            .count();
        rest = rest
            .get(pad..)
            .and_then(|r| r.strip_prefix(b"\r\n"))
            .ok_or("a boundary delimiter line does not end in CRLF")?;
        let end = find(rest, next.as_bytes()).ok_or("a part is not closed by a delimiter")?;
        let (part, after) = rest.split_at(end);
        out.push(part_of(part)?);
        rest = after.get(next.len()..).unwrap_or_default();
    }
}

/// The text of the last field called `name` (as Starlette's form keeps the
/// last of repeated fields); `Err` if the body is malformed or the field
/// is not UTF-8.
pub fn text_field(body: &[u8], boundary: &str, name: &str) -> Result<Option<String>, String> {
    let parts = parts(body, boundary)?;
    let Some(part) = parts.iter().rev().find(|p| p.name == name) else {
        return Ok(None);
    };
    String::from_utf8(part.body.to_vec())
        .map(Some)
        .map_err(|_| format!("form field `{name}` is not UTF-8"))
}

/// A part: header lines, an empty line, the content.
fn part_of(part: &[u8]) -> Result<Part<'_>, String> {
    let (head, body) = match part.strip_prefix(b"\r\n") {
        Some(body) => (&b""[..], body),
        None => {
            let at = find(part, b"\r\n\r\n").ok_or("a part's headers do not end")?;
            (
                part.get(..at).unwrap_or_default(),
                part.get(at + 4..).unwrap_or_default(),
            )
        }
    };
    let head = std::str::from_utf8(head).map_err(|_| "a part's headers are not UTF-8")?;
    let disposition = head
        .split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
        .map(|(_, v)| v)
        .ok_or("a part has no Content-Disposition")?;
    let (kind, params) = disposition.split_once(';').unwrap_or((disposition, ""));
    if !kind.trim().eq_ignore_ascii_case("form-data") {
        return Err(format!(
            "a part's disposition is {:?}, not form-data",
            kind.trim()
        ));
    }
    let params = params_of(params);
    let get = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.clone())
    };
    Ok(Part {
        name: get("name").ok_or("a part has no name")?,
        filename: get("filename"),
        body,
    })
}

/// `; key=value; key="quoted; value"` parameters, in order. A quoted value
/// may hold `;` and backslash-escaped characters.
fn params_of(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ';' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars
            .by_ref()
            .take_while(|c| *c != '=')
            .collect::<String>()
            .trim()
            .to_string();
        if key.is_empty() {
            return out;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ';') {
                value.push(c);
            }
            value = value.trim_end().to_string();
        }
        out.push((key, value));
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What httpx (the OpenAI Python SDK) sends for
    /// `audio.transcriptions.create(model=..., file=...)`.
    fn sdk_body(b: &str, model: Option<&str>, audio: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(m) = model {
            out.extend_from_slice(
                format!("--{b}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{m}\r\n")
                    .as_bytes(),
            );
        }
        out.extend_from_slice(
            format!(
                "--{b}\r\nContent-Disposition: form-data; name=\"file\"; \
                 filename=\"a;b.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
            )
            .as_bytes(),
        );
        out.extend_from_slice(audio);
        out.extend_from_slice(format!("\r\n--{b}--\r\n").as_bytes());
        out
    }

    #[test]
    fn boundaries() {
        let b = |s: &str| boundary(s);
        assert_eq!(
            b("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(
            b("Multipart/Form-Data;charset=utf-8; BOUNDARY=\"a b;c\"").as_deref(),
            Some("a b;c")
        );
        assert_eq!(b("application/json"), None);
        assert_eq!(b("multipart/form-data"), None);
        assert_eq!(b("multipart/form-data; boundary="), None);
        assert_eq!(b("multipart/mixed; boundary=abc"), None);
        assert_eq!(
            b(&format!("multipart/form-data; boundary={}", "x".repeat(71))),
            None
        );
    }

    #[test]
    fn reads_what_the_sdk_sends() {
        // Audio bytes that hold CR, LF, dashes and a near-boundary.
        let audio = b"RIFF\r\n--bound\r\x00\xff--";
        let body = sdk_body("bound4", Some("whisper-lora"), audio);
        let p = parts(&body, "bound4").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].name, "model");
        assert_eq!(p[0].body, b"whisper-lora");
        assert_eq!(p[1].name, "file");
        assert_eq!(p[1].filename.as_deref(), Some("a;b.wav"));
        assert_eq!(p[1].body, audio);
        assert_eq!(
            text_field(&body, "bound4", "model").unwrap().as_deref(),
            Some("whisper-lora")
        );
        let body = sdk_body("bound4", None, audio);
        assert_eq!(text_field(&body, "bound4", "model").unwrap(), None);
    }

    #[test]
    fn preamble_padding_headerless_parts_and_repeats() {
        let body = b"preamble\r\n--b \t\r\ncontent-disposition: FORM-DATA; name=model\r\n\r\n\
                     one\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ntwo\
                     \r\n--b--epilogue";
        assert_eq!(
            text_field(body, "b", "model").unwrap().as_deref(),
            Some("two")
        );
        let p = parts(body, "b").unwrap();
        assert_eq!(p[0].body, b"one");
        // An empty body is no parts; a part with no headers has no name.
        assert_eq!(parts(b"--b--\r\n", "b").unwrap(), vec![]);
        assert!(parts(b"--b\r\n\r\nx\r\n--b--", "b").is_err());
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        for bad in [
            &b""[..],
            b"no delimiter",
            b"--b",
            b"--bx\r\n",
            b"--b\r\nContent-Disposition: form-data; name=\"m\"\r\n\r\nunclosed",
            b"--b\r\nContent-Disposition: form-data; name=\"m\"",
            b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b--",
            b"--b\r\nContent-Disposition: attachment; name=\"m\"\r\n\r\nx\r\n--b--",
            b"--b\r\nContent-Disposition: form-data; name=\"m\"\r\n\r\n\xff\r\n--b--",
        ] {
            assert!(
                text_field(bad, "b", "m").is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}

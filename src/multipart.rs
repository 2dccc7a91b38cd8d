//! One form field of a `multipart/form-data` body (RFC 7578), read without
//! copying: audio transcription calls name their model in a `model` field
//! beside the file. Only what routing needs: the boundary from the
//! content type, and a plain (non-file) field's value. Anything malformed
//! reads as "no such field", never as an error: the engine judges the body.

/// The longest boundary RFC 2046 allows.
const MAX_BOUNDARY: usize = 70;

/// The longest field value read: a model name, not a file.
const MAX_VALUE: usize = 1024;

/// The boundary of a `multipart/form-data` content type, quoted or not.
pub fn boundary(content_type: &str) -> Option<&str> {
    let mut params = content_type.split(';');
    let media = params.next()?.trim();
    if !media.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let value = params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim().eq_ignore_ascii_case("boundary").then(|| v.trim())
    })?;
    let value = match value.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"')?,
        None => value,
    };
    (!value.is_empty() && value.len() <= MAX_BOUNDARY).then_some(value)
}

/// The value of the first plain field called `name` in `body`, a
/// multipart body delimited by `boundary`.
pub fn field<'a>(body: &'a [u8], boundary: &str, name: &str) -> Option<&'a [u8]> {
    fields(body, boundary, name, 1).into_iter().next()
}

/// The values of the first `max` plain fields called `name`, in order.
pub fn fields<'a>(body: &'a [u8], boundary: &str, name: &str, max: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut delimiter = Vec::with_capacity(boundary.len() + 4);
    delimiter.extend_from_slice(b"\r\n--");
    delimiter.extend_from_slice(boundary.as_bytes());
    // The first delimiter may open the body without the CRLF before it.
    let Some(first) = delimiter.get(2..).and_then(|d| find(body, d)) else {
        return out;
    };
    let mut rest = body.get(first + delimiter.len() - 2..).unwrap_or_default();
    // After a delimiter: `--` ends the body, else CRLF opens a part.
    while out.len() < max && !rest.starts_with(b"--") {
        let Some(part) = skip_line(rest).and_then(|i| rest.get(i..)) else {
            break;
        };
        let Some(end) = find(part, &delimiter) else {
            break;
        };
        if let Some(value) = part.get(..end).and_then(|p| value_if_named(p, name)) {
            out.push(value);
        }
        rest = part.get(end + delimiter.len()..).unwrap_or_default();
    }
    out
}

/// The part's value when its headers name it `name` and it is not a file.
fn value_if_named<'a>(part: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let head_end = find(part, b"\r\n\r\n")?;
    let head = std::str::from_utf8(part.get(..head_end)?).ok()?;
    let disposition = head.split("\r\n").find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-disposition")
            .then_some(v)
    })?;
    let mut params = disposition.split(';');
    if !params.next()?.trim().eq_ignore_ascii_case("form-data") {
        return None;
    }
    let mut named = false;
    for p in params {
        let Some((k, v)) = p.split_once('=') else {
            continue;
        };
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .unwrap_or(v);
        match k.trim().to_ascii_lowercase().as_str() {
            "name" => named = v == name,
            "filename" | "filename*" => return None,
            _ => {}
        }
    }
    let value = part.get(head_end + 4..)?;
    (named && value.len() <= MAX_VALUE).then_some(value)
}

/// Past the end of the first line (its CRLF).
fn skip_line(s: &[u8]) -> Option<usize> {
    find(s, b"\r\n").map(|i| i + 2)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"model\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--Xy\r\n\r\n--XyZ\r\ncontent-disposition: form-data; name=model\r\n\r\nwhisper-large\r\n--XyZ\r\nContent-Disposition: form-data; name=\"language\"\r\n\r\nen\r\n--XyZ--\r\n";

    #[test]
    fn boundaries_quoted_or_not() {
        assert_eq!(boundary("multipart/form-data; boundary=XyZ"), Some("XyZ"));
        assert_eq!(
            boundary("Multipart/Form-Data;charset=utf-8; BOUNDARY=\"a b\""),
            Some("a b")
        );
        assert_eq!(boundary("application/json"), None);
        assert_eq!(boundary("multipart/form-data"), None);
        assert_eq!(boundary("multipart/form-data; boundary=\"\""), None);
        assert_eq!(
            boundary(&format!("multipart/form-data; boundary={}", "x".repeat(71))),
            None
        );
    }

    #[test]
    fn a_plain_field_after_a_file_that_looks_like_it() {
        assert_eq!(field(BODY, "XyZ", "model"), Some(&b"whisper-large"[..]));
        assert_eq!(field(BODY, "XyZ", "language"), Some(&b"en"[..]));
        assert_eq!(field(BODY, "XyZ", "file"), None, "a file is not a field");
        assert_eq!(field(BODY, "XyZ", "prompt"), None);
        assert_eq!(field(BODY, "other", "model"), None);
    }

    #[test]
    fn malformed_bodies_have_no_fields() {
        for body in [
            &b""[..],
            b"--XyZ",
            b"--XyZ\r\n",
            b"--XyZ\r\nContent-Disposition: form-data; name=model\r\n\r\nm",
            b"--XyZ\r\nContent-Disposition: attachment; name=model\r\n\r\nm\r\n--XyZ--",
            b"--XyZ--\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n--XyZ--",
        ] {
            assert_eq!(field(body, "XyZ", "model"), None, "{body:?}");
        }
        let long = [
            &b"--XyZ\r\nContent-Disposition: form-data; name=model\r\n\r\n"[..],
            &[b'm'; 2000],
            b"\r\n--XyZ--",
        ]
        .concat();
        assert_eq!(field(&long, "XyZ", "model"), None, "not a model name");
    }
}

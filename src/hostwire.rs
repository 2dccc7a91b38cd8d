//! The byte formats of the proxy-wasm ABI that the shell's host calls
//! exchange with Envoy: header maps and property paths. Pure, so they are
//! tested natively; a malformed map from the host is `None`, never a panic.

/// Serialises header pairs as the ABI wants them: a count, then each
/// pair's name and value lengths, then the names and values, each followed
/// by a NUL (which the lengths do not count).
pub fn serialize_pairs<V: AsRef<[u8]>>(pairs: &[(&str, V)]) -> Vec<u8> {
    let data: usize = pairs
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().len() + 10)
        .sum();
    let mut out = Vec::with_capacity(4 + data);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

fn le_u32(bytes: &[u8], at: usize) -> Option<usize> {
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(b) as usize)
}

/// The `len` bytes at `*p` and the NUL after them, moving `*p` past both.
fn terminated<'a>(bytes: &'a [u8], p: &mut usize, len: usize) -> Option<&'a [u8]> {
    let end = p.checked_add(len)?;
    let field = bytes.get(*p..end)?;
    if bytes.get(end) != Some(&0) {
        return None;
    }
    *p = end + 1;
    Some(field)
}

/// Reads a header map the host serialised; `None` if it is malformed. Names
/// are HTTP tokens (ASCII); values stay bytes, as clients may send any.
pub fn deserialize_pairs(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let n = le_u32(bytes, 0)?;
    // Each pair takes at least 10 bytes: bounds the allocation below.
    if n > bytes.len() / 10 + 1 {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    let mut p = n.checked_mul(8)?.checked_add(4)?;
    for i in 0..n {
        let key_len = le_u32(bytes, 4 + i * 8)?;
        let value_len = le_u32(bytes, 8 + i * 8)?;
        let key = terminated(bytes, &mut p, key_len)?;
        let value = terminated(bytes, &mut p, value_len)?;
        out.push((String::from_utf8_lossy(key).into_owned(), value.to_vec()));
    }
    Some(out)
}

/// A property path (`upstream.address`) as the ABI wants it: the parts
/// joined by NULs.
pub fn serialize_path(path: &[&str]) -> Vec<u8> {
    path.join("\0").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_with_byte_values() {
        let pairs: [(&str, &[u8]); 3] = [
            (":path", b"/v1/completions"),
            ("x-bytes", &[0xff, 0x00, b'a']),
            ("empty", b""),
        ];
        let wire = serialize_pairs(&pairs);
        let back = deserialize_pairs(&wire).expect("well formed");
        assert_eq!(back.len(), 3);
        for ((k, v), (bk, bv)) in pairs.iter().zip(&back) {
            assert_eq!((*k, *v), (bk.as_str(), bv.as_slice()));
        }
        assert_eq!(deserialize_pairs(b""), Some(Vec::new()));
    }

    #[test]
    fn a_malformed_map_is_none_at_every_truncation() {
        let wire = serialize_pairs(&[("a", "1"), ("bb", "22")]);
        for cut in 1..wire.len() {
            assert_eq!(deserialize_pairs(&wire[..cut]), None, "cut at {cut}");
        }
        let mut huge = wire.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(deserialize_pairs(&huge), None);
    }

    #[test]
    fn paths_are_joined_by_nul() {
        assert_eq!(
            serialize_path(&["upstream", "address"]),
            b"upstream\0address"
        );
    }
}

//! Access to Envoy shared data: every worker VM of one `vm_id` reads and
//! writes the same keys, with compare-and-swap.

/// Access to proxy-wasm shared data.
pub trait SharedStore {
    /// The value and its CAS token.
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);
    /// Writes `value` if the key's CAS token is still `cas` (`None`: always).
    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetError {
    /// Another worker wrote first.
    CasMismatch,
    Failed(String),
}

/// CAS rounds before an update gives up: workers only collide for the few
/// microseconds between a read and its write, so 64 in a row means the store
/// is broken, not busy.
const CAS_ATTEMPTS: usize = 64;

/// Reads `key`, applies `change` to its decoded value and writes it back,
/// retrying lost races; returns what was written.
pub fn cas_update<S, T>(
    store: &mut S,
    key: &str,
    decode: impl Fn(Option<&[u8]>) -> T,
    encode: impl Fn(&T) -> Vec<u8>,
    mut change: impl FnMut(&mut T),
) -> Result<T, String>
where
    S: SharedStore + ?Sized,
{
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = store.shared_get(key);
        let mut value = decode(bytes.as_deref());
        change(&mut value);
        match store.shared_set(key, &encode(&value), cas) {
            Ok(()) => return Ok(value),
            Err(SetError::CasMismatch) => continue,
            Err(SetError::Failed(e)) => return Err(e),
        }
    }
    Err(format!(
        "shared data stayed contended for {CAS_ATTEMPTS} attempts"
    ))
}

/// An in-memory store with proxy-wasm's CAS semantics, for tests and benches.
#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: std::collections::HashMap<String, (Vec<u8>, u32)>,
    /// Fail the next N sets with a CAS mismatch (to exercise retries).
    pub contend: u32,
}

impl SharedStore for MemoryStore {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        match self.entries.get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        }
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        if self.contend > 0 {
            self.contend -= 1;
            return Err(SetError::CasMismatch);
        }
        let current = self.entries.get(key).map(|(_, c)| *c);
        if let (Some(want), Some(have)) = (cas, current) {
            if want != have {
                return Err(SetError::CasMismatch);
            }
        }
        let next = current.unwrap_or(0).wrapping_add(1);
        self.entries.insert(key.to_owned(), (value.to_vec(), next));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(b: Option<&[u8]>) -> u32 {
        b.and_then(|b| b.first()).copied().unwrap_or(0) as u32
    }

    #[test]
    fn updates_retry_lost_races_and_give_up_eventually() {
        let mut s = MemoryStore::default();
        let enc = |v: &u32| vec![*v as u8];
        assert_eq!(cas_update(&mut s, "k", count, enc, |v| *v += 1), Ok(1));
        s.contend = 5;
        assert_eq!(cas_update(&mut s, "k", count, enc, |v| *v += 1), Ok(2));
        s.contend = 100;
        assert!(cas_update(&mut s, "k", count, enc, |_| {}).is_err());
    }

    #[test]
    fn memory_store_enforces_cas() {
        let mut s = MemoryStore::default();
        s.shared_set("k", b"a", None).unwrap();
        let (_, cas) = s.shared_get("k");
        s.shared_set("k", b"b", cas).unwrap();
        assert_eq!(s.shared_set("k", b"c", cas), Err(SetError::CasMismatch));
    }
}

//! Access to Envoy shared data: every worker VM of one `vm_id` reads and
//! writes the same keys, with compare-and-swap.

/// Access to proxy-wasm shared data.
pub trait SharedStore {
    /// The value and its CAS token.
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);
    /// The value as the store holds it now, past any copy this callback
    /// kept of an earlier read: for a check that must see what other
    /// workers wrote since (admission's, after taking a pod's place).
    fn shared_get_fresh(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.shared_get(key)
    }
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

/// What one host callback has read: Envoy's clock (milliseconds do not
/// move within a callback, so a reading in microseconds taken for a
/// duration serves later millisecond reads too) and shared-data records. A request reads its
/// model's load table to place itself and again to hold load, in the same
/// callback; the second read is served from here. Another worker changing
/// the record meanwhile makes the CAS write fail, which drops the entry, so
/// the retry reads afresh. Cleared at each callback.
#[derive(Debug, Default)]
pub struct CallbackReads {
    clock_us: std::cell::Cell<Option<u64>>,
    /// At most a few per callback: a list, searched in order, keeps its
    /// room from one callback to the next and hashes nothing.
    records: std::cell::RefCell<Vec<(super::keys::Key, Record)>>,
}

/// A shared-data value and its CAS token, as read.
type Record = (Option<Vec<u8>>, Option<u32>);

impl CallbackReads {
    /// A new callback: what was read in the last one may be stale.
    pub fn clear(&mut self) {
        self.clock_us.set(None);
        self.records.get_mut().clear();
    }

    /// The callback's time in milliseconds; `read_us` reads the clock in
    /// microseconds when nothing in this callback has yet.
    pub fn clock_ms(&self, read_us: impl FnOnce() -> u64) -> u64 {
        if let Some(t) = self.clock_us.get() {
            return t / 1000;
        }
        let t = read_us();
        self.clock_us.set(Some(t));
        t / 1000
    }

    /// A reading of the clock in microseconds (durations read afresh): the
    /// first of a callback also answers its millisecond reads.
    pub fn saw_us(&self, us: u64) {
        if self.clock_us.get().is_none() {
            self.clock_us.set(Some(us));
        }
    }

    pub fn get(&self, key: &str, read: impl FnOnce() -> Record) -> Record {
        if let Some((_, v)) = self.records.borrow().iter().find(|(k, _)| k == key) {
            return v.clone();
        }
        let v = read();
        self.records.borrow_mut().push((key.into(), v.clone()));
        v
    }

    /// Reads `key` afresh with `read`, and keeps that for the rest of the
    /// callback.
    pub fn refresh(&self, key: &str, read: impl FnOnce() -> Record) -> Record {
        let v = read();
        let mut records = self.records.borrow_mut();
        match records.iter_mut().find(|(k, _)| k == key) {
            Some((_, kept)) => *kept = v.clone(),
            None => records.push((key.into(), v.clone())),
        }
        v
    }

    /// A write to `key` (whatever its outcome, its CAS moved or is not ours).
    pub fn wrote(&mut self, key: &str) {
        self.records.get_mut().retain(|(k, _)| k != key);
    }
}

/// Reads of a store that go past the callback's kept reads
/// ([`SharedStore::shared_get_fresh`]), for code that takes a store and
/// must see other workers' latest writes. It only reads: a write through it
/// fails.
pub struct Fresh<'a, S: ?Sized>(pub &'a S);

impl<S: SharedStore + ?Sized> SharedStore for Fresh<'_, S> {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.0.shared_get_fresh(key)
    }

    fn shared_set(&mut self, _: &str, _: &[u8], _: Option<u32>) -> Result<(), SetError> {
        Err(SetError::Failed(
            "a fresh view of shared data only reads".into(),
        ))
    }
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

    /// A store read through [`CallbackReads`], as the shell's stream host.
    struct Cached<'a> {
        store: &'a mut MemoryStore,
        reads: CallbackReads,
        sets: u32,
    }

    impl SharedStore for Cached<'_> {
        fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
            self.reads.get(key, || self.store.shared_get(key))
        }
        fn shared_get_fresh(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
            self.reads.refresh(key, || self.store.shared_get(key))
        }
        fn shared_set(
            &mut self,
            key: &str,
            value: &[u8],
            cas: Option<u32>,
        ) -> Result<(), SetError> {
            self.reads.wrote(key);
            self.sets += 1;
            self.store.shared_set(key, value, cas)
        }
    }

    #[test]
    fn a_record_read_twice_in_a_callback_is_read_once_and_a_stale_one_is_read_again() {
        let mut store = MemoryStore::default();
        store.shared_set("k", &[1], None).unwrap();
        let mut c = Cached {
            store: &mut store,
            reads: CallbackReads::default(),
            sets: 0,
        };
        assert_eq!(c.shared_get("k").0, Some(vec![1]));
        // Another worker writes meanwhile: the cached CAS is stale.
        c.store.shared_set("k", &[5], None).unwrap();
        assert_eq!(
            c.shared_get("k").0,
            Some(vec![1]),
            "served from the callback's reads"
        );
        let out = cas_update(&mut c, "k", count, |v| vec![*v as u8], |v| *v += 1).unwrap();
        assert_eq!(
            out, 6,
            "the CAS failed on the stale read, the retry read afresh"
        );
        assert_eq!(c.sets, 2, "one failed write, one that held");
        assert_eq!(c.reads.clock_ms(|| 7_400), 7);
        assert_eq!(c.reads.clock_ms(|| 9_000), 7, "one clock read per callback");
        c.reads.clear();
        c.reads.saw_us(9_100);
        c.reads.saw_us(12_000);
        assert_eq!(
            c.reads.clock_ms(|| 15_000),
            9,
            "the callback's first microsecond reading serves"
        );
    }

    #[test]
    fn a_fresh_read_sees_another_workers_write_and_later_reads_keep_it() {
        let mut store = MemoryStore::default();
        store.shared_set("k", &[1], None).unwrap();
        let c = Cached {
            store: &mut store,
            reads: CallbackReads::default(),
            sets: 0,
        };
        assert_eq!(c.shared_get("k").0, Some(vec![1]));
        c.store.shared_set("k", &[2], None).unwrap();
        assert_eq!(c.shared_get("k").0, Some(vec![1]), "kept");
        assert_eq!(c.shared_get_fresh("k").0, Some(vec![2]), "read past it");
        assert_eq!(c.shared_get("k").0, Some(vec![2]), "and kept in turn");
        assert_eq!(c.shared_get_fresh("new").0, None);
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

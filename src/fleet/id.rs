//! Stable identities. Everything that outlives a request (load, health,
//! scraped metrics, prefix entries) is keyed by these, never by a position in
//! today's configuration, so a pod set that changes while Envoy runs leaves
//! every other pod's state where it was.

use std::fmt;

/// FNV-1a, 64 bits: stable across VMs, builds and processes (std's hasher is
/// seeded per process, so it could not name shared state).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_extend(0xcbf2_9ce4_8422_2325, bytes)
}

/// Continues an FNV-1a hash over more bytes.
pub fn fnv1a_extend(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A pod, known by its name and its address together: a pod re-created at a
/// new IP under the same name is a new pod (its KV cache is gone), and two
/// names for one address are two configuration entries the operator meant
/// apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(pub u64);

impl PodId {
    pub fn of(name: &str, address: &str) -> PodId {
        // The separator keeps ("a", "b:1") and ("ab", ":1") apart.
        let h = fnv1a_extend(fnv1a(name.as_bytes()), &[0]);
        PodId(fnv1a_extend(h, address.as_bytes()))
    }
}

impl fmt::Display for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A model, known by its name (what clients send).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u64);

impl ModelId {
    pub fn of(name: &str) -> ModelId {
        ModelId(fnv1a(name.as_bytes()))
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn pod_identity_is_name_and_address() {
        let a = PodId::of("p0", "10.0.0.1:8000");
        assert_eq!(a, PodId::of("p0", "10.0.0.1:8000"));
        assert_ne!(a, PodId::of("p0", "10.0.0.2:8000"), "re-addressed");
        assert_ne!(a, PodId::of("p1", "10.0.0.1:8000"), "renamed");
        assert_ne!(PodId::of("a", "b:1"), PodId::of("ab", ":1"));
    }
}

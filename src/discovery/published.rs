//! The discovered pod set in shared data: the lister VM writes it when it
//! changes, with a generation in a small key of its own that every VM reads
//! each tick (the set itself is copied only when the generation moved).
//! JSON rather than a fixed record: pods carry strings, the set is written
//! once per change, and one serde derive is the whole codec.

use super::adapter::DiscoveredAdapter;
use super::kube::DiscoveredPod;
use crate::codec::{RecordReader, RecordWriter};
use crate::pods::SharedStore;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedPods {
    pub generation: u64,
    pub pods: Vec<DiscoveredPod>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<DiscoveredAdapter>,
}

pub fn decode_generation(bytes: Option<&[u8]>) -> u64 {
    bytes.and_then(|b| RecordReader::new(b).u64()).unwrap_or(0)
}

pub fn encode_generation(generation: u64) -> Vec<u8> {
    let mut w = RecordWriter::with_capacity(8);
    w.u64(generation);
    w.finish()
}

/// The published set, if any (a value that does not decode reads as none).
pub fn read<S: SharedStore + ?Sized>(store: &S, key: &str) -> Option<PublishedPods> {
    let (bytes, _) = store.shared_get(key);
    serde_json::from_slice(&bytes?).ok()
}

/// Publishes `pods` and `adapters` (`None`: what is published already)
/// unless they are what is published; returns the record when it wrote
/// one. The set goes in before its generation, so a VM that sees a
/// generation finds its set.
pub fn publish<S: SharedStore + ?Sized>(
    store: &mut S,
    set_key: &str,
    generation_key: &str,
    pods: Option<&[DiscoveredPod]>,
    adapters: Option<&[DiscoveredAdapter]>,
) -> Result<Option<PublishedPods>, String> {
    let current = read(store, set_key);
    let (old_pods, old_adapters) = current
        .as_ref()
        .map_or((&[][..], &[][..]), |c| (&c.pods[..], &c.adapters[..]));
    let pods = pods.unwrap_or(old_pods);
    let adapters = adapters.unwrap_or(old_adapters);
    if current.is_some() && pods == old_pods && adapters == old_adapters {
        return Ok(None);
    }
    let generation = current
        .as_ref()
        .map_or(1, |c| c.generation.wrapping_add(1).max(1));
    let record = PublishedPods {
        generation,
        pods: pods.to_vec(),
        adapters: adapters.to_vec(),
    };
    let json = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
    store
        .shared_set(set_key, &json, None)
        .map_err(|e| format!("{e:?}"))?;
    store
        .shared_set(generation_key, &encode_generation(generation), None)
        .map_err(|e| format!("{e:?}"))?;
    Ok(Some(record))
}

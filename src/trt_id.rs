//! TensorRT-LLM disaggregated request ids (snowflake layout).
//!
//! `[ms since 2023-01-01 (41 bits)][machine id (10 bits)][counter (12 bits)]`,
//! folded into `[TRT_MIN_GLOBAL_ID, i64::MAX)` because TensorRT-LLM reserves the
//! ids below `1 << 42` for requests it numbers itself.
//!
//! Envoy runs one VM per worker thread and all of them share the machine id,
//! so the 12 counter bits are split: the top 4 hold a worker slot handed out
//! through shared data, the low 8 count within a millisecond. Ids stay unique
//! across up to 16 workers without any per-request cross-VM call.

use std::cell::RefCell;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Bits of the machine id field.
pub const TRT_MACHINE_ID_BITS: u32 = 10;
/// Every id handed to TensorRT-LLM is at least this.
pub const TRT_MIN_GLOBAL_ID: i64 = 1 << 42;
/// The snowflake epoch, 2023-01-01T00:00:00Z, in Unix milliseconds.
pub const TRT_EPOCH_MS: u64 = 1_672_531_200_000;

const COUNTER_BITS: u32 = 12;
const SEQ_BITS: u32 = 8;
/// Worker slots available in the counter field.
pub const WORKER_SLOTS: u8 = 1 << (COUNTER_BITS - SEQ_BITS);
const SEQ_MAX: u16 = (1 << SEQ_BITS) - 1;
const TIMESTAMP_MASK: u64 = (1 << 41) - 1;

/// A machine id outside `[0, 2^TRT_MACHINE_ID_BITS)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidMachineId(pub u64);

impl fmt::Display for InvalidMachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TensorRT-LLM machine id {} is out of range; it must be in [0, {}) ({} bits)",
            self.0,
            1u64 << TRT_MACHINE_ID_BITS,
            TRT_MACHINE_ID_BITS
        )
    }
}

impl std::error::Error for InvalidMachineId {}

/// Checks that `id` fits the machine-id field.
pub fn validate_trt_machine_id(id: u64) -> Result<u16, InvalidMachineId> {
    if id < (1 << TRT_MACHINE_ID_BITS) {
        Ok(id as u16)
    } else {
        Err(InvalidMachineId(id))
    }
}

/// A gateway replica's machine id, from the value of its environment
/// variable (`trt_machine_id_env`): ids of two replicas can only collide if
/// their machine ids are equal, so each replica needs its own.
///
/// - a number in `[0, 1024)`: that id;
/// - a StatefulSet pod name (`metadata.name`, `<set>-<ordinal>`): the
///   ordinal. Unique among the set's replicas while there are fewer than
///   1024 — the derivation to use;
/// - a pod IP (`status.podIP`): its low 10 bits. Replicas collide when
///   their addresses are equal modulo 1024, which happens across nodes
///   (10.1.3.7 and 10.1.7.7 both give 775): use it only where pods of one
///   Deployment share one /22 or smaller block, else give each replica its
///   number.
pub fn machine_id_from(value: &str) -> Result<u16, String> {
    let v = value.trim();
    if let Ok(n) = v.parse::<u64>() {
        return validate_trt_machine_id(n).map_err(|e| e.to_string());
    }
    if let Ok(ip) = v.parse::<std::net::IpAddr>() {
        let low = match ip {
            std::net::IpAddr::V4(a) => u32::from(a) as u64,
            std::net::IpAddr::V6(a) => u128::from(a) as u64,
        };
        return Ok((low & ((1 << TRT_MACHINE_ID_BITS) - 1)) as u16);
    }
    let ordinal = v
        .rsplit_once('-')
        .and_then(|(_, n)| n.parse::<u64>().ok())
        .ok_or_else(|| {
            format!(
                "{v:?} is neither a machine id (0 to 1023), a pod IP, nor a StatefulSet pod name ending in -<ordinal>"
            )
        })?;
    validate_trt_machine_id(ordinal).map_err(|e| format!("{v:?}: {e}"))
}

/// Generates disagg request ids for one VM.
#[derive(Debug, Clone)]
pub struct DisaggIdGenerator {
    machine_id: u16,
    worker_slot: u8,
    last_ms: Option<u64>,
    seq: u16,
}

impl DisaggIdGenerator {
    /// `worker_slot` is taken modulo [`WORKER_SLOTS`].
    pub fn new(machine_id: u16, worker_slot: u8) -> Result<Self, InvalidMachineId> {
        let machine_id = validate_trt_machine_id(machine_id as u64)?;
        Ok(DisaggIdGenerator {
            machine_id,
            worker_slot: worker_slot % WORKER_SLOTS,
            last_ms: None,
            seq: 0,
        })
    }

    /// The next id at wall-clock time `now_ms` (Unix ms). Ids from one
    /// generator strictly increase in their raw form: a clock that stalls or
    /// steps back reuses the last millisecond, and a millisecond whose counter
    /// is spent borrows the next one instead of waiting (a wasm VM can't sleep).
    pub fn next_id(&mut self, now_ms: u64) -> i64 {
        let now = now_ms.saturating_sub(TRT_EPOCH_MS) & TIMESTAMP_MASK;
        match self.last_ms {
            Some(last) if now <= last => {
                if self.seq < SEQ_MAX {
                    self.seq += 1;
                } else {
                    self.last_ms = Some(last + 1);
                    self.seq = 0;
                }
            }
            _ => {
                self.last_ms = Some(now);
                self.seq = 0;
            }
        }
        let ms = self.last_ms.unwrap_or(now);
        let raw = (ms << (TRT_MACHINE_ID_BITS + COUNTER_BITS))
            | ((self.machine_id as u64) << COUNTER_BITS)
            | ((self.worker_slot as u64) << SEQ_BITS)
            | self.seq as u64;
        fold(raw)
    }
}

/// Folds a raw snowflake into TensorRT-LLM's global id range.
fn fold(raw: u64) -> i64 {
    let span = (i64::MAX - TRT_MIN_GLOBAL_ID) as u64;
    (raw % span) as i64 + TRT_MIN_GLOBAL_ID
}

thread_local! {
    static GENERATORS: RefCell<Vec<DisaggIdGenerator>> = const { RefCell::new(Vec::new()) };
}

/// The seed API: the next id for `machine_id` from this thread's generator,
/// on the system clock. The filter uses a [`DisaggIdGenerator`] with Envoy's
/// clock and a worker slot instead.
pub fn get_disagg_request_id(machine_id: u16) -> Result<i64, InvalidMachineId> {
    let machine_id = validate_trt_machine_id(machine_id as u64)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Ok(GENERATORS.with(|g| {
        let mut g = g.borrow_mut();
        if let Some(gen) = g.iter_mut().find(|x| x.machine_id == machine_id) {
            return gen.next_id(now);
        }
        let mut gen = DisaggIdGenerator {
            machine_id,
            worker_slot: 0,
            last_ms: None,
            seq: 0,
        };
        let id = gen.next_id(now);
        g.push(gen);
        id
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_000_000_000; // late 2025

    #[test]
    fn machine_ids_are_bounded_by_ten_bits() {
        assert_eq!(validate_trt_machine_id(0), Ok(0));
        assert_eq!(validate_trt_machine_id(1023), Ok(1023));
        let e = validate_trt_machine_id(1024).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TensorRT-LLM machine id 1024 is out of range; it must be in [0, 1024) (10 bits)"
        );
        assert!(DisaggIdGenerator::new(4096, 0).is_err());
    }

    #[test]
    fn layout_matches_the_snowflake_fields() {
        let mut g = DisaggIdGenerator::new(5, 3).unwrap();
        let id = g.next_id(NOW);
        let raw = ((NOW - TRT_EPOCH_MS) << 22) | (5 << 12) | (3 << 8);
        assert_eq!(id, fold(raw));
        // Current timestamps keep raw ids below the fold, so the fields are
        // readable in the id itself.
        let unfolded = (id - TRT_MIN_GLOBAL_ID) as u64;
        assert_eq!(unfolded, raw);
        assert!(id > (1i64 << 53), "real ids exceed f64's exact range");
    }

    #[test]
    fn ids_are_at_least_the_minimum_even_at_the_epoch() {
        let mut g = DisaggIdGenerator::new(0, 0).unwrap();
        assert_eq!(g.next_id(0), TRT_MIN_GLOBAL_ID);
        assert_eq!(g.next_id(TRT_EPOCH_MS), TRT_MIN_GLOBAL_ID + 1);
    }

    #[test]
    fn ids_increase_within_a_millisecond_and_across_a_stalled_clock() {
        let mut g = DisaggIdGenerator::new(1, 0).unwrap();
        let mut last = 0;
        for _ in 0..1000 {
            let id = g.next_id(NOW);
            assert!(id > last);
            last = id;
        }
        let id = g.next_id(NOW - 5_000);
        assert!(id > last, "a clock stepping back must not repeat ids");
    }

    #[test]
    fn workers_sharing_a_machine_id_never_collide() {
        let mut a = DisaggIdGenerator::new(7, 0).unwrap();
        let mut b = DisaggIdGenerator::new(7, 1).unwrap();
        let ids_a: Vec<i64> = (0..300).map(|_| a.next_id(NOW)).collect();
        let ids_b: std::collections::HashSet<i64> = (0..300).map(|_| b.next_id(NOW)).collect();
        assert!(ids_a.iter().all(|id| !ids_b.contains(id)));
    }

    #[test]
    fn replica_machine_ids_come_from_a_number_an_ordinal_or_an_ip() {
        assert_eq!(machine_id_from("7"), Ok(7));
        assert_eq!(machine_id_from(" pd-gateway-12 "), Ok(12));
        assert_eq!(machine_id_from("10.1.3.7"), Ok(3 * 256 + 7));
        assert_eq!(
            machine_id_from("10.1.7.7"),
            Ok(3 * 256 + 7),
            "a collision, as documented"
        );
        assert_eq!(machine_id_from("fd00::3ff"), Ok(1023));
        assert!(machine_id_from("1024").is_err());
        assert!(machine_id_from("gw-4096")
            .unwrap_err()
            .contains("out of range"));
        assert!(machine_id_from("gateway")
            .unwrap_err()
            .contains("StatefulSet"));
    }

    #[test]
    fn seed_api_validates_and_generates() {
        assert!(get_disagg_request_id(1024).is_err());
        let a = get_disagg_request_id(3).unwrap();
        let b = get_disagg_request_id(3).unwrap();
        assert!(a >= TRT_MIN_GLOBAL_ID && b > a);
    }
}

//! What the scheduler is asked to place, and how much load a pod takes
//! before it gives way.

use crate::fleet::Scheduling;

/// What the scheduler is asked to place.
pub struct PlacementRequest<'a> {
    /// Estimated prompt length in tokens.
    pub prompt_tokens: u64,
    /// Prefix-cache match percentage per pod slot (0 when absent).
    pub prefix_match: &'a dyn Fn(usize) -> f64,
    /// `consistent_hash`: the hash naming the prompt's leading blocks.
    pub prefix_key: Option<u64>,
    /// `consistent_hash`: when a pod's load makes it give way (from
    /// [`Scheduling::bounded_load_factor`]).
    pub load_bound: LoadBound,
    /// This VM's round-robin turn over the model's prefill pods.
    pub prefill_turn: u64,
    /// The next round-robin turn over a roleset's decode pods (by roleset
    /// index): each phase rotates on its own, or decode pods whose index
    /// never lines up with their roleset's prefill turn would never be chosen.
    pub decode_turn: &'a mut dyn FnMut(usize) -> u64,
    /// Uniform random numbers: ties between equal pods and rolesets are
    /// broken with them, so idle capacity shares the work.
    pub random: &'a mut dyn FnMut() -> u64,
    /// Slots of the pods this request already failed on.
    pub exclude: &'a [usize],
    /// Session affinity: the session's key. Its pods are ranked by it, the
    /// prefill and the decode pod alike, with `load_bound` the session's.
    pub session: Option<u64>,
}

/// When a pod holding a prefix is too busy to keep it (consistent hashing
/// with bounded loads, Mirrokni, Thorup and Zadimoghaddam): each pod takes
/// at most ⌈`factor` × (the pods' load + 1) / pods⌉, so no pod runs more
/// than `factor` times the mean, at any load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadBound {
    pub factor: f64,
}

impl LoadBound {
    pub fn of(s: &Scheduling) -> LoadBound {
        LoadBound {
            factor: s.bounded_load_factor,
        }
    }

    /// The load at which a pod gives way, when the candidates' loads sum to
    /// `total` over `pods` pods.
    pub fn capacity(&self, total: f64, pods: usize) -> f64 {
        (self.factor * (total + 1.0) / pods.max(1) as f64).ceil()
    }
}

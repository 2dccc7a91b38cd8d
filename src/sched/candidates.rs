//! The first stage of a placement: which rolesets fit the prompt's length,
//! which of their pods are usable, and the combined pods to fall back on.

use super::choice::{Choice, NoPod};
use super::random::shuffle;
use super::request::PlacementRequest;
use super::state::{state, PodState};
use crate::fleet::{DecodePolicy, Endpoint, Model, PrefillPolicy};
use std::rc::Rc;

/// A pod that may take the request, with the roleset it pairs within.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'m> {
    pub roleset: usize,
    pub ep: &'m Rc<Endpoint>,
}

/// Everything the later stages choose from.
pub(crate) struct Pool<'m> {
    /// Rolesets (indices) whose bucket fits the prompt.
    pub fits: Vec<usize>,
    pub prefill: Vec<Candidate<'m>>,
    pub decode: Vec<Candidate<'m>>,
    /// Usable combined pods whose bucket fits.
    pub combined: Vec<&'m Rc<Endpoint>>,
}

impl<'m> Pool<'m> {
    /// The decode candidates of `roleset`.
    pub fn decode_of(&self, roleset: usize) -> Vec<Candidate<'m>> {
        self.decode
            .iter()
            .filter(|c| c.roleset == roleset)
            .copied()
            .collect()
    }

    /// The prefill candidates of `roleset`.
    pub fn prefill_of(&self, roleset: usize) -> Vec<Candidate<'m>> {
        self.prefill
            .iter()
            .filter(|c| c.roleset == roleset)
            .copied()
            .collect()
    }
}

fn usable(ep: &Endpoint, pods: &[PodState], exclude: &[usize]) -> bool {
    !exclude.contains(&ep.slot) && !state(pods, ep).unhealthy
}

/// The least of `items` by `key`; the first of equals.
pub(crate) fn least<T>(items: &[T], key: impl Fn(&T) -> f64) -> Option<&T> {
    items.iter().fold(None, |best: Option<&T>, x| match best {
        Some(b) if key(b) <= key(x) => Some(b),
        _ => Some(x),
    })
}

/// The usable prefill and decode pods of the rolesets `fits` names, each
/// roleset only when it has both.
fn roleset_candidates<'m>(
    model: &'m Model,
    pods: &[PodState],
    exclude: &[usize],
    fits: &[usize],
) -> (Vec<Candidate<'m>>, Vec<Candidate<'m>>) {
    let mut prefill: Vec<Candidate> = Vec::new();
    let mut decode: Vec<Candidate> = Vec::new();
    for (ri, rs) in model.rolesets.iter().enumerate() {
        if !fits.contains(&ri) {
            continue;
        }
        let usable_of = |list: &'m [Rc<Endpoint>]| -> Vec<Candidate<'m>> {
            list.iter()
                .filter(|e| usable(e, pods, exclude))
                .map(|ep| Candidate { roleset: ri, ep })
                .collect()
        };
        let p: Vec<Candidate> = usable_of(&rs.prefill)
            .into_iter()
            .filter(|c| !state(pods, c.ep).not_ready_for_prefill)
            .collect();
        let d = usable_of(&rs.decode);
        // A roleset pairs within itself: half of one is no candidate.
        if !p.is_empty() && !d.is_empty() {
            prefill.extend(p);
            decode.extend(d);
        }
    }
    (prefill, decode)
}

/// The pool to choose from, or the decision when there is nothing to choose
/// (only combined pods, or no pod at all).
/// Candidates come out shuffled (all but a round-robin phase's, whose
/// rotation needs a stable order): every later "first of equals" is then a
/// random one, so equal idle pods and rolesets share the work.
pub(crate) fn gather<'m>(
    model: &'m Model,
    pods: &[PodState],
    req: &mut PlacementRequest,
) -> Result<Pool<'m>, Choice<'m>> {
    let configured = model.rolesets.iter().any(|r| r.is_eligible());
    if !configured && model.combined.is_empty() {
        return Err(Choice::NoPod(NoPod::NotConfigured));
    }
    let mut combined: Vec<&Rc<Endpoint>> = model
        .combined
        .iter()
        .filter(|c| {
            c.prompt_tokens
                .is_none_or(|r| r.contains(req.prompt_tokens))
        })
        .filter(|c| usable(c, pods, req.exclude))
        .collect();

    // Prompt-length buckets: a roleset without a range takes any length.
    let mut fits: Vec<usize> = model
        .rolesets
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_eligible())
        .filter(|(_, r)| {
            r.prompt_tokens
                .is_none_or(|b| b.contains(req.prompt_tokens))
        })
        .map(|(i, _)| i)
        .collect();
    let (mut prefill, mut decode) = roleset_candidates(model, pods, req.exclude, &fits);
    shuffle(&mut combined, req.random);
    shuffle(&mut fits, req.random);
    if model.prefill_policy != PrefillPolicy::RoundRobin {
        shuffle(&mut prefill, req.random);
    }
    if model.decode_policy != DecodePolicy::RoundRobin {
        shuffle(&mut decode, req.random);
    }
    if prefill.is_empty() {
        return Err(match least(&combined, |c| state(pods, c).decode_load()) {
            Some(pod) => Choice::Combined {
                pod,
                reason: if fits.is_empty() {
                    "no_bucket"
                } else {
                    "pd_unavailable"
                },
            },
            None if fits.is_empty() && configured => Choice::NoPod(NoPod::NoBucket),
            None => Choice::NoPod(NoPod::AllUnhealthy),
        });
    }
    Ok(Pool {
        fits,
        prefill,
        decode,
        combined,
    })
}

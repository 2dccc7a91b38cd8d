//! Choosing the prefill and decode pods. Round-robin for now: a pair always
//! comes from one roleset, and only rolesets with both roles are eligible.

use crate::config::{Config, Endpoint, Model};
use std::cell::Cell;

/// A prefill and a decode pod of one roleset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair<'m> {
    pub prefill: &'m Endpoint,
    pub decode: &'m Endpoint,
}

/// The `turn`-th pair of `model` in round-robin order: rolesets rotate
/// first, then pods within each roleset.
pub fn round_robin_pair(model: &Model, turn: u64) -> Option<Pair<'_>> {
    let eligible: Vec<_> = model.rolesets.iter().filter(|r| r.is_eligible()).collect();
    if eligible.is_empty() {
        return None;
    }
    let rs = eligible[(turn % eligible.len() as u64) as usize];
    let k = turn / eligible.len() as u64;
    Some(Pair {
        prefill: &rs.prefill[(k % rs.prefill.len() as u64) as usize],
        decode: &rs.decode[(k % rs.decode.len() as u64) as usize],
    })
}

/// Per-VM round-robin state.
#[derive(Debug, Default)]
pub struct RoundRobin {
    per_model: Vec<Cell<u64>>,
    any_decode: Cell<u64>,
    decodes: Vec<Endpoint>,
}

impl RoundRobin {
    pub fn new(config: &Config) -> RoundRobin {
        let mut decodes: Vec<Endpoint> = Vec::new();
        for m in &config.models {
            for rs in &m.rolesets {
                for d in &rs.decode {
                    if !decodes.iter().any(|x| x.address == d.address) {
                        decodes.push(d.clone());
                    }
                }
            }
        }
        RoundRobin {
            per_model: config.models.iter().map(|_| Cell::new(0)).collect(),
            any_decode: Cell::new(0),
            decodes,
        }
    }

    /// The next pair for the model at `model_index` in the config.
    pub fn pair<'m>(&self, model_index: usize, model: &'m Model) -> Option<Pair<'m>> {
        let turn = self.per_model.get(model_index)?;
        let t = turn.get();
        turn.set(t.wrapping_add(1));
        round_robin_pair(model, t)
    }

    /// A decode pod of any model, for requests the router does not split
    /// (`/v1/models`, `/health`, ...): they still must not choose their own
    /// upstream.
    pub fn any_decode(&self) -> Option<&Endpoint> {
        if self.decodes.is_empty() {
            return None;
        }
        let t = self.any_decode.get();
        self.any_decode.set(t.wrapping_add(1));
        Some(&self.decodes[(t % self.decodes.len() as u64) as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[
                {"name":"a","prefill":["10.0.0.1:1","10.0.0.2:1"],"decode":["10.0.1.1:1"]},
                {"name":"half","prefill":["10.0.9.9:1"]},
                {"name":"b","prefill":["10.0.0.3:1"],"decode":["10.0.1.2:1","10.0.1.3:1"]}]},
              {"name":"empty","engine":"vllm","rolesets":[{"decode":["10.0.1.1:1"]}]}]}"#,
        )
        .expect("config")
    }

    #[test]
    fn pairs_come_from_one_eligible_roleset_and_rotate() {
        let c = config();
        let rr = RoundRobin::new(&c);
        let m = &c.models[0];
        let picks: Vec<(String, String)> = (0..4)
            .map(|_| {
                let p = rr.pair(0, m).expect("pair");
                (p.prefill.address.clone(), p.decode.address.clone())
            })
            .collect();
        assert_eq!(
            picks,
            vec![
                ("10.0.0.1:1".into(), "10.0.1.1:1".into()),
                ("10.0.0.3:1".into(), "10.0.1.2:1".into()),
                ("10.0.0.2:1".into(), "10.0.1.1:1".into()),
                ("10.0.0.3:1".into(), "10.0.1.3:1".into()),
            ]
        );
        assert!(picks.iter().all(|(p, _)| p != "10.0.9.9:1"));
    }

    #[test]
    fn a_model_without_an_eligible_roleset_has_no_pair() {
        let c = config();
        let rr = RoundRobin::new(&c);
        assert_eq!(rr.pair(1, &c.models[1]), None);
    }

    #[test]
    fn unsplit_requests_rotate_over_distinct_decodes() {
        let c = config();
        let rr = RoundRobin::new(&c);
        let got: Vec<_> = (0..4)
            .map(|_| rr.any_decode().unwrap().address.clone())
            .collect();
        assert_eq!(
            got,
            vec!["10.0.1.1:1", "10.0.1.2:1", "10.0.1.3:1", "10.0.1.1:1"]
        );
    }
}

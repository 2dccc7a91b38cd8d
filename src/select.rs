//! Where requests the router does not split go: round-robin over every
//! healthy decode pod of the configuration (`/v1/models`, `/health`, ...).
//! Split requests are placed by [`crate::sched`].

use crate::config::{Config, Endpoint};
use std::cell::Cell;

/// Per-VM round-robin over distinct decode pods.
#[derive(Debug, Default)]
pub struct RoundRobin {
    turn: Cell<u64>,
    decodes: Vec<Endpoint>,
}

impl RoundRobin {
    pub fn new(config: &Config) -> RoundRobin {
        let mut decodes: Vec<Endpoint> = Vec::new();
        for m in &config.models {
            for d in m
                .rolesets
                .iter()
                .flat_map(|rs| rs.decode.iter())
                .chain(m.combined.iter())
            {
                if !decodes.iter().any(|x| x.address == d.address) {
                    decodes.push(d.clone());
                }
            }
        }
        RoundRobin {
            turn: Cell::new(0),
            decodes,
        }
    }

    /// The next decode pod for which `usable` holds: requests that are not
    /// split still must not choose their own upstream.
    pub fn any_decode(&self, usable: impl Fn(&Endpoint) -> bool) -> Option<&Endpoint> {
        let n = self.decodes.len() as u64;
        let t = self.turn.get();
        self.turn.set(t.wrapping_add(1));
        (0..n)
            .map(|k| &self.decodes[((t + k) % n) as usize])
            .find(|e| usable(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_over_distinct_usable_decodes() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[
                {"prefill":["10.0.0.1:1"],"decode":["10.0.1.1:1"]},
                {"prefill":["10.0.0.3:1"],"decode":["10.0.1.2:1","10.0.1.3:1"]}]},
              {"name":"n","engine":"vllm","rolesets":[{"decode":["10.0.1.1:1"]}]}]}"#,
        )
        .expect("config");
        let rr = RoundRobin::new(&c);
        let next = |f: &dyn Fn(&Endpoint) -> bool| rr.any_decode(f).map(|e| e.address.clone());
        let all = |_: &Endpoint| true;
        let got: Vec<_> = (0..4).map(|_| next(&all).unwrap()).collect();
        assert_eq!(
            got,
            vec!["10.0.1.1:1", "10.0.1.2:1", "10.0.1.3:1", "10.0.1.1:1"]
        );
        let skip = |e: &Endpoint| e.address != "10.0.1.2:1";
        let got: Vec<_> = (0..3).map(|_| next(&skip).unwrap()).collect();
        assert_eq!(got, vec!["10.0.1.3:1", "10.0.1.3:1", "10.0.1.1:1"]);
        assert!(next(&|_| false).is_none());
    }
}

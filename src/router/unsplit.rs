//! Where requests the router does not split go: round-robin over every
//! healthy decode pod of the fleet (`/v1/models`, `/health`, ...). Split
//! requests are placed by [`crate::sched`].

use crate::fleet::{Endpoint, Fleet};
use std::rc::Rc;

/// The distinct decode (and combined) pods of every model, in order.
pub fn decode_pods(fleet: &Fleet) -> Vec<Rc<Endpoint>> {
    let mut out: Vec<Rc<Endpoint>> = Vec::new();
    for m in fleet.models() {
        for d in m
            .rolesets
            .iter()
            .flat_map(|rs| rs.decode.iter())
            .chain(m.combined.iter())
        {
            if !out.iter().any(|x| x.address == d.address) {
                out.push(Rc::clone(d));
            }
        }
    }
    out
}

/// The pod for `turn` among `pods`, skipping those `usable` refuses:
/// requests that are not split still must not choose their own upstream.
pub fn next_decode(
    pods: &[Rc<Endpoint>],
    turn: u64,
    usable: impl Fn(&Endpoint) -> bool,
) -> Option<&Rc<Endpoint>> {
    let n = pods.len();
    (0..n)
        .filter_map(|k| pods.get(((turn as usize).wrapping_add(k)) % n.max(1)))
        .find(|e| usable(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn rotates_over_distinct_usable_decodes() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[
                {"prefill":["10.0.0.1:1"],"decode":["10.0.1.1:1"]},
                {"prefill":["10.0.0.3:1"],"decode":["10.0.1.2:1","10.0.1.3:1"]}]},
              {"name":"n","engine":"vllm","rolesets":[{"decode":["10.0.1.1:1"]}]}]}"#,
        )
        .expect("config");
        let pods = decode_pods(&c.fleet());
        let mut turn = 0;
        let mut next = |f: &dyn Fn(&Endpoint) -> bool| {
            turn += 1;
            next_decode(&pods, turn - 1, f).map(|e| e.address.clone())
        };
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

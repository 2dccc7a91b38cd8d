//! The pods' NICs: one per pod, shared by every KV transfer in flight on it.
//! A transfer from a prefill pod to a decode pod moves at the NIC's
//! bandwidth divided by the number of transfers on the busier of its two
//! NICs, recomputed whenever one starts or ends (processor sharing). Pure:
//! times are passed in; the fleet drives it in modelled time.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy)]
struct Flow {
    src: usize,
    dst: usize,
    /// Bytes still to move.
    left: f64,
}

/// The transfers in flight, by id.
#[derive(Debug)]
pub struct Links {
    bytes_per_s: f64,
    flows: HashMap<u64, Flow>,
    /// When `left` was last brought up to date (modelled seconds).
    at_s: f64,
    next: u64,
}

impl Links {
    /// NICs of `bytes_per_s` each.
    pub fn new(bytes_per_s: f64) -> Links {
        Links {
            bytes_per_s,
            flows: HashMap::new(),
            at_s: 0.0,
            next: 1,
        }
    }

    fn on_nic(&self, pod: usize) -> usize {
        self.flows
            .values()
            .filter(|f| f.src == pod || f.dst == pod)
            .count()
    }

    /// The rate `f` moves at now.
    fn rate(&self, f: &Flow) -> f64 {
        let sharing = self.on_nic(f.src).max(self.on_nic(f.dst)).max(1);
        self.bytes_per_s / sharing as f64
    }

    /// Moves every flow on to `now_s` at the rates of the flows in flight.
    pub fn advance(&mut self, now_s: f64) {
        let dt = (now_s - self.at_s).max(0.0);
        if dt > 0.0 {
            let rates: Vec<(u64, f64)> = self
                .flows
                .iter()
                .map(|(id, f)| (*id, self.rate(f)))
                .collect();
            for (id, rate) in rates {
                if let Some(f) = self.flows.get_mut(&id) {
                    f.left = (f.left - rate * dt).max(0.0);
                }
            }
        }
        self.at_s = self.at_s.max(now_s);
    }

    /// Starts moving `bytes` from pod `src` to pod `dst` at `now_s`.
    pub fn start(&mut self, now_s: f64, src: usize, dst: usize, bytes: f64) -> u64 {
        self.advance(now_s);
        let id = self.next;
        self.next += 1;
        self.flows.insert(
            id,
            Flow {
                src,
                dst,
                left: bytes.max(0.0),
            },
        );
        id
    }

    /// Seconds from the last update until flow `id` ends at today's rates
    /// (0 when done or unknown).
    pub fn eta_s(&self, id: u64) -> f64 {
        self.flows.get(&id).map_or(0.0, |f| f.left / self.rate(f))
    }

    /// Forgets flow `id` (done).
    pub fn finish(&mut self, id: u64) {
        self.flows.remove(&id);
    }

    pub fn in_flight(&self) -> usize {
        self.flows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs flows `(start_s, src, dst, bytes)` to the end event by event;
    /// returns each one's end time.
    fn ends(bw: f64, flows: &[(f64, usize, usize, f64)]) -> Vec<f64> {
        let mut l = Links::new(bw);
        let mut ids: Vec<Option<u64>> = vec![None; flows.len()];
        let mut out = vec![f64::NAN; flows.len()];
        let mut now = 0.0;
        loop {
            for (i, (at, src, dst, bytes)) in flows.iter().enumerate() {
                if ids[i].is_none() && *at <= now + 1e-12 {
                    ids[i] = Some(l.start(now, *src, *dst, *bytes));
                }
            }
            let next_start = flows
                .iter()
                .zip(&ids)
                .filter(|(_, id)| id.is_none())
                .map(|((at, ..), _)| *at)
                .fold(f64::INFINITY, f64::min);
            let next_end = ids
                .iter()
                .enumerate()
                .filter_map(|(i, id)| id.filter(|_| out[i].is_nan()))
                .map(|id| now + l.eta_s(id))
                .fold(f64::INFINITY, f64::min);
            if next_start.is_infinite() && next_end.is_infinite() {
                return out;
            }
            now = next_start.min(next_end);
            l.advance(now);
            for (i, id) in ids.iter().enumerate() {
                if let Some(id) = id {
                    if out[i].is_nan() && l.eta_s(*id) < 1e-12 {
                        out[i] = now;
                        l.finish(*id);
                    }
                }
            }
        }
    }

    #[test]
    fn concurrent_transfers_share_the_nic_bandwidth() {
        // Alone: 1 GB at 1 GB/s takes 1 s.
        assert_eq!(ends(1e9, &[(0.0, 0, 8, 1e9)]), vec![1.0]);
        // Two out of one prefill pod: each at half the rate, both end at 2 s.
        let two = ends(1e9, &[(0.0, 0, 8, 1e9), (0.0, 0, 9, 1e9)]);
        assert!(two.iter().all(|t| (t - 2.0).abs() < 1e-9), "{two:?}");
        // Two into one decode pod: the same.
        let into = ends(1e9, &[(0.0, 0, 8, 1e9), (0.0, 1, 8, 1e9)]);
        assert!(into.iter().all(|t| (t - 2.0).abs() < 1e-9), "{into:?}");
        // Disjoint pairs do not slow each other.
        let apart = ends(1e9, &[(0.0, 0, 8, 1e9), (0.0, 1, 9, 1e9)]);
        assert!(apart.iter().all(|t| (t - 1.0).abs() < 1e-9), "{apart:?}");
    }

    #[test]
    fn a_transfer_speeds_up_when_its_neighbour_ends() {
        // 0.5 GB and 1 GB together: the small one ends at 1 s (half rate),
        // the large one has 0.5 GB left and moves it alone by 1.5 s.
        let t = ends(1e9, &[(0.0, 0, 8, 0.5e9), (0.0, 0, 9, 1e9)]);
        assert!(
            (t[0] - 1.0).abs() < 1e-9 && (t[1] - 1.5).abs() < 1e-9,
            "{t:?}"
        );
        // One that starts halfway through another's: shares from then on.
        let t = ends(1e9, &[(0.0, 0, 8, 1e9), (0.5, 0, 9, 0.5e9)]);
        assert!(
            (t[0] - 1.5).abs() < 1e-9 && (t[1] - 1.5).abs() < 1e-9,
            "{t:?}"
        );
    }
}

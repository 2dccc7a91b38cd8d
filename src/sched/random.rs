//! The scheduler's random numbers: ties between equal pods are broken with
//! them.

/// SplitMix64: the scheduler's random numbers, seeded once per request
/// from the host (a host call per number would cost more than the choice).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Shuffles `items` (Fisher-Yates) so that "the first of equals" anywhere
/// later is a uniformly random one (AIBrix shuffles its candidates too).
pub(crate) fn shuffle<T>(items: &mut [T], random: &mut dyn FnMut() -> u64) {
    for i in (1..items.len()).rev() {
        let j = (random() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

//! Byte classes a block of bytes at a time, for the two scans whose time
//! grows with a body: a string's bytes up to the next one that matters
//! (a long prompt), and a run of canonical integers (TensorRT-LLM's token
//! ids, 131 000 of them for a 512 KB prompt).
//!
//! Inside wasm (what ships) a block is sixteen bytes, read with SIMD128:
//! inside wasmtime a 512 KB prompt's string takes 17 µs, against 61 µs
//! eight bytes at a time in integer registers and 59 µs by serde_json's
//! skip, which reads four (`usize` is 32 bits in wasm32). SIMD128 is part
//! of WebAssembly 2.0; Envoy's V8 (the end-to-end tests) and wasmtime (the
//! unit tests inside wasm) run it, and a runtime without it would refuse
//! the module when it loads, never fail a request. Both scans take four
//! blocks a step (one branch, or one scalar check of the integers' masks,
//! per 64 bytes): V8 read a 512 KB prompt about a quarter faster so, and
//! TensorRT-LLM's ids in about two thirds of the time (bench/results/HISTORY.md, "Cuts
//! tried"). Natively (tests, benches) a block is eight
//! bytes in a `u64`, and the unit tests run on both.

/// The index of the first byte at or after `from` that is `"`, `\`, below
/// 0x20, or (with `ASCII_ONLY`) 0x80 or above; `b.len()` if none is.
pub(crate) fn next_special<const ASCII_ONLY: bool>(b: &[u8], from: usize) -> usize {
    let Some(rest) = b.get(from..) else {
        return b.len();
    };
    from + imp::first_special::<ASCII_ONLY>(rest)
}

fn is_special<const ASCII_ONLY: bool>(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20 || (ASCII_ONLY && c >= 0x80)
}

/// The byte loop for what is left after the last full block.
fn tail<const ASCII_ONLY: bool>(rest: &[u8], at: usize) -> usize {
    let tail = rest.get(at..).unwrap_or_default();
    at + tail
        .iter()
        .position(|c| is_special::<ASCII_ONLY>(*c))
        .unwrap_or(tail.len())
}

/// The bytes the integer scan takes at a time: four SIMD blocks inside
/// wasm, one `u64` natively.
#[cfg(target_arch = "wasm32")]
pub(crate) const INT_GROUP: usize = 64;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) const INT_GROUP: usize = 8;

/// One group's commas, digits and zeros: bit `k` for byte `k`.
#[derive(Clone, Copy, Default)]
struct IntClasses {
    comma: u64,
    digit: u64,
    zero: u64,
}

/// Where the canonical run of integers that starts at `start` (a number's
/// start, just after `[` or a comma) stops being canonical: digits and
/// single commas only, no leading zeros, a block at a time. Every byte
/// before the returned position is a valid part of the array, and the
/// position is `start` or just after a comma, so the byte loop can go on
/// from there with no state.
pub(crate) fn canonical_prefix(b: &[u8], start: usize) -> usize {
    let Some(rest) = b.get(start..) else {
        return start;
    };
    start + imp::canonical_run(rest)
}

/// The run's logic on each block's classes; `W` bytes a block (at most
/// 64). "The previous byte" is a shift left by one, the block's last byte
/// carried into the next.
#[inline(always)]
fn canonical_run_by<const W: usize>(rest: &[u8], classes: impl Fn(&[u8]) -> IntClasses) -> usize {
    let full = u64::MAX >> (64 - W);
    let last_bit = |m: u64| (m >> (W - 1)) & 1;
    let mut resume = 0;
    // What the byte before the run was: a separator, so the run begins a
    // number (a comma there would make `,,`, and a zero then a digit `01`).
    let (mut prev_comma, mut prev_zero, mut prev_start) = (1, 0, 0);
    for (n, chunk) in rest.chunks_exact(W).enumerate() {
        let IntClasses { comma, digit, zero } = classes(chunk);
        if comma | digit != full {
            break;
        }
        // A byte that starts a number: the one after a comma.
        let starts = ((comma << 1) | prev_comma) & full;
        let double_comma = comma & starts;
        let leading_zero = digit & ((zero << 1) | prev_zero) & ((starts << 1) | prev_start);
        if double_comma | leading_zero != 0 {
            break;
        }
        if comma != 0 {
            // Just after the block's last comma.
            resume = n * W + (63 - comma.leading_zeros() as usize) + 1;
        }
        prev_comma = last_bit(comma);
        prev_zero = last_bit(zero);
        prev_start = last_bit(starts);
    }
    resume
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use crate::body::blocks::{canonical_run_by, tail, IntClasses, INT_GROUP};
    use core::arch::wasm32::{
        i8x16_lt, i8x16_splat, u8x16, u8x16_bitmask, u8x16_eq, u8x16_lt, u8x16_splat, u8x16_sub,
        v128, v128_any_true, v128_or,
    };

    fn load(chunk: &[u8]) -> v128 {
        let c: [u8; 16] = chunk.try_into().unwrap_or_default();
        u8x16(
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13],
            c[14], c[15],
        )
    }

    /// The block's special bytes, as lanes of all ones.
    #[target_feature(enable = "simd128")]
    fn specials<const ASCII_ONLY: bool>(chunk: &[u8]) -> v128 {
        let v = load(chunk);
        // Signed, bytes from 0x80 are negative: below 0x20 as well.
        let low = if ASCII_ONLY {
            i8x16_lt(v, i8x16_splat(0x20))
        } else {
            u8x16_lt(v, u8x16_splat(0x20))
        };
        let quotes = v128_or(
            u8x16_eq(v, u8x16_splat(b'"')),
            u8x16_eq(v, u8x16_splat(b'\\')),
        );
        v128_or(quotes, low)
    }

    #[target_feature(enable = "simd128")]
    pub(crate) fn first_special<const ASCII_ONLY: bool>(rest: &[u8]) -> usize {
        // Four blocks a test: a long string's bytes are mostly plain, and
        // one branch per 64 bytes instead of per 16.
        let mut quads = rest.chunks_exact(64);
        for (n, quad) in quads.by_ref().enumerate() {
            let m = [0, 16, 32, 48]
                .map(|k| specials::<ASCII_ONLY>(quad.get(k..k + 16).unwrap_or_default()));
            if v128_any_true(v128_or(v128_or(m[0], m[1]), v128_or(m[2], m[3]))) {
                let (k, block) = m
                    .iter()
                    .enumerate()
                    .find(|(_, b)| v128_any_true(**b))
                    .unwrap_or((3, &m[3]));
                return n * 64 + k * 16 + u8x16_bitmask(*block).trailing_zeros() as usize;
            }
        }
        let done = rest.len() - quads.remainder().len();
        let mut chunks = quads.remainder().chunks_exact(16);
        for (n, chunk) in chunks.by_ref().enumerate() {
            let m = specials::<ASCII_ONLY>(chunk);
            if v128_any_true(m) {
                return done + n * 16 + u8x16_bitmask(m).trailing_zeros() as usize;
            }
        }
        tail::<ASCII_ONLY>(rest, rest.len() - chunks.remainder().len())
    }

    /// Four blocks' classes at a time: the run's logic, scalar, then
    /// runs once per 64 bytes instead of per 16.
    #[target_feature(enable = "simd128")]
    pub(crate) fn canonical_run(rest: &[u8]) -> usize {
        let (comma, zero, ten) = (u8x16_splat(b','), u8x16_splat(b'0'), u8x16_splat(10));
        let mask = |m: v128, k: usize| u64::from(u8x16_bitmask(m)) << (16 * k);
        canonical_run_by::<INT_GROUP>(rest, |group| {
            let mut c = IntClasses::default();
            for k in 0..4 {
                let v = load(group.get(16 * k..16 * (k + 1)).unwrap_or_default());
                c.comma |= mask(u8x16_eq(v, comma), k);
                // Wrapping: only '0'..='9' land below 10.
                c.digit |= mask(u8x16_lt(u8x16_sub(v, zero), ten), k);
                c.zero |= mask(u8x16_eq(v, zero), k);
            }
            c
        })
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use crate::body::blocks::{canonical_run_by, tail, IntClasses, INT_GROUP};

    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;

    fn splat(byte: u8) -> u64 {
        u64::from(byte) * 0x0101_0101_0101_0101
    }

    fn word(chunk: &[u8]) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        u64::from_le_bytes(word)
    }

    /// The high bit of each byte that is zero, and maybe of bytes after
    /// the first zero (borrows), never before it: only the first is read.
    fn zero_bytes_from_first(x: u64) -> u64 {
        x.wrapping_sub(splat(1)) & !x & HIGH
    }

    /// The high bit of each byte of `x` that is zero. Exact per byte: the
    /// sum of two 7-bit halves never carries into the next byte.
    pub(crate) fn zero_bytes(x: u64) -> u64 {
        !(((x & LOW7) + LOW7) | x) & HIGH
    }

    /// The high bit of each byte of `w` that is an ASCII digit.
    pub(crate) fn digit_bytes(w: u64) -> u64 {
        let x = w ^ splat(b'0');
        // x < 10 exactly for digits: low 7 bits below 10, and no high bit.
        !(((x & LOW7) + splat(0x80 - 10)) | x) & HIGH
    }

    /// High bits per byte to bit `k` for byte `k`.
    pub(crate) fn bits(high: u64) -> u64 {
        (high >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56
    }

    pub(crate) fn first_special<const ASCII_ONLY: bool>(rest: &[u8]) -> usize {
        let mut words = rest.chunks_exact(8);
        for (n, chunk) in words.by_ref().enumerate() {
            let w = word(chunk);
            let below_space = if ASCII_ONLY {
                // Bytes from 0x80 count too: their high bit is kept.
                w.wrapping_sub(splat(0x20)) | w
            } else {
                w.wrapping_sub(splat(0x20)) & !w
            };
            let special = (zero_bytes_from_first(w ^ splat(b'"'))
                | zero_bytes_from_first(w ^ splat(b'\\'))
                | below_space)
                & HIGH;
            if special != 0 {
                return n * 8 + special.trailing_zeros() as usize / 8;
            }
        }
        tail::<ASCII_ONLY>(rest, rest.len() - words.remainder().len())
    }

    pub(crate) fn canonical_run(rest: &[u8]) -> usize {
        canonical_run_by::<INT_GROUP>(rest, |chunk| {
            let w = word(chunk);
            IntClasses {
                comma: bits(zero_bytes(w ^ splat(b','))),
                digit: bits(digit_bytes(w)),
                zero: bits(zero_bytes(w ^ splat(b'0'))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value at every position of two groups of four blocks
    /// and the single blocks and bytes after them, after every other byte
    /// value before it: the block scan finds what the byte loop finds.
    #[test]
    fn the_block_scan_agrees_with_the_byte_loop() {
        let mut buf = vec![b'a'; 64 * 2 + 16 + 5];
        for pos in 0..buf.len() {
            for v in 0..=255u8 {
                for before in [b'a', 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xc3, 0xff] {
                    buf.fill(b'a');
                    if pos > 0 {
                        buf[pos - 1] = before;
                    }
                    buf[pos] = v;
                    for from in [0, 1, 7] {
                        assert_eq!(
                            next_special::<true>(&buf, from),
                            from + tail::<true>(&buf[from..], 0),
                            "ascii-only, {v:#x} at {pos} after {before:#x}, from {from}"
                        );
                        assert_eq!(
                            next_special::<false>(&buf, from),
                            from + tail::<false>(&buf[from..], 0),
                            "{v:#x} at {pos} after {before:#x}, from {from}"
                        );
                    }
                }
            }
        }
        assert_eq!(next_special::<true>(b"abc", 5), 3, "past the end");
    }

    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn integer_masks_are_exact_for_every_byte() {
        use imp::{bits, digit_bytes, zero_bytes};
        for v in 0..=255u8 {
            let bytes = [v, b'5', v, 0, 0xff, v, b',', v];
            let w = u64::from_le_bytes(bytes);
            let want =
                |f: fn(u8) -> bool| (0..8).fold(0u64, |m, k| m | (u64::from(f(bytes[k])) << k));
            assert_eq!(bits(digit_bytes(w)), want(|x| x.is_ascii_digit()), "{v}");
            let comma = 0x2c2c_2c2c_2c2c_2c2c;
            assert_eq!(bits(zero_bytes(w ^ comma)), want(|x| x == b','), "{v}");
        }
    }
}

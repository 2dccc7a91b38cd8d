//! Generates `code_blocks.rs`: 4096 small functions of distinct code, one
//! 64-byte cache line of machine code each (two steps of 64-bit xor,
//! multiply and rotate by constants no two steps share), for the `code*N`
//! step: 16·N of them run per request, in a scattered order (as a request's
//! code is: many small functions far apart, which the instruction
//! prefetcher cannot stream as it streams one long function), so a request
//! touches N KiB more code than `min-pd`.
use std::fmt::Write as _;

/// 256 KiB of code in 64-byte functions.
const BLOCKS: usize = 4096;

fn main() {
    let mut src = String::new();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        // SplitMix64: distinct constants, so no two functions fold together.
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for f in 0..BLOCKS {
        writeln!(src, "#[inline(never)]\nfn block_{f}(mut x: u64) -> u64 {{").unwrap();
        for _ in 0..2 {
            let (a, m, r) = (next(), next() | 1, next() % 63 + 1);
            writeln!(
                src,
                "    x = (x ^ {a:#x}).wrapping_mul({m:#x}).rotate_left({r});"
            )
            .unwrap();
        }
        writeln!(src, "    x\n}}").unwrap();
    }
    writeln!(src, "static BLOCKS: [fn(u64) -> u64; {BLOCKS}] = [").unwrap();
    // Scattered: consecutive calls land far apart in the code.
    for i in 0..BLOCKS {
        let f = i * 1237 % BLOCKS;
        writeln!(src, "    block_{f},").unwrap();
    }
    src.push_str("];\n");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("code_blocks.rs");
    std::fs::write(out, src).unwrap();
}

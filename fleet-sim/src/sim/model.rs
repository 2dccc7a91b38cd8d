//! How long a simulated GPU takes: one engine step (chunked prefill and
//! continuous decode batching, as vLLM v1 schedules them) and one KV
//! transfer. A roofline model of Llama-3.1-8B in bf16 on one H100 SXM 80 GB,
//! with these figures (bench/README.md, "Fleet simulation", names their
//! sources):
//! - 8.03 B parameters: 16.06 GB of weights, 13.96 GFLOP per token through
//!   the linear layers (2 × 6.98 B);
//! - attention: 4 × 4096 × 32 layers = 524,288 FLOP per query-key pair;
//! - KV: 2 × 32 layers × 8 heads × 128 × 2 B = 128 KiB per token;
//! - H100: 989 TFLOPS dense bf16 at 40 % utilisation, 3.35 TB/s of HBM at
//!   75 % for weights, 2.5 TB/s effective for KV reads;
//! - 0.5 ms of scheduling per step; a transfer of 25 GB/s per GPU (one
//!   400 Gb/s NIC, RDMA, Mooncake's measured 190 GB/s over 8) plus 1 ms,
//!   the NIC's bandwidth shared by the transfers in flight on it (nic.rs);
//! - a reload from the host tier at 25 GB/s: a PCIe Gen5 x16 link's 64 GB/s
//!   per direction nominal, of which the KV's scattered blocks get about 40 %
//!   (the model's assumption; `mock-engine sim --host-gbs`).
//!
//! Derived, not measured: a 1k-token prefill takes about 37 ms, 32k about
//! 1.8 s; a decode step about 7 ms for one short sequence and 27 ms for a
//! batch filling the KV cache.

/// What one model on one GPU costs. Every field can be set from the
/// simulator's command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    pub weight_bytes: f64,
    pub weight_read_bytes_per_s: f64,
    pub flops_per_s: f64,
    pub flops_per_token: f64,
    pub attention_flops_per_pair: f64,
    pub kv_read_s_per_token: f64,
    pub step_overhead_s: f64,
    pub kv_bytes_per_token: f64,
    pub transfer_bytes_per_s: f64,
    pub transfer_overhead_s: f64,
    /// Host tier to GPU (vLLM's KV offloading loading blocks back).
    pub host_bytes_per_s: f64,
}

impl Default for Gpu {
    fn default() -> Gpu {
        Gpu {
            weight_bytes: 16.06e9,
            weight_read_bytes_per_s: 3.35e12 * 0.75,
            flops_per_s: 989e12 * 0.40,
            flops_per_token: 13.96e9,
            attention_flops_per_pair: 524_288.0,
            kv_read_s_per_token: 131_072.0 / 2.5e12,
            step_overhead_s: 0.5e-3,
            kv_bytes_per_token: 131_072.0,
            transfer_bytes_per_s: 25e9,
            transfer_overhead_s: 1e-3,
            host_bytes_per_s: 25e9,
        }
    }
}

/// A prefill chunk in a step: `tokens` computed after `before` tokens of the
/// same prompt (cached or computed in earlier steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub tokens: u32,
    pub before: u32,
}

impl Gpu {
    /// One step: `decodes` sequences generating a token each, over
    /// `decode_context` tokens of KV in all, and these prefill chunks. The
    /// linear layers are bound by reading the weights or by compute,
    /// whichever is slower; attention and KV reads add.
    pub fn step_s(&self, decodes: u32, decode_context: u64, chunks: &[Chunk]) -> f64 {
        let prefill_tokens: f64 = chunks.iter().map(|c| c.tokens as f64).sum();
        let linear = (decodes as f64 + prefill_tokens) * self.flops_per_token / self.flops_per_s;
        let weights = self.weight_bytes / self.weight_read_bytes_per_s;
        let attention: f64 = chunks
            .iter()
            .map(|c| {
                let n = c.tokens as f64;
                self.attention_flops_per_pair * n * (c.before as f64 + n / 2.0)
            })
            .sum::<f64>()
            / self.flops_per_s;
        self.step_overhead_s
            + linear.max(weights)
            + attention
            + decode_context as f64 * self.kv_read_s_per_token
    }

    /// Moving `tokens` of KV from a prefill pod to a decode pod.
    pub fn transfer_s(&self, tokens: u32) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        self.transfer_overhead_s
            + tokens as f64 * self.kv_bytes_per_token / self.transfer_bytes_per_s
    }

    /// Loading `tokens` of KV back from the host tier to the GPU.
    pub fn reload_s(&self, tokens: u32) -> f64 {
        tokens as f64 * self.kv_bytes_per_token / self.host_bytes_per_s
    }

    /// Seconds the prefill of `tokens` takes on an idle pod that holds
    /// `cached` of them on the GPU: chunks of `step_tokens`, one step each.
    pub fn prefill_alone_s(&self, tokens: u32, cached: u32, step_tokens: u32) -> f64 {
        let mut done = cached.min(tokens.saturating_sub(1));
        let mut t = 0.0;
        while done < tokens {
            let n = (tokens - done).min(step_tokens.max(1));
            t += self.step_s(
                0,
                0,
                &[Chunk {
                    tokens: n,
                    before: done,
                }],
            );
            done += n;
        }
        t
    }

    /// The unloaded floor of a PD request's time to first token: its prefill
    /// alone on an idle pod that holds `cached` tokens, the KV of the rest
    /// moved to an idle decode pod that holds the same prefix, and that
    /// pod's first decode step.
    pub fn floor_ttft_s(&self, tokens: u32, cached: u32, step_tokens: u32) -> f64 {
        let cached = cached.min(tokens.saturating_sub(1));
        self.prefill_alone_s(tokens, cached, step_tokens)
            + self.transfer_s(tokens - cached)
            + self.step_s(1, tokens as u64, &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill_s(g: &Gpu, n: u32) -> f64 {
        g.step_s(
            0,
            0,
            &[Chunk {
                tokens: n,
                before: 0,
            }],
        )
    }

    #[test]
    fn prefill_time_grows_with_uncached_tokens() {
        let g = Gpu::default();
        let t1k = prefill_s(&g, 1024);
        let t8k = prefill_s(&g, 8192);
        assert!((0.030..0.045).contains(&t1k), "{t1k}");
        assert!((0.29..0.37).contains(&t8k), "{t8k}");
        // A cached prefix costs only its attention: far less than computing it.
        let tail_after_cache = g.step_s(
            0,
            0,
            &[Chunk {
                tokens: 1024,
                before: 7168,
            }],
        );
        assert!(tail_after_cache < t8k / 4.0, "{tail_after_cache} vs {t8k}");
        assert!(tail_after_cache > t1k);
    }

    #[test]
    fn decode_steps_rise_with_the_batch_and_its_context() {
        let g = Gpu::default();
        let one = g.step_s(1, 1024, &[]);
        let full = g.step_s(32, 32 * 12_000, &[]);
        assert!((0.006..0.008).contains(&one), "{one}");
        assert!((0.024..0.030).contains(&full), "{full}");
        assert!(g.step_s(256, 256 * 1024, &[]) > g.step_s(64, 64 * 1024, &[]));
    }

    #[test]
    fn a_host_tier_reload_takes_its_bytes_at_the_host_bandwidth() {
        let g = Gpu::default();
        // 8,192 tokens of 128 KiB at 25 GB/s: 43 ms, an eighth of computing them.
        let t = g.reload_s(8192);
        assert!((t - 8192.0 * 131_072.0 / 25e9).abs() < 1e-12, "{t}");
        assert!(t < prefill_s(&g, 8192) / 6.0);
        let slow = Gpu {
            host_bytes_per_s: 5e9,
            ..g
        };
        assert!((slow.reload_s(8192) / t - 5.0).abs() < 1e-9);
    }

    #[test]
    fn the_unloaded_floor_is_prefill_of_the_uncached_tail_transfer_and_one_step() {
        let g = Gpu::default();
        let cold = g.floor_ttft_s(8192, 0, 8192);
        let want = prefill_s(&g, 8192) + g.transfer_s(8192) + g.step_s(1, 8192, &[]);
        assert!((cold - want).abs() < 1e-12, "{cold} vs {want}");
        let warm = g.floor_ttft_s(8192, 7168, 8192);
        assert!(warm < cold / 3.0, "{warm} vs {cold}");
        // Chunks of the step budget, one step each.
        let long = g.prefill_alone_s(20_000, 0, 8192);
        let three = prefill_s(&g, 8192)
            + g.step_s(
                0,
                0,
                &[Chunk {
                    tokens: 8192,
                    before: 8192,
                }],
            )
            + g.step_s(
                0,
                0,
                &[Chunk {
                    tokens: 3616,
                    before: 16_384,
                }],
            );
        assert!((long - three).abs() < 1e-12);
    }

    #[test]
    fn transfers_take_their_bytes_over_the_link() {
        let g = Gpu::default();
        assert_eq!(g.transfer_s(0), 0.0);
        let t = g.transfer_s(12_000);
        assert!((0.060..0.068).contains(&t), "{t}");
    }
}

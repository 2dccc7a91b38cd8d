//! One simulated engine: vLLM v1's scheduler in miniature. Requests wait in
//! arrival order until the KV cache can hold their prompt and output; each
//! step gives every running decode one token and the rest of the step's
//! token budget to prompts still being computed (chunked prefill), and
//! lasts what [`Gpu::step_s`] says. A prompt's blocks become hits for later
//! requests at the end of the step that computed them. A request whose hits
//! were in the host tier waits for their reload ([`Gpu::reload_s`]; one
//! reload after another, the host link shared) while the other requests
//! step. Pure: the pod's task drives it in real time and turns its events
//! into answers.

use super::cache::{BlockCache, Reserved};
use super::model::{Chunk, Gpu};
use super::text::{Prompt, BLOCK_TOKENS};
use std::collections::VecDeque;

/// How one engine is set up.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    pub gpu: Gpu,
    /// KV room on the GPU, in trace blocks of 512 tokens: what running
    /// requests may hold.
    pub kv_blocks: usize,
    /// Blocks the prefix cache keeps in all (the GPU's and a host-memory
    /// tier's); at least `kv_blocks`.
    pub cache_blocks: usize,
    /// vLLM's `max_num_seqs`.
    pub max_running: usize,
    /// vLLM's `max_num_batched_tokens` (a step's token budget).
    pub step_tokens: u32,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            gpu: Gpu::default(),
            // 440,000 tokens of KV: an H100 80 GB at gpu_memory_utilization
            // 0.9 with Llama-3.1-8B's 16 GB of weights.
            kv_blocks: 440_000 / BLOCK_TOKENS as usize,
            cache_blocks: 440_000 / BLOCK_TOKENS as usize,
            // vLLM's defaults on an 80 GB GPU.
            max_running: 1024,
            step_tokens: 8192,
        }
    }
}

/// A request for the engine.
#[derive(Debug, Clone)]
pub struct Job {
    pub key: u64,
    pub prompt: Prompt,
    /// Tokens to generate (1 for a prefill leg).
    pub output: u32,
    /// The prompt's KV arrived from a prefill pod: nothing to compute.
    pub handed_off: bool,
    /// The prompt's first tokens whose KV was pulled from the decode pod of
    /// the conversation's last turn (vLLM's bidirectional NIXL transfer):
    /// not computed, whatever this pod held of them (0: none).
    pub pulled_to: u32,
    /// When it finishes, its blocks stay held (pinned, taking KV room) under
    /// its key until [`Engine::release_held`]: a decode whose KV the next
    /// turn's prefill may pull.
    pub hold: bool,
}

impl Job {
    /// A request of `output` tokens for `prompt`, computed here.
    pub fn new(key: u64, prompt: Prompt, output: u32) -> Job {
        Job {
            key,
            prompt,
            output,
            handed_off: false,
            pulled_to: 0,
            hold: false,
        }
    }
}

/// What a step did to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Admitted: its prompt's cached tokens here, and the tokens it will
    /// compute.
    Admitted {
        key: u64,
        cached: u32,
        computed: u32,
    },
    /// `n` more tokens generated; `first` when they start the output.
    Tokens {
        key: u64,
        n: u32,
        first: bool,
    },
    Finished {
        key: u64,
    },
}

#[derive(Debug)]
struct Running {
    job: Job,
    /// Prompt tokens still to compute.
    to_prefill: u32,
    /// Tokens of the prompt already in KV (cached or computed).
    done: u32,
    generated: u32,
    /// The blocks it pins (hits and the blocks it computes into the cache).
    pinned: Vec<u64>,
    /// Its named blocks' ends, in prompt tokens, not yet marked computed.
    to_mark: VecDeque<(u32, u64)>,
    anonymous: usize,
    /// Seconds until its host-tier hits are back on the GPU.
    loading_s: f64,
    cancelled: bool,
}

impl Running {
    fn runnable(&self) -> bool {
        self.loading_s <= 0.0
    }
}

/// What an engine has counted since it started (for `/metrics` and the
/// benchmark's load figures).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    pub prompt_tokens: u64,
    /// Prompt tokens looked up in the prefix cache, and found.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    /// Prompt tokens computed here.
    pub computed_tokens: u64,
    pub generated_tokens: u64,
    pub finished: u64,
    /// Seconds of steps run.
    pub busy_s: f64,
    /// Blocks dropped from the prefix cache.
    pub evicted_blocks: u64,
    /// Prompt tokens loaded back from the host tier.
    pub reloaded_tokens: u64,
    /// The integral of running requests over time (request-seconds).
    pub running_s: f64,
}

/// One engine's state.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    cache: BlockCache,
    waiting: VecDeque<Job>,
    running: Vec<Running>,
    counters: Counters,
    /// The chunks of the step planned, by index into `running`.
    planned: Vec<(usize, u32)>,
    planned_s: f64,
    /// The planned step only waits for reloads: no GPU work.
    planned_idle: bool,
    /// Finished requests' blocks kept for a pull, by key: (pinned, anonymous).
    held: std::collections::HashMap<u64, (Vec<u64>, usize)>,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Engine {
        Engine {
            cache: BlockCache::new(config.cache_blocks.max(config.kv_blocks), config.kv_blocks),
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: Counters::default(),
            planned: Vec::new(),
            planned_s: 0.0,
            planned_idle: false,
            held: std::collections::HashMap::new(),
        }
    }

    /// Frees the blocks a finished request `key` held (pulled, or its hold
    /// expired); false when it holds none.
    pub fn release_held(&mut self, key: u64) -> bool {
        match self.held.remove(&key) {
            Some((pinned, anonymous)) => {
                self.cache.release(&pinned, anonymous);
                true
            }
            None => false,
        }
    }

    pub fn submit(&mut self, job: Job) {
        self.waiting.push_back(job);
    }

    /// Drops a request (its client left): waiting, it goes now; running,
    /// at the end of the step, its KV given back.
    pub fn cancel(&mut self, key: u64) {
        self.release_held(key);
        self.waiting.retain(|j| j.key != key);
        for r in &mut self.running {
            if r.job.key == key {
                r.cancelled = true;
            }
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Keeps the cache's changes from now on (KV events).
    pub fn track_changes(&mut self) {
        self.cache.track_changes();
    }

    /// The cache's changes since last taken (none when not tracked).
    pub fn take_changes(&mut self) -> Option<super::cache::Changes> {
        self.cache.take_changes()
    }

    /// The share of KV blocks in use by running requests (0 to 1).
    pub fn kv_usage(&self) -> f64 {
        self.cache.in_use() as f64 / self.cache.pin_limit().max(1) as f64
    }

    pub fn counters(&self) -> Counters {
        Counters {
            evicted_blocks: self.cache.evicted(),
            ..self.counters
        }
    }

    /// Tokens of `prompt` this engine holds as a cached prefix now.
    pub fn cached_tokens(&self, prompt: &Prompt) -> u32 {
        let hits = self.cache.leading_hits(&prompt.ids());
        let tokens: u32 = prompt.blocks.iter().take(hits).map(|b| b.tokens).sum();
        // The last token is always computed (vLLM recomputes it to sample).
        tokens.min(prompt.tokens.saturating_sub(1))
    }

    /// Admits waiting requests in arrival order while the step's token
    /// budget has room after the running requests' share and their KV fits.
    /// vLLM v1's `Scheduler.schedule` serves RUNNING requests first and then
    /// WAITING ones `while token_budget > 0`, looking a waiting request's
    /// prefix up only then: a prompt queued behind another of the same
    /// prefix finds the blocks computed by the time it gets budget, not
    /// those of the moment it arrived.
    fn admit(&mut self, events: &mut Vec<Event>) {
        let mut chunks = Vec::new();
        while self.running.len() < self.config.max_running && self.share(&mut chunks) > 0 {
            let Some(job) = self.waiting.front() else {
                break;
            };
            let ids = job.prompt.ids();
            let named: u32 = job
                .prompt
                .blocks
                .iter()
                .take(ids.len())
                .map(|b| b.tokens)
                .sum();
            let rest = job.prompt.tokens.saturating_sub(named) + job.output;
            let anonymous = rest.div_ceil(BLOCK_TOKENS) as usize;
            let cached = self.cached_tokens(&job.prompt);
            let Some(reserved) = self.cache.reserve(&ids, anonymous) else {
                break;
            };
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.start(job, reserved, cached, events);
        }
    }

    /// One step's token budget as vLLM v1's scheduler hands it out: a token
    /// to each runnable decode, then to each runnable prompt still being
    /// computed, in admission order, as much of its rest as is left (a
    /// request waiting for its reload gets none). Fills `chunks` (index into
    /// `running`, tokens) and gives the tokens left for waiting requests:
    /// admission and the step's plan share this one rule.
    fn share(&self, chunks: &mut Vec<(usize, u32)>) -> u32 {
        chunks.clear();
        let decodes = self
            .running
            .iter()
            .filter(|r| r.runnable() && r.to_prefill == 0)
            .count() as u32;
        let mut budget = self.config.step_tokens.saturating_sub(decodes);
        for (i, r) in self.running.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if r.to_prefill > 0 && r.runnable() {
                let n = r.to_prefill.min(budget);
                budget -= n;
                chunks.push((i, n));
            }
        }
        budget
    }

    /// A request admitted with its reservation: `cached` tokens found here.
    fn start(&mut self, job: Job, reserved: Reserved, cached: u32, events: &mut Vec<Event>) {
        let reload = (reserved.reloaded as u32 * BLOCK_TOKENS).min(cached);
        let queued = self.running.iter().map(|r| r.loading_s).fold(0.0, f64::max);
        let loading_s = if reload > 0 {
            queued + self.config.gpu.reload_s(reload)
        } else {
            0.0
        };
        self.counters.reloaded_tokens += reload as u64;
        let mut to_mark = VecDeque::new();
        let mut end = 0;
        for b in &job.prompt.blocks {
            end += b.tokens;
            if let Some(id) = b.id.filter(|id| reserved.pinned.contains(id)) {
                to_mark.push_back((end, id));
            }
        }
        let to_prefill = if job.handed_off {
            // The prompt's KV arrived from the prefill pod.
            let arrived: Vec<u64> = to_mark.drain(..).map(|(_, id)| id).collect();
            self.cache.mark_computed(&arrived);
            0
        } else {
            // Pulled tokens are in KV like cached ones; the last token is
            // always computed.
            let held = cached.max(job.pulled_to.min(job.prompt.tokens.saturating_sub(1)));
            job.prompt.tokens.saturating_sub(held)
        };
        let cached = if job.handed_off { 0 } else { cached };
        self.counters.prompt_tokens += job.prompt.tokens as u64;
        if !job.handed_off {
            self.counters.prefix_queries += job.prompt.tokens as u64;
            self.counters.prefix_hits += cached as u64;
        }
        events.push(Event::Admitted {
            key: job.key,
            cached,
            computed: to_prefill,
        });
        let mut r = Running {
            done: job.prompt.tokens.saturating_sub(to_prefill),
            to_prefill,
            generated: 0,
            pinned: reserved.pinned,
            to_mark,
            anonymous: reserved.anonymous,
            loading_s,
            cancelled: false,
            job,
        };
        Self::mark(&mut self.cache, &mut r);
        self.running.push(r);
    }

    /// Marks the blocks `r` has computed so far: hits for later requests.
    fn mark(cache: &mut BlockCache, r: &mut Running) {
        while let Some(&(end, id)) = r.to_mark.front() {
            if end > r.done {
                break;
            }
            cache.mark_computed(&[id]);
            r.to_mark.pop_front();
        }
    }

    /// Plans the next step and says how long it takes; `None` when there is
    /// nothing to run. Admissions come back as events at once.
    pub fn plan(&mut self, events: &mut Vec<Event>) -> Option<f64> {
        self.admit(events);
        if self.running.is_empty() {
            return None;
        }
        let mut planned = std::mem::take(&mut self.planned);
        self.share(&mut planned);
        self.planned = planned;
        let mut decodes = 0u32;
        let mut context = 0u64;
        for r in self.running.iter().filter(|r| r.runnable()) {
            if r.to_prefill == 0 {
                decodes += 1;
                context += (r.done + r.generated) as u64;
            }
        }
        let chunks: Vec<Chunk> = self
            .planned
            .iter()
            .filter_map(|(i, n)| {
                self.running.get(*i).map(|r| Chunk {
                    tokens: *n,
                    before: r.done,
                })
            })
            .collect();
        self.planned_idle = decodes == 0 && chunks.is_empty();
        self.planned_s = if self.planned_idle {
            // Every running request waits for a reload: until the first ends.
            self.running
                .iter()
                .map(|r| r.loading_s)
                .fold(f64::INFINITY, f64::min)
        } else {
            self.config.gpu.step_s(decodes, context, &chunks)
        };
        Some(self.planned_s)
    }

    /// Ends the planned step: tokens generated, prompts advanced, requests
    /// finished and their KV given back (their prompts stay cached).
    pub fn complete(&mut self, events: &mut Vec<Event>) {
        let dt = self.planned_s;
        if !self.planned_idle {
            self.counters.busy_s += dt;
        }
        self.counters.running_s += dt * self.running.len() as f64;
        let mut prefilled = vec![false; self.running.len()];
        for (i, n) in self.planned.drain(..) {
            if let Some(r) = self.running.get_mut(i) {
                r.to_prefill -= n;
                r.done += n;
                self.counters.computed_tokens += n as u64;
                Self::mark(&mut self.cache, r);
                if let Some(p) = prefilled.get_mut(i) {
                    *p = r.to_prefill == 0;
                }
            }
        }
        for (i, r) in self.running.iter_mut().enumerate() {
            // A request that waited for its reload this step does nothing.
            let was_loading = !r.runnable();
            r.loading_s = (r.loading_s - dt).max(0.0);
            if was_loading || self.planned_idle {
                continue;
            }
            // A prompt finished this step samples its first token; a
            // decode generates one.
            let decoding = r.to_prefill == 0 && !prefilled.get(i).copied().unwrap_or(false);
            if (decoding || prefilled.get(i).copied().unwrap_or(false)) && !r.cancelled {
                r.generated += 1;
                self.counters.generated_tokens += 1;
                events.push(Event::Tokens {
                    key: r.job.key,
                    n: 1,
                    first: r.generated == 1,
                });
            }
        }
        // Partitioning keeps the rest in arrival order (prefill chunks go
        // to the oldest first).
        let (ended, running): (Vec<Running>, Vec<Running>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|r| r.cancelled || r.generated >= r.job.output);
        self.running = running;
        for r in ended {
            if r.job.hold && !r.cancelled {
                self.held.insert(r.job.key, (r.pinned, r.anonymous));
            } else {
                self.cache.release(&r.pinned, r.anonymous);
            }
            if !r.cancelled {
                self.counters.finished += 1;
                events.push(Event::Finished { key: r.job.key });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::text::{parse_prompt, prompt_text, Shape};

    fn job(key: u64, ids: &[u64], tokens: u32, output: u32) -> Job {
        Job::new(
            key,
            parse_prompt(
                prompt_text(ids, tokens, Shape::default()).as_bytes(),
                Shape::default(),
            ),
            output,
        )
    }

    /// Runs the engine until idle; returns the simulated seconds and events.
    fn run(e: &mut Engine) -> (f64, Vec<Event>) {
        let mut t = 0.0;
        let mut events = Vec::new();
        while let Some(dt) = e.plan(&mut events) {
            t += dt;
            e.complete(&mut events);
        }
        (t, events)
    }

    #[test]
    fn a_repeated_prefix_is_cached_and_costs_less() {
        let mut e = Engine::new(EngineConfig::default());
        e.submit(job(1, &[1, 2, 3, 4], 2048, 1));
        let (cold, events) = run(&mut e);
        assert!(events.contains(&Event::Admitted {
            key: 1,
            cached: 0,
            computed: 2048
        }));
        assert!(events.contains(&Event::Finished { key: 1 }));
        e.submit(job(2, &[1, 2, 3, 5], 2048, 1));
        let (warm, events) = run(&mut e);
        assert!(events.contains(&Event::Admitted {
            key: 2,
            cached: 1536,
            computed: 512
        }));
        assert!(warm < cold / 2.0, "{warm} vs {cold}");
        let c = e.counters();
        assert_eq!(
            (c.prefix_queries, c.prefix_hits, c.computed_tokens),
            (4096, 1536, 2560)
        );
    }

    #[test]
    fn only_computed_blocks_are_hits_not_a_prefix_still_being_computed() {
        let mut e = Engine::new(EngineConfig::default());
        // Admitted in the same step: the second finds nothing computed yet.
        e.submit(job(1, &[1, 2, 3, 4], 2048, 1));
        e.submit(job(2, &[1, 2, 3, 5], 2048, 1));
        let (_, events) = run(&mut e);
        for key in [1, 2] {
            assert!(events.contains(&Event::Admitted {
                key,
                cached: 0,
                computed: 2048
            }));
        }
        // Once computed, the prefix is a hit.
        e.submit(job(3, &[1, 2, 3, 6], 2048, 1));
        let (_, events) = run(&mut e);
        assert!(events.contains(&Event::Admitted {
            key: 3,
            cached: 1536,
            computed: 512
        }));
        assert_eq!(e.counters().computed_tokens, 2048 * 2 + 512);
    }

    #[test]
    fn a_prompt_waits_for_step_budget_and_then_finds_what_the_one_ahead_computed() {
        let mut e = Engine::new(EngineConfig::default());
        // The first takes the whole of the first step's 8,192 tokens.
        let ahead: Vec<u64> = (1..=20).collect();
        let mut behind: Vec<u64> = (1..=16).collect();
        behind.push(99);
        e.submit(job(1, &ahead, 20 * 512, 1));
        e.submit(job(2, &behind, 17 * 512, 1));
        let mut events = Vec::new();
        e.plan(&mut events);
        assert_eq!(
            (e.running(), e.waiting()),
            (1, 1),
            "no budget left for the second"
        );
        e.complete(&mut events);
        let (_, rest) = run(&mut e);
        // Admitted at the second step, it finds the first's 16 blocks.
        assert!(rest.contains(&Event::Admitted {
            key: 2,
            cached: 16 * 512,
            computed: 512
        }));
        assert_eq!(e.counters().computed_tokens, 20 * 512 + 512);
    }

    #[test]
    fn a_host_tier_hit_waits_for_its_reload_at_the_host_bandwidth() {
        let timed = |gpu: Gpu| {
            let mut e = Engine::new(EngineConfig {
                gpu,
                kv_blocks: 6,
                cache_blocks: 12,
                ..EngineConfig::default()
            });
            // 1, 2, 3 go to the host tier to make room for the next two.
            e.submit(job(1, &[1, 2, 3], 1536, 1));
            e.submit(job(2, &[4, 5, 6], 1536, 1));
            e.submit(job(3, &[7, 8, 9, 10, 11], 2560, 1));
            run(&mut e);
            let busy = e.counters().busy_s;
            e.submit(job(4, &[1, 2, 3, 12], 2048, 1));
            let (t, events) = run(&mut e);
            assert!(events.contains(&Event::Admitted {
                key: 4,
                cached: 1536,
                computed: 512
            }));
            let c = e.counters();
            assert_eq!(c.reloaded_tokens, 1536);
            (t, c.busy_s - busy)
        };
        let fast = Gpu::default();
        let slow = Gpu {
            host_bytes_per_s: fast.host_bytes_per_s / 10.0,
            ..fast
        };
        let ((t_fast, busy_fast), (t_slow, busy_slow)) = (timed(fast), timed(slow));
        let extra = slow.reload_s(1536) - fast.reload_s(1536);
        assert!((t_slow - t_fast - extra).abs() < 1e-9, "{t_fast} {t_slow}");
        assert!(t_fast >= fast.reload_s(1536) + busy_fast);
        // Waiting for the reload is not GPU time.
        assert!((busy_slow - busy_fast).abs() < 1e-12);
    }

    #[test]
    fn a_gpu_only_cache_evicts_when_the_prompts_outgrow_it() {
        let mut e = Engine::new(EngineConfig {
            kv_blocks: 8,
            cache_blocks: 8,
            ..EngineConfig::default()
        });
        for k in 0..4 {
            e.submit(job(k, &[10 * k, 10 * k + 1, 10 * k + 2], 1536, 1));
            run(&mut e);
        }
        let c = e.counters();
        assert_eq!(
            c.evicted_blocks,
            12 - 8 + 1,
            "12 blocks, 8 of room, one for output"
        );
        assert_eq!(c.reloaded_tokens, 0);
    }

    #[test]
    fn prefill_time_follows_uncached_tokens() {
        let t = |tokens: u32| {
            let mut e = Engine::new(EngineConfig::default());
            let ids: Vec<u64> = (0..tokens.div_ceil(512) as u64).collect();
            e.submit(job(1, &ids, tokens, 1));
            run(&mut e).0
        };
        let (t2k, t8k, t16k) = (t(2048), t(8192), t(16_384));
        assert!(t8k > 3.5 * t2k && t16k > 1.9 * t8k, "{t2k} {t8k} {t16k}");
    }

    #[test]
    fn decodes_batch_and_a_handed_off_prompt_is_not_computed() {
        let mut e = Engine::new(EngineConfig::default());
        for k in 0..8 {
            e.submit(Job {
                handed_off: true,
                ..job(k, &[100 + k], 512, 10)
            });
        }
        let (t, events) = run(&mut e);
        assert_eq!(e.counters().computed_tokens, 0);
        let tokens: u32 = events
            .iter()
            .map(|ev| match ev {
                Event::Tokens { n, .. } => *n,
                _ => 0,
            })
            .sum();
        assert_eq!(tokens, 80);
        // Ten steps for all eight, not eighty.
        assert!(t < 10.0 * 0.010, "{t}");
        let firsts = events
            .iter()
            .filter(|ev| matches!(ev, Event::Tokens { first: true, .. }))
            .count();
        assert_eq!(firsts, 8);
    }

    #[test]
    fn requests_wait_for_kv_room_in_arrival_order() {
        let config = EngineConfig {
            kv_blocks: 4,
            cache_blocks: 4,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(config);
        e.submit(job(1, &[1, 2, 3], 1536, 10));
        e.submit(job(2, &[4], 512, 10));
        let mut events = Vec::new();
        e.plan(&mut events);
        assert_eq!((e.running(), e.waiting()), (1, 1), "{events:?}");
        let (_, events) = run(&mut e);
        assert!(events.contains(&Event::Finished { key: 2 }));
    }

    #[test]
    fn a_cancelled_request_gives_its_room_back_without_finishing() {
        let mut e = Engine::new(EngineConfig::default());
        e.submit(job(1, &[1], 512, 1000));
        let mut events = Vec::new();
        e.plan(&mut events);
        e.cancel(1);
        e.complete(&mut events);
        assert_eq!(e.running(), 0);
        assert!(!events.contains(&Event::Finished { key: 1 }));
        assert_eq!(e.kv_usage(), 0.0);
    }
    #[test]
    fn pulled_tokens_are_not_computed_and_become_hits() {
        let mut e = Engine::new(EngineConfig::default());
        // 4,096 tokens, the first 3,000 pulled from the last turn's decode.
        e.submit(Job {
            pulled_to: 3000,
            ..job(1, &[1, 2, 3, 4, 5, 6, 7, 8], 4096, 1)
        });
        let (pulled, events) = run(&mut e);
        assert!(events.contains(&Event::Admitted {
            key: 1,
            cached: 0,
            computed: 1096
        }));
        // The blocks it pulled and those it computed are hits now.
        let c = e.counters();
        assert_eq!((c.computed_tokens, c.prefix_hits), (1096, 0));
        assert_eq!(
            e.cached_tokens(&job(2, &[1, 2, 3, 4, 5, 6, 7, 8], 4096, 1).prompt),
            4095
        );
        let mut cold = Engine::new(EngineConfig::default());
        cold.submit(job(1, &[1, 2, 3, 4, 5, 6, 7, 8], 4096, 1));
        assert!(pulled < run(&mut cold).0 / 2.0);
        // A pull never covers the last token, nor less than the cache holds.
        e.submit(Job {
            pulled_to: 9000,
            ..job(3, &[1, 2, 3, 4, 9], 2100, 1)
        });
        let (_, events) = run(&mut e);
        assert!(events.contains(&Event::Admitted {
            key: 3,
            cached: 2048,
            computed: 1
        }));
    }

    #[test]
    fn a_held_request_keeps_its_kv_room_until_released() {
        let mut e = Engine::new(EngineConfig {
            kv_blocks: 8,
            cache_blocks: 8,
            ..EngineConfig::default()
        });
        e.submit(Job {
            hold: true,
            ..job(1, &[1, 2, 3, 4, 5, 6], 3072, 10)
        });
        let (_, events) = run(&mut e);
        assert!(events.contains(&Event::Finished { key: 1 }));
        assert_eq!(e.kv_usage(), 7.0 / 8.0, "six prompt blocks, one of output");
        // No room for a second request of four blocks while it holds.
        e.submit(job(2, &[11, 12, 13, 14], 2048, 1));
        let mut events = Vec::new();
        e.plan(&mut events);
        assert_eq!((e.running(), e.waiting()), (0, 1));
        assert!(e.release_held(1));
        assert!(!e.release_held(1), "released once");
        let (_, events) = run(&mut e);
        assert!(events.contains(&Event::Finished { key: 2 }));
    }
}

"""The fleet simulation's configurations (bench/fleet.py): each router
setup, the changes measured against them, the variants they run in, the
defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# ------------------------------------------------------------ configurations

@dataclass(frozen=True)
class Config:
    """One router setup. `model` is merged into pd-router's model entry,
    `plugin` into its top-level configuration (dicts merged deeply);
    `scale` multiplies the time scale of its runs."""
    name: str
    router: str  # "pd", "vllm-router", "smg", "epp", "llmd" or "dynamo"
    engine: str  # the sims' wire contract: "vllm" or "sglang"
    model: dict = field(default_factory=dict)
    plugin: dict = field(default_factory=dict)
    replicas: int = 1
    scale: float = 1.0
    # The replayer sends prompts as token ids (what the sims' render gives
    # for the text), for a router that keys on them.
    token_ids: bool = False
    # The replayer names each request's conversation in an x-session-id
    # header (`mock-engine replay --session-header`, its rule in
    # fleet-sim/src/replay.rs `sessions`).
    session: bool = False
    # The decode sims keep each request's KV for the next turn's prefill for
    # this many modelled seconds (vLLM NIXL's bidirectional transfer,
    # `decoder_kv_blocks_ttl`); 0: off.
    decoder_kv_ttl_s: float = 0.0
    # A peer's own options, appended to its command line (the peers' tuning
    # sweep, bench/README.md "The peers' tuning sweep").
    peer_args: tuple = ()
    # The endpoint picker's runs: its scorers and their weights (empty:
    # EPP_WEIGHTS, llm-d's sample), its prefix-cache scorer's parameters
    # over EPP_PREFIX.
    epp_weights: dict = field(default_factory=dict)
    epp_prefix: dict = field(default_factory=dict)
    # llm-d's picker: its other scorers' parameters, by scorer type; its
    # index's in-memory settings (`inMemoryConfig`; empty: v0.4.0's
    # defaults); the decode profile's scorers and weights (empty: as the
    # prefill profile's).
    epp_params: dict = field(default_factory=dict)
    llmd_index: dict = field(default_factory=dict)
    epp_decode_weights: dict = field(default_factory=dict)
    # The variants it runs in (by key of VARIANTS); empty: every one asked.
    variants: tuple = ()
    # A change: the configuration it is measured against.
    against: str = ""
    about: str = ""


# Adding a configuration is one line here. A configuration without
# `variants` runs in every variant the command line asks for; one with them
# only in those (the rows that measure one change against the default).
AIBRIX = {"prefill_policy": "prefix_cache", "decode_policy": "load_balancing"}
SESSION = {"headers": ["x-session-id"]}
DECIDER = {"min_prompt_tokens": 256, "min_uncached_tokens": 256,
           "prefill_saturated_local": False}
CONFIGS = [
    Config("pd-ttft", "pd", "vllm",
           about="pd-router's defaults: least_ttft, decode least_request; vLLM NIXL sims"),
    Config("pd-prefix", "pd", "vllm", AIBRIX,
           about="pd-router, AIBrix's prefix_cache and load_balancing"),
    Config("pd-least", "pd", "vllm", {"prefill_policy": "least_request"},
           variants=("1x", "32p"), about="pd-router, least_request"),
    Config("pd-chash", "pd", "vllm", {"prefill_policy": "consistent_hash"},
           about="pd-router, consistent_hash"),
    Config("pd-random", "pd", "vllm", {"prefill_policy": "random"},
           variants=("1x", "32p"), about="pd-router, random placement"),
    Config("pd-chash-x3", "pd", "vllm", {"prefill_policy": "consistent_hash"}, replicas=3,
           variants=("1x", "32p"),
           about="three Envoy replicas with consistent_hash, the replayer taking them in turn"),
    # Session affinity on the conversation trace: the replayer sends each
    # conversation's id (bench/README.md, "Session affinity rows").
    Config("pd-session", "pd", "vllm", {"session": SESSION}, session=True, variants=("1x",),
           about="pd-router's defaults with session affinity on x-session-id"),
    # Next-turn KV reuse: needs pd-router's `kv_reuse` (issue 40.3); a filter
    # without it refuses the configuration and the row is skipped.
    Config("pd-session-reuse", "pd", "vllm", {"session": SESSION, "kv_reuse": {"ttl_ms": 450000}},
           session=True, decoder_kv_ttl_s=480.0, variants=("1x",),
           about="pd-router, session affinity and next-turn KV reuse (kv_reuse); the decode "
                 "sims keep their KV 480 s (vLLM NIXL bidirectional)"),
    Config("pd-sglang", "pd", "sglang", variants=("1x", "2x"),
           about="pd-router's defaults, SGLang sims (bootstrap rooms)"),
    # Prompts as token ids: its cache_aware keys on them as they come, where
    # a text prompt makes it ask every pod to render (tokenize) it first.
    Config("vllm-router", "vllm-router", "vllm", token_ids=True,
           about="vllm-router 0.1.17 --vllm-pd-disaggregation --policy cache_aware, "
                 "prompts as token ids"),
    # SMG (Shepherd Model Gateway, sglang-router's successor): its PD
    # cache_aware keeps a tree per worker (sglang-router 0.3.2's was random in
    # PD mode). It takes the sims for SGLang's (their /server_info), so it
    # runs on the SGLang sims.
    Config("smg", "smg", "sglang",
           about="SMG 1.13.0 smg launch --pd-disaggregation --policy cache_aware, SGLang sims"),
    # The peers' tuning sweep's winners on the tuning window (bench/README.md,
    # "The peers' tuning sweep"): vllm-router kept its defaults; SMG polls
    # its workers' load every second (10 s of real time are 50 modelled
    # seconds here) and offers nothing to workers with thin trees.
    Config("vllm-router-tuned", "vllm-router", "vllm", token_ids=True, variants=("1x", "2x"),
           about="vllm-router's sweep winner: its defaults (= vllm-router)"),
    Config("smg-tuned", "smg", "sglang", variants=("1x", "2x"),
           peer_args=("--load-monitor-interval", "1", "--worker-warmup-secs", "0",
                      "--worker-warmup-divert-every", "0"),
           about="SMG's sweep winner: cache_aware, load polled every second, worker "
                 "warm-up off (smg-t13)"),
]

# NVIDIA Dynamo's KV router (bench/README.md, "Dynamo"): its frontend and a
# shim that makes the vLLM NIXL sims Dynamo workers, from bench/.venv-dynamo.
# Opt-in (`--configs dynamo`, `just bench-fleet-dynamo`): not in the default
# run, so `just bench-fleet` and CI need no Dynamo install.
OPT_IN = [
    Config("dynamo", "dynamo", "vllm", variants=("1x",),
           about="Dynamo 1.6.1 frontend --router-mode kv (prefill and decode workers through "
                 "a shim that publishes the KV events the sims do not), vLLM NIXL sims"),
    # Dynamo's sweep winner on the tuning window (bench/README.md, "The
    # peers' tuning sweep"): the p99 medians of credits 1, 2 and 4 within
    # 2 % of each other, credit 4 keeping the most hits.
    Config("dynamo-tuned", "dynamo", "vllm", variants=("1x",),
           peer_args=("--router-kv-overlap-score-credit", "4"),
           about="Dynamo's sweep winner: KV router, overlap credit 4 (dynamo-t3)"),
]

# The peers' tuning sweep (bench/README.md, "The peers' tuning sweep"): each
# peer's cache_aware knobs, on the tuning window only, 2 seeds each; run with
# `--configs` (they are not in the default run).
VLLM_ROUTER = dict(router="vllm-router", engine="vllm", token_ids=True, variants=("1x",))
SMG = dict(router="smg", engine="sglang", variants=("1x",))
PEER_SWEEP = [
    Config("vllm-router-t1", peer_args=("--cache-threshold", "0.1"), **VLLM_ROUTER,
           about="vllm-router cache_aware, cache threshold 0.1"),
    Config("vllm-router-t2", peer_args=("--cache-threshold", "0.5"), **VLLM_ROUTER,
           about="vllm-router cache_aware, cache threshold 0.5"),
    Config("vllm-router-t3", peer_args=("--balance-abs-threshold", "8"), **VLLM_ROUTER,
           about="vllm-router cache_aware, balance abs threshold 8"),
    Config("vllm-router-t4", peer_args=("--balance-abs-threshold", "4",
                                        "--balance-rel-threshold", "1.2"), **VLLM_ROUTER,
           about="vllm-router cache_aware, balance thresholds abs 4, rel 1.2"),
    Config("vllm-router-t5", peer_args=("--balance-abs-threshold", "2",
                                        "--balance-rel-threshold", "1.1"), **VLLM_ROUTER,
           about="vllm-router cache_aware, balance thresholds abs 2, rel 1.1"),
    Config("vllm-router-t6", peer_args=("--eviction-interval-secs", "5",
                                        "--max-tree-size", "1759232"), **VLLM_ROUTER,
           about="vllm-router cache_aware, its tree evicted every 5 s to a pod's prefix "
                 "cache (3,436 blocks of 512 tokens) a worker"),
    Config("smg-t1", peer_args=("--cache-threshold", "0.1"), **SMG,
           about="SMG cache_aware, cache threshold 0.1"),
    Config("smg-t2", peer_args=("--cache-threshold", "0.5"), **SMG,
           about="SMG cache_aware, cache threshold 0.5"),
    Config("smg-t3", peer_args=("--balance-abs-threshold", "4",
                                "--balance-rel-threshold", "1.2"), **SMG,
           about="SMG cache_aware, spill thresholds abs 4, rel 1.2"),
    Config("smg-t4", peer_args=("--balance-abs-threshold", "2",
                                "--balance-rel-threshold", "1.1"), **SMG,
           about="SMG cache_aware, spill thresholds abs 2, rel 1.1"),
    Config("smg-t5", peer_args=("--worker-warmup-secs", "0",
                                "--worker-warmup-divert-every", "0"), **SMG,
           about="SMG cache_aware, worker warm-up off (no misses or hits diverted to "
                 "thin workers)"),
    Config("smg-t6", peer_args=("--eviction-interval-secs", "5",
                                "--max-tree-size", "56295424"), **SMG,
           about="SMG cache_aware, its tree evicted every 5 s to the 8 prefill pods' "
                 "prefix caches in characters (4 a token)"),
    # Round 2, SMG only, declared after round 1: its load poll (10 s of real
    # time, 50 modelled at scale 5) left the prefill pods it had seen at 80 %
    # KV use or more out of routing until the next poll.
    Config("smg-t7", peer_args=("--load-monitor-interval", "1"), **SMG,
           about="SMG cache_aware, the workers' load polled every second (pd-router's "
                 "scrape interval)"),
    Config("smg-t8", peer_args=("--disable-worker-overload-protection",), **SMG,
           about="SMG cache_aware, worker overload protection off"),
    Config("smg-t9", peer_args=("--load-monitor-interval", "1", "--balance-abs-threshold", "4",
                                "--balance-rel-threshold", "1.2"), **SMG,
           about="SMG cache_aware, load polled every second, spill thresholds abs 4, rel 1.2"),
    Config("smg-t10", peer_args=("--disable-worker-overload-protection",
                                 "--balance-abs-threshold", "4",
                                 "--balance-rel-threshold", "1.2"), **SMG,
           about="SMG cache_aware, worker overload protection off, spill thresholds abs 4, "
                 "rel 1.2"),    # Round 3, SMG only, declared after round 2: round 1's knobs again, with
    # round 2's winner (the load polled every second) under them.
    Config("smg-t11", peer_args=("--load-monitor-interval", "1", "--cache-threshold", "0.1"),
           **SMG, about="SMG cache_aware, load polled every second, cache threshold 0.1"),
    Config("smg-t12", peer_args=("--load-monitor-interval", "1", "--cache-threshold", "0.5"),
           **SMG, about="SMG cache_aware, load polled every second, cache threshold 0.5"),
    Config("smg-t13", peer_args=("--load-monitor-interval", "1", "--worker-warmup-secs", "0",
                                 "--worker-warmup-divert-every", "0"), **SMG,
           about="SMG cache_aware, load polled every second, worker warm-up off"),
    Config("smg-t14", peer_args=("--load-monitor-interval", "1", "--eviction-interval-secs", "5",
                                 "--max-tree-size", "56295424"), **SMG,
           about="SMG cache_aware, load polled every second, its tree evicted every 5 s to "
                 "the 8 prefill pods' prefix caches"),
    # Dynamo's round, declared before its runs (issue 37's equal effort): its
    # KV router's cost is the prefill tokens queued on a worker plus the
    # prompt's tokens it lacks, less `credit` times those it holds (so 1
    # weighs a token held as one queued); `decay` shrinks the credit as the
    # worker's queue passes the least loaded one's (1 halves it at one
    # request's worth).
    *(Config(f"dynamo-t{i}", "dynamo", "vllm", variants=("1x",), peer_args=args, about=about)
      for i, (args, about) in enumerate([
          (("--router-kv-overlap-score-credit", "0.5"), "Dynamo KV router, overlap credit 0.5"),
          (("--router-kv-overlap-score-credit", "2"), "Dynamo KV router, overlap credit 2"),
          (("--router-kv-overlap-score-credit", "4"), "Dynamo KV router, overlap credit 4"),
          (("--router-kv-overlap-score-credit", "4", "--router-kv-overlap-score-credit-decay",
            "1"), "Dynamo KV router, overlap credit 4, halved at one request's worth "
                  "of excess prefill load"),
      ], start=1)),
]

# The placement's tuning rows (bench/README.md, "Tuning the placement"):
# pd-router's default with one scheduling knob changed, run by name on the
# tuning windows only.
PLACEMENT_SWEEP = [
    *(Config(f"pd-ttft-w{w}", "pd", "vllm", {}, {"scheduling": {"uncached_token_weight": w}},
             against="pd-ttft", variants=("1x",), about=f"least_ttft, uncached_token_weight {w}")
      for w in (24, 32, 96, 192, 384)),
    *(Config(f"pd-ttft-slots{n // 1024}k", "pd", "vllm", {}, {"scheduling": {"prefix_table_slots": n}},
             against="pd-ttft", variants=("1x",), about=f"least_ttft, a prefix table of {n:,} slots")
      for n in (32768, 65536, 131072, 262144)),
    *(Config(f"pd-ttft-cap{n // 1024}k", "pd", "vllm", {}, {"scheduling": {"affinity_cap_tokens": n}},
             against="pd-ttft", variants=("1x",),
             about=f"least_ttft, the weight's part above 1 capped at {n:,} tokens")
      for n in (32768, 131072, 262144)),
    # The cap as a multiple of the prompt (bench/README.md, "A cap relative
    # to the prompt"), declared after fleet_tail.py on t6k: the tail's
    # requests that were not giant prompts waited behind one on their
    # conversation's pod.
    *(Config(f"pd-ttft-capp{k}", "pd", "vllm", {}, {"scheduling": {"affinity_cap_prompts": k}},
             against="pd-ttft", variants=("1x",),
             about=f"least_ttft, the weight's part above 1 capped at {k} times the prompt")
      for k in (2, 4)),
    # Declared after the relative caps gave up 5-19 points of hits on the
    # tuning windows: the cap grows with the prompt above a floor of 65,536
    # tokens, so only waits past about 3 modelled seconds move a prompt.
    Config("pd-ttft-capf64k4", "pd", "vllm", {},
           {"scheduling": {"affinity_cap_tokens": 65536, "affinity_cap_prompts": 4}},
           against="pd-ttft", variants=("1x",),
           about="least_ttft, the weight's part above 1 capped at 4 times the prompt, "
                 "at least 65,536 tokens"),
    # Declared after the relative caps (bench/README.md, "Where the tail
    # is"): instead of moving the turns stuck behind a giant prefill, keep
    # the giant off the pod whose conversations are streaming, a cost that
    # grows with the square of the tokens it computes there.
    *(Config(f"pd-ttft-home{n // 1024}k", "pd", "vllm", {}, {"scheduling": {"busy_home_tokens": n}},
             against="pd-ttft", variants=("1x",),
             about=f"least_ttft, each streaming conversation of a pod costs u^2/{n:,} tokens")
      for n in (131072, 524288)),
    # Declared after those raised the tail by gathering the giants on pods
    # busy with other giants (fleet-tail-home128k-t6k.txt): the cost bounded
    # at an eighth of the tokens computed, so a giant takes at most that
    # much more queue; S large enough that only giants feel it.
    *(Config(f"pd-ttft-homecap{n // 1048576}m", "pd", "vllm", {},
             {"scheduling": {"busy_home_tokens": n, "busy_home_cap": 0.125}},
             against="pd-ttft", variants=("1x",),
             about=f"least_ttft, each streaming conversation of a pod costs u^2/{n:,} tokens, "
                   "at most u/8")
      for n in (2097152, 8388608)),
    # Declared after those (bench/README.md, "Weighing tokens by their
    # attention"): a giant cold prompt delays the turns queued behind it by
    # more than its token count says, since each of its tokens attends to
    # all before it. Llama-3.1-8B's own figure (2 x 6.98 G non-embedding
    # parameters over 4 x 32 layers x 4,096 wide: 26,600), alone and under
    # caps on what holding the prompt is worth, in that unit.
    Config("pd-ttft-att", "pd", "vllm", {}, {"scheduling": {"attention_tokens": 26600}},
           against="pd-ttft", variants=("1x",),
           about="least_ttft, tokens weighed by their attention (attention_tokens 26,600)"),
    *(Config(f"pd-ttft-att-cap{n // 1024}k", "pd", "vllm", {},
             {"scheduling": {"attention_tokens": 26600, "affinity_cap_tokens": n}},
             against="pd-ttft", variants=("1x",),
             about=f"least_ttft, tokens weighed by their attention, the affinity capped at {n:,}")
      for n in (196608, 262144)),
    # Declared after those gave up hits (bench/README.md, "Weighing tokens
    # by their attention"): keep the turns home and the giants off the
    # pods whose conversations stream (busy_home_tokens, unbounded); weighed
    # by its attention a giant in flight makes its pod look three times
    # busier, which is what should keep the next giant from gathering there.
    *(Config(f"pd-ttft-att-home{n // 1024}k", "pd", "vllm", {},
             {"scheduling": {"attention_tokens": 26600, "busy_home_tokens": n}},
             against="pd-ttft", variants=("1x",),
             about=f"least_ttft, tokens weighed by their attention, each streaming "
                   f"conversation of a pod costs u^2/{n:,} tokens")
      for n in (131072, 262144)),
    # Declared after those (fleet_lost_hits.py on t6k: the weighing's lost
    # hits are load moves, 77 against the default's 46): the weighing makes
    # a giant queue about three times its tokens and a queue of short
    # prompts about its tokens, so a higher weight should keep the moves
    # behind giants and drop the others.
    *(Config(f"pd-ttft-att-w{w}", "pd", "vllm", {},
             {"scheduling": {"attention_tokens": 26600, "uncached_token_weight": w}},
             against="pd-ttft", variants=("1x",),
             about=f"least_ttft, tokens weighed by their attention, uncached_token_weight {w}")
      for w in (96, 144)),
]

# One change each against a configuration above (`against`), in the
# variants that say something: `--changes` runs them with those, and writes
# fleet-changes.* (bench/README.md, "What was changed").
CHANGES = [
    Config("pd-prefix-b128", "pd", "vllm", AIBRIX,
           {"scheduling": {"prefix_block_tokens": 32, "prefix_max_blocks": 128}},
           against="pd-prefix", variants=("1x",),
           about="AIBrix's policies on blocks of 128 bytes, the first 16 KB hashed "
                 "(before issue 24)"),
    Config("pd-ttft-w1", "pd", "vllm", {}, {"scheduling": {"uncached_token_weight": 1}},
           against="pd-ttft", variants=("1x",), about="least_ttft, uncached_token_weight 1 (the TTFT alone)"),
    Config("pd-ttft-w4", "pd", "vllm", {}, {"scheduling": {"uncached_token_weight": 4}},
           against="pd-ttft", variants=("1x",), about="least_ttft, uncached_token_weight 4"),
    Config("pd-ttft-w8", "pd", "vllm", {}, {"scheduling": {"uncached_token_weight": 8}},
           against="pd-ttft", variants=("1x",), about="least_ttft, uncached_token_weight 8"),
    Config("pd-ttft-w64", "pd", "vllm", {}, {"scheduling": {"uncached_token_weight": 64}},
           against="pd-ttft", variants=("1x",), about="least_ttft, uncached_token_weight 64"),
    Config("pd-ttft-lb", "pd", "vllm", {"decode_policy": "load_balancing"},
           against="pd-ttft", variants=("1x", "32p"), about="least_ttft, decode load_balancing (AIBrix's)"),
    Config("pd-ttft-decider", "pd", "vllm", {"decider": DECIDER},
           against="pd-ttft", variants=("1x", "2x"), about="pd-router's defaults, the decider on"),
    Config("pd-ttft-follow", "pd", "vllm",
           {"decider": {"min_prompt_tokens": 0, "min_uncached_tokens": 0}},
           against="pd-ttft", variants=("1x",), about="pd-router's defaults, the decode pod follows the "
                                   "prompt's KV (a decider that never keeps one whole)"),
    Config("pd-ttft-x3", "pd", "vllm", replicas=3, against="pd-ttft", variants=("1x",),
           about="three Envoy replicas with pd-router's defaults"),
    Config("pd-session-lf4", "pd", "vllm", {"session": dict(SESSION, load_factor=4)},
           session=True, against="pd-session", variants=("1x",),
           about="session affinity, load_factor 4 (a session gives way to load later)"),
    Config("pd-session-reuse-ttl20", "pd", "vllm",
           {"session": SESSION, "kv_reuse": {"ttl_ms": 18000}}, session=True,
           decoder_kv_ttl_s=20.0, against="pd-session-reuse", variants=("1x",),
           about="next-turn KV reuse with decode holds of 20 s (the router's handles 18 s)"),
    Config("pd-prefix-decider", "pd", "vllm", dict(AIBRIX, decider=DECIDER),
           against="pd-prefix", variants=("1x",), about="AIBrix's policies, the decider on"),
    Config("pd-chash-c1.25", "pd", "vllm", {"prefill_policy": "consistent_hash"},
           {"scheduling": {"bounded_load_factor": 1.25}}, against="pd-chash", variants=("1x",),
           about="consistent_hash, bounded_load_factor 1.25"),
    Config("pd-chash-k256", "pd", "vllm", {"prefill_policy": "consistent_hash"},
           {"scheduling": {"prefix_block_tokens": 32, "consistent_hash_blocks": 8}},
           against="pd-chash", variants=("1x",), about="consistent_hash keyed on the first 8 blocks of 128 bytes "
                                   "(before issue 24), the bound of now"),
]

# The endpoint picker as a peer (issue 37; bench/README.md, "The endpoint
# picker as a peer"): GIE v1.5.0's EPP with llm-d's PD plugins (tools/epp)
# places both legs with its own scorers, over ext_proc from deploy/envoy-epp's
# Envoy, where pd-router in executor mode ("placement": "epp") carries out
# the hand-off; the sims each on an address of their own (the pool's pods),
# a real kube-apiserver and etcd holding the pool and one Pod a sim pod. Run
# only when named in --configs: it needs `just epp kube-apiserver` (Go).
#
# Its scheduling (EPP_WEIGHTS, EPP_PREFIX): llm-d's own P/D sample
# (llm-d-inference-scheduler deploy/config/pd-epp-config.yaml): in both
# profiles GIE's prefix-cache scorer (weight 2; approximate: it remembers
# where it sent each prompt's blocks of 16 tokens, 4 bytes a token, at most
# 256, 31,250 blocks per pod, and does not see the pods' caches) and its
# queue scorer (weight 1: the pods' waiting requests), the max-score picker; every request split (llm-d's
# prefix-based decider needs its tokenizer, not in GIE; tools/epp/pd.go
# always splits, as pd-router does here). llm-d's precise prefix scorer is
# the `llmd` peer below (LLMD_PEER).
#
# The scorers and their weights in both profiles (llm-d's sample); a
# configuration's `epp_weights` replaces them.
EPP_WEIGHTS = {"prefix-cache-scorer": 2, "queue-scorer": 1}
EPP_PREFIX = {"maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250}


def epp_scheduling(weights: dict, prefix: dict) -> dict:
    """The picker's EndpointPickerConfig: the role filters, `weights`'
    scorers (the prefix-cache scorer with EPP_PREFIX and `prefix` over it),
    the max-score picker, llm-d's profile handler and prefill header."""
    both = {"prefillProfile": "prefill", "decodeProfile": "decode"}
    scorers = [{"type": t, "parameters": dict(EPP_PREFIX, **prefix)}
               if t == "prefix-cache-scorer" else {"type": t} for t in weights]
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": scorers + [
            {"type": "prefill-filter"}, {"type": "decode-filter"}, {"type": "max-score-picker"},
            {"type": "pd-profile-handler", "parameters": dict(both)},
            {"type": "prefill-header-handler", "parameters": dict(both)},
        ],
        "schedulingProfiles": [
            {"name": role, "plugins": [{"pluginRef": f"{role}-filter"},
                                       {"pluginRef": "max-score-picker"}]
             + [{"pluginRef": t, "weight": w} for t, w in weights.items()]}
            for role in ("prefill", "decode")
        ],
    }


EPP_PEER = [
    Config("epp", "epp", "vllm",
           about="GIE v1.5.0 EPP + llm-d PD plugins (prefix-cache 2, queue 1; llm-d's sample) "
                 "over ext_proc, pd-router executing its picks; vLLM NIXL sims, a pod an address"),
    # Its one tuning: the prefix scorer hashes the first 32,768 tokens of a
    # prompt instead of 4,096 (the tuning window's prompts: median 8,400
    # tokens, p90 29,000), so conversations that share a long start still
    # differ. Its memory per pod is not a knob in v1.5.0: the indexer sizes
    # each pod's LRU from the pod's vllm:cache_config_info num_gpu_blocks,
    # else 31,250 blocks of 16 tokens (an H100's HBM, about what the sims'
    # GPU KV is), whatever lruCapacityPerServer says (approximateprefix
    # plugin.go makeserver); the sims export no cache_config_info.
    Config("epp-32k", "epp", "vllm", epp_prefix={"maxPrefixBlocksToMatch": 2048},
           about="epp, its prefix scorer matching up to 32,768 tokens (2,048 blocks of 16)"),
    # GIE's own default scheduling (its chart, config/charts/epplib
    # templates/_config.yaml at v1.5.0): queue 2, KV-cache use 2, prefix 3,
    # here in both of llm-d's profiles.
    Config("epp-gie", "epp", "vllm",
           epp_weights={"queue-scorer": 2, "kv-cache-utilization-scorer": 2,
                        "prefix-cache-scorer": 3},
           about="epp with GIE's default scorers: queue 2, kv-cache-utilization 2, "
                 "prefix-cache 3"),
]

# llm-d's own endpoint picker (issue 37; bench/README.md, "llm-d's precise
# prefix scorer as a peer"): llm-d-inference-scheduler v0.4.0 (`just
# llmd-epp`) on GIE v1.2.0's runner, its own P/D plugins (the role filters,
# pd-profile-handler with threshold 0: every request split, the prefill
# header) and its precise prefix-cache scorer: it tokenizes each prompt
# (a char-level tokenizer.json of the sims' alphabet), keys its blocks by
# chained sha256 and looks them up in an index the pods' KV events fill
# (`mock-engine sim --kv-events`, bench/pdbench/kv_bridge.py publishing them
# over ZMQ as vLLM does). A key is one sim block (512 tokens), the block
# size vLLM would be started with to match. Its weights are llm-d's
# precise-prefix guide's (guides/precise-prefix-cache-aware
# gaie-kv-events/values.yaml): precise prefix 3, KV-cache use 2, queue 2,
# here in both P/D profiles. Run only when named in --configs: it needs
# `just llmd-epp kube-apiserver epp` (Go, cgo; GIE's CRD comes with `epp`).
LLMD_WEIGHTS = {"precise-prefix-cache-scorer": 3, "kv-cache-utilization-scorer": 2,
                "queue-scorer": 2}


def llmd_scheduling(c: Config, block_size: int, tokenizer: str, endpoint: str,
                    model: str) -> dict:
    """llm-d's picker's EndpointPickerConfig for `c`: epp_scheduling's P/D
    plugins with its scorers (LLMD_WEIGHTS unless it names its own, the
    decode profile's apart if it names them), the precise prefix scorer
    keying `block_size` characters a block with the local `tokenizer` for
    `model`, subscribed to KV events at `endpoint`."""
    weights = c.epp_weights or LLMD_WEIGHTS
    decode = c.epp_decode_weights or weights
    cfg = epp_scheduling(dict(weights, **decode), {})
    for prof in cfg["schedulingProfiles"]:
        w = weights if prof["name"] == "prefill" else decode
        prof["plugins"] = [p for p in prof["plugins"]
                           if "weight" not in p or p["pluginRef"] in w]
        for p in prof["plugins"]:
            if "weight" in p:
                p["weight"] = w[p["pluginRef"]]
    indexer = {
        "tokenProcessorConfig": {"blockSize": block_size, "hashSeed": ""},
        "tokenizersPoolConfig": {"modelName": model,
                                 "local": {"modelTokenizerMap": {model: tokenizer}}},
    }
    if c.llmd_index:
        indexer["kvBlockIndexConfig"] = {"inMemoryConfig": dict(c.llmd_index)}
    precise = {"indexerConfig": indexer,
               "kvEventsConfig": {"zmqEndpoint": endpoint, "topicFilter": "kv@"}}
    for p in cfg["plugins"]:
        if p["type"] == "precise-prefix-cache-scorer":
            p["parameters"] = precise
        elif p["type"] in c.epp_params:
            p["parameters"] = c.epp_params[p["type"]]
    return cfg


LLMD_PEER = [
    Config("llmd", "llmd", "vllm",
           about="llm-d v0.4.0's EPP: its P/D plugins, precise prefix 3 (the pods' KV events), "
                 "KV-cache use 2, queue 2; pd-router executing its picks; vLLM NIXL sims"),
    # Its sweep's winner (llmd-t3; bench/README.md, "The peers' tuning
    # sweep"), spelled out below the sweep.
]
# Its tuning sweep (bench/README.md, "The peers' tuning sweep"), the same
# rule and budget as the other peers'. v0.4.0's in-memory index keeps at
# most 10 pods per key (`podCacheSize`): here 16 pods publish, and a block
# every prompt starts with is held by all of them, so the pods past the
# 10 most recent fall out of that key's list and score 0 for every prompt
# starting with it, whatever else they hold. Each setting gives it room
# for every pod. The active-request scorer counts the requests it placed
# on each pod until their response completes; under P/D only the decode
# pod's response completes, so a prefill pod's count falls only when its
# entry expires (`requestTimeout`, real time): 2 s is 10 modelled s.
ROOMY = {"size": 100_000_000, "podCacheSize": 32}
DECODE_BY_LOAD = {"kv-cache-utilization-scorer": 2, "queue-scorer": 2}
ACTIVE_2S = {"active-request-scorer": {"requestTimeout": "2s"}}
LLMD_SWEEP = [
    Config("llmd-t1", "llmd", "vllm", variants=("1x",), llmd_index=ROOMY,
           about="llmd, its index keeping up to 32 pods a key"),
    Config("llmd-t2", "llmd", "vllm", variants=("1x",), llmd_index=ROOMY,
           epp_decode_weights=DECODE_BY_LOAD,
           about="llmd-t1, the decode profile by load alone (KV-cache use 2, queue 2)"),
    Config("llmd-t3", "llmd", "vllm", variants=("1x",), llmd_index=ROOMY,
           epp_weights={"precise-prefix-cache-scorer": 1, "kv-cache-utilization-scorer": 2,
                        "queue-scorer": 2}, epp_decode_weights=DECODE_BY_LOAD,
           about="llmd-t2, precise prefix weighed 1 (KV-cache use 2, queue 2)"),
    Config("llmd-t4", "llmd", "vllm", variants=("1x",), llmd_index=ROOMY,
           epp_weights=dict(LLMD_WEIGHTS, **{"active-request-scorer": 2}),
           epp_decode_weights=dict(DECODE_BY_LOAD, **{"active-request-scorer": 2}),
           epp_params=ACTIVE_2S,
           about="llmd-t2 and its own count of requests placed (active-request 2, 2 s)"),
    Config("llmd-t5", "llmd", "vllm", variants=("1x",), llmd_index=ROOMY,
           epp_weights={"precise-prefix-cache-scorer": 1, "kv-cache-utilization-scorer": 2,
                        "queue-scorer": 2, "active-request-scorer": 2},
           epp_decode_weights=dict(DECODE_BY_LOAD, **{"active-request-scorer": 2}),
           epp_params=ACTIVE_2S,
           about="llmd-t3 and its own count of requests placed (active-request 2, 2 s)"),
]

LLMD_PEER.append(dataclasses.replace(
    LLMD_SWEEP[2], name="llmd-tuned", variants=(),
    about="llm-d's sweep winner (llmd-t3): precise prefix 1, KV-cache use 2, queue 2; decode "
          "by load; 32 pods a key"))
BY_NAME = {c.name: c for c in
           CONFIGS + CHANGES + PEER_SWEEP + PLACEMENT_SWEEP + EPP_PEER + LLMD_PEER + LLMD_SWEEP
           + OPT_IN}


@dataclass(frozen=True)
class Variant:
    """How a configuration's run differs from the base one: load, pods and
    time scale multiplied (pods to `prefill`, decode pods in proportion)."""
    suffix: str
    load: float = 1.0
    prefill: int | None = None
    scale: float = 1.0


# 32p: the load-balance check at 32 prefill pods, the decode pods, the load
# and so the work per pod scaled with them; half the time scale keeps the
# machine's request rate that of the @2x runs.
VARIANTS = {"1x": Variant(""), "2x": Variant("@2x", load=2.0),
            "32p": Variant("@32p", prefill=32, scale=0.5)}
QUICK_CONFIGS = ["pd-ttft", "pd-prefix", "pd-chash", "vllm-router", "smg"]

# Defaults measured on the 2-core machine (bench/README.md, "Fleet simulation").
DEFAULTS = dict(requests=1000, time_scale=5.0, load=3.0, prefill=8, decode=8,
                cache_blocks=4 * 859)
QUICK = dict(requests=300)


@dataclass(frozen=True)
class Window:
    """Requests `start` to `start + size - 1` of the trace, measured after
    `warmup` requests replayed before them (which fill the pods' caches and
    queues and are not measured)."""
    start: int
    size: int = 1000
    warmup: int = 1000


# Tuning and judging are apart: every choice of a policy or a default is made
# on the tuning windows (`tune`, the first 1,000 requests, the slice the
# earlier choices were made on; `t6k` and `t11k`, later in the trace where
# more of each prompt was seen before, as on the judged ones); `judge`
# reports on three others, which no choice may look at (bench/README.md,
# "Tuning and judging windows").
WINDOWS = {"tune": Window(0, warmup=0), "t6k": Window(6000), "t11k": Window(11000),
           "w2k": Window(2000), "w4k": Window(4000), "w9k": Window(9000)}
WINDOW_SETS = {"tunes": ["tune", "t6k", "t11k"], "judge": ["w2k", "w4k", "w9k"]}
# The judged runs' configurations: the default and the best peer of the
# earlier runs (vllm-router; sglang-router 0.3.2, which SMG replaced, placed
# at random in PD mode).
JUDGE_CONFIGS = ["pd-ttft", "vllm-router"]


@dataclass
class Run:
    name: str
    config: Config
    variant: str
    requests: int
    load: float
    prefill: int
    decode: int
    time_scale: float
    # A window's run: the replay skips `skip` requests and measures the
    # last `requests - warmup` of those it sends; `seed` 0 is the trace as it is.
    window: str = ""
    skip: int = 0
    warmup: int = 0
    seed: int = 0

    @property
    def key(self) -> str:
        """The run's name with its window and seed, unique in a results file."""
        return self.name + (f"/{self.window}" if self.window else "") + (
            f"/s{self.seed}" if self.seed else "")


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out

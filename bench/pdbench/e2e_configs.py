"""The end-to-end bench's configurations (bench/run.py): their names, kinds
and descriptions, and the yardsticks the report compares them with."""

from __future__ import annotations

SIZES = {"1K": 1024, "64K": 64 * 1024, "512K": 512 * 1024}

# The min-pd+N<kind> rows: N extra host calls of one kind per request, so one
# call's cost is (their CPU per request - min-pd's) / N, well above the noise.
CALLS_PER_REQUEST = 100
# name, kind, description
CONFIGS = [
    ("envoy-forward", "floor", "(a) Envoy, one upstream, no filter"),
    ("envoy-mirror", "floor", "(b) Envoy, two upstream requests (mirror), no filter"),
    ("envoy-buffer-mirror", "floor", "(b') (b) + the buffer filter: the floor inside Envoy"),
    ("min-pd", "min", "(m) minimal PD wasm filter, default mocks: the proxy-wasm floor"),
    ("min-pd-vllm", "min-engine", "(m) the least a vLLM NIXL filter does, on pd-vllm's mocks"),
    ("min-pd-trtllm", "min-engine", "(m) the least a TensorRT-LLM filter does (the ids relayed "
     "as bytes, unread), on pd-trtllm's mocks"),
    # On demand, as the bisect rows: `just bench` stays within its time.
    ("min-pd-sglang", "min-extra", "(m) the least an SGLang filter does (bootstrap fields on "
     "both legs, sent at once), on pd-sglang's mocks"),
    ("min-pd+json", "bisect", "(m) + serde_json validates the body and the prefill's answer"),
    ("min-pd+edit", "bisect", "(m) + json + new prefill and decode bodies, as a hand-off"),
    *((f"min-pd+{CALLS_PER_REQUEST}{kind}", "bisect",
       f"(m) + {CALLS_PER_REQUEST} host calls per request: {what}")
      for kind, what in (("clock", "the time"), ("get", "shared-data read, 56 B"),
                         ("set", "shared-data write, 56 B"), ("counter", "counter increment"),
                         ("histogram", "histogram record"), ("header", "request header write"),
                         ("headers", "request header map read"),
                         ("headermap", "request header map written whole, one call"),
                         ("code", "KiB of distinct code run (no host call)"),
                         ("hotcode", "the first KiB of that code run N times: the same work"),
                         ("data", "KiB of filter memory read, a byte a line (no host call)"))),
    ("pd-vllm", "pd", "(c) pd-router, vllm (nixl)"),
    ("pd-sglang", "pd", "(c) pd-router, sglang"),
    ("pd-trtllm", "pd", "(c) pd-router, trtllm"),
    ("pd-trtllm-b64", "pd", "(c) pd-router, trtllm, chat ids as base64 (trt_token_ids_b64)"),
    ("pd-default", "pd", "(c) pd-router, default"),
    ("smg", "peer", "(d) SMG 1.13.0 (sglang-router's successor), PD mode, SGLang mocks"),
    ("vllm-router", "peer", "(d) vllm-router 0.1.17, PD mode, vLLM NIXL mocks"),
    ("envoy+smg", "stack", "(e) Envoy -> SMG, CPU of both"),
    ("envoy+vllm-router", "stack", "(e) Envoy -> vllm-router, CPU of both"),
]
FLOOR = "envoy-mirror"
BUFFER_FLOOR = "envoy-buffer-mirror"
MIN_PD = "min-pd"
MIN_PD_VLLM = "min-pd-vllm"
MIN_PD_TRTLLM = "min-pd-trtllm"
MIN_PD_SGLANG = "min-pd-sglang"
PEERS = [c for c, k, _ in CONFIGS if k == "peer"]
PD = [c for c, k, _ in CONFIGS if k == "pd"]
# pd-router engine -> the peer doing the same PD job on the same mocks.
HEAD_TO_HEAD = {"pd-sglang": "smg", "pd-vllm": "vllm-router"}
# ... and the gateway stack doing it: Envoy in front of that peer.
STACKS = {"pd-sglang": "envoy+smg", "pd-vllm": "envoy+vllm-router"}
# The engines the min-pd target covers (TensorRT-LLM has its own target).
MIN_PD_TARGET = ["pd-vllm", "pd-sglang", "pd-default"]

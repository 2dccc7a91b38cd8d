"""The no-hop bench's rows (bench/nohop.py), its cells and its targets."""

from __future__ import annotations

SIZES = {"1K": 1024, "64K": 64 * 1024, "220K": 220 * 1024}
CONCURRENCY = [20, 50, 100, 150]
# The 1 KB CPU target's cell, measured beside the grid.
CPU_TARGET_CELL = ("1K", 32)

FLOOR = "min-pd-vllm"
BUFFER_FLOOR = "envoy-buffer-mirror"
PD = "pd-vllm"
EPP = "epp+pd-vllm"
MIN_PD = "min-pd"
# name, kind, what runs, the processes in its path
ROWS = [
    (BUFFER_FLOOR, "floor", "Envoy buffering the body, two upstream requests (mirror), "
     "no filter: the floor for any PD router inside Envoy", ["envoy"]),
    (FLOOR, "floor", "the minimal PD wasm filter doing the least a vLLM NIXL hand-off "
     "needs, on the vLLM mocks: the TTFT floor", ["envoy"]),
    (PD, "pd", "Envoy + pd-router deciding and executing (vLLM NIXL)", ["envoy"]),
    (EPP, "ext_proc", "Envoy + GIE v1.5.0's EPP with llm-d's PD plugins over ext_proc "
     "(FULL_DUPLEX_STREAMED, TLS) + pd-router executing its picks (the stand-in for "
     "llm-d's routing sidecar)", ["envoy", "epp"]),
    ("vllm-router", "peer", "vllm-router 0.1.17 --vllm-pd-disaggregation, standalone",
     ["vllm-router"]),
    ("envoy+vllm-router", "stack", "Envoy (no filter) in front of vllm-router",
     ["envoy", "vllm-router"]),
    # The 1 KB CPU target's cell only.
    (MIN_PD, "cpu-target", "the minimal PD filter on default-engine mocks: the floor of "
     "the 1 KB CPU target", ["envoy"]),
    ("pd-default", "cpu-target", "pd-router, default engine, on default-engine mocks",
     ["envoy"]),
]
GRID_ROWS = [r[0] for r in ROWS if r[1] != "cpu-target"]
ALL_ROWS = [r[0] for r in ROWS]
PATHS = {r[0]: r[3] for r in ROWS}
ROUTERS = [PD, EPP, "vllm-router", "envoy+vllm-router"]

# The targets, stated before the run (bench/README.md, "No-hop rows").
TTFT_SHARE = 1 / 5
CPU_SHARE = 1 / 3
TARGET_CELL = ("220K", 150)
CPU_TARGET_RATIO = 1.15


def cells(sizes: list[str], concs: list[int], configs: list[str]):
    """(size, concurrency, configs measured there): the grid's rows at every
    size and concurrency; at 1 KB c=32 (added when 1 KB is measured) every
    row."""
    out = []
    for s in sizes:
        pairs = [(s, c) for c in concs]
        if s == CPU_TARGET_CELL[0] and CPU_TARGET_CELL not in pairs:
            pairs.append(CPU_TARGET_CELL)
        for cell in pairs:
            rows = configs if cell == CPU_TARGET_CELL else [r for r in configs if r in GRID_ROWS]
            if rows:
                out.append((*cell, list(rows)))
    return out

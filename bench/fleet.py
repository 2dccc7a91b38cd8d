#!/usr/bin/env python3
"""Fleet benchmark: a production trace through each router onto simulated GPU pods.

How well each router places the requests (bench/README.md, "Fleet
simulation").

For each configuration: a fresh `mock-engine sim` (prefill and decode pods in
one process, modelled time divided by --time-scale), a fresh router in front
of it (pd-router in Envoy, one or several replicas, or a peer), then
`mock-engine replay` sends the first --requests of the trace at its
timestamps (its rate times --load), and the sim's records and pod counters
are read back. Everything the script starts is stopped (by process group)
before the next configuration starts, also when one fails.

Per configuration: the fleet's prefix-cache hit rate (of the trace's limit,
an unbounded cache shared by the fleet, and of all prompt tokens), TTFT and
end-to-end percentiles, output tokens/s, prompt tokens computed, max/mean
pod load per role, the prefill pods' busy fraction, errors, hand-offs that
were missing or expired, and the replayer's own lag.

Writes bench/results/fleet.txt (the table and the run's parameters),
fleet.csv, fleet.png and fleet-raw.json (every figure per configuration);
--quick writes fleet-quick.* instead, so `just bench` leaves the full run's
files alone.

Run with `./just bench-fleet` (builds and installs what it needs), or once
built: bench/.venv/bin/python bench/fleet.py --help
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import gzip
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from run import free_port, read_line, wait_until

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
MODEL = "sim-model"
# `mock-engine sim --lease-s`'s default: how long a vLLM prefill pod keeps
# its KV for the decode, modelled seconds.
SIM_LEASE_S = 30.0


# ------------------------------------------------------------ configurations

@dataclass(frozen=True)
class Config:
    """One router setup. `model` is merged into pd-router's model entry,
    `plugin` into its top-level configuration (dicts merged deeply);
    `scale` multiplies the time scale of its runs."""
    name: str
    router: str  # "pd", "vllm-router" or "sglang-router"
    engine: str  # the sims' wire contract: "vllm" or "sglang"
    model: dict = field(default_factory=dict)
    plugin: dict = field(default_factory=dict)
    replicas: int = 1
    scale: float = 1.0
    # The replayer sends prompts as token ids (what the sims' render gives
    # for the text), for a router that keys on them.
    token_ids: bool = False
    # The variants it runs in (by key of VARIANTS); empty: every one asked.
    variants: tuple = ()
    # A change: the configuration it is measured against.
    against: str = ""
    about: str = ""


# Adding a configuration is one line here. A configuration without
# `variants` runs in every variant the command line asks for; one with them
# only in those (the rows that measure one change against the default).
AIBRIX = {"prefill_policy": "prefix_cache", "decode_policy": "load_balancing"}
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
    Config("pd-sglang", "pd", "sglang", variants=("1x", "2x"),
           about="pd-router's defaults, SGLang sims (bootstrap rooms)"),
    # Prompts as token ids: its cache_aware keys on them as they come, where
    # a text prompt makes it ask every pod to render (tokenize) it first.
    Config("vllm-router", "vllm-router", "vllm", token_ids=True,
           about="vllm-router 0.1.17 --vllm-pd-disaggregation --policy cache_aware, "
                 "prompts as token ids"),
    Config("sglang-router", "sglang-router", "sglang",
           about="sglang-router 0.3.2 --pd-disaggregation --policy cache_aware "
                 "(random in PD mode: its PD policies are never seeded)"),
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
BY_NAME = {c.name: c for c in CONFIGS + CHANGES}


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
QUICK_CONFIGS = ["pd-ttft", "pd-prefix", "pd-chash", "vllm-router", "sglang-router"]

# Defaults measured on the 2-core machine (bench/README.md, "Fleet simulation").
DEFAULTS = dict(requests=1000, time_scale=5.0, load=3.0, prefill=8, decode=8,
                cache_blocks=4 * 859)
QUICK = dict(requests=300)


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


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# --------------------------------------------------------------- processes

_libc = ctypes.CDLL(None, use_errno=True)


def _child_setup() -> None:
    os.setsid()  # a process group of its own: stopped with everything it started
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: dies with this script


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Procs:
    """The processes of one configuration, each in its own process group,
    stopped by PID (SIGTERM to the group, then SIGKILL)."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.procs: list[tuple[str, subprocess.Popen]] = []
        # The routers' own Prometheus pages (kept with --keep).
        self.metrics_urls: list[str] = []

    def start(self, name: str, argv: list[str], env: dict | None = None,
              stdout=subprocess.DEVNULL) -> subprocess.Popen:
        full_env = dict(os.environ)
        for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                  "all_proxy"):
            full_env.pop(k, None)
        full_env.update({"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
        full_env.update(env or {})
        with open(self.scratch / f"{name}.log", "wb") as err:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                                 env=full_env, preexec_fn=_child_setup)
        self.procs.append((name, p))
        return p

    def log_tail(self, name: str, lines: int = 12) -> str:
        try:
            text = (self.scratch / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 5
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            # The group may outlive its leader: make sure it is gone.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.poll() is None:
                p.wait()
        self.procs.clear()


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    try:
        with _opener.open(urllib.request.Request(url), timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of `pid` (all its threads), seconds; 0 if gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores together."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


# ------------------------------------------------------------------- the sim

def start_sim(procs: Procs, a, run: Run) -> dict:
    argv = [str(a.mock), "sim", "--engine", run.config.engine, "--prefill", str(run.prefill),
            "--decode", str(run.decode), "--time-scale", f"{run.time_scale:g}", "--model", MODEL]
    if a.kv_blocks:
        argv += ["--kv-blocks", str(a.kv_blocks)]
    if a.cache_blocks:
        argv += ["--cache-blocks", str(a.cache_blocks)]
    p = procs.start("sim", argv, stdout=subprocess.PIPE)
    line = read_line(p, 30)
    try:
        ready = json.loads(line)
    except json.JSONDecodeError:
        ready = {}
    if not ready.get("ready"):
        raise RuntimeError(f"sim did not start: {line!r}\n{procs.log_tail('sim')}")
    return ready


def endpoints(pods: list[dict], engine: str) -> list[dict]:
    out = []
    for pod in pods:
        e = {"address": pod["address"], "name": pod["name"]}
        if engine == "sglang":
            e["bootstrap_port"] = pod["bootstrap_port"]
        out.append(e)
    return out


# -------------------------------------------------------------------- routers

def plugin_config(c: Config, sim: dict) -> dict:
    """pd-router's configuration for the sim's pods."""
    # The policies a configuration does not name are pd-router's defaults.
    model = deep_merge({
        "name": MODEL, "engine": c.engine,
        "rolesets": [{"name": "rs0", "prefill": endpoints(sim["prefill"], c.engine),
                      "decode": endpoints(sim["decode"], c.engine)}],
    }, c.model)
    return deep_merge({
        "prefill_cluster": "pd_prefill",
        "routing_header": "x-envoy-original-dst-host",
        # Real seconds: a prefill queued for minutes of modelled time still
        # answers within this.
        "prefill_timeout_ms": 300000,
        "max_body_bytes": 33554432,
        "scrape_interval_ms": 1000,
        # The sims' vLLM NIXL lease (30 modelled s) in real time.
        "kv_lease_ms": max(1, round(SIM_LEASE_S * 1000 / sim["time_scale"])),
        "models": [model],
    }, {k: v for k, v in c.plugin.items()})


def envoy_config(wasm: Path, plugin: dict) -> dict:
    """The shipped envoy.yaml: kernel-chosen ports, this module, the plugin
    configuration replaced, and no circuit-breaker limits (an open-loop
    replay keeps more than Envoy's default 1024 requests in flight when
    pods queue)."""
    cfg = yaml.safe_load((REPO / "envoy.yaml").read_text())
    cfg["admin"]["address"]["socket_address"]["port_value"] = 0
    for listener in cfg["static_resources"]["listeners"]:
        listener["address"]["socket_address"]["port_value"] = 0
    hcm = None
    for listener in cfg["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                if f["name"] == "envoy.filters.network.http_connection_manager":
                    hcm = f["typed_config"]
    if hcm is None:
        raise RuntimeError("envoy.yaml: no http_connection_manager")
    wasm_filter = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.wasm")
    conf = wasm_filter["typed_config"]["config"]
    conf["vm_config"]["code"]["local"]["filename"] = str(wasm)
    conf["configuration"] = {"@type": "type.googleapis.com/google.protobuf.StringValue",
                             "value": json.dumps(plugin)}
    # Generous timeouts: modelled minutes of queueing are real seconds.
    hcm["stream_idle_timeout"] = "600s"
    for vh in hcm["route_config"]["virtual_hosts"]:
        for r in vh["routes"]:
            r["route"]["timeout"] = "0s"
            r["route"]["idle_timeout"] = "600s"
    big = {"max_connections": 1000000, "max_pending_requests": 1000000,
           "max_requests": 1000000, "max_retries": 1000000}
    for cl in cfg["static_resources"]["clusters"]:
        cl["circuit_breakers"] = {"thresholds": [dict(big, priority="DEFAULT"),
                                                 dict(big, priority="HIGH")]}
    return cfg


def start_envoy(procs: Procs, a, name: str, cfg: dict) -> int:
    path = procs.scratch / f"{name}.json"
    path.write_text(json.dumps(cfg, indent=1))
    admin_path = procs.scratch / f"{name}.admin"
    p = procs.start(name, [str(a.envoy), "-c", str(path), "--disable-hot-restart",
                           "--concurrency", "2", "-l", "warning",
                           "--admin-address-path", str(admin_path)])

    def admin():
        try:
            s = admin_path.read_text().strip()
            return int(s.rsplit(":", 1)[1]) if s else None
        except (OSError, ValueError, IndexError):
            return None

    admin_port = wait_until(f"{name} admin", admin, 30, p)
    procs.metrics_urls.append(f"http://127.0.0.1:{admin_port}/stats/prometheus")

    def listener():
        s, body = http_get(f"http://127.0.0.1:{admin_port}/listeners", 2)
        ready, _ = http_get(f"http://127.0.0.1:{admin_port}/ready", 2)
        if s != 200 or ready != 200:
            return None
        for line in body.decode().splitlines():
            if line.startswith("pd_listener::"):
                return int(line.rsplit(":", 1)[1]) or None
        return None

    try:
        return wait_until(f"{name} listener", listener, 30, p)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail(name)}") from None


def start_peer(procs: Procs, name: str, argv: list[str], probe: str) -> int:
    """A peer router on fresh ports, once `probe` answers 200; its
    Prometheus page joins the run's metrics."""
    port, prom = free_port(), free_port()
    argv = argv + ["--host", "127.0.0.1", "--port", str(port),
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)]
    p = procs.start(name, argv)
    try:
        wait_until(f"{name} {probe}",
                   lambda: http_get(f"http://127.0.0.1:{port}{probe}", 2)[0] == 200, 60, p)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail(name)}") from None
    procs.metrics_urls.append(f"http://127.0.0.1:{prom}/metrics")
    return port


def start_vllm_router(procs: Procs, a, sim: dict) -> int:
    argv = [str(a.peer_venv / "bin" / "vllm-router"), "--vllm-pd-disaggregation"]
    for pod in sim["prefill"]:
        argv += ["--prefill", f"http://{pod['address']}"]
    for pod in sim["decode"]:
        argv += ["--decode", f"http://{pod['address']}"]
    argv += ["--policy", "cache_aware", "--log-level", "warning",
             "--worker-startup-check-interval", "1"]
    return start_peer(procs, "vllm-router", argv, "/health")


def start_sglang_router(procs: Procs, a, sim: dict) -> int:
    argv = [str(a.peer_venv / "bin" / "python"), "-m", "sglang_router.launch_router",
            "--pd-disaggregation"]
    for pod in sim["prefill"]:
        argv += ["--prefill", f"http://{pod['address']}", str(pod["bootstrap_port"])]
    for pod in sim["decode"]:
        argv += ["--decode", f"http://{pod['address']}"]
    argv += ["--policy", "cache_aware", "--log-level", "warn", "--history-backend", "none"]
    return start_peer(procs, "sglang-router", argv, "/readiness")


def start_router(procs: Procs, a, c: Config, sim: dict) -> list[str]:
    """Starts the configuration's router(s); returns the URLs to replay to."""
    if c.router == "pd":
        cfg = envoy_config(a.wasm, plugin_config(c, sim))
        ports = [start_envoy(procs, a, f"envoy{i}", cfg) for i in range(c.replicas)]
    elif c.router == "vllm-router":
        ports = [start_vllm_router(procs, a, sim)]
    elif c.router == "sglang-router":
        ports = [start_sglang_router(procs, a, sim)]
    else:
        raise ValueError(f"unknown router {c.router}")
    return [f"http://127.0.0.1:{p}/v1/completions" for p in ports]


# ------------------------------------------------------------------- the trace

def load_trace(path: Path, scratch: Path) -> tuple[Path, list[dict]]:
    """The trace as a plain file the replayer reads, and its lines."""
    if path.suffix == ".gz":
        plain = scratch / path.name.removesuffix(".gz")
        with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        plain = path
    lines = []
    with open(plain) as f:
        for line in f:
            if line.strip():
                lines.append(json.loads(line))
    return plain, lines


def block_tokens(t: dict, i: int) -> int:
    return max(0, min(512, t["input_length"] - 512 * i))


def reusable_tokens(trace: list[dict]) -> list[int]:
    """Per request: the tokens of its leading blocks already seen in an
    earlier request (an unbounded cache shared by the fleet), capped as a pod
    caps its hit (the last token is always computed)."""
    seen: set = set()
    out = []
    for t in trace:
        tokens = 0
        for i, h in enumerate(t["hash_ids"]):
            if h not in seen:
                break
            tokens += block_tokens(t, i)
        out.append(min(tokens, max(0, t["input_length"] - 1)))
        seen.update(t["hash_ids"])
    return out


# -------------------------------------------------------------------- metrics

def pct(xs: list[float], p: float) -> float | None:
    """The p-th percentile, linear between the closest ranks."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def max_over_mean(values: list[float]) -> float | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else None


def pod_ttft(legs: dict[str, list[dict]]) -> float | None:
    """The time to first token the pods alone take, on the sim's clock: the
    decode leg's (or the whole request's) arrival to its first token, plus
    the answered prefill leg's time on its pod before the decode arrived (a
    sequential hand-off's whole prefill; nothing for a concurrent one, whose
    decode waits for the KV on its pod). The router's and HTTP's real time,
    which the time scale multiplies, is left out."""
    def answered(role: str) -> dict | None:
        rs = [r for r in legs.get(role) or [] if r["status"] == 200]
        return max(rs, key=lambda r: r.get("finish_s") or 0) if rs else None
    last = answered("decode") or answered("whole")
    if last is None or last.get("first_token_s") is None:
        return None
    t = last["first_token_s"] - last["arrival_s"]
    pre = answered("prefill")
    if pre is not None and pre.get("finish_s") is not None:
        t += max(0.0, min(pre["finish_s"], last["arrival_s"]) - pre["arrival_s"])
    return t


def summarize(seen: list[dict], records: list[dict], pods: dict, trace: list[dict],
              reusable: list[int]) -> dict:
    by_user: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        by_user.setdefault(r["user"], {}).setdefault(r["role"], []).append(r)

    def computed_here(user: str) -> dict | None:
        """The record of the pod that computed the prompt: the prefill leg
        (the answered one if several), else a whole request."""
        legs = by_user.get(user, {})
        for role in ("prefill", "whole"):
            rs = legs.get(role) or []
            ok = [r for r in rs if r["status"] == 200 and r.get("finish_s") is not None]
            if ok or rs:
                return max(ok or rs, key=lambda r: r.get("finish_s") or 0)
        return None

    cached = 0
    overhead = []
    pod_times = []
    for s in seen:
        r = computed_here(s["user"])
        if r is not None:
            cached += r["cached_tokens"]
        # What the router and HTTP add to the time to first token (real
        # time, multiplied by the time scale): the client's TTFT minus the
        # pods' own, from the first leg's arrival to the first token.
        legs = [x for rs in by_user.get(s["user"], {}).values() for x in rs]
        firsts = [x["first_token_s"] for x in legs
                  if x["role"] in ("decode", "whole") and x.get("first_token_s") is not None]
        if legs and firsts and s.get("ttft_s") is not None and s["status"] == 200:
            overhead.append(s["ttft_s"] - (min(firsts) - min(x["arrival_s"] for x in legs)))
            t = pod_ttft(by_user.get(s["user"], {}))
            if t is not None:
                pod_times.append(t)
    prompt_tokens = sum(t["input_length"] for t in trace)
    limit = sum(reusable)
    good = [s for s in seen if s["status"] == 200 and not s.get("error")]
    ttft = [s["ttft_s"] for s in good if s.get("ttft_s") is not None]
    e2e = [s["e2e_s"] for s in good if s.get("e2e_s") is not None]
    ends = [s["arrival_s"] + s["late_s"] + s["e2e_s"] for s in seen if s.get("e2e_s") is not None]
    span = (max(ends) - min(s["arrival_s"] for s in seen)) if ends else None
    out_tokens = sum(s["output_tokens"] for s in good)
    timeouts = sum(1 for s in seen if s.get("error") == "timed out")
    errors = len(seen) - len(good)
    first_error = next((f"{s['status']}: {s.get('error') or ''}"[:200]
                        for s in seen if s not in good), "")

    # The prefill pods' run, on the sim's clock: from the first arrival to
    # the last prompt computed on a prefill pod (the decode tail after it
    # leaves them idle); the decode pods': to the last completion.
    role_pods = {role: [p for p in pods["pods"] if p["role"] == role]
                 for role in ("prefill", "decode")}
    on_prefill = {p["name"] for p in role_pods["prefill"]}
    starts = [r["arrival_s"] for r in records]
    p_end = [r["finish_s"] for r in records
             if r.get("finish_s") is not None and r["pod"] in on_prefill]
    d_end = [r["finish_s"] for r in records if r.get("finish_s") is not None]
    window = (max(p_end) - min(starts)) if starts and p_end else None
    d_window = (max(d_end) - min(starts)) if starts and d_end else None
    busy = [p["busy_s"] / window for p in role_pods["prefill"]] if window else []
    dbusy = [p["busy_s"] / d_window for p in role_pods["decode"]] if d_window else []
    late = [s["late_s"] for s in seen]
    return {
        "requests": len(seen),
        "answered": len(good),
        "hit_of_limit": cached / limit if limit else None,
        "hit_of_prompt": cached / prompt_tokens if prompt_tokens else None,
        "cached_tokens": cached,
        "reusable_tokens": limit,
        "prompt_tokens": prompt_tokens,
        "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
        "e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99),
        "overhead_p50": pct(overhead, 50), "overhead_p99": pct(overhead, 99),
        "pod_ttft_p50": pct(pod_times, 50), "pod_ttft_p99": pct(pod_times, 99),
        "output_tokens": out_tokens,
        "span_s": span,
        "output_tok_s": out_tokens / span if span else None,
        "computed_tokens": sum(r["computed_tokens"] for r in records),
        "transferred_tokens": sum(r["transferred_tokens"] for r in records),
        "prefill_load_max_mean": max_over_mean([p["running_s"] for p in role_pods["prefill"]]),
        "decode_load_max_mean": max_over_mean([p["running_s"] for p in role_pods["decode"]]),
        "prefill_busy": sum(busy) / len(busy) if busy else None,
        "prefill_busy_max": max(busy) if busy else None,
        "decode_busy": sum(dbusy) / len(dbusy) if dbusy else None,
        "window_s": window,
        "errors": errors,
        "timeouts": timeouts,
        "first_error": first_error,
        "handoff_missing": sum(1 for r in records if r["handoff"] == "missing"),
        "handoff_expired": sum(1 for r in records if r["handoff"] == "expired"),
        "late_p99": pct(late, 99), "late_max": max(late) if late else None,
        "pods_prefill": len(role_pods["prefill"]), "pods_decode": len(role_pods["decode"]),
    }


def peer_decisions(pages: list[str]) -> dict:
    """vllm-router's prefill routing outcomes (prefix_hit, prefix_miss,
    missing_tokens: no token ids within its budget, so by load alone)."""
    out: dict[str, float] = {}
    for page in pages:
        for line in page.splitlines():
            if (line.startswith("vllm_router_prefix_routing_decisions_total{")
                    and 'stage="prefill"' in line):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                out[outcome] = out.get(outcome, 0) + float(line.rsplit(" ", 1)[1])
    return out


# -------------------------------------------------------------------- one run

def run_one(a, run: Run, trace_file: Path, trace: list[dict], reusable: list[int],
            scratch: Path) -> dict:
    run_dir = scratch / run.name
    run_dir.mkdir()
    procs = Procs(run_dir)
    t0 = time.time()
    scale, load = run.time_scale, run.load
    try:
        sim = start_sim(procs, a, run)
        urls = start_router(procs, a, run.config, sim)
        out = run_dir / "replay.jsonl"
        # Real seconds: the replay's span, then room for the queue to drain.
        span_real = (trace[-1]["timestamp"] - trace[0]["timestamp"]) / 1000 / load / scale
        timeout_s = max(60, int(a.request_timeout / scale))
        argv = [str(a.mock), "replay", "--trace", str(trace_file), "--time-scale",
                f"{scale:g}", "--load", f"{load:g}", "--limit", str(run.requests),
                "--out", str(out), "--timeout-s", str(timeout_s), "--model", MODEL]
        for u in urls:
            argv += ["--url", u]
        if run.config.token_ids:
            argv.append("--token-ids")
        t_replay = time.time()
        cpu0 = {n: proc_cpu_s(p.pid) for n, p in procs.procs}
        m0 = machine_ticks()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rp = procs.start("replay", argv)
        try:
            rp.wait(timeout=span_real + timeout_s + 60)
        except subprocess.TimeoutExpired:
            raise RuntimeError("the replayer did not finish") from None
        replay_s = time.time() - t_replay
        m1 = machine_ticks()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU seconds per real second of the replay, by process (the
        # replayer's from its rusage: it has exited and been reaped).
        cpu = {n: (proc_cpu_s(p.pid) - cpu0.get(n, 0.0)) / replay_s for n, p in procs.procs
               if n != "replay"}
        cpu["replay"] = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / replay_s
        machine_busy = (m1[0] - m0[0]) / max(1, m1[1] - m0[1])
        if rp.returncode != 0:
            raise RuntimeError(f"replay exited {rp.returncode}: {procs.log_tail('replay', 5)}")
        seen = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        base = f"http://{sim['prefill'][0]['address']}"
        s1, rec_body = http_get(base + "/sim/records", 60)
        s2, pods_body = http_get(base + "/sim/pods", 30)
        if s1 != 200 or s2 != 200:
            raise RuntimeError(f"/sim/records {s1}, /sim/pods {s2}")
        records = json.loads(rec_body)
        pods = json.loads(pods_body)
        # Records of requests outside the replay (none expected) are left out.
        users = {s["user"] for s in seen}
        records = [r for r in records if r["user"] in users]
        summary = summarize(seen, records, pods, trace, reusable)
        summary.update(replay_wall_s=replay_s, machine_busy=machine_busy,
                       cpu={k: round(v, 3) for k, v in cpu.items()}, kv_blocks=sim.get("kv_blocks"),
                       cache_blocks=sim.get("cache_blocks", sim.get("kv_blocks")))
        pages = [http_get(u, 10)[1].decode(errors="replace") for u in procs.metrics_urls]
        summary["prefill_decisions"] = peer_decisions(pages)
        if a.keep:
            for i, page in enumerate(pages):
                (run_dir / f"router-metrics-{i}.txt").write_text(page)
            (run_dir / "records.json").write_text(rec_body.decode())
            (run_dir / "pods.json").write_text(pods_body.decode())
        return summary
    finally:
        procs.stop_all()
        log(f"    ({time.time() - t0:.0f} s)")


# -------------------------------------------------------------------- report

COLUMNS = [
    # key, header, format, csv name
    ("hit_of_limit", "hit%lim", "{:.1%}", "hit_of_limit"),
    ("hit_of_prompt", "hit%prm", "{:.1%}", "hit_of_prompt"),
    ("ttft_p50", "ttft50", "{:.2f}", "ttft_p50_s"),
    ("ttft_p90", "ttft90", "{:.2f}", "ttft_p90_s"),
    ("ttft_p99", "ttft99", "{:.2f}", "ttft_p99_s"),
    ("pod_ttft_p50", "pod50", "{:.2f}", "pod_ttft_p50_s"),
    ("pod_ttft_p99", "pod99", "{:.2f}", "pod_ttft_p99_s"),
    ("e2e_p50", "e2e50", "{:.1f}", "e2e_p50_s"),
    ("e2e_p99", "e2e99", "{:.1f}", "e2e_p99_s"),
    ("output_tok_s", "out/s", "{:.0f}", "output_tok_s"),
    ("computed_tokens", "computed", "{:.1f}", "computed_tokens"),
    ("prefill_load_max_mean", "P max/mn", "{:.2f}", "prefill_load_max_mean"),
    ("decode_load_max_mean", "D max/mn", "{:.2f}", "decode_load_max_mean"),
    ("prefill_busy", "P busy", "{:.0%}", "prefill_busy"),
    ("overhead_p50", "ovh50", "{:.2f}", "overhead_p50_s"),
    ("errors", "err", "{:d}", "errors"),
    ("handoffs", "ho m/e", "{}", "handoff_missing_expired"),
    ("late_p99", "late99", "{:.2f}", "late_p99_s"),
]


def cell(row: dict, key: str, spec: str) -> str:
    if key == "handoffs":
        return f"{row.get('handoff_missing', 0)}/{row.get('handoff_expired', 0)}"
    v = row.get(key)
    if v is None:
        return "-"
    if key == "computed_tokens":
        return spec.format(v / 1e6) + "M"
    return spec.format(v)


def describe_runs(runs: list[Run]) -> list[str]:
    """One line per variant: its load, pods, time scale and requests (and
    the configurations whose time scale differs)."""
    out = []
    for v, x in VARIANTS.items():
        rs = [r for r in runs if r.variant == v]
        if not rs:
            continue
        common = max(rs, key=lambda r: sum(q.time_scale == r.time_scale for q in rs))
        other = sorted({f"{r.config.name} {r.time_scale:g}" for r in rs
                        if r.time_scale != common.time_scale})
        label = f"{x.suffix or 'no suffix'}"
        out.append(f"  {label:<10} load {common.load:g}, {common.prefill} prefill + "
                   f"{common.decode} decode pods, the first {common.requests} requests, time "
                   f"scale {common.time_scale:g}" + (f" ({', '.join(other)})" if other else ""))
    return out


def report(results: dict, failed: dict, params: dict, runs: list[Run], wall_s: float) -> str:
    out = []
    w = out.append
    w("Fleet simulation (bench/fleet.py): the trace replayed through each router onto "
      "simulated pods. Times are modelled seconds.")
    w(f"Trace: {params['trace']}, the first {params['requests']} requests "
      f"({params['trace_span_s']:.0f} s of the trace at load 1). Load: the trace's rate times "
      "it. Time scale: modelled s per real s.")
    w(f"Pods: KV {params['kv_blocks']} blocks of 512 tokens per pod (Llama-3.1-8B on an H100), "
      f"prefix cache {params['cache_blocks']} blocks per pod (GPU and host tier). "
      f"Filter built from {params['commit']}.")
    w("Runs:")
    out.extend(describe_runs(runs))
    w("")
    names = list(results) + [n for n in failed if n not in results]
    width = max([len(n) for n in names] + [16])
    widths = [max(len(h), 7) for _, h, _, _ in COLUMNS]
    hdr = f"{'config':<{width}}" + "".join(f" {h:>{wd}}" for (_, h, _, _), wd in
                                           zip(COLUMNS, widths))
    w(hdr)
    w("-" * len(hdr))
    limit_row = {"hit_of_limit": 1.0, "hit_of_prompt": params["limit_pct"]}
    w(f"{'trace limit':<{width}}" + "".join(
        f" {(cell(limit_row, k, spec) if k in limit_row else ''):>{wd}}"
        for (k, _, spec, _), wd in zip(COLUMNS, widths)))
    for n in names:
        if n in results:
            r = results[n]
            w(f"{n:<{width}}" + "".join(f" {cell(r, k, spec):>{wd}}"
                                        for (k, _, spec, _), wd in zip(COLUMNS, widths)))
        else:
            w(f"{n:<{width}} (failed: {failed[n]})"[:200])
    w("")
    w("hit%lim: prompt tokens found cached on the pod that computed the prompt (the prefill "
      "leg, or a request served whole) / the")
    w("  trace's limit (the tokens of each request's leading blocks seen in an earlier request "
      "of the run: an unbounded cache")
    w("  shared by the fleet); hit%prm: the same / all prompt tokens. The limit row is the "
      "first requests' (the @32p runs' too).")
    w("ttft, e2e: p50/p90/p99 over answered requests, as the client saw them. pod50/99: the "
      "TTFT the pods alone took (router")
    w("  and HTTP time left out: the placement's). out/s: output tokens / (first arrival to "
      "last completion).")
    w("computed: prompt tokens computed on all pods (decodes that computed the prompt "
      "included). P/D max/mn: per role, the max over")
    w("  pods of running requests integrated over time / the mean. P busy: the prefill pods' "
      "step time / (first arrival to the last")
    w("  prefill), averaged over pods. ovh50: the client's TTFT minus the pods' own (first leg "
      "in to first token out), p50: the router's")
    w("  and HTTP's real time, multiplied by the time scale. err: non-200 or timed out. "
      "ho m/e: decode legs whose hand-off was missing /")
    w("  expired (they computed the prompt). late99: the replayer's own lag, p99.")
    if any(r.variant == "2x" for r in runs):
        w("@2x: the arrivals outpace the prefill pods, and P busy's window includes the "
          "backlog's drain after the last arrival.")
    if any(r.config.router == "vllm-router" for r in runs):
        w("vllm-router gets each prompt as token ids (the sims' render of its text) and keys "
          "on them without a render call (where it")
        w("  has none it routes by load alone: missing_tokens below). Every router's own time "
          "is real time, multiplied by the")
        w("  time scale (ovh50); pod50/99 leave it out.")
    for n in names:
        d = (results.get(n) or {}).get("prefill_decisions")
        if d:
            w(f"  {n}: prefill decisions " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(d.items())))
    for n in names:
        r = results.get(n)
        if r and r.get("errors"):
            w(f"  {n}: {r['errors']} errors ({r['timeouts']} timeouts), first: {r['first_error']}")
    w("")
    w(f"Wall time: {wall_s / 60:.1f} min.")
    return "\n".join(out)


CSV_EXTRA = ["prefill_busy_max", "decode_busy", "overhead_p99", "requests", "answered",
             "timeouts", "cached_tokens", "reusable_tokens", "prompt_tokens",
             "transferred_tokens", "span_s", "late_max", "machine_busy", "replay_wall_s"]


def write_csv(path: Path, results: dict) -> None:
    with open(path, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["config", "router", "engine", "replicas", "load", "prefill_pods",
                     "decode_pods", "time_scale"] + [c for _, _, _, c in COLUMNS] + CSV_EXTRA)
        for n, r in results.items():
            row = [n, r["router"], r["engine"], r["replicas"], r["load"], r["pods_prefill"],
                   r["pods_decode"], r["time_scale"]]
            for k, _, _, _ in COLUMNS:
                row.append(f"{r.get('handoff_missing')}/{r.get('handoff_expired')}"
                           if k == "handoffs" else r.get(k))
            row += [r.get(k) for k in CSV_EXTRA]
            wr.writerow(row)


def plot_title(params: dict, stem: str) -> str:
    runs = params["runs"]
    parts = []
    for v, x in VARIANTS.items():
        r = next((r for n, r in runs.items() if n.endswith(x.suffix) and
                  (x.suffix or "@" not in n)), None)
        if r:
            parts.append(f"{x.suffix or 'base'}: load {r['load']:g} on {r['prefill']}P+"
                         f"{r['decode']}D")
    return (f"Fleet simulation, the first {params['requests']} requests of the trace ("
            + "; ".join(parts) + f"): bench/results/{stem}.txt")


def plot(results: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.6 * len(names) + 2), 8), sharex=True)
    xs = range(len(names))
    ax1.bar(xs, [100 * (results[n].get("hit_of_limit") or 0) for n in names], color="#1f4e9c")
    ax1.set_ylabel("prefix-cache hit, % of the trace's limit")
    ax1.axhline(100, color="grey", lw=0.8, ls="--")
    ax1.grid(axis="y", alpha=0.3)
    wd = 0.4
    ax2.bar([x - wd / 2 for x in xs], [results[n].get("ttft_p50") or 0 for n in names], wd,
            label="TTFT p50", color="#3a86d4")
    ax2.bar([x + wd / 2 for x in xs], [results[n].get("ttft_p99") or 0 for n in names], wd,
            label="TTFT p99", color="#e06a6e")
    ax2.set_yscale("log")
    ax2.set_ylabel("TTFT, modelled s (log)")
    ax2.grid(axis="y", which="both", alpha=0.3)
    ax2.legend()
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels(names, rotation=45, ha="right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------- main

def plan(a, ap) -> list[Run]:
    variants = (a.variants or ("1x" if a.quick else ",".join(VARIANTS))).split(",")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v} (one of {', '.join(VARIANTS)})")
    if a.changes:
        # Each change and what it is measured against, in the change's variants.
        want = {}
        for c in CHANGES:
            for v in c.variants or variants:
                want.setdefault(c.name, set()).add(v)
                want.setdefault(c.against, set()).add(v)
        order = [c.name for c in CONFIGS + CHANGES if c.name in want]
        return [run_of(a, BY_NAME[n], v) for v in VARIANTS for n in order if v in want[n]]
    names = (a.configs.split(",") if a.configs else
             QUICK_CONFIGS if a.quick else [c.name for c in CONFIGS])
    picked: list[tuple[Config, str]] = []
    for n in filter(None, names):
        base, _, suffix = n.partition("@")
        if base not in BY_NAME:
            ap.error(f"unknown config {base} (one of {', '.join(BY_NAME)})")
        if suffix:
            v = next((k for k, x in VARIANTS.items() if x.suffix == "@" + suffix), None)
            if v is None:
                ap.error(f"unknown variant @{suffix} in {n}")
            picked.append((BY_NAME[base], v))
        else:
            c = BY_NAME[base]
            picked.extend((c, v) for v in variants if not c.variants or v in c.variants)
    # Variant by variant: the 1x rows first, then 2x, then 32 pods.
    picked.sort(key=lambda r: list(VARIANTS).index(r[1]))
    return [run_of(a, c, v) for c, v in picked]


def run_of(a, c: Config, v: str) -> Run:
    """Configuration `c` in variant `v`."""
    requests = a.requests or (QUICK["requests"] if a.quick else DEFAULTS["requests"])
    x = VARIANTS[v]
    prefill = x.prefill or a.prefill
    grow = prefill / a.prefill
    return Run(name=c.name + x.suffix, config=c, variant=v,
               requests=a.requests_32p or requests if v == "32p" else requests,
               load=a.load * x.load * grow, prefill=prefill,
               decode=max(1, round(a.decode * grow)),
               time_scale=a.time_scale * x.scale * c.scale)


def git_state() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src",
                                "mock-engine/src"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return head + (" (src/ or mock-engine/src/ with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, default=BENCH / "traces/mooncake-conversation.jsonl.gz",
                    help="a Mooncake-format trace, plain or .gz")
    ap.add_argument("--requests", type=int, default=None,
                    help=f"the first N requests of the trace (default {DEFAULTS['requests']}, "
                         f"--quick {QUICK['requests']})")
    ap.add_argument("--requests-32p", type=int, default=None,
                    help="requests of the 32-prefill-pod runs (default: --requests)")
    ap.add_argument("--time-scale", type=float, default=DEFAULTS["time_scale"],
                    help="modelled seconds per real second (sim and replayer; default "
                         f"{DEFAULTS['time_scale']:g}; the @32p runs at half)")
    ap.add_argument("--load", type=float, default=DEFAULTS["load"],
                    help=f"the trace's rate multiplied by this (default {DEFAULTS['load']:g}; "
                         "@2x runs twice it, @32p runs it times 32 / --prefill)")
    ap.add_argument("--prefill", type=int, default=DEFAULTS["prefill"],
                    help=f"prefill pods (default {DEFAULTS['prefill']})")
    ap.add_argument("--decode", type=int, default=DEFAULTS["decode"],
                    help=f"decode pods (default {DEFAULTS['decode']}; @32p: in proportion)")
    ap.add_argument("--kv-blocks", type=int, default=None,
                    help="KV room per pod on the GPU, 512-token blocks (default: the sim's, an "
                         "H100's 440,000 tokens)")
    ap.add_argument("--cache-blocks", type=int, default=DEFAULTS["cache_blocks"],
                    help="prefix-cache blocks per pod, GPU and host tier (default "
                         f"{DEFAULTS['cache_blocks']}, four times the H100's KV; 0: the sim's, "
                         "no host tier)")
    ap.add_argument("--configs", default=None,
                    help="configurations, comma-separated: a base name runs the --variants, a "
                         "full name (pd-prefix@2x) just that run (default: all; --quick: "
                         + ",".join(QUICK_CONFIGS) + ")")
    ap.add_argument("--variants", default=None,
                    help="of each base name: 1x (at --load), 2x (twice it), 32p (32 prefill "
                         "pods) (default 1x,2x,32p; --quick: 1x)")
    ap.add_argument("--quick", action="store_true",
                    help="a short run (the `just bench` one): fewer configurations and requests; "
                         "writes fleet-quick.*")
    ap.add_argument("--changes", action="store_true",
                    help="run each change of CHANGES with the configuration it is measured "
                         "against, in the change's variants; writes fleet-changes.*")
    ap.add_argument("--request-timeout", type=float, default=1200,
                    help="a request unanswered after this many modelled seconds is an error")
    ap.add_argument("--out-dir", type=Path, default=BENCH / "results")
    ap.add_argument("--envoy", type=Path,
                    default=Path(os.environ.get("ENVOY_BIN", REPO / ".venv/bin/envoy")))
    ap.add_argument("--wasm", type=Path, default=Path(os.environ.get(
        "PD_ROUTER_WASM", REPO / "target/wasm32-wasip1/release/pd_router.wasm")))
    ap.add_argument("--mock", type=Path, default=REPO / "target/release/mock-engine")
    ap.add_argument("--peer-venv", type=Path, default=BENCH / ".venv")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, "
                    "records)")
    a = ap.parse_args()

    runs = plan(a, ap)
    for what, p in (("envoy", a.envoy), ("wasm", a.wasm), ("mock-engine", a.mock)):
        if not p.exists():
            ap.error(f"{what} not found at {p} (`./just bench-fleet` builds everything)")
    if any(r.config.router != "pd" for r in runs) and not (a.peer_venv / "bin/vllm-router").exists():
        ap.error(f"the peers are not installed in {a.peer_venv} (`./just bench-fleet` does it)")
    a.wasm = a.wasm.resolve()
    a.kv_blocks = a.kv_blocks or None
    a.cache_blocks = a.cache_blocks or None

    t_start = time.time()

    # The tree the recipe just built from (edits made while the runs go

    # do not change the binaries).

    commit = git_state()
    scratch = Path(tempfile.mkdtemp(prefix="pd-fleet-"))

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    traces: dict[int, tuple[list[dict], list[int]]] = {}
    try:
        trace_file, lines = load_trace(a.trace, scratch)
        for n in sorted({r.requests for r in runs}):
            traces[n] = (lines[:n], reusable_tokens(lines[:n]))
        log(f"fleet: {len(runs)} runs; " + "; ".join(
            f"the first {n} requests' limit {sum(re) / sum(t['input_length'] for t in tr):.1%} of "
            f"their prompt tokens" for n, (tr, re) in traces.items()))
        for i, run in enumerate(runs):
            log(f"[{i + 1}/{len(runs)}] {run.name}: {run.config.about}; {run.requests} requests, "
                f"load {run.load:g}, {run.prefill}P+{run.decode}D, time scale {run.time_scale:g}")
            trace, reusable = traces[run.requests]
            try:
                r = run_one(a, run, trace_file, trace, reusable, scratch)
            except Exception as e:  # noqa: BLE001 - reported, the rest go on
                failed[run.name] = str(e).strip().replace("\n", " | ")[:300]
                log(f"  FAILED: {failed[run.name]}")
                continue
            c = run.config
            r.update(config=run.name, base=c.name, variant=run.variant, router=c.router,
                     engine=c.engine, replicas=c.replicas, load=run.load,
                     time_scale=run.time_scale, about=c.about)
            results[run.name] = r
            log("  " + ", ".join(f"{h.strip()} {cell(r, k, spec)}" for k, h, spec, _ in COLUMNS)
                + f"; P busy max {cell(r, 'prefill_busy_max', '{:.0%}')}, ovh99 "
                  f"{cell(r, 'overhead_p99', '{:.2f}')}, replay {r['replay_wall_s']:.0f} s "
                  f"real, machine {r['machine_busy']:.0%} busy, CPU "
                + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu"].items()))
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); writing what was measured")
    finally:
        if a.keep:
            log(f"logs kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    if not results and not failed:
        return 1
    # The pods' sizes, as the sims' ready lines named them.
    any_run = next(iter(results.values()), {})
    main_n = max(traces) if traces else 0
    tr, re = traces.get(main_n, ([], []))
    prompt = sum(t["input_length"] for t in tr)
    by_variant = {}
    for r in runs:
        by_variant.setdefault(r.variant, r)
    params = {
        "trace": str(a.trace.resolve().relative_to(REPO) if a.trace.resolve().is_relative_to(REPO)
                     else a.trace),
        "commit": commit,
        "requests": main_n,
        "trace_span_s": (tr[-1]["timestamp"] - tr[0]["timestamp"]) / 1000 if tr else 0,
        "limit_pct": sum(re) / prompt if prompt else 0,
        "load": a.load, "time_scale": a.time_scale, "prefill": a.prefill, "decode": a.decode,
        "kv_blocks": any_run.get("kv_blocks", a.kv_blocks),
        "cache_blocks": any_run.get("cache_blocks", a.cache_blocks),
        "runs": {r.name: {"requests": r.requests, "load": r.load, "prefill": r.prefill,
                          "decode": r.decode, "time_scale": r.time_scale} for r in runs},
    }
    wall = time.time() - t_start
    text = report(results, failed, params, runs, wall)
    stem = "fleet-changes" if a.changes else "fleet-quick" if a.quick else "fleet"
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / f"{stem}.txt").write_text(text + "\n")
    write_csv(a.out_dir / f"{stem}.csv", results)
    (a.out_dir / f"{stem}-raw.json").write_text(json.dumps(
        {"params": params, "results": results, "failed": failed}, indent=1) + "\n")
    try:
        plot(results, a.out_dir / f"{stem}.png", plot_title(params, stem))
    except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
        log(f"plot failed: {e}")
    print(text)
    log(f"wrote {a.out_dir}/{stem}.txt, .csv, .png, -raw.json")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

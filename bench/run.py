#!/usr/bin/env python3
"""End-to-end benchmark of pd-router against its floor and its peers.

Measures, for chat request bodies of 1 KB, 64 KB and 512 KB at concurrency 1
and 32, the router's CPU time per request and the requests/s of:

  envoy-forward   Envoy forwarding to one upstream, no filter             (a)
  envoy-mirror    Envoy forwarding twice, no filter: the route mirrors    (b)
                  every request to a second cluster (the floor: two
                  upstream requests per client request)
  envoy-buffer-mirror  (b) plus the buffer filter before the router: the  (b')
                  floor for any PD router inside Envoy
  min-pd          a minimal PD wasm filter (bench/min-pd-filter: pause,   (m)
                  read the body, dispatch_http_call it to the prefill,
                  set the decode header and the body, resume) in the
                  shipped envoy.yaml, default mocks: the floor for any
                  proxy-wasm PD router on Envoy's V8
  min-pd-vllm, min-pd-trtllm, min-pd-sglang  the same filter doing the     (m)
                  least that engine's hand-off needs, on pd-<engine>'s
                  mocks (min-pd-sglang on demand: --configs)
  pd-vllm ...     pd-router in Envoy (the shipped envoy.yaml, plugin       (c)
                  configuration replaced), one Envoy per engine: vllm
                  (nixl), sglang, trtllm, default
  sglang-router   the same PD job done by sglang-router (SGLang mocks)     (d)
  vllm-router     ... and by vllm-router (vLLM NIXL mocks)
  envoy+sglang-router  the shipped Envoy (no filter) forwarding to the     (e)
  envoy+vllm-router    peer router: what a user who already runs a gateway
                  pays; both processes on core 0, CPU summed

Every router runs pinned to core 0 (Envoy with --concurrency 1, the peers
with TOKIO_WORKER_THREADS=1); the mock engines and the load generator run
pinned to core 1. All routers and mocks start once; each repetition then
visits every cell (body size x concurrency x configuration) in turn, the
configuration order rotated per repetition, and the results are medians over
repetitions. The load generator reads the router's utime+stime from
/proc/PID/stat at the edges of its measured window: CPU per request = that
CPU time / requests completed in the window. For the two-process stacks (e)
this script reads the peer's the same way over the same window and adds it.

Writes bench/results/latest.csv (medians), latest-raw.csv (every repetition),
latest.txt (the printed report) and latest.png (the plot).

Run with `./just bench-e2e` (which builds and installs what it needs), or
directly once built: bench/.venv/bin/python bench/run.py [--reps 3] ...
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
MODEL = "bench-model"
ROUTER_CORE = "0"
LOAD_CORE = "1"

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
    ("sglang-router", "peer", "(d) sglang-router 0.3.2, PD mode, SGLang mocks"),
    ("vllm-router", "peer", "(d) vllm-router 0.1.17, PD mode, vLLM NIXL mocks"),
    ("envoy+sglang-router", "stack", "(e) Envoy -> sglang-router, CPU of both"),
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
HEAD_TO_HEAD = {"pd-sglang": "sglang-router", "pd-vllm": "vllm-router"}
# ... and the gateway stack doing it: Envoy in front of that peer.
STACKS = {"pd-sglang": "envoy+sglang-router", "pd-vllm": "envoy+vllm-router"}
# The engines the min-pd target covers (TensorRT-LLM has its own target).
MIN_PD_TARGET = ["pd-vllm", "pd-sglang", "pd-default"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: the kernel kills the child if this script dies
    # (even by SIGKILL), so nothing is left running.
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


class Procs:
    """Every process this script starts, killed by PID on the way out."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], core: str, env: dict | None = None,
              stdout=subprocess.DEVNULL) -> subprocess.Popen:
        err = open(self.scratch / f"{name}.log", "wb")
        full_env = dict(os.environ)
        full_env.update({"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
        for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            full_env.pop(k, None)
        if env:
            full_env.update(env)
        # taskset execs the command: the PID is the process itself.
        p = subprocess.Popen(["taskset", "-c", core, *argv], stdin=subprocess.DEVNULL,
                             stdout=stdout, stderr=err, env=full_env,
                             preexec_fn=_die_with_parent)
        err.close()
        self.procs.append((name, p))
        return p

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.scratch / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    p.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.time() + 5
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def read_line(p: subprocess.Popen, timeout: float) -> str:
    """The first stdout line of `p`, within `timeout` seconds."""
    fd = p.stdout.fileno()
    buf = b""
    deadline = time.time() + timeout
    while b"\n" not in buf:
        left = deadline - time.time()
        if left <= 0 or p.poll() is not None:
            break
        r, _, _ = select.select([fd], [], [], left)
        if r:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace").split("\n")[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(method: str, url: str, body: bytes | None = None, timeout: float = 10):
    """(status, headers, body); status 0 when the connection failed."""
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("content-type", "application/json")
    try:
        with _opener.open(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except (OSError, urllib.error.URLError):
        return 0, {}, b""


def wait_until(what: str, check, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = check()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not ready after {timeout:.0f} s")


# -------------------------------------------------------------------- mocks

@dataclass
class Mock:
    name: str
    http: int
    bootstrap: int | None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.http}"

    def endpoint(self) -> dict:
        e = {"address": self.address, "name": self.name}
        if self.bootstrap is not None:
            e["bootstrap_port"] = self.bootstrap
        return e

    def finished(self) -> float:
        """POST /v1/* answered completely so far (its /metrics counter)."""
        status, _, body = http("GET", f"http://{self.address}/metrics")
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("vllm:request_success_total"):
                return float(line.rsplit(" ", 1)[1])
        return -1.0


def start_mock(procs: Procs, mock_bin: Path, name: str, args: list[str]) -> Mock:
    p = procs.start(name, [str(mock_bin), "--name", name, "--model", MODEL, "--quiet", *args],
                    LOAD_CORE, stdout=subprocess.PIPE)
    line = read_line(p, 20)
    if not line.startswith("READY "):
        raise RuntimeError(f"mock {name} did not start: {line!r}\n{procs.log_tail(name)}")
    ready = json.loads(line[len("READY "):])
    return Mock(name, ready["http"], ready.get("bootstrap"))


# ------------------------------------------------------------------- envoys

def base_envoy(wasm: Path) -> dict:
    """The shipped envoy.yaml with kernel-chosen ports and the module's path."""
    cfg = yaml.safe_load((REPO / "envoy.yaml").read_text())
    cfg["admin"]["address"]["socket_address"]["port_value"] = 0
    for listener in cfg["static_resources"]["listeners"]:
        listener["address"]["socket_address"]["port_value"] = 0
    wasm_filter = find_wasm_filter(cfg)
    wasm_filter["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = str(wasm)
    return cfg


def hcm(cfg: dict) -> dict:
    for listener in cfg["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                if f["name"] == "envoy.filters.network.http_connection_manager":
                    return f["typed_config"]
    raise RuntimeError("envoy.yaml: no http_connection_manager")


def find_wasm_filter(cfg: dict) -> dict:
    for f in hcm(cfg)["http_filters"]:
        if f["name"] == "envoy.filters.http.wasm":
            return f
    raise RuntimeError("envoy.yaml: no envoy.filters.http.wasm filter")


def pd_envoy(wasm: Path, plugin_config: dict) -> dict:
    """(c): the shipped configuration, plugin configuration replaced (what the
    tests do between the BEGIN/END markers)."""
    cfg = base_envoy(wasm)
    find_wasm_filter(cfg)["typed_config"]["config"]["configuration"] = {
        "@type": "type.googleapis.com/google.protobuf.StringValue",
        "value": json.dumps(plugin_config),
    }
    return cfg


def min_pd_envoy(min_wasm: Path, prefill: Mock, decode: Mock, steps: str = "") -> dict:
    """(m): the shipped configuration with the module replaced by the minimal
    PD filter (bench/min-pd-filter) and its configuration."""
    cfg = base_envoy(min_wasm)
    wasm = find_wasm_filter(cfg)["typed_config"]["config"]
    wasm["name"] = wasm["root_id"] = wasm["vm_config"]["vm_id"] = "min-pd"
    plugin = {"prefill": prefill.address, "decode": decode.address, "steps": steps}
    if prefill.bootstrap is not None:
        plugin["bootstrap_port"] = str(prefill.bootstrap)
    wasm["configuration"] = {
        "@type": "type.googleapis.com/google.protobuf.StringValue",
        "value": json.dumps(plugin),
    }
    return cfg


def static_cluster(name: str, port: int) -> dict:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": port}}}}]}],
        },
    }


def forward_envoy(wasm: Path, primary: int, mirror: int | None, buffer: bool = False) -> dict:
    """(a)/(b)/(b')/(e): the shipped configuration without the filter, its route
    sent to a static cluster (port `primary` on 127.0.0.1), for (b) and (b')
    mirrored to a second one, and for (b') the whole body buffered first (as
    a PD filter must) by Envoy's buffer filter."""
    cfg = base_envoy(wasm)
    h = hcm(cfg)
    h["http_filters"] = [f for f in h["http_filters"] if f["name"] != "envoy.filters.http.wasm"]
    if buffer:
        h["http_filters"].insert(0, {
            "name": "envoy.filters.http.buffer",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                "max_request_bytes": 64 * 1024 * 1024,
            },
        })
    clusters = [static_cluster("bench_primary", primary)]
    for vh in h["route_config"]["virtual_hosts"]:
        for r in vh["routes"]:
            r["route"]["cluster"] = "bench_primary"
            if mirror is not None:
                r["route"]["request_mirror_policies"] = [{
                    "cluster": "bench_mirror",
                    "runtime_fraction": {"default_value": {"numerator": 100,
                                                           "denominator": "HUNDRED"}},
                }]
    if mirror is not None:
        clusters.append(static_cluster("bench_mirror", mirror))
    cfg["static_resources"]["clusters"] = clusters
    return cfg


def start_envoy(procs: Procs, envoy_bin: Path, name: str, cfg: dict) -> tuple[subprocess.Popen, int]:
    path = procs.scratch / f"{name}.json"
    path.write_text(json.dumps(cfg, indent=1))
    admin_path = procs.scratch / f"{name}.admin"
    p = procs.start(name, [str(envoy_bin), "-c", str(path), "--disable-hot-restart",
                           "--concurrency", "1", "-l", "warning",
                           "--admin-address-path", str(admin_path)], ROUTER_CORE)

    def admin():
        try:
            a = admin_path.read_text().strip()
            return int(a.rsplit(":", 1)[1]) if a else None
        except (OSError, ValueError, IndexError):
            return None

    admin_port = wait_until(f"{name} admin", admin, 30, p)

    def listener():
        s, _, body = http("GET", f"http://127.0.0.1:{admin_port}/listeners")
        ready, _, _ = http("GET", f"http://127.0.0.1:{admin_port}/ready")
        if s != 200 or ready != 200:
            return None
        for line in body.decode().splitlines():
            if line.startswith("pd_listener::"):
                port = int(line.rsplit(":", 1)[1])
                return port or None
        return None

    try:
        port = wait_until(f"{name} listener", listener, 30, p)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail(name)}") from None
    return p, port


# -------------------------------------------------------------------- peers

def start_sglang_router(procs: Procs, venv: Path, prefill: Mock, decode: Mock):
    port, prom = free_port(), free_port()
    argv = [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router",
            "--pd-disaggregation",
            "--prefill", f"http://{prefill.address}", str(prefill.bootstrap),
            "--decode", f"http://{decode.address}",
            "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
            "--log-level", "warn", "--disable-retries", "--disable-circuit-breaker",
            "--disable-health-check", "--history-backend", "none"]
    p = procs.start("sglang-router", argv, ROUTER_CORE, env={"TOKIO_WORKER_THREADS": "1"})
    # It listens before its workers are registered: /readiness says when.
    try:
        wait_until("sglang-router readiness",
                   lambda: http("GET", f"http://127.0.0.1:{port}/readiness", timeout=2)[0] == 200,
                   60, p)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail('sglang-router')}") from None
    return p, port


def start_vllm_router(procs: Procs, venv: Path, prefill: Mock, decode: Mock):
    port, prom = free_port(), free_port()
    argv = [str(venv / "bin" / "vllm-router"), "--vllm-pd-disaggregation",
            "--prefill", f"http://{prefill.address}", "--decode", f"http://{decode.address}",
            "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
            "--log-level", "warning", "--disable-retries", "--disable-circuit-breaker",
            "--health-check-interval-secs", "3600", "--max-concurrent-requests", "1000000",
            "--worker-startup-check-interval", "1"]
    p = procs.start("vllm-router", argv, ROUTER_CORE, env={"TOKIO_WORKER_THREADS": "1"})
    # It checks its workers' /health before it opens its port.
    try:
        wait_until("vllm-router health",
                   lambda: http("GET", f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200,
                   60, p)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail('vllm-router')}") from None
    return p, port


# -------------------------------------------------------------------- bench

@dataclass
class Target:
    name: str
    proc: subprocess.Popen
    port: int
    # Mocks each request must reach (checked once before measuring).
    reaches: list[Mock]
    # x-mock-kv the answer must carry (the hand-off happened), if any.
    kv: str | None = None
    dead: str | None = None
    # The two-process stacks (e): the peer behind `proc` (an Envoy), whose
    # CPU counts too.
    second: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


def make_body(size: int) -> bytes:
    head = '{"model":"%s","messages":[{"role":"user","content":"' % MODEL
    tail = '"}],"max_tokens":4}'
    room = size - len(head) - len(tail)
    # Numbered sentences: no two 128-byte blocks alike, as in a real prompt.
    words, i, total = [], 0, 0
    while total < room:
        w = f"The quick brown fox jumps over the lazy dog {i}. "
        words.append(w)
        total += len(w)
        i += 1
    text = "".join(words)[:room]
    body = (head + text + tail).encode()
    assert len(body) == size, (len(body), size)
    json.loads(body)
    return body


def sanity_check(t: Target, body: bytes) -> None:
    """One request: 200, the hand-off done, every expected mock reached."""
    before = [m.finished() for m in t.reaches]
    status, headers, resp = http("POST", t.url, body, timeout=30)
    if status != 200:
        raise RuntimeError(f"status {status}: {resp[:300]!r}")
    headers = {k.lower(): v for k, v in headers.items()}
    if t.kv is not None and headers.get("x-mock-kv") != t.kv:
        raise RuntimeError(f"answer has x-mock-kv {headers.get('x-mock-kv')!r}, expected {t.kv!r}")
    if t.name.startswith("pd-") and "prefill-target-pod" not in headers:
        raise RuntimeError("answer has no prefill-target-pod header: the request was not split")
    deadline = time.time() + 3
    while True:
        after = [m.finished() for m in t.reaches]
        missed = [m.name for m, b, a in zip(t.reaches, before, after) if a < b + 1]
        if not missed:
            return
        if time.time() > deadline:
            raise RuntimeError(f"request never reached {', '.join(missed)}")
        time.sleep(0.05)


def proc_ticks(pid: int) -> int:
    """utime + stime of `pid` (all its threads), in clock ticks; 0 if gone."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return 0


def perf_shares(data: Path) -> list[tuple[float, str]]:
    """(percent, where) of a `perf record` file's samples by shared object;
    V8's generated code (the wasm module, compiled) has no object: `[JIT]`."""
    out = subprocess.run(["perf", "report", "-i", str(data), "--sort", "dso", "--stdio", "-q"],
                         capture_output=True, text=True, timeout=120).stdout
    shares = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith("%"):
            where = " ".join(parts[1:])
            if where.startswith("[JIT]") or where == "[unknown]" or where.startswith("//anon"):
                where = "[JIT]"
            shares.append((float(parts[0].rstrip("%")), where))
    merged: dict[str, float] = {}
    for pct, where in shares:
        merged[where] = merged.get(where, 0.0) + pct
    return sorted(((v, k) for k, v in merged.items()), reverse=True)


# What `--syscalls` counts in the router over a cell (perf tracepoints and
# software events), besides the bytes it reads and writes (/proc/PID/io).
SYSCALL_EVENTS = "raw_syscalls:sys_enter,context-switches,page-faults"


def io_bytes(pid: int) -> dict[str, int]:
    """Bytes the process has read and written through system calls (sockets
    included: Envoy moves them with readv/writev)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return {"bytes read": int(fields["rchar"]), "bytes written": int(fields["wchar"])}


def perf_counts(out: Path) -> dict[str, float]:
    """`perf stat -x,` output: event -> count."""
    counts = {}
    for line in out.read_text().splitlines():
        f = line.split(",")
        if len(f) > 2 and f[0].replace(".", "", 1).isdigit():
            counts[f[2]] = float(f[0])
    return counts


def run_cell(loadgen: Path, t: Target, body_file: Path, conc: int, duration: float,
             warmup: float, perf_data: Path | None = None, stat: bool = False) -> dict:
    argv = ["taskset", "-c", LOAD_CORE, str(loadgen), "--url", t.url, "--body", str(body_file),
            "--concurrency", str(conc), "--duration", str(duration), "--warmup", str(warmup),
            "--cpu-pid", str(t.proc.pid), "--timeout", "30"]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    perf = None
    try:
        if t.second is not None or perf_data is not None:
            time.sleep(warmup)
        if perf_data is not None:
            # Sampling the router (the first process) over the measured
            # window, from the load core; a file from an earlier run must not
            # pass for this one's.
            perf_data.unlink(missing_ok=True)
            what = (["stat", "-x,", "-e", SYSCALL_EVENTS] if stat
                    else ["record", "-q", "-F", "2000"])
            perf = subprocess.Popen(
                ["taskset", "-c", LOAD_CORE, "perf", *what,
                 "-p", str(t.proc.pid), "-o", str(perf_data), "--", "sleep", str(duration)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                preexec_fn=_die_with_parent)
            io0 = io_bytes(t.proc.pid) if stat else None
        if t.second is not None:
            # The load generator reads one PID: read the second process here
            # over the same window (it opens `warmup` after the start, to a
            # few ms, and the load is steady by then), scaled to the window's
            # exact length.
            c0, w0 = proc_ticks(t.second.pid), time.monotonic()
            time.sleep(duration)
            c1, w1 = proc_ticks(t.second.pid), time.monotonic()
        if perf is not None:
            _, perf_err = perf.communicate(timeout=duration + 60)
            if io0 is not None:
                io1 = io_bytes(t.proc.pid)
                io = {k: io1[k] - io0[k] for k in io0}
            if perf.returncode != 0:
                perf_data.unlink(missing_ok=True)
                log(f"      perf {what[0]} failed ({perf.returncode}): {perf_err.strip()[-200:]}")
        out, err = p.communicate(timeout=warmup + duration + 60)
    except subprocess.TimeoutExpired:
        raise RuntimeError("loadgen or perf did not finish") from None
    finally:
        for q in (p, perf):
            if q is not None and q.poll() is None:
                q.kill()
                q.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"loadgen exited {p.returncode}: {err.strip()[-300:]}")
    r = json.loads(out.strip().splitlines()[-1])
    if perf is not None and stat:
        r["io"] = io
    if t.second is not None:
        second = (c1 - c0) / CLK_TCK * (r.get("elapsed_s") or 0) / max(1e-9, w1 - w0)
        r["cpu_s_second"] = second
        if r.get("cpu_s") is not None:
            r["cpu_s"] += second
            r["cpu_us_per_req"] = (r["cpu_s"] * 1e6 / r["completed"]
                                   if r.get("completed") else None)
    return r


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}x"


def verdict_line(label: str, checks: list) -> list[str]:
    """A target's two lines: [MET] / [NOT MET] / [n/a] and the label, then each
    measured ratio against its limit. checks: (what, ratio, limit)."""
    ok = [r <= limit for _, r, limit in checks if r is not None]
    missing = any(r is None for _, r, _ in checks) or not checks
    if ok and not all(ok):
        v = "NOT MET"
    elif missing:
        v = "n/a: not (all) measured"
    else:
        v = "MET"
    cells = ", ".join(f"{what} {fmt_ratio(r)}" + ("" if r is None or r <= limit else " (over)")
                      for what, r, limit in checks) or "(its body sizes were not measured)"
    return [f"  [{v}] {label}", f"      {cells}"]


def report(rows: dict, order_sizes, order_conc, configs, dead: dict,
           wall_min: float | None = None) -> str:
    """The table and the ratio summary. rows[(size, conc, config)] = aggregated dict."""
    out = []
    w = out.append
    w("Medians over repetitions. cpu_us/req = router CPU (utime+stime, /proc/PID/stat) per "
      "completed request")
    w("(envoy+<peer>: both processes' CPU, summed). vs (b) = ratio to envoy-mirror (Envoy "
      "forwarding twice, no filter);")
    w("vs min = ratio to min-pd (the minimal PD wasm filter); vs buf = ratio to "
      "envoy-buffer-mirror ((b) + the buffer filter);")
    w("vs peer = ratio to the best standalone peer in the cell (lowest cpu_us/req for the cpu "
      "ratio, highest req/s for")
    w("the req/s ratio). ! = errors in the cell.")
    w("")
    hdr = (f"{'body':<5} {'conc':>4}  {'config':<20} {'cpu_us/req':>10} {'req/s':>9} "
           f"{'p50_ms':>7} {'p99_ms':>7}  {'cpu vs(b)':>9} {'rps vs(b)':>9}  "
           f"{'cpu vs min':>10} {'cpu vs buf':>10}  {'cpu vs peer':>11} {'rps vs peer':>11}")
    w(hdr)
    w("-" * len(hdr))
    for size in order_sizes:
        for conc in order_conc:
            floor = rows.get((size, conc, FLOOR), {})
            mfloor = rows.get((size, conc, MIN_PD), {})
            bfloor = rows.get((size, conc, BUFFER_FLOOR), {})
            peers = [rows.get((size, conc, p), {}) for p in PEERS]
            peer_cpu = [p["cpu_us"] for p in peers if p.get("cpu_us") is not None]
            peer_rps = [p["rps"] for p in peers if p.get("rps") is not None]
            best_cpu = min(peer_cpu) if peer_cpu else None
            best_rps = max(peer_rps) if peer_rps else None
            for c in configs:
                r = rows.get((size, conc, c))
                if r is None:
                    w(f"{size:<5} {conc:>4}  {c:<20} {'(not measured: ' + dead.get(c, 'skipped') + ')'}"[:160])
                    continue
                flag = "!" if r["errors"] else " "
                w(f"{size:<5} {conc:>4}  {c:<20} {fmt(r['cpu_us']):>10}{flag}{fmt(r['rps'], '{:.0f}'):>8} "
                  f"{fmt(r['p50'], '{:.2f}'):>7} {fmt(r['p99'], '{:.2f}'):>7}  "
                  f"{fmt_ratio(ratio(r['cpu_us'], floor.get('cpu_us'))):>9} "
                  f"{fmt_ratio(ratio(r['rps'], floor.get('rps'))):>9}  "
                  f"{fmt_ratio(ratio(r['cpu_us'], mfloor.get('cpu_us'))):>10} "
                  f"{fmt_ratio(ratio(r['cpu_us'], bfloor.get('cpu_us'))):>10}  "
                  f"{fmt_ratio(ratio(r['cpu_us'], best_cpu)):>11} "
                  f"{fmt_ratio(ratio(r['rps'], best_rps)):>11}")
            w("")

    def get(size, conc, c, k):
        return rows.get((size, conc, c), {}).get(k)

    def cpu_ratio(size, conc, a, b):
        return ratio(get(size, conc, a, "cpu_us"), get(size, conc, b, "cpu_us"))

    all_cols = [(s, c) for s in order_sizes for c in order_conc]

    def col_head(label, cols, width=12):
        return f"  {label:<36}" + "".join(f"{s + ' c=' + str(c):>{width}}" for s, c in cols)

    def col_row(label, values, width=12):
        return f"  {label:<36}" + "".join(f"{fmt_ratio(v):>{width}}" for v in values)

    w("Summary")
    w("-------")
    sizes = [s for s in ("1K", "512K") if s in order_sizes]
    w("pd-router CPU per request vs the floor (b) envoy-mirror:")
    cols = [(s, c) for s in sizes for c in order_conc]
    w(col_head("engine", cols))
    run_pd = [pd for pd in PD if pd in configs]
    for pd in run_pd:
        w(col_row(pd, [cpu_ratio(s, c, pd, FLOOR) for s, c in cols]))
    w("")
    w("The floors, CPU per request: what buffering the body costs Envoy, and what the minimal "
      "PD wasm filter costs over that:")
    w(col_head("ratio", all_cols))
    w(col_row(f"{BUFFER_FLOOR} / {FLOOR}", [cpu_ratio(s, c, BUFFER_FLOOR, FLOOR)
                                             for s, c in all_cols]))
    w(col_row(f"{MIN_PD} / {BUFFER_FLOOR}", [cpu_ratio(s, c, MIN_PD, BUFFER_FLOOR)
                                              for s, c in all_cols]))
    w("")
    w(f"pd-router CPU per request vs the minimal PD wasm filter ({MIN_PD}) and vs "
      f"{BUFFER_FLOOR}:")
    w(col_head("ratio", all_cols))
    for pd in run_pd:
        w(col_row(f"{pd} / {MIN_PD}", [cpu_ratio(s, c, pd, MIN_PD) for s, c in all_cols]))
    for pd in run_pd:
        w(col_row(f"{pd} / {BUFFER_FLOOR}", [cpu_ratio(s, c, pd, BUFFER_FLOOR)
                                              for s, c in all_cols]))
    # The same job on the same mocks: what pd-router adds to the least a
    # vLLM filter must do (its mocks pull KV, so both cells share their load).
    if "pd-vllm" in run_pd:
        w(col_row(f"pd-vllm / {MIN_PD_VLLM}", [cpu_ratio(s, c, "pd-vllm", MIN_PD_VLLM)
                                               for s, c in all_cols]))
        w(col_row(f"{MIN_PD_VLLM} / {MIN_PD}", [cpu_ratio(s, c, MIN_PD_VLLM, MIN_PD)
                                               for s, c in all_cols]))
    if "pd-sglang" in run_pd and MIN_PD_SGLANG in configs:
        w(col_row(f"pd-sglang / {MIN_PD_SGLANG}", [cpu_ratio(s, c, "pd-sglang", MIN_PD_SGLANG)
                                                   for s, c in all_cols]))
        w(col_row(f"{MIN_PD_SGLANG} / {MIN_PD}", [cpu_ratio(s, c, MIN_PD_SGLANG, MIN_PD)
                                                  for s, c in all_cols]))
    # TensorRT-LLM's floor: the same bytes through Envoy with nothing read,
    # against pd-router's TensorRT-LLM path and against the vLLM floor.
    if "pd-trtllm" in run_pd:
        w(col_row(f"pd-trtllm / {MIN_PD_TRTLLM}", [cpu_ratio(s, c, "pd-trtllm", MIN_PD_TRTLLM)
                                                   for s, c in all_cols]))
        w(col_row(f"{MIN_PD_TRTLLM} / pd-vllm", [cpu_ratio(s, c, MIN_PD_TRTLLM, "pd-vllm")
                                                 for s, c in all_cols]))
        w(col_row(f"{MIN_PD_TRTLLM} / {MIN_PD_VLLM}", [cpu_ratio(s, c, MIN_PD_TRTLLM, MIN_PD_VLLM)
                                                       for s, c in all_cols]))
    conc_hi = max(order_conc)
    w("")
    w(f"pd-router requests/s at concurrency {conc_hi} vs the best peer (named):")
    w(f"  {'engine':<12}" + "".join(f"{s:>26}" for s in sizes))
    for pd in run_pd:
        cells = []
        for s in sizes:
            best = None
            for p in PEERS:
                v = get(s, conc_hi, p, "rps")
                if v is not None and (best is None or v > best[1]):
                    best = (p, v)
            if best is None:
                cells.append("-")
            else:
                cells.append(f"{fmt_ratio(ratio(get(s, conc_hi, pd, 'rps'), best[1]))} ({best[0]})")
        w(f"  {pd:<12}" + "".join(f"{c:>26}" for c in cells))
    w("")
    w("Head to head, same mocks (pd-router / peer; CPU: below 1 is less CPU, req/s: above 1 "
      "is faster):")
    w(f"  {'pair':<28}{'body':<6}" + "".join(f"{'cpu c=' + str(c):>11}" for c in order_conc)
      + "".join(f"{'req/s c=' + str(c):>12}" for c in order_conc))
    for pd, peer in HEAD_TO_HEAD.items():
        for s in order_sizes:
            w(f"  {pd + ' vs ' + peer:<28}{s:<6}"
              + "".join(f"{fmt_ratio(ratio(get(s, c, pd, 'cpu_us'), get(s, c, peer, 'cpu_us'))):>11}"
                        for c in order_conc)
              + "".join(f"{fmt_ratio(ratio(get(s, c, pd, 'rps'), get(s, c, peer, 'rps'))):>12}"
                        for c in order_conc))
    w("")
    w("Against the gateway stack doing the same job, same mocks (pd-router / Envoy + peer, "
      "both processes' CPU summed):")
    w(f"  {'pair':<34}{'body':<6}" + "".join(f"{'cpu c=' + str(c):>11}" for c in order_conc)
      + f"{'p50 c=1':>10}")
    for pd, stack in STACKS.items():
        for s in order_sizes:
            w(f"  {pd + ' vs ' + stack:<34}{s:<6}"
              + "".join(f"{fmt_ratio(cpu_ratio(s, c, pd, stack)):>11}" for c in order_conc)
              + f"{fmt_ratio(ratio(get(s, 1, pd, 'p50'), get(s, 1, stack, 'p50'))):>10}")
    w("")

    w("Targets (issue 11): medians of this run, CPU per request unless noted, each at every "
      "measured concurrency")
    w("(the issue names none); a ratio is pd-router / the yardstick.")
    tsizes = [s for s in ("1K", "64K", "512K") if s in order_sizes]
    for pd in MIN_PD_TARGET:
        out.extend(verdict_line(
            f"{pd} <= 1.15x {MIN_PD} at 1K, 64K and 512K",
            [(f"{s} c={c}", cpu_ratio(s, c, pd, MIN_PD), 1.15)
             for s in tsizes for c in order_conc]))
    w(f"  [info] pd-vllm / {MIN_PD_VLLM} (the same hand-off on the same mocks): "
      + ", ".join(f"{s} c={c} {fmt_ratio(cpu_ratio(s, c, 'pd-vllm', MIN_PD_VLLM))}"
                  for s in tsizes for c in order_conc))
    out.extend(verdict_line(
        "pd-trtllm at 512K <= 1.5x pd-vllm's",
        [(f"512K c={c}", cpu_ratio("512K", c, "pd-trtllm", "pd-vllm"), 1.5)
         for c in order_conc]))
    w(f"  [info] {MIN_PD_TRTLLM} / pd-vllm at 512K (the least a TensorRT-LLM filter does, "
      "the ids unread): "
      + ", ".join(f"c={c} {fmt_ratio(cpu_ratio('512K', c, MIN_PD_TRTLLM, 'pd-vllm'))}"
                  for c in order_conc))
    if "pd-trtllm-b64" in configs:
        w("  [info] pd-trtllm-b64 / pd-vllm at 512K (the ids as TensorRT-LLM's base64 form): "
          + ", ".join(f"c={c} {fmt_ratio(cpu_ratio('512K', c, 'pd-trtllm-b64', 'pd-vllm'))}"
                      for c in order_conc))
    for pd, stack in STACKS.items():
        out.extend(verdict_line(
            f"{pd} <= 1.0x {stack} at 1K",
            [(f"1K c={c}", cpu_ratio("1K", c, pd, stack), 1.0) for c in order_conc]))
        out.extend(verdict_line(
            f"{pd} <= 0.5x {stack} at 512K",
            [(f"512K c={c}", cpu_ratio("512K", c, pd, stack), 0.5) for c in order_conc]))
        out.extend(verdict_line(
            f"{pd} latency p50 at concurrency 1 <= {stack}'s, every size",
            [(f"{s} p50", ratio(get(s, 1, pd, "p50"), get(s, 1, stack, "p50")), 1.0)
             for s in order_sizes]))
    for pd, peer in HEAD_TO_HEAD.items():
        out.extend(verdict_line(
            f"{pd} <= 1.0x {peer} (standalone) from 64K up",
            [(f"{s} c={c}", cpu_ratio(s, c, pd, peer), 1.0)
             for s in ("64K", "512K") if s in order_sizes for c in order_conc]))
    # Where a target sits against its floor: the same ratio for the least
    # filter doing that engine's job (for SGLang min-pd-sglang where it ran,
    # on demand, else min-pd: SGLang's hand-off is three members on both legs).
    floor_of = {"pd-vllm": MIN_PD_VLLM,
                "pd-sglang": MIN_PD_SGLANG if MIN_PD_SGLANG in configs else MIN_PD}
    w("  [info] the floors on the same ratios (the least filter doing the engine's job "
      "in place of pd-router):")
    w(f"      {MIN_PD_VLLM} / {MIN_PD} (the 1.15x budget): "
      + ", ".join(f"{s} c={c} {fmt_ratio(cpu_ratio(s, c, MIN_PD_VLLM, MIN_PD))}"
                  for s, c in all_cols))
    if MIN_PD_SGLANG in configs:
        w(f"      {MIN_PD_SGLANG} / {MIN_PD} (the 1.15x budget): "
          + ", ".join(f"{s} c={c} {fmt_ratio(cpu_ratio(s, c, MIN_PD_SGLANG, MIN_PD))}"
                      for s, c in all_cols))
    for pd, stack in STACKS.items():
        w(f"      {floor_of[pd]} / {stack}: "
          + ", ".join(f"{s} c={c} {fmt_ratio(cpu_ratio(s, c, floor_of[pd], stack))}"
                      for s in ("1K", "512K") if s in order_sizes for c in order_conc))
    for pd, peer in HEAD_TO_HEAD.items():
        w(f"      {floor_of[pd]} / {peer}: "
          + ", ".join(f"{s} c={c} {fmt_ratio(cpu_ratio(s, c, floor_of[pd], peer))}"
                      for s in ("64K", "512K") if s in order_sizes for c in order_conc))
    w("  [info] at 1K vs the standalone peer, and how much of it the minimal wasm filter "
      "already costs:")
    for pd, peer in HEAD_TO_HEAD.items():
        for c in order_conc:
            r, m = cpu_ratio("1K", c, pd, peer), cpu_ratio("1K", c, MIN_PD, peer)
            share = "" if r is None or m is None else f" ({m / r:.0%} of {pd}'s)"
            w(f"      1K c={c}: {pd} / {peer} {fmt_ratio(r)}; {MIN_PD} / {peer} "
              f"{fmt_ratio(m)}{share}")
    calls = [(c, c.removeprefix(f"{MIN_PD}+{CALLS_PER_REQUEST}")) for c in configs
             if c.startswith(f"{MIN_PD}+{CALLS_PER_REQUEST}")]
    if calls:
        w(f"  [info] one host call (code, data: one KiB touched), µs of router CPU "
          f"(({MIN_PD}+{CALLS_PER_REQUEST}<kind> - {MIN_PD}) / {CALLS_PER_REQUEST}):")
        for c, kind in calls:
            costs = []
            for s, cc in all_cols:
                x, m = get(s, cc, c, "cpu_us"), get(s, cc, MIN_PD, "cpu_us")
                costs.append(f"{s} c={cc} " + ("-" if x is None or m is None
                                              else f"{(x - m) / CALLS_PER_REQUEST:.2f}"))
            w(f"      {kind:<10} " + ", ".join(costs))
    w(f"  [info] vs {BUFFER_FLOOR}: in the ratio table above; {MIN_PD} / {BUFFER_FLOOR}: "
      + ", ".join(f"{s} c={c} {fmt_ratio(cpu_ratio(s, c, MIN_PD, BUFFER_FLOOR))}"
                  for s, c in all_cols))
    if wall_min is not None:
        w(f"  [info] this script took {wall_min:.1f} min (`just bench` as a whole, fresh machine "
          "with installs and the native benches: target < 12 min)")
    w("")
    w("Core 1 (mocks + load generator) busy fraction, median: high values mean req/s is bound "
      "by the mocks, not the router.")
    for size in order_sizes:
        for conc in order_conc:
            parts = [f"{c}={fmt(rows[(size, conc, c)]['core1'], '{:.2f}')}" for c in configs
                     if (size, conc, c) in rows]
            w(f"  {size:<5} c={conc:<3} " + " ".join(parts))
    return "\n".join(out)


def paired_report(raw: list[dict], sizes, concs, names, wasm_a: Path, wasm_b: Path) -> str:
    """--wasm-b: each twin against its pair, repetition by repetition (the two
    ran in the same repetition, so a slow minute moves both)."""
    out = [f"A/B (--wasm-b): CPU per request of b ({wasm_b}) / a ({wasm_a}), the pairs' median "
           "and range over repetitions"]
    cell = {(r["rep"], r["body"], r["concurrency"], r["config"]): r["cpu_us_per_req"]
            for r in raw if (r["completed"] or 0) > 0}
    reps = sorted({r["rep"] for r in raw})
    for name in names:
        parts = []
        for s in sizes:
            for c in concs:
                pairs = [cell[(rep, s, c, name + "@b")] / cell[(rep, s, c, name)]
                         for rep in reps
                         if (rep, s, c, name) in cell and (rep, s, c, name + "@b") in cell]
                if pairs:
                    parts.append(f"{s} c={c} {median(pairs):.2f}x ({min(pairs):.2f}-"
                                 f"{max(pairs):.2f}, {len(pairs)})")
        out.append(f"  {name}: " + "; ".join(parts))
    return "\n".join(out)


def plot(rows: dict, sizes, concs, configs, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(concs), figsize=(8 * len(concs), 9), squeeze=False)
    width = 0.8 / len(configs)
    # Floors grey, pd-router blues and greens, peers warm.
    palette = {"envoy-forward": "#dcdcdc", "envoy-mirror": "#a8a8a8",
               "envoy-buffer-mirror": "#6e6e6e", "min-pd": "#333333",
               "min-pd-vllm": "#555555", "min-pd-trtllm": "#777777", "pd-vllm": "#1f4e9c",
               "pd-sglang": "#3a86d4", "pd-trtllm": "#2e9e6a", "pd-trtllm-b64": "#1b6b47", "pd-default": "#8fd19e",
               "sglang-router": "#f2a65a", "vllm-router": "#e06a6e",
               "envoy+sglang-router": "#b8560f", "envoy+vllm-router": "#8c1c20"}
    for col, conc in enumerate(concs):
        for row, (key, label) in enumerate([("cpu_us", "router CPU µs / request "
                                                       "(envoy+peer: both)"),
                                            ("rps", "requests / s")]):
            ax = axes[row][col]
            for i, c in enumerate(configs):
                xs, ys = [], []
                for j, s in enumerate(sizes):
                    v = rows.get((s, conc, c), {}).get(key)
                    if v is not None:
                        xs.append(j + (i - (len(configs) - 1) / 2) * width)
                        ys.append(v)
                ax.bar(xs, ys, width, label=c, color=palette.get(c, "black"))
            ax.set_xticks(range(len(sizes)))
            ax.set_xticklabels([f"{s} body" for s in sizes])
            ax.set_yscale("log")
            ax.set_ylabel(label)
            ax.set_title(f"{label}, concurrency {conc}")
            ax.grid(axis="y", which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8, ncol=2)
    fig.suptitle("pd-router end to end: router on one core (median over repetitions; "
                 "lower CPU and higher req/s are better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    # 1.3 s: at 10 ms a tick, /proc's CPU time is within 1.5 % over a
    # window that keeps a core half busy; this machine's noise is far larger, and
    # the repetitions (medians of 3) are what answers it.
    ap.add_argument("--duration", type=float, default=1.3,
                    help="measured seconds per cell (default 1.3)")
    # 0.2 s: a cell's connections and caches are warm within milliseconds
    # (every router starts once, before the first cell). With the 1.3 s
    # window, `just bench` stays under its 12 minutes on a fresh clone.
    ap.add_argument("--warmup", type=float, default=0.2,
                    help="unmeasured seconds of load before each window (default 0.2)")
    ap.add_argument("--sizes", default="1K,64K,512K")
    ap.add_argument("--concurrency", default="1,32")
    # The bisect rows and min-pd-sglang run on demand (`--configs
    # min-pd,min-pd+json,...`): `just bench` stays within its time budget.
    ap.add_argument("--configs", default=",".join(c for c, k, _ in CONFIGS
                                                  if k not in ("bisect", "min-extra")))
    ap.add_argument("--out", type=Path, default=BENCH / "results")
    ap.add_argument("--envoy", type=Path,
                    default=Path(os.environ.get("ENVOY_BIN", REPO / ".venv/bin/envoy")))
    ap.add_argument("--wasm", type=Path, default=Path(os.environ.get(
        "PD_ROUTER_WASM", REPO / "target/wasm32-wasip1/release/pd_router.wasm")))
    ap.add_argument("--wasm-b", type=Path, default=None,
                    help="a second pd-router module: every pd-<engine> configuration gets a "
                         "twin <name>@b running it on the same mocks, and the report adds "
                         "their paired ratios (b / a, repetition by repetition)")
    ap.add_argument("--min-wasm", type=Path, default=Path(os.environ.get(
        "MIN_PD_WASM", BENCH / "min-pd-filter/target/wasm32-wasip1/release/min_pd_filter.wasm")),
        help="the minimal PD filter (min-pd)")
    ap.add_argument("--mock", type=Path, default=REPO / "target/release/mock-engine")
    ap.add_argument("--loadgen", type=Path, default=REPO / "target/release/loadgen")
    ap.add_argument("--peer-venv", type=Path, default=BENCH / ".venv")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    ap.add_argument("--syscalls", action="store_true",
                    help="also count each router's system calls and context switches per "
                         "request (`perf stat` tracepoints) in an extra cell of the first "
                         "repetition; for envoy+<peer>, Envoy's alone")
    ap.add_argument("--idle-thrash", action="store_true",
                    help="run an idle-priority (SCHED_IDLE) process on the router core that "
                         "overwrites a 64 MiB buffer over and over: the core never idles, "
                         "and each wait costs the router its caches (an experiment on "
                         "what c=1 costs)")
    ap.add_argument("--perf", type=Path, default=None,
                    help="also sample each router with `perf record` in the first repetition "
                         "(files into this directory) and print where its CPU went by object")
    a = ap.parse_args()

    sizes = [s for s in a.sizes.split(",") if s]
    concs = [int(c) for c in a.concurrency.split(",") if c]
    configs = [c for c in a.configs.split(",") if c]
    for s in sizes:
        if s not in SIZES:
            ap.error(f"unknown size {s} (one of {', '.join(SIZES)})")
    known = {c for c, _, _ in CONFIGS}
    for c in configs:
        if c not in known:
            ap.error(f"unknown config {c} (one of {', '.join(sorted(known))})")
    if a.wasm_b:
        if not a.wasm_b.exists():
            ap.error(f"--wasm-b: {a.wasm_b} not found")
        a.wasm_b = a.wasm_b.resolve()
        configs += [f"{c}@b" for c in configs if c in PD]
    need_files = [("envoy", a.envoy), ("wasm", a.wasm), ("mock-engine", a.mock),
                  ("loadgen", a.loadgen)]
    if any(c.startswith(MIN_PD) for c in configs):
        need_files.append(("min-wasm", a.min_wasm))
    for what, p in need_files:
        if not p.exists():
            ap.error(f"{what} not found at {p} (run `./just bench-e2e`, which builds everything)")
    if (os.cpu_count() or 1) < 2:
        ap.error("needs 2 cores: the router is pinned to core 0, the load to core 1")
    a.wasm = a.wasm.resolve()
    a.min_wasm = a.min_wasm.resolve()

    t_start = time.time()
    cells = len(sizes) * len(concs) * len(configs)
    log(f"bench: {len(configs)} configurations x {len(sizes)} sizes x {len(concs)} concurrencies"
        f" = {cells} cells x {a.reps} repetitions, {a.warmup + a.duration:.1f} s each: about "
        f"{cells * a.reps * (a.warmup + a.duration + 0.05) / 60:.1f} min of load")

    scratch = Path(tempfile.mkdtemp(prefix="pd-bench-"))
    procs = Procs(scratch)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    raw: list[dict] = []
    profiles: dict[tuple, list] = {}
    if a.perf:
        a.perf.mkdir(parents=True, exist_ok=True)
    dead: dict[str, str] = {}
    warnings: list[str] = []
    notes: list[str] = []
    ok = False
    try:
        body_files = {}
        for s in sizes:
            f = scratch / f"body-{s}.json"
            f.write_bytes(make_body(SIZES[s]))
            body_files[s] = f

        log("starting mock engines (core 1)")
        need = set(configs)
        mocks: dict[str, Mock] = {}

        def mock(name, *args):
            if name not in mocks:
                mocks[name] = start_mock(procs, a.mock, name, list(args))
            return mocks[name]

        targets: dict[str, Target] = {}

        def add(name, start):
            try:
                targets[name] = start()
            except Exception as e:  # noqa: BLE001 - a config that cannot start is reported
                dead[name] = f"did not start: {str(e).splitlines()[0][:200]}"
                log(f"  {name}: {dead[name]}")
                for line in str(e).splitlines()[1:]:
                    log(f"    {line}")

        log("starting routers (core 0)")
        if need & {"envoy-forward", "envoy-mirror", BUFFER_FLOOR}:
            fa = mock("fwd-a", "--engine", "default", "--role", "decode")
            fb = mock("fwd-b", "--engine", "default", "--role", "decode")
            if "envoy-forward" in need:
                add("envoy-forward", lambda: Target("envoy-forward", *start_envoy(
                    procs, a.envoy, "envoy-forward", forward_envoy(a.wasm, fa.http, None)),
                    [fa]))
            if "envoy-mirror" in need:
                add("envoy-mirror", lambda: Target("envoy-mirror", *start_envoy(
                    procs, a.envoy, "envoy-mirror", forward_envoy(a.wasm, fa.http, fb.http)),
                    [fa, fb]))
            if BUFFER_FLOOR in need:
                add(BUFFER_FLOOR, lambda: Target(BUFFER_FLOOR, *start_envoy(
                    procs, a.envoy, BUFFER_FLOOR,
                    forward_envoy(a.wasm, fa.http, fb.http, buffer=True)), [fa, fb]))

        engines = {
            "vllm": (["--engine", "vllm", "--role", "prefill", "--connector", "nixl",
                      "--lenient-prefill"], ["--engine", "vllm", "--role", "decode"], "pulled"),
            "sglang": (["--engine", "sglang", "--role", "prefill", "--lenient-prefill"],
                       ["--engine", "sglang", "--role", "decode"], "pulled"),
            "trtllm": (["--engine", "trtllm", "--role", "prefill"],
                       ["--engine", "trtllm", "--role", "decode"], "pulled"),
            "default": (["--engine", "default", "--role", "prefill"],
                        ["--engine", "default", "--role", "decode"], "none"),
        }
        pair = {}

        def engine_mocks(engine):
            if engine not in pair:
                p_args, d_args, _ = engines[engine]
                pair[engine] = (mock(f"{engine}-prefill", *p_args), mock(f"{engine}-decode", *d_args))
            return pair[engine]

        # pd-<engine>[-b64]: -b64 is TensorRT-LLM's base64 form of the ids,
        # on the same mocks.
        pd_names = [(f"pd-{e}", e) for e in engines] + [("pd-trtllm-b64", "trtllm")]
        for name, engine in pd_names + [(f"{n}@b", e) for n, e in pd_names]:
            if name not in need:
                continue
            module = a.wasm_b if name.endswith("@b") else a.wasm
            kv = engines[engine][2]
            pm, dm = engine_mocks(engine)
            plugin = {"prefill_timeout_ms": 30000, "models": [{
                "name": MODEL, "engine": engine,
                "rolesets": [{"name": "rs0", "prefill": [pm.endpoint()],
                              "decode": [dm.endpoint()]}]}]}
            if name.removesuffix("@b").endswith("-b64"):
                plugin["models"][0]["trt_token_ids_b64"] = True
            if engine == "vllm":
                plugin["kv_connector"] = "nixl"
            add(name, lambda name=name, plugin=plugin, pm=pm, dm=dm, kv=kv, module=module: Target(
                name, *start_envoy(procs, a.envoy, name, pd_envoy(module, plugin)), [pm, dm], kv))

        min_steps = [(MIN_PD, ""), ("min-pd+json", "json"), ("min-pd+edit", "edit")]
        calls_prefix = f"min-pd+{CALLS_PER_REQUEST}"
        min_steps += [(c, f"{c.removeprefix(calls_prefix)}*{CALLS_PER_REQUEST}")
                      for c, _, _ in CONFIGS if c.startswith(calls_prefix)]
        for name, steps in min_steps:
            if name not in need:
                continue
            # Default-engine mocks of its own: the strict default prefill
            # wants `max_tokens: 1`, and min-pd sends the body unchanged.
            pm = mock("min-prefill", "--engine", "default", "--role", "prefill",
                      "--lenient-prefill")
            dm = mock("min-decode", "--engine", "default", "--role", "decode")
            add(name, lambda name=name, steps=steps, pm=pm, dm=dm: Target(name, *start_envoy(
                procs, a.envoy, name, min_pd_envoy(a.min_wasm, pm, dm, steps)), [pm, dm],
                "none"))
        if MIN_PD_VLLM in need:
            # pd-vllm's own mocks: the same pulls and side channel, so the
            # pair differs only in the filter.
            pm, dm = engine_mocks("vllm")
            add(MIN_PD_VLLM, lambda pm=pm, dm=dm: Target(MIN_PD_VLLM, *start_envoy(
                procs, a.envoy, MIN_PD_VLLM, min_pd_envoy(a.min_wasm, pm, dm, "vllm")),
                [pm, dm], "pulled"))
        if MIN_PD_SGLANG in need:
            # pd-sglang's own mocks: the same bootstrap exchange between
            # them, so the pair differs only in the filter.
            pm, dm = engine_mocks("sglang")
            add(MIN_PD_SGLANG, lambda pm=pm, dm=dm: Target(MIN_PD_SGLANG, *start_envoy(
                procs, a.envoy, MIN_PD_SGLANG, min_pd_envoy(a.min_wasm, pm, dm, "sglang")),
                [pm, dm], "pulled"))
        if MIN_PD_TRTLLM in need:
            # pd-trtllm's mocks, the context lenient about `max_tokens` (the
            # minimal filter appends, it does not rewrite): the same
            # tokenising, side channel and id check, so the pair differs in
            # the filter alone.
            p_args, d_args, kv = engines["trtllm"]
            pm = mock("min-trtllm-prefill", *p_args, "--lenient-prefill")
            dm = mock("min-trtllm-decode", *d_args)
            add(MIN_PD_TRTLLM, lambda pm=pm, dm=dm, kv=kv: Target(MIN_PD_TRTLLM, *start_envoy(
                procs, a.envoy, MIN_PD_TRTLLM, min_pd_envoy(a.min_wasm, pm, dm, "trtllm")),
                [pm, dm], kv))

        # Each peer runs once; its standalone config and its gateway stack
        # (e) share it (only the one being measured gets traffic).
        peer_starts = {"sglang-router": ("sglang", start_sglang_router),
                       "vllm-router": ("vllm", start_vllm_router)}
        for peer, (engine, start) in peer_starts.items():
            stack = f"envoy+{peer}"
            if peer not in need and stack not in need:
                continue
            pm, dm = engine_mocks(engine)
            try:
                peer_proc, peer_port = start(procs, a.peer_venv, pm, dm)
            except Exception as e:  # noqa: BLE001 - reported, the rest go on
                for name in (peer, stack):
                    if name in need:
                        dead[name] = f"did not start: {str(e).splitlines()[0][:200]}"
                        log(f"  {name}: {dead[name]}")
                continue
            if peer in need:
                targets[peer] = Target(peer, peer_proc, peer_port, [pm, dm], "pulled")
            if stack in need:
                add(stack, lambda stack=stack, pp=peer_proc, port=peer_port, pm=pm, dm=dm: Target(
                    stack, *start_envoy(procs, a.envoy, stack, forward_envoy(a.wasm, port, None)),
                    [pm, dm], "pulled", second=pp))

        log("checking each configuration with one request")
        for name in list(targets):
            t = targets[name]
            for s in sizes:
                try:
                    sanity_check(t, body_files[s].read_bytes())
                except Exception as e:  # noqa: BLE001
                    dead[name] = f"failed its check ({s}): {e}"[:300]
                    log(f"  {name}: {dead[name]}\n{procs.log_tail(name, 5)}")
                    del targets[name]
                    break
            else:
                threads = len(os.listdir(f"/proc/{t.proc.pid}/task"))
                also = f", + {t.second.pid}" if t.second else ""
                log(f"  {name}: ok (pid {t.proc.pid}{also}, {threads} threads, port {t.port})")

        # What the routers cost while idle (scrapes, timers, health checks):
        # they all share core 0 with the one being measured.
        def ticks(t):
            return proc_ticks(t.proc.pid) + (proc_ticks(t.second.pid) if t.second else 0)

        def core_ticks():
            out = {}
            for line in open("/proc/stat"):
                if line.startswith("cpu") and line[3].isdigit():
                    v = [int(x) for x in line.split()[1:9]]
                    out[line.split()[0][3:]] = (sum(v) - v[3] - v[4], sum(v))
            return out

        def idle_check(when):
            t0 = {n: ticks(t) for n, t in targets.items()}
            c0 = core_ticks()
            time.sleep(2)
            c1 = core_ticks()
            idle = {n: (ticks(t) - t0[n]) * 1000 / CLK_TCK / 2 for n, t in targets.items()}
            busy = {k: (c1[k][0] - c0[k][0]) / max(1, c1[k][1] - c0[k][1])
                    for k in c1 if k in c0}
            notes.append(f"Idle check {when} (2 s, nothing sent): routers' own CPU ms/s: "
                         + ", ".join(f"{n}={v:.0f}" for n, v in idle.items())
                         + "; core busy: " + ", ".join(f"core {k}={v:.2f}"
                                                        for k, v in busy.items()))
            log(notes[-1])
            if any(v > 0.15 for v in busy.values()):
                warning = (f"WARNING ({when}): the cores were busy while every benchmark process "
                           "was idle, so something else runs on this machine (" + ", ".join(
                               f"core {k} {v:.0%}" for k, v in busy.items())
                           + "): expect noisy numbers.")
                warnings.append(warning)
                log(warning)

        idle_check("before the run")
        thrash = None
        if a.idle_thrash:
            # Runs only when the router core would otherwise idle; between a
            # router's requests it evicts every cache level.
            thrash = procs.start("idle-thrash", [
                "chrt", "-i", "0", sys.executable, "-c",
                "b = bytearray(64 << 20)\nz = bytes(len(b[::64]))\n"
                "while True:\n    b[::64] = z"], ROUTER_CORE)
            notes.append("--idle-thrash: an idle-priority process overwrote 64 MiB on the "
                         "router core throughout (the core never idled; its caches were overwritten "
                         "in every wait)")
            log(notes[-1])

        order = [c for c in configs if c in targets]
        done = 0
        total = len(order) * len(sizes) * len(concs) * a.reps
        for rep in range(a.reps):
            rot = order[rep % len(order):] + order[:rep % len(order)] if order else []
            for s in sizes:
                for conc in concs:
                    for name in rot:
                        t = targets[name]
                        if t.dead:
                            continue
                        gone = [q for q in (t.proc, t.second) if q and q.poll() is not None]
                        if gone:
                            t.dead = f"exited with {gone[0].returncode} during the run"
                            dead[name] = t.dead
                            log(f"  {name}: {t.dead}\n{procs.log_tail(name, 5)}")
                            continue
                        try:
                            if a.perf and rep == 0:
                                # An extra, unrecorded cell: sampling costs the
                                # router CPU, so it stays out of the medians.
                                perf_data = a.perf / f"{name}-{s}-c{conc}.data"
                                run_cell(a.loadgen, t, body_files[s], conc, a.duration,
                                         a.warmup, perf_data)
                                if perf_data.exists():
                                    shares = perf_shares(perf_data)
                                    profiles[(name, s, conc)] = shares
                                    log(f"      perf {name} {s} c={conc}: " + ", ".join(
                                        f"{where} {pct:.1f}%" for pct, where in shares[:6]))
                            if a.syscalls and rep == 0:
                                # Also an extra cell: the tracepoints cost
                                # the router CPU.
                                out = scratch / f"stat-{name}-{s}-c{conc}.txt"
                                r0 = run_cell(a.loadgen, t, body_files[s], conc, a.duration,
                                              a.warmup, out, stat=True)
                                n = r0.get("completed") or 0
                                if out.exists() and n:
                                    counts = perf_counts(out) | r0.get("io", {})
                                    log(f"      per request, {name} {s} c={conc}: " + ", ".join(
                                        f"{k} {v / n:.2f}" for k, v in counts.items()))
                            r = run_cell(a.loadgen, t, body_files[s], conc, a.duration, a.warmup)
                        except Exception as e:  # noqa: BLE001 - keep the rest going
                            r = {"completed": 0, "errors": None, "first_error": str(e)[:300]}
                        done += 1
                        core = r.get("core_busy") or []
                        raw.append({
                            "rep": rep + 1, "body": s, "body_bytes": SIZES[s],
                            "concurrency": conc, "config": name,
                            "completed": r.get("completed"), "errors": r.get("errors"),
                            "elapsed_s": r.get("elapsed_s"), "rps": r.get("rps"),
                            "cpu_s": r.get("cpu_s"), "cpu_s_second": r.get("cpu_s_second"),
                            "cpu_us_per_req": r.get("cpu_us_per_req"),
                            "p50_ms": r.get("p50_ms"), "p99_ms": r.get("p99_ms"),
                            "core0_busy": core[0] if len(core) > 0 else None,
                            "core1_busy": core[1] if len(core) > 1 else None,
                            "first_error": r.get("first_error") or "",
                        })
                        bad = "" if r.get("errors") == 0 else f"  ERRORS {r.get('errors')}: {r.get('first_error')}"
                        log(f"  [{done:>3}/{total}] rep {rep + 1} {s:>4} c={conc:<2} {name:<19} "
                            f"{fmt(r.get('cpu_us_per_req')):>8} us/req {fmt(r.get('rps'), '{:.0f}'):>6} req/s"
                            f"{bad[:240]}")
        if thrash is not None:
            thrash.terminate()
            thrash.wait(timeout=10)
        if targets:
            idle_check("after the run")
        ok = True
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); writing what was measured")
    finally:
        procs.stop_all()
        if a.keep or not ok:
            log(f"logs kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    # Aggregate: medians over repetitions that completed requests.
    rows: dict = {}
    for s in sizes:
        for conc in concs:
            for c in configs:
                rs = [r for r in raw if (r["body"], r["concurrency"], r["config"]) == (s, conc, c)
                      and (r["completed"] or 0) > 0]
                if not rs:
                    continue
                rows[(s, conc, c)] = {
                    "cpu_us": median(r["cpu_us_per_req"] for r in rs),
                    "rps": median(r["rps"] for r in rs),
                    "p50": median(r["p50_ms"] for r in rs),
                    "p99": median(r["p99_ms"] for r in rs),
                    "core0": median(r["core0_busy"] for r in rs),
                    "core1": median(r["core1_busy"] for r in rs),
                    "errors": sum((r["errors"] or 0) for r in rs),
                    "reps": len(rs),
                }
            for c in configs:
                failed = [r for r in raw if (r["body"], r["concurrency"], r["config"]) == (s, conc, c)
                          and not (r["completed"] or 0) > 0]
                if failed and (s, conc, c) not in rows:
                    dead.setdefault(c, f"no request completed: {failed[0]['first_error'][:120]}")

    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "latest-raw.csv", "w", newline="") as f:
        fields = ["rep", "body", "body_bytes", "concurrency", "config", "completed", "errors",
                  "elapsed_s", "rps", "cpu_s", "cpu_s_second", "cpu_us_per_req", "p50_ms",
                  "p99_ms",
                  "core0_busy", "core1_busy", "first_error"]
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        wr.writerows(raw)
    with open(a.out / "latest.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["body", "body_bytes", "concurrency", "config", "cpu_us_per_req", "rps",
                     "p50_ms", "p99_ms", "cpu_vs_floor_b", "rps_vs_floor_b",
                     "cpu_vs_best_peer", "rps_vs_best_peer", "cpu_vs_min_pd",
                     "cpu_vs_buffer_mirror", "core1_busy", "errors", "reps"])
        for s in sizes:
            for conc in concs:
                floor = rows.get((s, conc, FLOOR), {})
                mfloor = rows.get((s, conc, MIN_PD), {})
                bfloor = rows.get((s, conc, BUFFER_FLOOR), {})
                pc = [rows[(s, conc, p)]["cpu_us"] for p in PEERS if (s, conc, p) in rows]
                pr = [rows[(s, conc, p)]["rps"] for p in PEERS if (s, conc, p) in rows]
                for c in configs:
                    r = rows.get((s, conc, c))
                    if r is None:
                        continue

                    def num(x, spec="{:.4f}"):
                        return "" if x is None else spec.format(x)

                    wr.writerow([s, SIZES[s], conc, c, num(r["cpu_us"], "{:.2f}"),
                                 num(r["rps"], "{:.1f}"), num(r["p50"], "{:.3f}"),
                                 num(r["p99"], "{:.3f}"),
                                 num(ratio(r["cpu_us"], floor.get("cpu_us"))),
                                 num(ratio(r["rps"], floor.get("rps"))),
                                 num(ratio(r["cpu_us"], min(pc) if pc else None)),
                                 num(ratio(r["rps"], max(pr) if pr else None)),
                                 num(ratio(r["cpu_us"], mfloor.get("cpu_us"))),
                                 num(ratio(r["cpu_us"], bfloor.get("cpu_us"))),
                                 num(r["core1"], "{:.3f}"), r["errors"], r["reps"]])
    text = report(rows, sizes, concs, configs, dead, (time.time() - t_start) / 60)
    if a.wasm_b:
        text += "\n\n" + paired_report(raw, sizes, concs, [c for c in configs if c + "@b" in configs],
                                       a.wasm, a.wasm_b)
    if notes:
        text += "\n\n" + "\n".join(notes)
    if warnings:
        text += "\n\n" + "\n".join(warnings)
    if dead:
        text += "\n\nNot measured / failed:\n" + "\n".join(f"  {c}: {why}" for c, why in dead.items())
    elapsed = time.time() - t_start
    text += f"\n\nWall time: {elapsed / 60:.1f} min ({a.reps} repetitions, {a.duration:g} s windows)"
    (a.out / "latest.txt").write_text(text + "\n")
    try:
        plot(rows, sizes, concs, configs, a.out / "latest.png")
    except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
        log(f"plot failed: {e}")
    print(text)
    log(f"wrote {a.out / 'latest.csv'}, latest-raw.csv, latest.txt, latest.png")
    return 0 if ok and not dead else 1


if __name__ == "__main__":
    sys.exit(main())

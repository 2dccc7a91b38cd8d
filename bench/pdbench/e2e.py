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
  smg             the same PD job done by SMG (SGLang mocks)               (d)
  vllm-router     ... and by vllm-router (vLLM NIXL mocks)
  envoy+smg       the shipped Envoy (no filter) forwarding to the          (e)
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
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .common import (interrupt_on_sigterm, run_measured, BENCH, CLK_TCK, LOAD_CORE, REPO, ROUTER_CORE, Procs, die_with_parent, fmt,
                     http, idle_check, log, proc_ticks, start_envoy)
from .e2e_configs import (BUFFER_FLOOR, CALLS_PER_REQUEST, CONFIGS, MIN_PD, MIN_PD_SGLANG,
                          MIN_PD_TRTLLM, MIN_PD_VLLM, PD, SIZES)
from .e2e_report import aggregate, paired_report, plot, report, write_csvs
from .engines import MODEL, Mock, start_mock, start_smg, start_vllm_router
from .envoy import forward_envoy, min_pd_envoy, pd_envoy


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
                         stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
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
                preexec_fn=die_with_parent)
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



# ---------------------------------------------------------------- the run

def arg_parser() -> argparse.ArgumentParser:
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
    return ap


def parse_args():
    """The options, checked: (options, sizes, concurrencies, configurations)."""
    ap = arg_parser()
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
    return a, sizes, concs, configs


# engine -> (prefill mock's arguments, decode mock's, the x-mock-kv a split
# request's answer carries).
ENGINES = {
    "vllm": (["--engine", "vllm", "--role", "prefill", "--connector", "nixl",
              "--lenient-prefill"], ["--engine", "vllm", "--role", "decode"], "pulled"),
    "sglang": (["--engine", "sglang", "--role", "prefill", "--lenient-prefill"],
               ["--engine", "sglang", "--role", "decode"], "pulled"),
    "trtllm": (["--engine", "trtllm", "--role", "prefill"],
               ["--engine", "trtllm", "--role", "decode"], "pulled"),
    "default": (["--engine", "default", "--role", "prefill"],
                ["--engine", "default", "--role", "decode"], "none"),
}


class Starter:
    """Starts the mocks (each once, whoever needs it first) and the routers
    of the configurations asked for; one that cannot start is named in
    `dead`, and the rest go on."""

    def __init__(self, a, procs: Procs, configs: list[str], dead: dict):
        self.a = a
        self.procs = procs
        self.need = set(configs)
        self.dead = dead
        self.mocks: dict[str, Mock] = {}
        self.pairs: dict[str, tuple[Mock, Mock]] = {}
        self.targets: dict[str, Target] = {}

    def mock(self, name, *args) -> Mock:
        if name not in self.mocks:
            self.mocks[name] = start_mock(self.procs, self.a.mock, name, list(args))
        return self.mocks[name]

    def engine_mocks(self, engine) -> tuple[Mock, Mock]:
        if engine not in self.pairs:
            p_args, d_args, _ = ENGINES[engine]
            self.pairs[engine] = (self.mock(f"{engine}-prefill", *p_args),
                                  self.mock(f"{engine}-decode", *d_args))
        return self.pairs[engine]

    def add(self, name, start) -> None:
        try:
            self.targets[name] = start()
        except Exception as e:  # noqa: BLE001 - a config that cannot start is reported
            self.dead[name] = f"did not start: {str(e).splitlines()[0][:200]}"
            log(f"  {name}: {self.dead[name]}")
            for line in str(e).splitlines()[1:]:
                log(f"    {line}")

    def envoy(self, name: str, cfg: dict):
        """(process, port) of an Envoy for configuration `name`."""
        return start_envoy(self.procs, self.a.envoy, name, cfg)

    def start_all(self) -> dict[str, Target]:
        log("starting routers (core 0)")
        self.start_floors()
        self.start_pd()
        self.start_min()
        self.start_peers()
        return self.targets

    def start_floors(self) -> None:
        """(a), (b), (b'): Envoy without a filter, on two default mocks."""
        a, need = self.a, self.need
        if not need & {"envoy-forward", "envoy-mirror", BUFFER_FLOOR}:
            return
        fa = self.mock("fwd-a", "--engine", "default", "--role", "decode")
        fb = self.mock("fwd-b", "--engine", "default", "--role", "decode")
        if "envoy-forward" in need:
            self.add("envoy-forward", lambda: Target("envoy-forward", *self.envoy(
                "envoy-forward", forward_envoy(a.wasm, fa.http, None)), [fa]))
        if "envoy-mirror" in need:
            self.add("envoy-mirror", lambda: Target("envoy-mirror", *self.envoy(
                "envoy-mirror", forward_envoy(a.wasm, fa.http, fb.http)), [fa, fb]))
        if BUFFER_FLOOR in need:
            self.add(BUFFER_FLOOR, lambda: Target(BUFFER_FLOOR, *self.envoy(
                BUFFER_FLOOR, forward_envoy(a.wasm, fa.http, fb.http, buffer=True)), [fa, fb]))

    def start_pd(self) -> None:
        """(c): pd-<engine>[-b64] and their @b twins. -b64 is TensorRT-LLM's
        base64 form of the ids, on the same mocks."""
        pd_names = [(f"pd-{e}", e) for e in ENGINES] + [("pd-trtllm-b64", "trtllm")]
        for name, engine in pd_names + [(f"{n}@b", e) for n, e in pd_names]:
            if name not in self.need:
                continue
            module = self.a.wasm_b if name.endswith("@b") else self.a.wasm
            kv = ENGINES[engine][2]
            pm, dm = self.engine_mocks(engine)
            plugin = {"prefill_timeout_ms": 30000, "models": [{
                "name": MODEL, "engine": engine,
                "rolesets": [{"name": "rs0", "prefill": [pm.endpoint()],
                              "decode": [dm.endpoint()]}]}]}
            if name.removesuffix("@b").endswith("-b64"):
                plugin["models"][0]["trt_token_ids_b64"] = True
            if engine == "vllm":
                plugin["kv_connector"] = "nixl"
            self.add(name, lambda name=name, plugin=plugin, pm=pm, dm=dm, kv=kv, module=module:
                     Target(name, *self.envoy(name, pd_envoy(module, plugin)), [pm, dm], kv))

    def start_min(self) -> None:
        """(m): the minimal PD filter, its bisect rows and its engine rows."""
        min_steps = [(MIN_PD, ""), ("min-pd+json", "json"), ("min-pd+edit", "edit")]
        calls_prefix = f"min-pd+{CALLS_PER_REQUEST}"
        min_steps += [(c, f"{c.removeprefix(calls_prefix)}*{CALLS_PER_REQUEST}")
                      for c, _, _ in CONFIGS if c.startswith(calls_prefix)]
        for name, steps in min_steps:
            if name not in self.need:
                continue
            # Default-engine mocks of its own: the strict default prefill
            # wants `max_tokens: 1`, and min-pd sends the body unchanged.
            pm = self.mock("min-prefill", "--engine", "default", "--role", "prefill",
                           "--lenient-prefill")
            dm = self.mock("min-decode", "--engine", "default", "--role", "decode")
            self.add(name, lambda name=name, steps=steps, pm=pm, dm=dm: Target(
                name, *self.envoy(name, min_pd_envoy(self.a.min_wasm, pm, dm, steps)),
                [pm, dm], "none"))
        # pd-vllm's own mocks: the same pulls and side channel; pd-sglang's:
        # the same bootstrap exchange between them. Each pair differs only
        # in the filter.
        for name, engine in ((MIN_PD_VLLM, "vllm"), (MIN_PD_SGLANG, "sglang")):
            if name in self.need:
                pm, dm = self.engine_mocks(engine)
                self.add(name, lambda name=name, engine=engine, pm=pm, dm=dm: Target(
                    name, *self.envoy(name, min_pd_envoy(self.a.min_wasm, pm, dm, engine)),
                    [pm, dm], "pulled"))
        if MIN_PD_TRTLLM in self.need:
            # pd-trtllm's mocks, the context lenient about `max_tokens` (the
            # minimal filter appends, it does not rewrite): the same
            # tokenising, side channel and id check, so the pair differs in
            # the filter alone.
            p_args, d_args, kv = ENGINES["trtllm"]
            pm = self.mock("min-trtllm-prefill", *p_args, "--lenient-prefill")
            dm = self.mock("min-trtllm-decode", *d_args)
            self.add(MIN_PD_TRTLLM, lambda pm=pm, dm=dm, kv=kv: Target(MIN_PD_TRTLLM, *self.envoy(
                MIN_PD_TRTLLM, min_pd_envoy(self.a.min_wasm, pm, dm, "trtllm")), [pm, dm], kv))

    def start_peers(self) -> None:
        """(d) and (e). Each peer runs once; its standalone config and its
        gateway stack share it (only the one being measured gets traffic)."""
        peer_starts = {"smg": ("sglang", start_smg),
                       "vllm-router": ("vllm", start_vllm_router)}
        for peer, (engine, start) in peer_starts.items():
            stack = f"envoy+{peer}"
            if peer not in self.need and stack not in self.need:
                continue
            pm, dm = self.engine_mocks(engine)
            try:
                peer_proc, peer_port = start(self.procs, self.a.peer_venv, pm, dm)
            except Exception as e:  # noqa: BLE001 - reported, the rest go on
                for name in (peer, stack):
                    if name in self.need:
                        self.dead[name] = f"did not start: {str(e).splitlines()[0][:200]}"
                        log(f"  {name}: {self.dead[name]}")
                continue
            if peer in self.need:
                self.targets[peer] = Target(peer, peer_proc, peer_port, [pm, dm], "pulled")
            if stack in self.need:
                self.add(stack, lambda stack=stack, pp=peer_proc, port=peer_port, pm=pm, dm=dm:
                         Target(stack, *self.envoy(stack, forward_envoy(self.a.wasm, port, None)),
                                [pm, dm], "pulled", second=pp))


def check_targets(targets: dict[str, Target], sizes, body_files: dict, dead: dict,
                  procs: Procs) -> None:
    """One request of each size through each configuration; one that fails
    is named in `dead` and left out."""
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


def target_ticks(t: Target) -> int:
    """CPU ticks of a target: both processes of a two-process stack."""
    return proc_ticks(t.proc.pid) + (proc_ticks(t.second.pid) if t.second else 0)


@dataclass
class Session:
    """One run: its options, what it started and what it measured."""
    a: argparse.Namespace
    sizes: list[str]
    concs: list[int]
    configs: list[str]
    scratch: Path
    procs: Procs
    body_files: dict = None
    targets: dict = None
    raw: list = None
    dead: dict = None
    notes: list = None
    warnings: list = None
    profiles: dict = None


def extra_cells(s: Session, t: Target, size: str, conc: int) -> None:
    """--perf and --syscalls: extra, unrecorded cells in the first repetition
    (sampling and tracepoints cost the router CPU, so they stay out of the
    medians)."""
    a = s.a
    if a.perf:
        perf_data = a.perf / f"{t.name}-{size}-c{conc}.data"
        run_cell(a.loadgen, t, s.body_files[size], conc, a.duration, a.warmup, perf_data)
        if perf_data.exists():
            shares = perf_shares(perf_data)
            s.profiles[(t.name, size, conc)] = shares
            log(f"      perf {t.name} {size} c={conc}: " + ", ".join(
                f"{where} {pct:.1f}%" for pct, where in shares[:6]))
    if a.syscalls:
        out = s.scratch / f"stat-{t.name}-{size}-c{conc}.txt"
        r0 = run_cell(a.loadgen, t, s.body_files[size], conc, a.duration, a.warmup, out,
                      stat=True)
        n = r0.get("completed") or 0
        if out.exists() and n:
            counts = perf_counts(out) | r0.get("io", {})
            log(f"      per request, {t.name} {size} c={conc}: " + ", ".join(
                f"{k} {v / n:.2f}" for k, v in counts.items()))


def measure_cell(s: Session, rep: int, size: str, conc: int, t: Target) -> dict:
    """One cell of one repetition, recorded in `s.raw`."""
    a = s.a
    try:
        if rep == 0:
            extra_cells(s, t, size, conc)
        r = run_cell(a.loadgen, t, s.body_files[size], conc, a.duration, a.warmup)
    except Exception as e:  # noqa: BLE001 - keep the rest going
        r = {"completed": 0, "errors": None, "first_error": str(e)[:300]}
    core = r.get("core_busy") or []
    s.raw.append({
        "rep": rep + 1, "body": size, "body_bytes": SIZES[size],
        "concurrency": conc, "config": t.name,
        "completed": r.get("completed"), "errors": r.get("errors"),
        "elapsed_s": r.get("elapsed_s"), "rps": r.get("rps"),
        "cpu_s": r.get("cpu_s"), "cpu_s_second": r.get("cpu_s_second"),
        "cpu_us_per_req": r.get("cpu_us_per_req"),
        "p50_ms": r.get("p50_ms"), "p99_ms": r.get("p99_ms"),
        "core0_busy": core[0] if len(core) > 0 else None,
        "core1_busy": core[1] if len(core) > 1 else None,
        "first_error": r.get("first_error") or "",
    })
    return r


def measure(s: Session) -> None:
    """Every repetition visits every cell, the configuration order rotated."""
    a, targets = s.a, s.targets
    order = [c for c in s.configs if c in targets]
    done = 0
    total = len(order) * len(s.sizes) * len(s.concs) * a.reps
    for rep in range(a.reps):
        rot = order[rep % len(order):] + order[:rep % len(order)] if order else []
        for size in s.sizes:
            for conc in s.concs:
                for name in rot:
                    t = targets[name]
                    if t.dead:
                        continue
                    gone = [q for q in (t.proc, t.second) if q and q.poll() is not None]
                    if gone:
                        t.dead = f"exited with {gone[0].returncode} during the run"
                        s.dead[name] = t.dead
                        log(f"  {name}: {t.dead}\n{s.procs.log_tail(name, 5)}")
                        continue
                    r = measure_cell(s, rep, size, conc, t)
                    done += 1
                    bad = "" if r.get("errors") == 0 else f"  ERRORS {r.get('errors')}: {r.get('first_error')}"
                    log(f"  [{done:>3}/{total}] rep {rep + 1} {size:>4} c={conc:<2} {name:<19} "
                        f"{fmt(r.get('cpu_us_per_req')):>8} us/req {fmt(r.get('rps'), '{:.0f}'):>6} req/s"
                        f"{bad[:240]}")


def start_thrash(s: Session):
    """--idle-thrash: runs only when the router core would otherwise idle;
    between a router's requests it evicts every cache level."""
    thrash = s.procs.start("idle-thrash", [
        "chrt", "-i", "0", sys.executable, "-c",
        "b = bytearray(64 << 20)\nz = bytes(len(b[::64]))\n"
        "while True:\n    b[::64] = z"], ROUTER_CORE)
    s.notes.append("--idle-thrash: an idle-priority process overwrote 64 MiB on the "
                   "router core throughout (the core never idled; its caches were overwritten "
                   "in every wait)")
    log(s.notes[-1])
    return thrash


def run(s: Session) -> None:
    """Starts everything, checks it, measures every cell."""
    s.body_files = {}
    for size in s.sizes:
        f = s.scratch / f"body-{size}.json"
        f.write_bytes(make_body(SIZES[size]))
        s.body_files[size] = f
    log("starting mock engines (core 1)")
    s.targets = Starter(s.a, s.procs, s.configs, s.dead).start_all()
    check_targets(s.targets, s.sizes, s.body_files, s.dead, s.procs)
    # What the routers cost while idle (scrapes, timers, health checks):
    # they all share core 0 with the one being measured.
    idle_check(s.targets, s.notes, s.warnings, "before the run", target_ticks)
    thrash = start_thrash(s) if s.a.idle_thrash else None
    measure(s)
    if thrash is not None:
        thrash.terminate()
        thrash.wait(timeout=10)
    if s.targets:
        idle_check(s.targets, s.notes, s.warnings, "after the run", target_ticks)


def write_results(s: Session, ok: bool, t_start: float) -> int:
    """latest.csv, latest-raw.csv, latest.txt and latest.png; the exit status."""
    a, sizes, concs, configs, dead = s.a, s.sizes, s.concs, s.configs, s.dead
    rows = aggregate(s.raw, sizes, concs, configs, dead)
    a.out.mkdir(parents=True, exist_ok=True)
    write_csvs(a.out, s.raw, rows, sizes, concs, configs)
    text = report(rows, sizes, concs, configs, dead, (time.time() - t_start) / 60)
    if a.wasm_b:
        text += "\n\n" + paired_report(s.raw, sizes, concs,
                                       [c for c in configs if c + "@b" in configs],
                                       a.wasm, a.wasm_b)
    if s.notes:
        text += "\n\n" + "\n".join(s.notes)
    if s.warnings:
        text += "\n\n" + "\n".join(s.warnings)
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


def main() -> int:
    a, sizes, concs, configs = parse_args()
    t_start = time.time()
    cells = len(sizes) * len(concs) * len(configs)
    log(f"bench: {len(configs)} configurations x {len(sizes)} sizes x {len(concs)} concurrencies"
        f" = {cells} cells x {a.reps} repetitions, {a.warmup + a.duration:.1f} s each: about "
        f"{cells * a.reps * (a.warmup + a.duration + 0.05) / 60:.1f} min of load")

    scratch = Path(tempfile.mkdtemp(prefix="pd-bench-"))
    s = Session(a, sizes, concs, configs, scratch, Procs(scratch), raw=[], dead={}, notes=[],
                warnings=[], profiles={}, targets={})

    interrupt_on_sigterm()
    if a.perf:
        a.perf.mkdir(parents=True, exist_ok=True)
    ok = run_measured(lambda: run(s), s.procs, scratch, a.keep)
    return write_results(s, ok, t_start)


if __name__ == "__main__":
    sys.exit(main())

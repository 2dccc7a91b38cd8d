"""The decider's bench rows (issue 25): what not splitting saves, at c=1.

Two workloads, each request a new one:

  chat-200     a 200-token chat: a system and a user message, about 800
               bytes of text, the question numbered per request
  followup-4k  a follow-up turn of a 4,000-token conversation: the same
               16,000 bytes of earlier turns (user and assistant), then a new
               last user message per request

each measured at concurrency 1 against:

  pd-vllm          pd-router in Envoy, vLLM NIXL, no decider: every request
                   split (prefill leg, KV pull, decode leg)
  pd-vllm+decider  the same with "decider": {"min_prompt_tokens": 256,
                   "min_uncached_tokens": 256}: the chat goes whole to the
                   decode pod (`short`), the follow-up turn too once the
                   decode pod served the conversation (`cached`)
  vllm-router      vllm-router, PD mode (as bench/run.py starts it), on the
                   same vLLM mocks
  smg              SMG (sglang-router's successor), PD mode, on SGLang mocks

The machinery is bench/run.py's (the shipped envoy.yaml, mocks and routers
started and pinned as there: routers on core 0, mocks and the client on core
1). The client is this script, not run.py's load generator, because every
request carries a different last message: a closed loop over one keep-alive
HTTP/1.1 connection, timing each answer. Each repetition visits every cell
(workload x configuration, the order rotated per repetition); the report has
the medians. CPU per request = the router process's CPU over the measured
window (the sum of its threads' run time, /proc/PID/task/*/schedstat, in ns)
/ the requests answered in it; prefill calls per request = the prefill
mock's answered requests over the same window / those requests.

Writes bench/results/decider.txt (the report), decider.csv (medians) and
decider-raw.csv (every repetition). Run by `./just bench-e2e` after run.py,
or directly once built: bench/.venv/bin/python bench/decider.py [--reps 3].
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .common import (interrupt_on_sigterm, run_measured, BENCH, CLK_TCK, LOAD_CORE, REPO, Procs, admin_port, fmt, http,
                     idle_check, log, median, proc_ticks, ratio, start_envoy)
from .engines import MODEL, Mock, start_mock, start_smg, start_vllm_router
from .envoy import pd_envoy

DECIDER = {"min_prompt_tokens": 256, "min_uncached_tokens": 256}
CONFIGS = [
    ("pd-vllm", "pd-router in Envoy, vLLM NIXL, no decider (every request split)"),
    ("pd-vllm+decider", "the same, decider min_prompt_tokens 256, min_uncached_tokens 256"),
    ("vllm-router", "vllm-router 0.1.17, PD mode, vLLM NIXL mocks (splits every request)"),
    ("smg", "SMG 1.13.0, PD mode, SGLang mocks (splits every request)"),
]
OFF, ON = "pd-vllm", "pd-vllm+decider"
PEERS = ["vllm-router", "smg"]
WORKLOADS = {
    "chat-200": "a 200-token chat (~800 bytes of messages), a new question each request",
    "followup-4k": "a follow-up turn of a 4,000-token conversation (16,000 bytes of earlier "
                   "turns, then a new last user message each request)",
}
# What each configuration must do with each workload's first three requests
# (checked before measuring): True = split (a prefill leg, the KV pulled),
# False = whole on the decode pod (no prefill leg, recomputed there).
EXPECT = {
    (OFF, "chat-200"): [True, True, True],
    (OFF, "followup-4k"): [True, True, True],
    (ON, "chat-200"): [False, False, False],
    # The first turn is fresh: split; the decode pod is remembered.
    (ON, "followup-4k"): [True, False, False],
}


# ---------------------------------------------------------------- workloads

def sentences(n_bytes: int, topic: str) -> str:
    """Numbered sentences: no two 128-byte blocks alike, as in a real prompt."""
    out, i, total = [], 0, 0
    while total < n_bytes:
        s = f"In part {i} of the {topic}, the council met again and the vote was close. "
        out.append(s)
        total += len(s)
        i += 1
    return "".join(out)[:n_bytes]


class Workload:
    """Request bodies: a fixed serialized head, a per-request last message."""

    def __init__(self, name: str):
        self.name = name
        if name == "chat-200":
            system = "You are a helpful assistant. Answer briefly and cite your sources."
            context = sentences(640, "history of the Roman republic")
            head = [{"role": "system", "content": system}]
            self.last = ("Context: " + context + " Question {i}: what happened in part {i}, "
                         "and why did the vote go that way?")
        else:
            turns = []
            per_turn = 16000 // 6
            for t in range(6):
                role = "user" if t % 2 == 0 else "assistant"
                turns.append({"role": role,
                              "content": sentences(per_turn, f"conversation turn {t}")})
            head = turns
            self.last = ("Follow-up question {i}: given all of the above, what happened "
                         "next in part {i}, and who voted against it?")
        prefix = json.dumps({"model": MODEL, "messages": head + [{"role": "user",
                                                                   "content": "\0"}],
                             "max_tokens": 4}, separators=(",", ":"))
        a, b = prefix.split("\\u0000")
        self.head, self.tail = a.encode(), b.encode()
        self.text_bytes = sum(len(m["content"]) for m in head) + len(self.last.format(i=0))

    def body(self, i: int) -> bytes:
        return self.head + self.last.format(i=i).encode() + self.tail


# ------------------------------------------------------------------- client

class Client:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, port: int, path: str = "/v1/chat/completions"):
        self.port = port
        self.start = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
                      "content-type: application/json\r\ncontent-length: ").encode()
        self.sock: socket.socket | None = None
        self.buf = b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.buf = b""

    def _recv(self) -> None:
        chunk = self.sock.recv(262144)
        if not chunk:
            raise ConnectionError("connection closed mid-answer")
        self.buf += chunk

    def request(self, body: bytes) -> tuple[int, bytes, bytes]:
        """(status, raw header block in lower case, body)."""
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(self.start + str(len(body)).encode() + b"\r\n\r\n" + body)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._recv()
        head, self.buf = self.buf[:end].lower(), self.buf[end + 4:]
        status = int(head[9:12])
        m = re.search(rb"\r\ncontent-length:\s*(\d+)", head)
        if m:
            n = int(m.group(1))
            while len(self.buf) < n:
                self._recv()
            payload, self.buf = self.buf[:n], self.buf[n:]
        elif b"transfer-encoding: chunked" in head:
            parts = []
            while True:
                while (e := self.buf.find(b"\r\n")) < 0:
                    self._recv()
                size = int(self.buf[:e].split(b";")[0], 16)
                while len(self.buf) < e + 2 + size + 2:
                    self._recv()
                parts.append(self.buf[e + 2:e + 2 + size])
                self.buf = self.buf[e + 2 + size + 2:]
                if size == 0:
                    break
            payload = b"".join(parts)
        else:
            raise RuntimeError(f"answer without a length: {head[:200]!r}")
        if b"connection: close" in head:
            self.close()
        return status, head, payload


def header(head: bytes, name: bytes) -> str | None:
    m = re.search(rb"\r\n" + name + rb":\s*([^\r]*)", head)
    return m.group(1).decode() if m else None


# ---------------------------------------------------------------------- cpu

def cpu_ns(pid: int) -> dict[int, int]:
    """Each thread's time on a CPU so far, in ns (tid -> ns)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out[int(tid)] = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def window_cpu_s(t0: dict[int, int], t1: dict[int, int], ticks0: int, ticks1: int) -> float:
    """CPU seconds between two readings: per-thread ns, unless a thread ended
    in between (its time is then only in /proc/PID/stat's 10 ms ticks)."""
    if set(t0) - set(t1):
        return (ticks1 - ticks0) / CLK_TCK
    return sum(ns - t0.get(tid, 0) for tid, ns in t1.items()) / 1e9


# -------------------------------------------------------------------- bench

@dataclass
class Target:
    name: str
    proc: object
    port: int
    prefill: Mock
    decode: Mock
    admin: int | None = None
    seq: dict = field(default_factory=dict)
    dead: str | None = None


def decisions(t: Target) -> dict[str, int]:
    """The decider's verdicts so far, by reason (Envoy's stats)."""
    if t.admin is None:
        return {}
    _, _, body = http("GET", f"http://127.0.0.1:{t.admin}/stats?filter=decisions")
    out: dict[str, int] = {}
    for line in body.decode(errors="replace").splitlines():
        m = re.search(r"pd_reason=\.=(\w+);.*:\s*(\d+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
    return out


def check(t: Target, w: Workload) -> str:
    """The first requests of a workload: 200, split or not as expected."""
    c = Client(t.port)
    seen = []
    try:
        for k in range(3):
            i = t.seq.get(w.name, 0)
            t.seq[w.name] = i + 1
            p0 = t.prefill.finished()
            status, head, payload = c.request(w.body(i))
            if status != 200:
                raise RuntimeError(f"status {status}: {payload[:200]!r}")
            kv = header(head, b"x-mock-kv")
            # A prefill leg may be counted a little after the answer (SGLang's
            # legs run side by side): wait for it, briefly.
            deadline = time.time() + 0.5
            while not (split := t.prefill.finished() > p0) and time.time() < deadline:
                time.sleep(0.02)
            if t.name.startswith("pd-") and split != (header(head, b"prefill-target-pod")
                                                     is not None):
                raise RuntimeError("the prefill-target-pod header and the prefill mock disagree")
            if split and kv != "pulled":
                raise RuntimeError(f"split, but the answer has x-mock-kv {kv!r}")
            if not split and kv != "recomputed":
                raise RuntimeError(f"not split, but the answer has x-mock-kv {kv!r}")
            want = EXPECT.get((t.name, w.name))
            if want is not None and split != want[k]:
                raise RuntimeError(f"request {k + 1}: {'split' if split else 'whole'}, "
                                   f"expected {'split' if want[k] else 'whole'}")
            if want is None and not split:
                raise RuntimeError(f"request {k + 1} was not split")
            seen.append("split" if split else "whole")
    finally:
        c.close()
    return ", ".join(seen)


def run_cell(t: Target, w: Workload, warmup: float, duration: float) -> dict:
    c = Client(t.port)
    n = errors = 0
    first_error = ""
    lat: list[float] = []
    clock = time.perf_counter

    def one(i: int) -> bool:
        nonlocal errors, first_error
        try:
            status, _, payload = c.request(w.body(i))
        except (OSError, RuntimeError, ValueError) as e:
            status, payload = 0, str(e).encode()
            c.close()
        if status != 200:
            errors += 1
            first_error = first_error or f"{status}: {payload[:200]!r}"
            return False
        return True

    gc.disable()
    try:
        end = clock() + warmup
        while clock() < end:
            i = t.seq.get(w.name, 0)
            t.seq[w.name] = i + 1
            one(i)
        # The window's edges fall between two requests (c=1): every answer
        # inside it is counted whole, and nothing is in flight at a reading.
        p0, d0 = t.prefill.finished(), t.decode.finished()
        c0, k0 = cpu_ns(t.proc.pid), proc_ticks(t.proc.pid)
        start = clock()
        end = start + duration
        while clock() < end:
            i = t.seq.get(w.name, 0)
            t.seq[w.name] = i + 1
            a = clock()
            if one(i):
                lat.append(clock() - a)
                n += 1
        elapsed = clock() - start
        c1, k1 = cpu_ns(t.proc.pid), proc_ticks(t.proc.pid)
        p1, d1 = t.prefill.finished(), t.decode.finished()
    finally:
        gc.enable()
        c.close()
    cpu = window_cpu_s(c0, c1, k0, k1)
    lat.sort()

    def pct(q):
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else None

    return {"completed": n, "errors": errors, "elapsed_s": elapsed,
            "rps": n / elapsed if elapsed else None, "cpu_s": cpu,
            "cpu_us_per_req": cpu * 1e6 / n if n else None,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "prefill_per_req": (p1 - p0) / n if n else None,
            "decode_per_req": (d1 - d0) / n if n else None,
            "first_error": first_error}


def start_all(a, procs: Procs, configs: list[str], dead: dict) -> dict[str, Target]:
    targets: dict[str, Target] = {}
    mocks: dict[str, Mock] = {}

    def mock(name, *args):
        if name not in mocks:
            mocks[name] = start_mock(procs, a.mock, name, list(args))
        return mocks[name]

    def vllm():
        # One vLLM pair for the three vLLM configurations (only the one being
        # measured gets traffic). The decode pod computes a prompt that comes
        # without a hand-off (--allow-recompute), as a vLLM decode pod does.
        return (mock("vllm-prefill", "--engine", "vllm", "--role", "prefill", "--connector",
                     "nixl", "--lenient-prefill"),
                mock("vllm-decode", "--engine", "vllm", "--role", "decode",
                     "--allow-recompute"))

    for name in configs:
        try:
            if name in (OFF, ON):
                pm, dm = vllm()
                model = {"name": MODEL, "engine": "vllm",
                         "rolesets": [{"name": "rs0", "prefill": [pm.endpoint()],
                                       "decode": [dm.endpoint()]}]}
                if name == ON:
                    model["decider"] = DECIDER
                plugin = {"prefill_timeout_ms": 30000, "kv_connector": "nixl",
                          "models": [model]}
                p, port = start_envoy(procs, a.envoy, name, pd_envoy(a.wasm, plugin))
                targets[name] = Target(name, p, port, pm, dm,
                                       admin=admin_port(procs.scratch, name))
            elif name == "vllm-router":
                pm, dm = vllm()
                p, port = start_vllm_router(procs, a.peer_venv, pm, dm)
                targets[name] = Target(name, p, port, pm, dm)
            elif name == "smg":
                pm = mock("sglang-prefill", "--engine", "sglang", "--role", "prefill",
                          "--lenient-prefill")
                dm = mock("sglang-decode", "--engine", "sglang", "--role", "decode")
                p, port = start_smg(procs, a.peer_venv, pm, dm)
                targets[name] = Target(name, p, port, pm, dm)
        except Exception as e:  # noqa: BLE001 - reported, the rest go on
            dead[name] = f"did not start: {str(e).splitlines()[0][:200]}"
            log(f"  {name}: {dead[name]}")
    return targets


def report(rows: dict, configs: list[str], workloads: list[str], dead: dict,
           verdicts: dict, checks: dict, sizes: dict[str, str]) -> str:
    out = []
    w = out.append
    w("Decider rows (issue 25): concurrency 1, one request at a time, each with a new last "
      "message.")
    w("Medians over repetitions. cpu_us/req = the router process's CPU (its threads' run "
      "time) per answered request;")
    w("for pd-router that is the whole Envoy. prefill/req = calls the prefill mock answered "
      "per request.")
    w("Mocks answer in well under a millisecond: the latencies are the router's hops and "
      "the mocks' HTTP work,")
    w("not GPU time. What not splitting saves here is the prefill call, the KV pull and a "
      "hop, never a prefill's compute.")
    w("")
    for wl in workloads:
        w(f"{wl}: {WORKLOADS[wl]}")
        if wl in sizes:
            w(f"  {sizes[wl]}")
    w("")
    hdr = (f"{'workload':<12} {'config':<16} {'cpu_us/req':>10} {'p50_ms':>7} {'p99_ms':>7} "
           f"{'req/s':>6} {'prefill/req':>11}  {'cpu vs off':>10} {'p50 vs off':>10}  "
           f"{'cpu vs vllm-r':>13} {'p50 vs vllm-r':>13}  {'cpu vs smg':>15} "
           f"{'p50 vs smg':>15}")
    w(hdr)
    w("-" * len(hdr))

    def get(wl, c, k):
        return rows.get((wl, c), {}).get(k)

    def fr(x):
        return "-" if x is None else f"{x:.2f}x"

    for wl in workloads:
        for c in configs:
            r = rows.get((wl, c))
            if r is None:
                w(f"{wl:<12} {c:<16} (not measured: {dead.get(c, 'no answer')})"[:160])
                continue
            flag = "!" if r["errors"] else " "
            w(f"{wl:<12} {c:<16} {fmt(r['cpu_us']):>10}{flag}{fmt(r['p50'], '{:.3f}'):>7} "
              f"{fmt(r['p99'], '{:.3f}'):>7} {fmt(r['rps'], '{:.0f}'):>6} "
              f"{fmt(r['prefill'], '{:.2f}'):>11}  "
              f"{fr(ratio(r['cpu_us'], get(wl, OFF, 'cpu_us'))):>10} "
              f"{fr(ratio(r['p50'], get(wl, OFF, 'p50'))):>10}  "
              f"{fr(ratio(r['cpu_us'], get(wl, 'vllm-router', 'cpu_us'))):>13} "
              f"{fr(ratio(r['p50'], get(wl, 'vllm-router', 'p50'))):>13}  "
              f"{fr(ratio(r['cpu_us'], get(wl, 'smg', 'cpu_us'))):>15} "
              f"{fr(ratio(r['p50'], get(wl, 'smg', 'p50'))):>15}")
        w("")
    w("Summary, concurrency 1 (a ratio below 1: less CPU per request or a lower p50 than "
      "the yardstick):")
    w(f"  {'ratio':<34}" + "".join(f"{wl + ' cpu':>17}{wl + ' p50':>17}" for wl in workloads))
    for a, b, what in [(ON, OFF, "decider on / off"),
                       (ON, "vllm-router", "decider on / vllm-router"),
                       (ON, "smg", "decider on / smg"),
                       (OFF, "vllm-router", "decider off / vllm-router"),
                       (OFF, "smg", "decider off / smg")]:
        w(f"  {what:<34}" + "".join(
            f"{fr(ratio(get(wl, a, 'cpu_us'), get(wl, b, 'cpu_us'))):>17}"
            f"{fr(ratio(get(wl, a, 'p50'), get(wl, b, 'p50'))):>17}" for wl in workloads))
    w("")
    if checks:
        w("Checked before measuring (each configuration's first three requests of each "
          "workload):")
        for (c, wl), seen in checks.items():
            w(f"  {c:<16} {wl:<12} {seen}")
        w("")
    if verdicts:
        w("The decider's verdicts over the whole run (pd_router_decisions, Envoy's stats):")
        for c, v in verdicts.items():
            w(f"  {c}: " + (", ".join(f"{k} {n}" for k, n in sorted(v.items()))
                            or "none (no decider: every request split)"))
    return "\n".join(out)


def parse_args():
    """The options, checked: (options, configurations, workloads)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.5,
                    help="measured seconds per cell (default 1.5)")
    ap.add_argument("--warmup", type=float, default=0.3,
                    help="unmeasured seconds of requests before each window (default 0.3)")
    ap.add_argument("--configs", default=",".join(c for c, _ in CONFIGS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", type=Path, default=BENCH / "results")
    ap.add_argument("--envoy", type=Path,
                    default=Path(os.environ.get("ENVOY_BIN", REPO / ".venv/bin/envoy")))
    ap.add_argument("--wasm", type=Path, default=Path(os.environ.get(
        "PD_ROUTER_WASM", REPO / "target/wasm32-wasip1/release/pd_router.wasm")))
    ap.add_argument("--mock", type=Path, default=REPO / "target/release/mock-engine")
    ap.add_argument("--peer-venv", type=Path, default=BENCH / ".venv")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    a = ap.parse_args()
    configs = [c for c in a.configs.split(",") if c]
    workloads = [w for w in a.workloads.split(",") if w]
    for c in configs:
        if c not in dict(CONFIGS):
            ap.error(f"unknown config {c} (one of {', '.join(dict(CONFIGS))})")
    for wl in workloads:
        if wl not in WORKLOADS:
            ap.error(f"unknown workload {wl} (one of {', '.join(WORKLOADS)})")
    for what, p in (("envoy", a.envoy), ("wasm", a.wasm), ("mock-engine", a.mock)):
        if not p.exists():
            ap.error(f"{what} not found at {p} (run `./just bench-e2e`, which builds everything)")
    if (os.cpu_count() or 1) < 2:
        ap.error("needs 2 cores: the router is pinned to core 0, the load to core 1")
    a.wasm = a.wasm.resolve()
    return a, configs, workloads


@dataclass
class Session:
    """One run: its options, what it started and what it measured."""
    a: argparse.Namespace
    configs: list[str]
    workloads: list[str]
    wls: dict
    procs: Procs
    raw: list = field(default_factory=list)
    dead: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    checks: dict = field(default_factory=dict)
    verdicts: dict = field(default_factory=dict)


def check_all(s: Session, targets: dict[str, Target]) -> None:
    """Each workload's first three requests through each configuration; one
    that fails is named in `s.dead` and left out."""
    log("checking each configuration with each workload's first three requests")
    for name in list(targets):
        t = targets[name]
        try:
            for wl in s.wls.values():
                s.checks[(name, wl.name)] = check(t, wl)
            log(f"  {name}: ok (pid {t.proc.pid}, port {t.port})")
        except Exception as e:  # noqa: BLE001
            s.dead[name] = f"failed its check: {e}"[:300]
            log(f"  {name}: {s.dead[name]}\n{s.procs.log_tail(name, 5)}")
            del targets[name]


RAW_FIELDS = ["rep", "workload", "config", "completed", "errors", "elapsed_s", "rps",
              "cpu_s", "cpu_us_per_req", "p50_ms", "p99_ms", "prefill_per_req",
              "decode_per_req", "first_error"]


def measure(s: Session, targets: dict[str, Target]) -> None:
    """Every repetition visits every cell, the configuration order rotated."""
    a = s.a
    order = [c for c in s.configs if c in targets]
    total = len(order) * len(s.workloads) * a.reps
    done = 0
    for rep in range(a.reps):
        rot = order[rep % len(order):] + order[:rep % len(order)] if order else []
        for wl in s.workloads:
            for name in rot:
                t = targets[name]
                if t.proc.poll() is not None:
                    s.dead[name] = f"exited with {t.proc.returncode} during the run"
                    continue
                try:
                    r = run_cell(t, s.wls[wl], a.warmup, a.duration)
                except Exception as e:  # noqa: BLE001 - keep the rest going
                    r = {"completed": 0, "errors": None, "first_error": str(e)[:300]}
                done += 1
                s.raw.append({"rep": rep + 1, "workload": wl, "config": name,
                              **{k: r.get(k) for k in RAW_FIELDS[3:]}})
                bad = "" if r.get("errors") == 0 else \
                    f"  ERRORS {r.get('errors')}: {r.get('first_error')}"
                log(f"  [{done:>2}/{total}] rep {rep + 1} {wl:<12} {name:<16} "
                    f"{fmt(r.get('cpu_us_per_req')):>7} us/req "
                    f"p50 {fmt(r.get('p50_ms'), '{:.3f}')} ms "
                    f"prefill/req {fmt(r.get('prefill_per_req'), '{:.2f}')}{bad[:200]}")


def run(s: Session) -> None:
    """Starts everything, checks it, measures every cell, reads the
    decider's verdicts."""
    log("starting mocks (core 1) and routers (core 0)")
    targets = start_all(s.a, s.procs, s.configs, s.dead)
    check_all(s, targets)
    # The client shares core 1 with the mocks, as run.py's load generator.
    os.sched_setaffinity(0, {int(LOAD_CORE)})
    idle_check(targets, s.notes, s.warnings, "before the run")
    measure(s, targets)
    if targets:
        idle_check(targets, s.notes, s.warnings, "after the run")
    for name, t in targets.items():
        if t.admin is not None:
            s.verdicts[name] = decisions(t)


def aggregate(s: Session) -> dict:
    """Medians over the repetitions that answered requests; a cell none
    answered names its configuration in `s.dead`."""
    rows: dict = {}
    raw = s.raw
    for wl in s.workloads:
        for c in s.configs:
            rs = [r for r in raw if (r["workload"], r["config"]) == (wl, c)
                  and (r["completed"] or 0) > 0]
            if rs:
                rows[(wl, c)] = {
                    "cpu_us": median(r["cpu_us_per_req"] for r in rs),
                    "p50": median(r["p50_ms"] for r in rs),
                    "p99": median(r["p99_ms"] for r in rs),
                    "rps": median(r["rps"] for r in rs),
                    "prefill": median(r["prefill_per_req"] for r in rs),
                    "errors": sum((r["errors"] or 0) for r in rs),
                    "reps": len(rs),
                }
            elif any((r["workload"], r["config"]) == (wl, c) for r in raw):
                first = next(r for r in raw if (r["workload"], r["config"]) == (wl, c))
                s.dead.setdefault(c, f"no request answered: {first['first_error'][:120]}")
    return rows


def write_csvs(s: Session, rows: dict) -> None:
    """decider-raw.csv (every repetition) and decider.csv (the medians)."""
    out = s.a.out
    with open(out / "decider-raw.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=RAW_FIELDS)
        wr.writeheader()
        wr.writerows(s.raw)
    with open(out / "decider.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["workload", "concurrency", "config", "cpu_us_per_req", "p50_ms", "p99_ms",
                     "rps", "prefill_calls_per_req", "cpu_vs_decider_off", "p50_vs_decider_off",
                     "cpu_vs_vllm_router", "p50_vs_vllm_router", "cpu_vs_smg",
                     "p50_vs_smg", "errors", "reps"])

        def num(x, spec="{:.4f}"):
            return "" if x is None else spec.format(x)

        for wl in s.workloads:
            for c in s.configs:
                r = rows.get((wl, c))
                if r is None:
                    continue
                base = {k: rows.get((wl, k), {}) for k in (OFF, *PEERS)}
                wr.writerow([wl, 1, c, num(r["cpu_us"], "{:.2f}"), num(r["p50"], "{:.3f}"),
                             num(r["p99"], "{:.3f}"), num(r["rps"], "{:.1f}"),
                             num(r["prefill"], "{:.3f}"),
                             num(ratio(r["cpu_us"], base[OFF].get("cpu_us"))),
                             num(ratio(r["p50"], base[OFF].get("p50"))),
                             num(ratio(r["cpu_us"], base["vllm-router"].get("cpu_us"))),
                             num(ratio(r["p50"], base["vllm-router"].get("p50"))),
                             num(ratio(r["cpu_us"], base["smg"].get("cpu_us"))),
                             num(ratio(r["p50"], base["smg"].get("p50"))),
                             r["errors"], r["reps"]])


def write_results(s: Session, ok: bool, sizes: dict, t_start: float) -> int:
    """decider.txt, decider.csv, decider-raw.csv; the exit status."""
    a, dead = s.a, s.dead
    rows = aggregate(s)
    a.out.mkdir(parents=True, exist_ok=True)
    write_csvs(s, rows)
    text = report(rows, s.configs, s.workloads, dead, s.verdicts, s.checks, sizes)
    if s.notes:
        text += "\n\n" + "\n".join(s.notes)
    if s.warnings:
        text += "\n\n" + "\n".join(s.warnings)
    if dead:
        text += "\n\nNot measured / failed:\n" + "\n".join(f"  {c}: {why}"
                                                          for c, why in dead.items())
    elapsed = time.time() - t_start
    text += (f"\n\nWall time: {elapsed:.0f} s ({a.reps} repetitions, {a.warmup:g} s warm-up + "
             f"{a.duration:g} s windows)")
    (a.out / "decider.txt").write_text(text + "\n")
    print(text)
    log(f"wrote {a.out / 'decider.txt'}, decider.csv, decider-raw.csv")
    return 0 if ok and not dead else 1


def main() -> int:
    a, configs, workloads = parse_args()
    t_start = time.time()
    log(f"decider rows: {len(configs)} configurations x {len(workloads)} workloads x "
        f"{a.reps} repetitions, {a.warmup + a.duration:.1f} s each: about "
        f"{len(configs) * len(workloads) * a.reps * (a.warmup + a.duration) / 60:.1f} min of load")
    scratch = Path(tempfile.mkdtemp(prefix="pd-decider-"))
    procs = Procs(scratch)

    interrupt_on_sigterm()
    wls = {wl: Workload(wl) for wl in workloads}
    sizes = {wl.name: f"{len(wl.body(0))}-byte bodies, {wl.text_bytes} bytes of message text "
                      f"(~{wl.text_bytes // 4} tokens at 4 bytes a token)" for wl in wls.values()}
    for name, size in sizes.items():
        log(f"  {name}: {size}")
    s = Session(a, configs, workloads, wls, procs)
    ok = run_measured(lambda: run(s), procs, scratch, a.keep)
    return write_results(s, ok, sizes, t_start)


if __name__ == "__main__":
    sys.exit(main())

"""The no-hop bench (issue 38): pd-router deciding and executing inside
Envoy, against an endpoint picker reached over ext_proc and against
vllm-router, with long prompts at high concurrency and mock engines that
answer at once.

Rows (bench/pdbench/nohop_configs.py): the buffer-only Envoy and the
minimal PD filter doing vLLM NIXL's hand-off (`min-pd-vllm`, the TTFT
floor); Envoy + pd-router (`pd-vllm`); Envoy + GIE v1.5.0's endpoint picker
with llm-d's PD plugins over ext_proc (FULL_DUPLEX_STREAMED, TLS, as
deploy/envoy-epp ships it), pd-router executing its picks in place of
llm-d's routing sidecar (`epp+pd-vllm`); vllm-router alone and behind Envoy.
Every router process is pinned to core 0 (Envoy --concurrency 1, the picker
GOMAXPROCS=1, vllm-router one Tokio worker); the mocks, the load generator,
kube-apiserver and etcd to core 1.

Workload: chat bodies of 220 KB, 64 KB and 1 KB at concurrency 20, 50, 100
and 150 (closed loop, one keep-alive connection per worker), and at 1 KB
c=32 the CPU target's cell, where `min-pd` and `pd-default` run too. Per
cell: requests/s, latency p50/p99 (the mocks answer a non-streamed
4-token completion at once, so the whole answer is the first token), the
added TTFT over `min-pd-vllm` in the same repetition, the CPU time of every
process in the path over the window (each thread's run time,
/proc/PID/task/*/schedstat), and each one's peak RSS over the cell (VmHWM,
reset before the cell through /proc/PID/clear_refs).

Writes bench/results/nohop.txt (the report), nohop.csv (medians),
nohop-raw.csv (every repetition) and nohop.png (added TTFT against
concurrency per router). `./just bench-nohop` builds what it needs first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .common import (interrupt_on_sigterm, run_measured, BENCH, LOAD_CORE, REPO, Procs, die_with_parent, fmt, http, idle_check, log,
                     peak_rss_mb, proc_ticks, settled)
from .decider import cpu_ns, window_cpu_s
from .e2e import ENGINES, Starter, Target, make_body, sanity_check
from .epp import start_epp_stack
from .nohop_configs import ALL_ROWS, CONCURRENCY, EPP, PATHS, SIZES, cells
from .nohop_report import replot, write_results


@dataclass
class Row:
    """A configuration's target and the processes in its path (label, process)."""
    target: Target
    path: list[tuple[str, subprocess.Popen]]


def arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.5, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=0.5,
                    help="unmeasured seconds of load before each window")
    ap.add_argument("--sizes", default="220K,64K,1K")
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument("--configs", default=",".join(ALL_ROWS))
    ap.add_argument("--quick", action="store_true",
                    help="one repetition of 220 KB and 1 KB at c=150 and the 1 KB c=32 cell, "
                         "1 s windows, written to a scratch directory unless --out names one "
                         "(the committed nohop.* stay the full run's)")
    ap.add_argument("--out", type=Path, default=None,
                    help="where the report goes (default bench/results)")
    ap.add_argument("--envoy", type=Path,
                    default=Path(os.environ.get("ENVOY_BIN", REPO / ".venv/bin/envoy")))
    ap.add_argument("--wasm", type=Path, default=Path(os.environ.get(
        "PD_ROUTER_WASM", REPO / "target/wasm32-wasip1/release/pd_router.wasm")))
    ap.add_argument("--min-wasm", type=Path, default=Path(os.environ.get(
        "MIN_PD_WASM", BENCH / "min-pd-filter/target/wasm32-wasip1/release/min_pd_filter.wasm")))
    ap.add_argument("--mock", type=Path, default=REPO / "target/release/mock-engine")
    ap.add_argument("--loadgen", type=Path, default=REPO / "target/release/loadgen")
    ap.add_argument("--peer-venv", type=Path, default=BENCH / ".venv")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    ap.add_argument("--replot", action="store_true",
                    help="no run: draw nohop.png again from nohop-raw.csv in --out")
    return ap


def parse_args():
    ap = arg_parser()
    a = ap.parse_args()
    if a.out is None:
        a.out = Path(tempfile.mkdtemp(prefix="nohop-quick-")) if a.quick else BENCH / "results"
    if a.quick:
        a.reps, a.duration, a.warmup = 1, 1.0, 0.5
        a.sizes, a.concurrency = "220K,1K", "150"
    sizes = [s for s in a.sizes.split(",") if s]
    concs = [int(c) for c in a.concurrency.split(",") if c]
    configs = [c for c in a.configs.split(",") if c]
    for s in sizes:
        if s not in SIZES:
            ap.error(f"unknown size {s} (known: {', '.join(SIZES)})")
    for c in configs:
        if c not in ALL_ROWS:
            ap.error(f"unknown configuration {c} (known: {', '.join(ALL_ROWS)})")
    for what, p in [("envoy", a.envoy), ("wasm", a.wasm), ("min-wasm", a.min_wasm),
                    ("mock-engine", a.mock), ("loadgen", a.loadgen)]:
        if not p.exists():
            ap.error(f"{what} not found at {p} (`./just bench-nohop` builds everything)")
    if (os.cpu_count() or 1) < 2:
        ap.error("needs 2 cores: the routers on core 0, the load on core 1")
    a.wasm, a.min_wasm = a.wasm.resolve(), a.min_wasm.resolve()
    # What e2e's Starter reads.
    a.wasm_b = None
    return a, sizes, concs, configs


# ---------------------------------------------------------------- start-up

def epp_settled(t: Target, body: bytes, prefill: str, timeout: float = 90) -> None:
    """Three answers in a row split onto the picked pods: the picker has the
    pool, its pods and their metrics, and pd-router has discovered them."""
    def attempt() -> tuple[bool, str]:
        status, headers, resp = http("POST", t.url, body, timeout=30)
        picked = {k.lower(): v for k, v in headers.items()}.get("prefill-target-pod")
        return status == 200 and picked == prefill, f"{status} {picked!r} {resp[:200]!r}"

    settled("the picker's row", attempt, streak=3, timeout=timeout, pause=0.25)


def start_rows(a, procs: Procs, configs: list[str], dead: dict, body_1k: bytes) -> dict[str, Row]:
    """Every row asked for: e2e's Starter for the Envoys, the floors and the
    peer; the picker's stack here. One that cannot start is named in `dead`."""
    rows: dict[str, Row] = {}
    targets = Starter(a, procs, [c for c in configs if c != EPP], dead).start_all()
    for name, t in targets.items():
        labels = PATHS[name]
        procs_in_path = [t.proc] + ([t.second] if t.second is not None else [])
        rows[name] = Row(t, list(zip(labels, procs_in_path)))
    if EPP in configs:
        p_args, d_args, kv = ENGINES["vllm"]
        try:
            st = start_epp_stack(procs, a.envoy, a.wasm, a.mock, p_args, d_args, EPP)
            t = Target(EPP, st.envoy, st.port, [st.prefill, st.decode], kv, second=st.epp)
            epp_settled(t, body_1k, st.prefill.name)
            rows[EPP] = Row(t, [("envoy", st.envoy), ("epp", st.epp)])
            rows["(kube-apiserver+etcd, not in the path)"] = Row(
                t, [("kube-apiserver", st.kube.apiserver), ("etcd", st.kube.etcd)])
        except Exception as e:  # noqa: BLE001 - reported, the rest go on
            dead[EPP] = f"did not start: {str(e).splitlines()[0][:300]}"
            log(f"  {EPP}: {dead[EPP]}\n{procs.log_tail('epp', 10)}")
    return rows


def check_rows(rows: dict[str, Row], body_files: dict, dead: dict, procs: Procs) -> None:
    """One request of each size through each row: 200, the hand-off done,
    both mocks reached; a row that fails is left out."""
    log("checking each configuration with one request per size")
    for name in [n for n in rows if not n.startswith("(")]:
        t = rows[name].target
        for size, f in body_files.items():
            try:
                sanity_check(t, f.read_bytes())
            except Exception as e:  # noqa: BLE001
                dead[name] = f"failed its check ({size}): {e}"[:300]
                log(f"  {name}: {dead[name]}\n{procs.log_tail(name, 5)}")
                del rows[name]
                break
        else:
            log(f"  {name}: ok (" + ", ".join(f"{lab} pid {p.pid}" for lab, p in rows[name].path)
                + f", port {t.port})")


# ----------------------------------------------------------------- a cell

def reset_peak(pid: int) -> None:
    """VmHWM back to the current RSS (Linux 4.0 and later)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# A slow row's cell runs long enough for its connections to finish their
# first round before the window (warm-up >= WARM_ROUNDS latencies) and a few
# rounds inside it (window >= WINDOW_ROUNDS latencies), the latency taken as
# concurrency / req/s of its last cell; at most MAX_WINDOW seconds.
WARM_ROUNDS = 2
WINDOW_ROUNDS = 5
MAX_WINDOW = 12.0


def cell_times(a, est: dict, name: str, size: str, conc: int) -> tuple[float, float]:
    """(warm-up, window) for a cell: the options', longer for a slow row."""
    rps = est.get((name, size, conc)) or est.get((name, size))
    lat = conc / rps if rps else 0.0
    return (min(MAX_WINDOW / 2, max(a.warmup, WARM_ROUNDS * lat)),
            min(MAX_WINDOW, max(a.duration, WINDOW_ROUNDS * lat)))


def run_cell(a, row: Row, body_file: Path, conc: int, warmup: float, duration: float) -> dict:
    """The load generator on core 1 for warmup + duration; each process of
    the path read at the window's edges (scaled to the load generator's
    exact window) and its peak RSS over the cell."""
    for _, p in row.path:
        reset_peak(p.pid)
    argv = ["taskset", "-c", LOAD_CORE, str(a.loadgen), "--url", row.target.url,
            "--body", str(body_file), "--concurrency", str(conc), "--duration", f"{duration:.3f}",
            "--warmup", f"{warmup:.3f}", "--timeout", "30"]
    lg = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    try:
        time.sleep(warmup)
        c0 = [(cpu_ns(p.pid), proc_ticks(p.pid)) for _, p in row.path]
        w0 = time.monotonic()
        time.sleep(duration)
        c1 = [(cpu_ns(p.pid), proc_ticks(p.pid)) for _, p in row.path]
        w1 = time.monotonic()
        out, err = lg.communicate(timeout=warmup + duration + 60)
    except subprocess.TimeoutExpired:
        raise RuntimeError("loadgen did not finish") from None
    finally:
        if lg.poll() is None:
            lg.kill()
            lg.communicate()
    if lg.returncode != 0:
        raise RuntimeError(f"loadgen exited {lg.returncode}: {err.strip()[-300:]}")
    r = json.loads(out.strip().splitlines()[-1])
    scale = (r.get("elapsed_s") or 0) / max(1e-9, w1 - w0)
    r["cpu_s"] = {lab: window_cpu_s(x0[0], x1[0], x0[1], x1[1]) * scale
                  for (lab, _), x0, x1 in zip(row.path, c0, c1)}
    r["rss_mb"] = {lab: peak_rss_mb(p.pid) for lab, p in row.path}
    return r


def record(rep: int, size: str, conc: int, name: str, r: dict) -> dict:
    n = r.get("completed") or 0
    core = r.get("core_busy") or []
    rec = {"rep": rep + 1, "body": size, "body_bytes": SIZES[size], "concurrency": conc,
           "config": name, "completed": r.get("completed"), "errors": r.get("errors"),
           "elapsed_s": r.get("elapsed_s"), "rps": r.get("rps"), "p50_ms": r.get("p50_ms"),
           "p99_ms": r.get("p99_ms"),
           "core0_busy": core[0] if core else None,
           "core1_busy": core[1] if len(core) > 1 else None,
           "first_error": r.get("first_error") or ""}
    cpu = r.get("cpu_s") or {}
    rec["cpu_us_per_req"] = sum(cpu.values()) * 1e6 / n if n and cpu else None
    for lab in ("envoy", "epp", "vllm-router"):
        rec[f"cpu_us_{lab}"] = cpu[lab] * 1e6 / n if n and lab in cpu else None
        rec[f"rss_mb_{lab}"] = (r.get("rss_mb") or {}).get(lab)
    rss = [v for v in (r.get("rss_mb") or {}).values() if v is not None]
    rec["rss_mb"] = sum(rss) if rss else None
    return rec


# ------------------------------------------------------------------ the run

@dataclass
class Session:
    a: argparse.Namespace
    sizes: list[str]
    concs: list[int]
    configs: list[str]
    procs: Procs
    raw: list
    dead: dict
    notes: list
    warnings: list
    rows: dict | None = None
    body_files: dict | None = None
    # (row, size[, concurrency]) -> req/s last measured: how long its cells run.
    est: dict = field(default_factory=dict)


def measure(s: Session) -> None:
    """Every repetition visits every cell (size, then concurrency, then each
    row, the row order rotated per repetition)."""
    grid = cells(s.sizes, s.concs, s.configs)
    total = sum(len(c[2]) for c in grid) * s.a.reps
    done = 0
    for rep in range(s.a.reps):
        for size, conc, names in grid:
            names = [n for n in names if n in s.rows]
            k = rep % len(names) if names else 0
            for name in names[k:] + names[:k]:
                row = s.rows[name]
                gone = [p for _, p in row.path if p.poll() is not None]
                if gone:
                    s.dead[name] = f"exited with {gone[0].returncode} during the run"
                    log(f"  {name}: {s.dead[name]}")
                    del s.rows[name]
                    continue
                warm, window = cell_times(s.a, s.est, name, size, conc)
                try:
                    r = run_cell(s.a, row, s.body_files[size], conc, warm, window)
                except Exception as e:  # noqa: BLE001 - keep the rest going
                    r = {"completed": 0, "errors": None, "first_error": str(e)[:300]}
                if r.get("rps"):
                    s.est[(name, size)] = s.est[(name, size, conc)] = r["rps"]
                rec = record(rep, size, conc, name, r)
                rec["warmup_s"] = round(warm, 3)
                s.raw.append(rec)
                done += 1
                bad = "" if r.get("errors") == 0 else f"  ERRORS {r.get('errors')}: {rec['first_error'][:200]}"
                log(f"  [{done:>3}/{total}] rep {rep + 1} {size:>4} c={conc:<3} {name:<19} "
                    f"{fmt(rec['cpu_us_per_req'], '{:.0f}'):>6} us/req {fmt(r.get('rps'), '{:.0f}'):>5} req/s "
                    f"p50 {fmt(r.get('p50_ms'))} p99 {fmt(r.get('p99_ms'))} ms "
                    f"rss {fmt(rec['rss_mb'], '{:.0f}')} MB{bad}")


def run(s: Session) -> None:
    s.body_files = {}
    for size in s.sizes + (["1K"] if "1K" not in s.sizes else []):
        f = s.procs.scratch / f"body-{size}.json"
        f.write_bytes(make_body(SIZES[size]))
        s.body_files[size] = f
    log("starting mocks (core 1) and routers (core 0)")
    s.rows = start_rows(s.a, s.procs, s.configs, s.dead, s.body_files["1K"].read_bytes())
    s.body_files = {k: v for k, v in s.body_files.items() if k in s.sizes}
    check_rows(s.rows, s.body_files, s.dead, s.procs)

    def ticks(r: Row) -> int:
        return sum(proc_ticks(p.pid) for _, p in r.path)

    idle_check(s.rows, s.notes, s.warnings, "before the run", ticks)
    s.rows = {n: r for n, r in s.rows.items() if not n.startswith("(")}
    measure(s)
    if s.rows:
        idle_check(s.rows, s.notes, s.warnings, "after the run", ticks)


def main() -> int:
    a, sizes, concs, configs = parse_args()
    if a.replot:
        replot(a.out, sizes, concs, configs)
        return 0
    t_start = time.time()
    n = sum(len(c[2]) for c in cells(sizes, concs, configs))
    log(f"nohop: {n} cells x {a.reps} repetitions of {a.warmup + a.duration:.1f} s: about "
        f"{n * a.reps * (a.warmup + a.duration + 0.15) / 60:.1f} min of load")
    scratch = Path(tempfile.mkdtemp(prefix="pd-nohop-"))
    s = Session(a, sizes, concs, configs, Procs(scratch), raw=[], dead={}, notes=[], warnings=[])

    interrupt_on_sigterm()
    ok = run_measured(lambda: run(s), s.procs, scratch, a.keep)
    return write_results(a, s.raw, sizes, concs, configs, s.dead, s.notes + s.warnings,
                         time.time() - t_start, ok)


if __name__ == "__main__":
    sys.exit(main())

"""What every bench script shares: paths, logging, the processes it starts,
HTTP, waiting, CPU readings, Envoy and peer start-up, number formatting.

One copy each; the scripts (bench/run.py, fleet.py, decider.py) import it.
"""

from __future__ import annotations

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
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
BENCH = REPO / "bench"
# The end-to-end benches pin every router to core 0, the mocks and the load
# to core 1.
ROUTER_CORE = "0"
LOAD_CORE = "1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes

_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: the kernel kills the child if this script dies
    # (even by SIGKILL), so nothing is left running.
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


def _group_and_die_with_parent() -> None:
    os.setsid()  # a process group of its own: stopped with everything it started
    die_with_parent()


class Procs:
    """Every process a script starts, stopped by PID on the way out. With
    `group`, each runs in a process group of its own, stopped as a group
    (SIGTERM, then SIGKILL), so what it started goes too. `tail` is how many
    lines of a log `log_tail` gives by default."""

    def __init__(self, scratch: Path, group: bool = False, tail: int = 15):
        self.scratch = scratch
        self.group = group
        self.tail = tail
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], core: str | None = None,
              env: dict | None = None, stdout=subprocess.DEVNULL) -> subprocess.Popen:
        full_env = dict(os.environ)
        full_env.update({"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
        for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                  "all_proxy"):
            full_env.pop(k, None)
        if env:
            full_env.update(env)
        if core is not None:
            # taskset execs the command: the PID is the process itself.
            argv = ["taskset", "-c", core, *argv]
        setup = _group_and_die_with_parent if self.group else die_with_parent
        with open(self.scratch / f"{name}.log", "wb") as err:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                                 env=full_env, preexec_fn=setup)
        self.procs.append((name, p))
        return p

    def log_tail(self, name: str, lines: int | None = None) -> str:
        try:
            text = (self.scratch / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-(lines or self.tail):])

    def _signal(self, p: subprocess.Popen, sig: int) -> None:
        try:
            if self.group:
                os.killpg(p.pid, sig)
            elif sig == signal.SIGTERM:
                p.terminate()
            else:
                p.kill()
        except (ProcessLookupError, PermissionError):
            pass

    def stop_all(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                self._signal(p, signal.SIGTERM)
        deadline = time.time() + 5
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                if not self.group:
                    p.kill()
            if self.group:
                # The group may outlive its leader: make sure it is gone.
                self._signal(p, signal.SIGKILL)
            if p.poll() is None:
                p.wait()
        self.procs.clear()


def interrupt_on_sigterm() -> None:
    """A SIGTERM (a cancelled recipe, a CI timeout) ends a run as Ctrl-C
    does, so what was measured is still written."""
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)


def run_measured(run, procs: Procs, scratch: Path, keep: bool) -> bool:
    """Runs `run()`: an interrupt keeps what was measured so far. Then stops
    every process and removes the scratch directory, whose logs stay when
    asked for or when the run did not finish. Whether it finished."""
    ok = False
    try:
        run()
        ok = True
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); writing what was measured")
    finally:
        procs.stop_all()
        if keep or not ok:
            log(f"logs kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return ok


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


def settled(what: str, attempt, streak: int, timeout: float, pause: float) -> None:
    """Calls `attempt` (returning ok and a description of its answer) until
    `streak` oks in a row, `pause` s after each miss; fails after `timeout`
    s naming the last answer. A row through a picker is ready when it
    routes right several times over, not once."""
    deadline, run, last = time.time() + timeout, 0, ""
    while run < streak:
        ok, last = attempt()
        run = run + 1 if ok else 0
        if time.time() > deadline:
            raise RuntimeError(f"{what} never settled: last answer {last}")
        if not ok:
            time.sleep(pause)


# --------------------------------------------------------------------- http

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


def http_get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when the connection failed."""
    status, _, body = http("GET", url, timeout=timeout)
    return status, body


# ---------------------------------------------------------------------- cpu

def proc_ticks(pid: int) -> int:
    """utime + stime of `pid` (all its threads), in clock ticks; 0 if gone."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return 0


def peak_rss_mb(pid: int) -> float | None:
    """The peak resident memory of `pid` (VmHWM), MB; None if gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def core_ticks() -> dict[str, tuple[int, int]]:
    """Per core: (busy, total) clock ticks so far."""
    out = {}
    for line in open("/proc/stat"):
        if line.startswith("cpu") and line[3].isdigit():
            v = [int(x) for x in line.split()[1:9]]
            out[line.split()[0][3:]] = (sum(v) - v[3] - v[4], sum(v))
    return out


def idle_check(targets: dict, notes: list[str], warnings: list[str], when: str,
               ticks=lambda t: proc_ticks(t.proc.pid)) -> None:
    """What the routers cost while idle (scrapes, timers, health checks) and
    how busy the cores are with nothing sent, over 2 s: a note, and a warning
    when something else keeps a core busy. `ticks(target)` reads a target's
    CPU ticks."""
    t0 = {n: ticks(t) for n, t in targets.items()}
    c0 = core_ticks()
    time.sleep(2)
    c1 = core_ticks()
    idle = {n: (ticks(t) - t0[n]) * 1000 / CLK_TCK / 2 for n, t in targets.items()}
    busy = {k: (c1[k][0] - c0[k][0]) / max(1, c1[k][1] - c0[k][1]) for k in c1 if k in c0}
    notes.append(f"Idle check {when} (2 s, nothing sent): routers' own CPU ms/s: "
                 + ", ".join(f"{n}={v:.0f}" for n, v in idle.items())
                 + "; core busy: " + ", ".join(f"core {k}={v:.2f}" for k, v in busy.items()))
    log(notes[-1])
    if any(v > 0.15 for v in busy.values()):
        warnings.append(f"WARNING ({when}): the cores were busy while every benchmark process "
                        "was idle, so something else runs on this machine (" + ", ".join(
                            f"core {k} {v:.0%}" for k, v in busy.items())
                        + "): expect noisy numbers.")
        log(warnings[-1])


# ------------------------------------------------------------ envoy, peers

def admin_port(scratch: Path, name: str) -> int | None:
    """The admin port Envoy `name` wrote to its --admin-address-path."""
    try:
        a = (scratch / f"{name}.admin").read_text().strip()
        return int(a.rsplit(":", 1)[1]) if a else None
    except (OSError, ValueError, IndexError):
        return None


def start_envoy(procs: Procs, envoy_bin: Path, name: str, cfg: dict, concurrency: int = 1,
                core: str | None = ROUTER_CORE, probe_timeout: float = 10
                ) -> tuple[subprocess.Popen, int]:
    """Envoy with configuration `cfg`, once its `pd_listener` listens and it
    is ready: (process, listener port)."""
    path = procs.scratch / f"{name}.json"
    path.write_text(json.dumps(cfg, indent=1))
    admin_path = procs.scratch / f"{name}.admin"
    p = procs.start(name, [str(envoy_bin), "-c", str(path), "--disable-hot-restart",
                           "--concurrency", str(concurrency), "-l", "warning",
                           "--admin-address-path", str(admin_path)], core)
    admin = wait_until(f"{name} admin", lambda: admin_port(procs.scratch, name), 30, p)

    def listener():
        s, body = http_get(f"http://127.0.0.1:{admin}/listeners", probe_timeout)
        ready, _ = http_get(f"http://127.0.0.1:{admin}/ready", probe_timeout)
        if s != 200 or ready != 200:
            return None
        for line in body.decode().splitlines():
            if line.startswith("pd_listener::"):
                return int(line.rsplit(":", 1)[1]) or None
        return None

    try:
        port = wait_until(f"{name} listener", listener, 30, p)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail(name)}") from None
    return p, port


def start_peer(procs: Procs, name: str, argv: list[str], probe: str, core: str | None = None,
               env: dict | None = None) -> tuple[subprocess.Popen, int, int]:
    """A peer router on fresh ports (`--host`, `--port`, `--prometheus-host`,
    `--prometheus-port` appended), once `probe` answers 200: (process, port,
    Prometheus port)."""
    port, prom = free_port(), free_port()
    argv = argv + ["--host", "127.0.0.1", "--port", str(port),
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)]
    p = procs.start(name, argv, core, env=env)
    try:
        wait_until(f"{name} {probe}",
                   lambda: http_get(f"http://127.0.0.1:{port}{probe}", 2)[0] == 200, 60, p)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail(name)}") from None
    return p, port, prom


# ------------------------------------------------------------------ numbers

def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}x"

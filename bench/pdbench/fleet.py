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
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from .common import (interrupt_on_sigterm, BENCH, CLK_TCK, REPO, Procs, admin_port, free_port, http, http_get, log, peak_rss_mb, proc_ticks,
                     read_line, settled, start_envoy, start_peer)
from .dynamo_peer import ensure_venv, give_names_back, start_dynamo
from .envoy import fleet_envoy, fleet_timeouts
from .epp import (PodMock, envoy_epp_config, epp_paths, install_pool, llmd_epp_path,
                  start_picker)
from .kube import Kube, kube_bins
from .fleet_configs import (BY_NAME, CHANGES, CONFIGS, DEFAULTS, EPP_WEIGHTS, JUDGE_CONFIGS, QUICK,
                            QUICK_CONFIGS, VARIANTS, WINDOW_SETS, WINDOWS, Config, Run, deep_merge,
                            epp_scheduling, llmd_scheduling)
from .fleet_metrics import (bucket_stats, load_trace, peer_decisions, reusable_tokens,
                            summarize, turn_stats)
from .fleet_judge import judge_report, plot_judged, write_judge_csv
from .fleet_report import COLUMNS, cell, plot, plot_title, report, write_csv

MODEL = "sim-model"
# `mock-engine sim --lease-s`'s default: how long a vLLM prefill pod keeps
# its KV for the decode, modelled seconds.
SIM_LEASE_S = 30.0
# The endpoint picker's runs: sim pod i on 127.0.0.(2 + i), all on one port
# (`mock-engine sim --host-range`), as an InferencePool's pods are.
EPP_FIRST_HOST = "127.0.0.2"

class Skipped(RuntimeError):
    """A configuration the filter under test refuses (an option it does not
    have yet): its row is skipped, not failed."""


class FleetProcs(Procs):
    """The processes of one configuration, each in its own process group,
    stopped by PID (SIGTERM to the group, then SIGKILL); and the routers'
    own Prometheus pages (kept with --keep)."""

    def __init__(self, scratch: Path):
        super().__init__(scratch, group=True, tail=12)
        self.metrics_urls: list[str] = []


def proc_cpu_s(pid: int) -> float:
    """utime + stime of `pid` (all its threads), seconds; 0 if gone."""
    return proc_ticks(pid) / CLK_TCK


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
    argv += ["--seed", str(run.seed), "--bytes-per-token", str(a.bytes_per_token),
             "--host-gbs", f"{a.host_gbs:g}"]
    if run.config.decoder_kv_ttl_s:
        argv += ["--decoder-kv-ttl-s", f"{run.config.decoder_kv_ttl_s:g}"]
    if run.config.router in ("epp", "llmd"):
        argv += ["--host-range", EPP_FIRST_HOST]
    if run.config.router == "llmd":
        argv += ["--kv-events"]
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
        "models": [scale_kv_reuse(model, sim["time_scale"])],
    }, {k: v for k, v in c.plugin.items()})


def scale_kv_reuse(model: dict, time_scale: float) -> dict:
    """`kv_reuse.ttl_ms` given in modelled time (as vLLM's 480 s
    `decoder_kv_blocks_ttl` is), in real time as the filter counts it."""
    reuse = model.get("kv_reuse")
    if not isinstance(reuse, dict) or "ttl_ms" not in reuse:
        return model
    return dict(model, kv_reuse=dict(reuse, ttl_ms=max(1, round(reuse["ttl_ms"] / time_scale))))


def refused_option(log: str) -> str | None:
    """The option a filter refused its configuration for (`unknown field
    `kv_reuse``), from Envoy's log; None if it did not."""
    marker = "unknown field `"
    at = log.find(marker)
    if at < 0:
        return None
    return log[at + len(marker):].split("`", 1)[0]


def start_fleet_envoy(procs: FleetProcs, a, name: str, cfg: dict) -> int:
    """An Envoy on both cores (unpinned, two workers); its Prometheus page
    joins the run's metrics. Its listener port."""
    _, port = start_envoy(procs, a.envoy, name, cfg, concurrency=2, core=None, probe_timeout=2)
    procs.metrics_urls.append(f"http://127.0.0.1:{admin_port(procs.scratch, name)}/stats/prometheus")
    return port


def start_fleet_peer(procs: FleetProcs, name: str, argv: list[str], probe: str) -> int:
    """A peer router, unpinned; its Prometheus page joins the run's metrics.
    Its port."""
    _, port, prom = start_peer(procs, name, argv, probe)
    procs.metrics_urls.append(f"http://127.0.0.1:{prom}/metrics")
    return port


def start_vllm_router(procs: Procs, a, c: Config, sim: dict) -> int:
    argv = [str(a.peer_venv / "bin" / "vllm-router"), "--vllm-pd-disaggregation"]
    for pod in sim["prefill"]:
        argv += ["--prefill", f"http://{pod['address']}"]
    for pod in sim["decode"]:
        argv += ["--decode", f"http://{pod['address']}"]
    argv += ["--policy", "cache_aware", "--log-level", "warning",
             "--worker-startup-check-interval", "1", *c.peer_args]
    return start_fleet_peer(procs, "vllm-router", argv, "/health")


def start_smg(procs: Procs, a, c: Config, sim: dict) -> int:
    """SMG in PD mode, each prefill pod with its SGLang bootstrap port
    (`--prefill URL PORT`). It answers /readiness 503 until its workers are
    registered."""
    argv = [str(a.peer_venv / "bin" / "smg"), "launch", "--pd-disaggregation"]
    for pod in sim["prefill"]:
        argv += ["--prefill", f"http://{pod['address']}", str(pod["bootstrap_port"])]
    for pod in sim["decode"]:
        argv += ["--decode", f"http://{pod['address']}"]
    argv += ["--policy", "cache_aware", "--log-level", "warn", "--history-backend", "none",
             "--worker-startup-check-interval", "1", *c.peer_args]
    return start_fleet_peer(procs, "smg", argv, "/readiness")


def epp_settled(url: str, sim: dict, timeout: float = 120) -> None:
    """Five answers in a row through the picker's Envoy, split with a valid
    hand-off (the sims' records say so): the picker has the pool and its
    pods, pd-router has discovered them. The prompts are text the sims find
    no blocks in, their records (user epp-settle-N) are not the replay's."""
    base = f"http://{sim['prefill'][0]['address']}"
    n = 0

    def attempt() -> tuple[bool, str]:
        nonlocal n
        n += 1
        user = f"epp-settle-{n}"
        body = json.dumps({"model": MODEL, "prompt": f"settle {n}", "max_tokens": 2,
                           "user": user}).encode()
        status, _, resp = http("POST", url, body, timeout=30)
        if status != 200:
            return False, f"{status} {resp[:300]!r}"
        _, recs = http_get(base + "/sim/records", 30)
        mine = [r for r in json.loads(recs) if r["user"] == user]
        ok = (sorted(r["role"] for r in mine) == ["decode", "prefill"]
              and all(r["handoff"] == "ok" for r in mine if r["role"] == "decode"))
        return ok, f"{status} {json.dumps(mine)[:300]}"

    settled("the picker's Envoy", attempt, streak=5, timeout=timeout, pause=0.5)


def llmd_picker(procs: FleetProcs, a, c: Config, sim: dict) -> tuple[dict, dict, tuple, callable]:
    """llm-d's picker's scheduling, its environment, its arguments, and
    what starts the KV events' bridge once the picker listens: the sims' tokenizer.json in the
    scratch directory, a ZMQ port for the picker's subscriber, a key per sim
    block (512 tokens of --bytes-per-token characters)."""
    base = f"http://{sim['prefill'][0]['address']}"
    status, body = http_get(base + "/sim/kv_events/tokenizer.json", 10)
    if status != 200:
        raise RuntimeError(f"/sim/kv_events/tokenizer.json: {status} (a sim without --kv-events?)")
    tokenizer = procs.scratch / "tokenizer.json"
    tokenizer.write_bytes(body)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    block = 512 * a.bytes_per_token
    sched = llmd_scheduling(c, block, str(tokenizer), endpoint, MODEL)
    env = {"PYTHONPATH": str(llmd_epp_path().parent / "python")}
    # GIE v1.2.0's runner reads KV-cache use from `vllm:gpu_cache_usage_perc`
    # unless told otherwise; vLLM names it `vllm:kv_cache_usage_perc` since
    # v0.10, as the sims do (GIE v1.5.0 reads that name by default).
    args = ("--kv-cache-usage-percentage-metric", "vllm:kv_cache_usage_perc")

    def bridge() -> None:
        p = procs.start("kv-bridge", [sys.executable, "-m", "pdbench.kv_bridge", "--sim", base,
                                      "--endpoint", endpoint, "--model", MODEL,
                                      "--block-size", str(block)],
                        env={"PYTHONPATH": str(BENCH)}, stdout=subprocess.PIPE)
        line = read_line(p, 30)
        if line != "READY":
            raise RuntimeError(f"kv bridge did not start: {line!r}\n{procs.log_tail('kv-bridge')}")
    return sched, env, args, bridge


def start_epp(procs: FleetProcs, a, c: Config, sim: dict) -> int:
    """The endpoint picker's stack over the sims (bench/pdbench/epp.py's, as
    the no-hop row runs it, not pinned): kube-apiserver and etcd with GIE's
    CRD, the shipped pool on the sims' common port and one Pod with llm-d's
    labels and the sim pod's address per sim pod; the picker with the
    configuration's scheduling (GIE's with tools/epp's P/D plugins, or
    llm-d's own for `llmd`, fed the pods' KV events); deploy/envoy-epp's
    Envoy (two workers) with pd-router in executor mode, the fleet's
    timeouts and pd-router's fleet knobs. Its listener port, once requests
    go through split."""
    epp, crd = epp_paths()
    more_crds = ()
    if c.router == "llmd":
        epp = llmd_epp_path()
        crd, more_crds = epp.with_name("inferencepools.yaml"), (
            epp.with_name("inferenceobjectives.yaml"),)
    for f in (epp, crd, *more_crds, *kube_bins()):
        if not f.exists():
            raise RuntimeError(f"{f} not found (`just epp llmd-epp kube-apiserver` builds the "
                               "pickers and the API server)")
    pods = [(p, role) for role in ("prefill", "decode") for p in sim[role]]
    ports = {p["address"].rsplit(":", 1)[1] for p, _ in pods}
    if len(ports) != 1:
        raise RuntimeError(f"the sims are not on one port: {sorted(ports)}")
    port = int(ports.pop())
    kube = Kube(procs, None)
    install_pool(kube, crd, port, [(PodMock(p["name"], port, None, p["address"].rsplit(":", 1)[0]),
                                    role) for p, role in pods], more_crds)
    config = procs.scratch / "epp-config.yaml"
    env, args, bridge = {}, (), None
    if c.router == "llmd":
        sched, env, args, bridge = llmd_picker(procs, a, c, sim)
    else:
        sched = epp_scheduling(c.epp_weights or EPP_WEIGHTS, c.epp_prefix)
    config.write_text(yaml.safe_dump(sched, sort_keys=False))
    _, grpc = start_picker(procs, epp, kube, config, core=None, gomaxprocs=None, env=env,
                           args=args)
    if bridge:
        bridge()
    d = procs.scratch / "envoy-epp"
    d.mkdir(exist_ok=True)
    # pd-router's fleet knobs, as the pd-* rows have them.
    knobs = {k: v for k, v in plugin_config(c, sim).items()
             if k in ("prefill_timeout_ms", "scrape_interval_ms", "kv_lease_ms", "max_body_bytes")}
    cfg = envoy_epp_config(a.wasm, grpc, kube, d, MODEL, knobs)
    # deploy/envoy-epp has no circuit-breaker limits already.
    fleet_timeouts(cfg)
    port = start_fleet_envoy(procs, a, "envoy0", cfg)
    try:
        epp_settled(f"http://127.0.0.1:{port}/v1/completions", sim)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail('epp', 8)}\n{procs.log_tail('envoy0', 8)}"
                           ) from None
    return port


def start_router(procs: Procs, a, c: Config, sim: dict) -> list[str]:
    """Starts the configuration's router(s); returns the URLs to replay to."""
    if c.router == "pd":
        cfg = fleet_envoy(a.wasm, plugin_config(c, sim))
        try:
            ports = [start_fleet_envoy(procs, a, f"envoy{i}", cfg) for i in range(c.replicas)]
        except RuntimeError as e:
            option = refused_option(procs.log_tail("envoy0", 400))
            if option:
                raise Skipped(f"skipped: this filter refuses `{option}` (unknown field): its "
                              "configuration needs a pd-router that has it") from e
            raise
    elif c.router == "vllm-router":
        ports = [start_vllm_router(procs, a, c, sim)]
    elif c.router == "smg":
        ports = [start_smg(procs, a, c, sim)]
    elif c.router in ("epp", "llmd"):
        ports = [start_epp(procs, a, c, sim)]
    elif c.router == "dynamo":
        port = start_dynamo(procs, c, sim, a.bytes_per_token)
        procs.metrics_urls.append(f"http://127.0.0.1:{port}/metrics")
        ports = [port]
    else:
        raise ValueError(f"unknown router {c.router}")
    return [f"http://127.0.0.1:{p}/v1/completions" for p in ports]


# -------------------------------------------------------------------- one run

def run_one(a, run: Run, trace_file: Path, trace: list[dict], reusable: list[int],
            scratch: Path) -> dict:
    run_dir = scratch / run.key.replace("/", "_")
    run_dir.mkdir()
    procs = FleetProcs(run_dir)
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
                f"{scale:g}", "--load", f"{load:g}", "--skip", str(run.skip),
                "--limit", str(run.requests), "--seed", str(run.seed), "--bytes-per-token",
                str(a.bytes_per_token), "--out", str(out), "--timeout-s", str(timeout_s),
                "--model", MODEL]
        for u in urls:
            argv += ["--url", u]
        if run.config.token_ids:
            argv.append("--token-ids")
        if run.config.session:
            argv += ["--session-header", "x-session-id"]
        if a.extend_turns:
            argv.append("--extend-turns")
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
        # Peak memory by process: what a bigger shared prefix table costs Envoy.
        rss = {n: round(m) for n, p in procs.procs if n != "replay"
               and (m := peak_rss_mb(p.pid)) is not None}
        if rp.returncode != 0:
            raise RuntimeError(f"replay exited {rp.returncode}: {procs.log_tail('replay', 5)}")
        seen = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        summary = collect(a, run, procs, sim, seen, trace, reusable, run_dir)
        summary.update(replay_wall_s=replay_s,
                       machine_busy=(m1[0] - m0[0]) / max(1, m1[1] - m0[1]),
                       cpu={k: round(v, 3) for k, v in cpu.items()}, rss_mb=rss)
        return summary
    finally:
        procs.stop_all()
        log(f"    ({time.time() - t0:.0f} s)")


def collect(a, run: Run, procs: FleetProcs, sim: dict, seen: list[dict], trace: list[dict],
            reusable: list[int], run_dir: Path) -> dict:
    """The run's figures from the sim's records and pods, over the measured
    requests (those after the warm-up); the pods' load and busy figures over
    the whole replay; each measured request's prompt, TTFT and unloaded floor."""
    base = f"http://{sim['prefill'][0]['address']}"
    s1, rec_body = http_get(base + "/sim/records", 60)
    s2, pods_body = http_get(base + "/sim/pods", 30)
    if s1 != 200 or s2 != 200:
        raise RuntimeError(f"/sim/records {s1}, /sim/pods {s2}")
    pods = json.loads(pods_body)
    records = json.loads(rec_body)
    if run.config.router == "dynamo":
        # Its frontend does not pass `user` on: the shim named each request
        # by its prompt, the replayer's names are given back here.
        records = give_names_back(records, seen, trace, a.bytes_per_token)
    # Records of requests outside the replay (none expected) are left out.
    users = {s["user"] for s in seen}
    records = [r for r in records if r["user"] in users]
    measured = [s for s in seen if s["index"] >= run.warmup]
    judged = {s["user"] for s in measured}
    summary = summarize(measured, [r for r in records if r["user"] in judged], pods,
                        trace[run.warmup:], reusable[run.warmup:])
    summary.update(turn_stats(seen, records, reusable, run.warmup))
    if run.warmup:
        whole = summarize(seen, records, pods, trace, reusable)
        for k in ("prefill_busy", "prefill_busy_max", "decode_busy", "window_s",
                  "prefill_load_max_mean", "decode_load_max_mean"):
            summary[k] = whole[k]
    pairs = [[t["input_length"], r] for t, r in zip(trace[run.warmup:], reusable[run.warmup:])]
    status, _, floor_body = http("POST", base + "/sim/floor",
                                 json.dumps({"requests": pairs}).encode(), timeout=60)
    floors = json.loads(floor_body)["floor_s"] if status == 200 else [None] * len(pairs)
    by_index = {s["index"] - run.warmup: s for s in measured}
    summary["buckets"] = bucket_stats(
        [(p[0], (by_index.get(i) or {}).get("ttft_s"), f)
         for i, (p, f) in enumerate(zip(pairs, floors))])
    summary.update(
        kv_blocks=sim.get("kv_blocks"), cache_blocks=sim.get("cache_blocks", sim.get("kv_blocks")),
        evicted_blocks=sum(p.get("evicted_blocks", 0) for p in pods["pods"]),
        reloaded_tokens=sum(p.get("reloaded_tokens", 0) for p in pods["pods"]))
    pages = [http_get(u, 10)[1].decode(errors="replace") for u in procs.metrics_urls]
    summary["prefill_decisions"] = peer_decisions(pages)
    if a.keep:
        for i, page in enumerate(pages):
            (run_dir / f"router-metrics-{i}.txt").write_text(page)
        (run_dir / "records.json").write_text(rec_body.decode())
        (run_dir / "pods.json").write_text(pods_body.decode())
    return summary


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
    names = (a.configs.split(",") if a.configs else QUICK_CONFIGS if a.quick else
             JUDGE_CONFIGS if a.windows else [c.name for c in CONFIGS])
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
    return expand(a, ap, [run_of(a, c, v) for c, v in picked])


def expand(a, ap, runs: list[Run]) -> list[Run]:
    """Each run in each --windows window and with each seed of --repeats
    (seeds 1..N; without --repeats, seed 0: the trace as it is), window by
    window, seed by seed, the configurations alternating."""
    names = [w for n in (a.windows or "").split(",") if n for w in WINDOW_SETS.get(n, [n])]
    for n in names:
        if n not in WINDOWS:
            ap.error(f"unknown window {n} (one of {', '.join(list(WINDOWS) + list(WINDOW_SETS))})")
    seeds = list(range(1, a.repeats + 1)) if a.repeats else [0]
    if not names:
        return [dataclasses.replace(r, seed=s) for s in seeds for r in runs]
    out = []
    for n in names:
        w = WINDOWS[n]
        for s in seeds:
            out.extend(dataclasses.replace(r, window=n, skip=w.start - w.warmup, warmup=w.warmup,
                                           requests=w.warmup + w.size, seed=s) for r in runs)
    return out


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


# The filter `just bench-fleet` builds from this checkout.
BUILT_WASM = REPO / "target/wasm32-wasip1/release/pd_router.wasm"


def git_state() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src",
                                "mock-engine/src", "fleet-sim/src"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return head + (" (src/, mock-engine/src/ or fleet-sim/src/ with uncommitted changes)"
                       if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def arg_parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--windows", default=None,
                    help="measure these windows of the trace, each after its warm-up, instead of "
                         "the first --requests: " + ", ".join(
                             f"{n} ({w.start}-{w.start + w.size - 1} after {w.warmup})"
                             for n, w in WINDOWS.items()) + "; " + "; ".join(
                             f"{n} = {','.join(ws)}" for n, ws in WINDOW_SETS.items())
                         + " (default configurations then: "
                         + ",".join(JUDGE_CONFIGS) + ")")
    ap.add_argument("--repeats", type=int, default=0,
                    help="run each configuration N times, seeds 1..N (arrivals spread within "
                         "their second, the prompts' filler varied); the report gives the median "
                         "and range and a verdict where the ranges do not overlap")
    ap.add_argument("--bytes-per-token", type=int, default=4,
                    help="bytes of prompt text per token (default 4, pd-router's own estimate)")
    ap.add_argument("--extend-turns", action="store_true",
                    help="each later turn's prompt text begins with the previous turn's (what "
                         "kv_reuse checks; the replayer's --extend-turns), in every configuration")
    ap.add_argument("--host-gbs", type=float, default=25.0,
                    help="host tier to GPU reload bandwidth, GB/s (default 25)")
    ap.add_argument("--stem", default=None,
                    help="the results files' name (default fleet, fleet-quick, fleet-changes; "
                         "fleet-judge with --windows)")
    ap.add_argument("--render", type=Path, default=None,
                    help="run nothing: judge again the runs of a <stem>-raw.json (its report's "
                         "judged part, <stem>-summary.csv, the plot)")
    ap.add_argument("--request-timeout", type=float, default=1200,
                    help="a request unanswered after this many modelled seconds is an error")
    ap.add_argument("--out-dir", type=Path, default=BENCH / "results")
    ap.add_argument("--envoy", type=Path,
                    default=Path(os.environ.get("ENVOY_BIN", REPO / ".venv/bin/envoy")))
    ap.add_argument("--wasm", type=Path, default=Path(os.environ.get(
        "PD_ROUTER_WASM", BUILT_WASM)))
    ap.add_argument("--mock", type=Path, default=REPO / "target/release/mock-engine")
    ap.add_argument("--peer-venv", type=Path, default=BENCH / ".venv")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, "
                    "records)")
    return ap


def parse_args():
    """The options, checked, and the runs they ask for."""
    ap = arg_parser()
    a = ap.parse_args()
    if a.render:
        return a, []
    runs = plan(a, ap)
    for what, p in (("envoy", a.envoy), ("wasm", a.wasm), ("mock-engine", a.mock)):
        if not p.exists():
            ap.error(f"{what} not found at {p} (`./just bench-fleet` builds everything)")
    if any(r.config.router == "dynamo" for r in runs):
        if a.extend_turns:
            ap.error("dynamo: --extend-turns is not supported (its records are matched to the "
                     "replayer's requests by the trace's block ids)")
        ensure_venv()
    for peer in sorted({r.config.router for r in runs} - {"pd", "epp", "llmd", "dynamo"}):
        if not (a.peer_venv / "bin" / peer).exists():
            ap.error(f"{peer} is not installed in {a.peer_venv} (`./just bench-fleet` "
                     "installs bench/requirements.txt)")
    a.wasm = a.wasm.resolve()
    a.kv_blocks = a.kv_blocks or None
    a.cache_blocks = a.cache_blocks or None
    return a, runs


def run_all(a, runs: list[Run], scratch: Path, results: dict, failed: dict, traces: dict) -> None:
    """Each run in turn, into `results` (or `failed`, and the rest go on);
    `traces` gets the trace's first N requests and their reusable tokens, per
    N the runs replay."""
    trace_file, lines = load_trace(a.trace, scratch)
    for k in sorted({(r.skip, r.requests, r.warmup) for r in runs}):
        skip, n, warmup = k
        tr = lines[skip:skip + n]
        traces[k] = (tr, reusable_tokens(tr))
        if len(tr) < n:
            raise SystemExit(f"{a.trace} has {len(lines)} requests: too few for requests "
                             f"{skip}-{skip + n - 1}")
    log(f"fleet: {len(runs)} runs; " + "; ".join(
        f"requests {s + w}-{s + n - 1}: limit {sum(re[w:]) / sum(t['input_length'] for t in tr[w:]):.1%} "
        f"of their prompt tokens" for (s, n, w), (tr, re) in traces.items()))
    for i, run in enumerate(runs):
        log(f"[{i + 1}/{len(runs)}] {run.key}: {run.config.about}; requests {run.skip}-"
            f"{run.skip + run.requests - 1} ({run.warmup} warm-up), load {run.load:g}, "
            f"{run.prefill}P+{run.decode}D, time scale {run.time_scale:g}")
        trace, reusable = traces[(run.skip, run.requests, run.warmup)]
        try:
            r = run_one(a, run, trace_file, trace, reusable, scratch)
        except Skipped as e:
            failed[run.key] = str(e)
            log(f"  SKIPPED: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - reported, the rest go on
            failed[run.key] = str(e).strip().replace("\n", " | ")[:300]
            log(f"  FAILED: {failed[run.key]}")
            continue
        c = run.config
        r.update(config=run.name, base=c.name, variant=run.variant, router=c.router,
                 engine=c.engine, replicas=c.replicas, load=run.load,
                 time_scale=run.time_scale, about=c.about, window=run.window, seed=run.seed,
                 first_request=run.skip + run.warmup)
        results[run.key] = r
        log("  " + ", ".join(f"{h.strip()} {cell(r, k, spec)}" for k, h, spec, _ in COLUMNS)
            + f"; P busy max {cell(r, 'prefill_busy_max', '{:.0%}')}, ovh99 "
              f"{cell(r, 'overhead_p99', '{:.2f}')}, replay {r['replay_wall_s']:.0f} s "
              f"real, machine {r['machine_busy']:.0%} busy, CPU "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu"].items())
            + "; peak MB " + ", ".join(f"{k} {v}" for k, v in r.get("rss_mb", {}).items()))


def run_params(a, runs: list[Run], results: dict, traces: dict, commit: str) -> dict:
    """The run's parameters, as the report and fleet*-raw.json give them."""
    # The pods' sizes, as the sims' ready lines named them.
    any_run = next(iter(results.values()), {})
    main = max(traces, key=lambda k: (k[1], -k[0])) if traces else (0, 0, 0)
    tr, re = traces.get(main, ([], []))
    tr, re = tr[main[2]:], re[main[2]:]
    prompt = sum(t["input_length"] for t in tr)
    return {
        "trace": str(a.trace.resolve().relative_to(REPO) if a.trace.resolve().is_relative_to(REPO)
                     else a.trace),
        "commit": commit,
        "requests": len(tr),
        "trace_span_s": (tr[-1]["timestamp"] - tr[0]["timestamp"]) / 1000 if tr else 0,
        "limit_pct": sum(re) / prompt if prompt else 0,
        "windows": {n: {"first": s + w, "last": s + n_ - 1, "warmup": w,
                        "limit_pct": sum(r_[w:]) / max(1, sum(t["input_length"] for t in t_[w:]))}
                    for (s, n_, w), (t_, r_) in traces.items()
                    for n in {r.window for r in runs
                              if r.window and (r.skip, r.requests, r.warmup) == (s, n_, w)}},
        "seeds": sorted({r.seed for r in runs}),
        "bytes_per_token": a.bytes_per_token, "host_gbs": a.host_gbs,
        "extend_turns": a.extend_turns,
        "load": a.load, "time_scale": a.time_scale, "prefill": a.prefill, "decode": a.decode,
        "kv_blocks": any_run.get("kv_blocks", a.kv_blocks),
        "cache_blocks": any_run.get("cache_blocks", a.cache_blocks),
        "runs": {r.name: {"requests": r.requests, "load": r.load, "prefill": r.prefill,
                          "decode": r.decode, "time_scale": r.time_scale} for r in runs},
    }


def write_results(a, runs: list[Run], results: dict, failed: dict, params: dict,
                  wall: float) -> None:
    """<stem>.txt, .csv, -raw.json and .png: fleet, fleet-quick (--quick) or
    fleet-changes (--changes)."""
    text = report(results, failed, params, runs, wall)
    stem = a.stem or ("fleet-changes" if a.changes else "fleet-quick" if a.quick else
                      "fleet-judge" if a.windows else "fleet")
    judged = len(params["seeds"]) > 1 or bool(a.windows)
    if judged:
        text += "\n\n" + judge_report(results, params)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    if judged:
        write_judge_csv(a.out_dir / f"{stem}-summary.csv", results)
    (a.out_dir / f"{stem}.txt").write_text(text + "\n")
    write_csv(a.out_dir / f"{stem}.csv", results)
    (a.out_dir / f"{stem}-raw.json").write_text(json.dumps(
        {"params": params, "results": results, "failed": failed}, indent=1) + "\n")
    try:
        if judged:
            plot_judged(results, a.out_dir / f"{stem}.png", plot_title(params, stem))
        else:
            plot(results, a.out_dir / f"{stem}.png", plot_title(params, stem))
    except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
        log(f"plot failed: {e}")
    print(text)
    log(f"wrote {a.out_dir}/{stem}.txt, .csv, .png, -raw.json")


def render(raw: Path) -> int:
    """Judges the runs of a <stem>-raw.json again: the judged part of
    <stem>.txt, <stem>-summary.csv and <stem>.png (the runs' rows stay)."""
    d = json.loads(raw.read_text())
    stem, out = raw.name.removesuffix("-raw.json"), raw.parent
    txt = out / f"{stem}.txt"
    head = txt.read_text().split("\n\nOver seeds")[0] if txt.exists() else ""
    txt.write_text(head + "\n\n" + judge_report(d["results"], d["params"]) + "\n")
    write_judge_csv(out / f"{stem}-summary.csv", d["results"])
    plot_judged(d["results"], out / f"{stem}.png", plot_title(d["params"], stem))
    log(f"wrote {txt}, {stem}-summary.csv, {stem}.png")
    return 0


def main() -> int:
    a, runs = parse_args()
    if a.render:
        return render(a.render)
    t_start = time.time()
    # The tree the recipe just built from (edits made while the runs go on
    # do not change the binaries).
    commit = git_state()
    if a.wasm.resolve() != BUILT_WASM.resolve():
        # Another build (`--wasm`, PD_ROUTER_WASM): the checkout's state says
        # nothing of it.
        commit = f"{a.wasm} (--wasm; the checkout is at {commit})"
    scratch = Path(tempfile.mkdtemp(prefix="pd-fleet-"))

    interrupt_on_sigterm()
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    traces: dict[int, tuple[list[dict], list[int]]] = {}
    try:
        run_all(a, runs, scratch, results, failed, traces)
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); writing what was measured")
    finally:
        if a.keep:
            log(f"logs kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    if not results and not failed:
        return 1
    params = run_params(a, runs, results, traces, commit)
    write_results(a, runs, results, failed, params, time.time() - t_start)
    return 0 if all(v.startswith("skipped:") for v in failed.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The end-to-end bench's report (latest.txt), its CSV files and its plot,
from the medians over repetitions: rows[(size, concurrency, config)]."""

from __future__ import annotations

import csv
from pathlib import Path

from .common import fmt, fmt_ratio, median, ratio
from .e2e_configs import (BUFFER_FLOOR, CALLS_PER_REQUEST, FLOOR, HEAD_TO_HEAD, MIN_PD,
                          MIN_PD_SGLANG, MIN_PD_TARGET, MIN_PD_TRTLLM, MIN_PD_VLLM, PD, PEERS,
                          SIZES, STACKS)


def aggregate(raw: list[dict], sizes, concs, configs, dead: dict) -> dict:
    """Medians over the repetitions that completed requests; a cell none
    completed names its configuration in `dead`."""
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
    return rows


RAW_FIELDS = ["rep", "body", "body_bytes", "concurrency", "config", "completed", "errors",
              "elapsed_s", "rps", "cpu_s", "cpu_s_second", "cpu_us_per_req", "p50_ms",
              "p99_ms",
              "core0_busy", "core1_busy", "first_error"]


def write_csvs(out: Path, raw: list[dict], rows: dict, sizes, concs, configs) -> None:
    """latest-raw.csv (every repetition) and latest.csv (the medians)."""
    with open(out / "latest-raw.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=RAW_FIELDS)
        wr.writeheader()
        wr.writerows(raw)
    with open(out / "latest.csv", "w", newline="") as f:
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
                    wr.writerow([s, SIZES[s], conc, c, _num(r["cpu_us"], "{:.2f}"),
                                 _num(r["rps"], "{:.1f}"), _num(r["p50"], "{:.3f}"),
                                 _num(r["p99"], "{:.3f}"),
                                 _num(ratio(r["cpu_us"], floor.get("cpu_us"))),
                                 _num(ratio(r["rps"], floor.get("rps"))),
                                 _num(ratio(r["cpu_us"], min(pc) if pc else None)),
                                 _num(ratio(r["rps"], max(pr) if pr else None)),
                                 _num(ratio(r["cpu_us"], mfloor.get("cpu_us"))),
                                 _num(ratio(r["cpu_us"], bfloor.get("cpu_us"))),
                                 _num(r["core1"], "{:.3f}"), r["errors"], r["reps"]])


def _num(x, spec="{:.4f}"):
    return "" if x is None else spec.format(x)


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


class _Run:
    """One run's medians, and the ratios the report reads from them."""

    def __init__(self, rows: dict, order_sizes, order_conc, configs):
        self.rows = rows
        self.order_sizes = order_sizes
        self.order_conc = order_conc
        self.configs = configs
        self.all_cols = [(s, c) for s in order_sizes for c in order_conc]
        # The summary's sizes: the smallest and the largest.
        self.sizes = [s for s in ("1K", "512K") if s in order_sizes]
        self.run_pd = [pd for pd in PD if pd in configs]

    def get(self, size, conc, c, k):
        return self.rows.get((size, conc, c), {}).get(k)

    def cpu_ratio(self, size, conc, a, b):
        return ratio(self.get(size, conc, a, "cpu_us"), self.get(size, conc, b, "cpu_us"))

    @staticmethod
    def col_head(label, cols, width=12):
        return f"  {label:<36}" + "".join(f"{s + ' c=' + str(c):>{width}}" for s, c in cols)

    @staticmethod
    def col_row(label, values, width=12):
        return f"  {label:<36}" + "".join(f"{fmt_ratio(v):>{width}}" for v in values)

    def ratios(self, a, b, cols=None) -> str:
        """`size c=conc ratio, ...` of a / b over `cols` (default all)."""
        return ", ".join(f"{s} c={c} {fmt_ratio(self.cpu_ratio(s, c, a, b))}"
                         for s, c in (self.all_cols if cols is None else cols))


def report(rows: dict, order_sizes, order_conc, configs, dead: dict,
           wall_min: float | None = None) -> str:
    """The table and the ratio summary. rows[(size, conc, config)] = aggregated dict."""
    run = _Run(rows, order_sizes, order_conc, configs)
    out = _table(run, dead)
    out += _summary(run)
    out += _head_to_head(run)
    out += _targets(run)
    out += _floors(run)
    out += _costs(run, wall_min)
    return "\n".join(out)


def _table(run: _Run, dead: dict) -> list[str]:
    rows, configs = run.rows, run.configs
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
    for size in run.order_sizes:
        for conc in run.order_conc:
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
    return out


def _summary(run: _Run) -> list[str]:
    cpu_ratio, col_head, col_row, all_cols = run.cpu_ratio, run.col_head, run.col_row, run.all_cols
    out = []
    w = out.append
    w("Summary")
    w("-------")
    w("pd-router CPU per request vs the floor (b) envoy-mirror:")
    cols = [(s, c) for s in run.sizes for c in run.order_conc]
    w(col_head("engine", cols))
    for pd in run.run_pd:
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
    for pd in run.run_pd:
        w(col_row(f"{pd} / {MIN_PD}", [cpu_ratio(s, c, pd, MIN_PD) for s, c in all_cols]))
    for pd in run.run_pd:
        w(col_row(f"{pd} / {BUFFER_FLOOR}", [cpu_ratio(s, c, pd, BUFFER_FLOOR)
                                              for s, c in all_cols]))
    # The same job on the same mocks: what pd-router adds to the least a
    # vLLM filter must do (its mocks pull KV, so both cells share their load).
    pairs = []
    if "pd-vllm" in run.run_pd:
        pairs += [("pd-vllm", MIN_PD_VLLM), (MIN_PD_VLLM, MIN_PD)]
    if "pd-sglang" in run.run_pd and MIN_PD_SGLANG in run.configs:
        pairs += [("pd-sglang", MIN_PD_SGLANG), (MIN_PD_SGLANG, MIN_PD)]
    # TensorRT-LLM's floor: the same bytes through Envoy with nothing read,
    # against pd-router's TensorRT-LLM path and against the vLLM floor.
    if "pd-trtllm" in run.run_pd:
        pairs += [("pd-trtllm", MIN_PD_TRTLLM), (MIN_PD_TRTLLM, "pd-vllm"),
                  (MIN_PD_TRTLLM, MIN_PD_VLLM)]
    for a, b in pairs:
        w(col_row(f"{a} / {b}", [cpu_ratio(s, c, a, b) for s, c in all_cols]))
    return out


def _head_to_head(run: _Run) -> list[str]:
    get, order_conc, order_sizes = run.get, run.order_conc, run.order_sizes
    out = []
    w = out.append
    conc_hi = max(order_conc)
    w("")
    w(f"pd-router requests/s at concurrency {conc_hi} vs the best peer (named):")
    w(f"  {'engine':<12}" + "".join(f"{s:>26}" for s in run.sizes))
    for pd in run.run_pd:
        cells = []
        for s in run.sizes:
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
              + "".join(f"{fmt_ratio(run.cpu_ratio(s, c, pd, stack)):>11}" for c in order_conc)
              + f"{fmt_ratio(ratio(get(s, 1, pd, 'p50'), get(s, 1, stack, 'p50'))):>10}")
    w("")
    return out


def _targets(run: _Run) -> list[str]:
    get, cpu_ratio, order_conc, order_sizes = run.get, run.cpu_ratio, run.order_conc, run.order_sizes
    out = []
    w = out.append
    w("Targets (issue 11): medians of this run, CPU per request unless noted, each at every "
      "measured concurrency")
    w("(the issue names none); a ratio is pd-router / the yardstick.")
    tsizes = [s for s in ("1K", "64K", "512K") if s in order_sizes]
    tcols = [(s, c) for s in tsizes for c in order_conc]
    for pd in MIN_PD_TARGET:
        out.extend(verdict_line(
            f"{pd} <= 1.15x {MIN_PD} at 1K, 64K and 512K",
            [(f"{s} c={c}", cpu_ratio(s, c, pd, MIN_PD), 1.15) for s, c in tcols]))
    w(f"  [info] pd-vllm / {MIN_PD_VLLM} (the same hand-off on the same mocks): "
      + run.ratios("pd-vllm", MIN_PD_VLLM, tcols))
    out.extend(verdict_line(
        "pd-trtllm at 512K <= 1.5x pd-vllm's",
        [(f"512K c={c}", cpu_ratio("512K", c, "pd-trtllm", "pd-vllm"), 1.5)
         for c in order_conc]))
    w(f"  [info] {MIN_PD_TRTLLM} / pd-vllm at 512K (the least a TensorRT-LLM filter does, "
      "the ids unread): "
      + ", ".join(f"c={c} {fmt_ratio(cpu_ratio('512K', c, MIN_PD_TRTLLM, 'pd-vllm'))}"
                  for c in order_conc))
    if "pd-trtllm-b64" in run.configs:
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
    return out


def _floors(run: _Run) -> list[str]:
    """Where a target sits against its floor: the same ratio for the least
    filter doing that engine's job (for SGLang min-pd-sglang where it ran, on
    demand, else min-pd: SGLang's hand-off is three members on both legs)."""
    order_conc, order_sizes = run.order_conc, run.order_sizes
    floor_of = {"pd-vllm": MIN_PD_VLLM,
                "pd-sglang": MIN_PD_SGLANG if MIN_PD_SGLANG in run.configs else MIN_PD}
    out = []
    w = out.append
    w("  [info] the floors on the same ratios (the least filter doing the engine's job "
      "in place of pd-router):")
    w(f"      {MIN_PD_VLLM} / {MIN_PD} (the 1.15x budget): " + run.ratios(MIN_PD_VLLM, MIN_PD))
    if MIN_PD_SGLANG in run.configs:
        w(f"      {MIN_PD_SGLANG} / {MIN_PD} (the 1.15x budget): "
          + run.ratios(MIN_PD_SGLANG, MIN_PD))
    for pd, stack in STACKS.items():
        w(f"      {floor_of[pd]} / {stack}: " + run.ratios(
            floor_of[pd], stack,
            [(s, c) for s in ("1K", "512K") if s in order_sizes for c in order_conc]))
    for pd, peer in HEAD_TO_HEAD.items():
        w(f"      {floor_of[pd]} / {peer}: " + run.ratios(
            floor_of[pd], peer,
            [(s, c) for s in ("64K", "512K") if s in order_sizes for c in order_conc]))
    w("  [info] at 1K vs the standalone peer, and how much of it the minimal wasm filter "
      "already costs:")
    for pd, peer in HEAD_TO_HEAD.items():
        for c in order_conc:
            r, m = run.cpu_ratio("1K", c, pd, peer), run.cpu_ratio("1K", c, MIN_PD, peer)
            share = "" if r is None or m is None else f" ({m / r:.0%} of {pd}'s)"
            w(f"      1K c={c}: {pd} / {peer} {fmt_ratio(r)}; {MIN_PD} / {peer} "
              f"{fmt_ratio(m)}{share}")
    return out


def _costs(run: _Run, wall_min: float | None) -> list[str]:
    """One host call's cost (the min-pd+N<kind> rows), the run's time and how
    busy the load core was."""
    out = []
    w = out.append
    calls = [(c, c.removeprefix(f"{MIN_PD}+{CALLS_PER_REQUEST}")) for c in run.configs
             if c.startswith(f"{MIN_PD}+{CALLS_PER_REQUEST}")]
    if calls:
        w(f"  [info] one host call (code, data: one KiB touched), µs of router CPU "
          f"(({MIN_PD}+{CALLS_PER_REQUEST}<kind> - {MIN_PD}) / {CALLS_PER_REQUEST}):")
        for c, kind in calls:
            costs = []
            for s, cc in run.all_cols:
                x, m = run.get(s, cc, c, "cpu_us"), run.get(s, cc, MIN_PD, "cpu_us")
                costs.append(f"{s} c={cc} " + ("-" if x is None or m is None
                                              else f"{(x - m) / CALLS_PER_REQUEST:.2f}"))
            w(f"      {kind:<10} " + ", ".join(costs))
    w(f"  [info] vs {BUFFER_FLOOR}: in the ratio table above; {MIN_PD} / {BUFFER_FLOOR}: "
      + run.ratios(MIN_PD, BUFFER_FLOOR))
    if wall_min is not None:
        w(f"  [info] this script took {wall_min:.1f} min (`just bench` as a whole, fresh machine "
          "with installs and the native benches: target < 12 min)")
    w("")
    w("Core 1 (mocks + load generator) busy fraction, median: high values mean req/s is bound "
      "by the mocks, not the router.")
    for size in run.order_sizes:
        for conc in run.order_conc:
            parts = [f"{c}={fmt(run.rows[(size, conc, c)]['core1'], '{:.2f}')}"
                     for c in run.configs if (size, conc, c) in run.rows]
            w(f"  {size:<5} c={conc:<3} " + " ".join(parts))
    return out


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
               "smg": "#f2a65a", "vllm-router": "#e06a6e",
               "envoy+smg": "#b8560f", "envoy+vllm-router": "#8c1c20"}
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


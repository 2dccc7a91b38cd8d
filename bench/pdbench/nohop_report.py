"""The no-hop bench's report (nohop.txt), CSV files and plot (nohop.png),
from the medians over repetitions: rows[(size, concurrency, config)]."""

from __future__ import annotations

import csv
from pathlib import Path

from .common import fmt, log, median, ratio
from .nohop_configs import (CPU_SHARE, CPU_TARGET_CELL, CPU_TARGET_RATIO, FLOOR, MIN_PD, PD,
                            ROUTERS, ROWS, SIZES, TARGET_CELL, TTFT_SHARE, cells)

LABELS = ("envoy", "epp", "vllm-router")
RAW_FIELDS = (["rep", "body", "body_bytes", "concurrency", "config", "completed", "errors",
               "warmup_s", "elapsed_s", "rps", "p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms",
               "cpu_us_per_req"] + [f"cpu_us_{lab}" for lab in LABELS] + ["rss_mb"]
              + [f"rss_mb_{lab}" for lab in LABELS] + ["core0_busy", "core1_busy", "first_error"])
MEDIAN_FIELDS = ["rps", "p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms", "cpu_us_per_req",
                 *(f"cpu_us_{lab}" for lab in LABELS), "rss_mb",
                 *(f"rss_mb_{lab}" for lab in LABELS), "core0_busy", "core1_busy"]
KIND = {r[0]: r[1] for r in ROWS}


def add_ttft(raw: list[dict]) -> None:
    """Each record's latency over the floor's in the same repetition and cell."""
    floor = {(r["rep"], r["body"], r["concurrency"]): r for r in raw
             if r["config"] == FLOOR and (r["completed"] or 0) > 0}
    for r in raw:
        f = floor.get((r["rep"], r["body"], r["concurrency"]))
        for q in ("p50", "p99"):
            ok = f is not None and r[f"{q}_ms"] is not None and (r["completed"] or 0) > 0
            r[f"added_{q}_ms"] = r[f"{q}_ms"] - f[f"{q}_ms"] if ok else None


def aggregate(raw: list[dict], grid, dead: dict) -> dict:
    """Medians over the repetitions that completed requests."""
    rows = {}
    for size, conc, names in grid:
        for c in names:
            rs = [r for r in raw if (r["body"], r["concurrency"], r["config"]) == (size, conc, c)]
            good = [r for r in rs if (r["completed"] or 0) > 0]
            if not good:
                if rs:
                    dead.setdefault(c, f"no request completed: {rs[0]['first_error'][:150]}")
                continue
            m = {k: median(r[k] for r in good) for k in MEDIAN_FIELDS}
            m["errors"] = sum(r["errors"] or 0 for r in good)
            m["reps"] = len(good)
            rows[(size, conc, c)] = m
    return rows


def write_csvs(out: Path, raw: list[dict], rows: dict) -> None:
    with open(out / "nohop-raw.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=RAW_FIELDS, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(raw)
    with open(out / "nohop.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["body", "body_bytes", "concurrency", "config", *MEDIAN_FIELDS, "errors",
                     "reps"])
        for (size, conc, c), m in rows.items():
            wr.writerow([size, SIZES[size], conc, c,
                         *("" if m[k] is None else f"{m[k]:.4g}" for k in MEDIAN_FIELDS),
                         m["errors"], m["reps"]])


def _parts(m: dict, prefix: str, spec: str) -> str:
    parts = [(lab, m.get(f"{prefix}_{lab}")) for lab in LABELS]
    parts = [(lab, v) for lab, v in parts if v is not None]
    if len(parts) < 2:
        return ""
    return " (" + " + ".join(f"{lab} {spec.format(v)}" for lab, v in parts) + ")"


def table(rows: dict, grid) -> list[str]:
    """One line per cell and row, as a Markdown table."""
    out = ["| body | c | row | added TTFT p50 / p99, ms | latency p50 / p99, ms | req/s | "
           "CPU µs/req | peak RSS, MB | core 0 / 1 busy |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size, conc, names in grid:
        for c in names:
            m = rows.get((size, conc, c))
            if m is None:
                out.append(f"| {size} | {conc} | `{c}` | not measured | | | | | |")
                continue
            added = ("floor" if c == FLOOR else
                     f"{fmt(m['added_p50_ms'])} / {fmt(m['added_p99_ms'])}")
            out.append(
                f"| {size} | {conc} | `{c}` | {added} | {fmt(m['p50_ms'])} / {fmt(m['p99_ms'])} | "
                f"{fmt(m['rps'], '{:.0f}')} | {fmt(m['cpu_us_per_req'], '{:.0f}')}"
                f"{_parts(m, 'cpu_us', '{:.0f}')} | {fmt(m['rss_mb'], '{:.0f}')}"
                f"{_parts(m, 'rss_mb', '{:.0f}')} | {fmt(m['core0_busy'], '{:.2f}')} / "
                f"{fmt(m['core1_busy'], '{:.2f}')} |")
    return out


def verdict(value, limit) -> str:
    if value is None or limit is None:
        return "n/a (not measured)"
    return "MET" if value <= limit else "MISSED"


def _per_rep(raw: list[dict], cell, num: str, den: str, key: str) -> str:
    """The ratio num / den per repetition, to show the spread."""
    by = {}
    for r in raw:
        if (r["body"], r["concurrency"]) == cell and r["config"] in (num, den):
            by.setdefault(r["rep"], {})[r["config"]] = r.get(key)
    rs = [ratio(v.get(num), v.get(den)) for _, v in sorted(by.items())]
    return ", ".join(fmt(x, "{:.2f}") for x in rs)


def targets(rows: dict, raw: list[dict]) -> list[str]:
    """Each target with its figures and a verdict."""
    out = ["Targets (stated in bench/README.md before the run):"]
    ext = [c for c, k in KIND.items() if k == "ext_proc" and (*TARGET_CELL, c) in rows]
    pd = rows.get((*TARGET_CELL, PD))
    size, conc = TARGET_CELL
    for q in ("p50", "p99"):
        key = f"added_{q}_ms"
        best = min(ext, key=lambda c: rows[(*TARGET_CELL, c)][key], default=None)
        b = rows[(*TARGET_CELL, best)][key] if best else None
        v = pd[key] if pd else None
        out.append(f"  {size} c={conc}: {PD} added TTFT {q} {fmt(v)} ms <= {TTFT_SHARE:.2f} x "
                   f"the best ext_proc router's ({best}: {fmt(b)} ms, limit "
                   f"{fmt(None if b is None else b * TTFT_SHARE)} ms): ratio "
                   f"{fmt(ratio(v, b), '{:.3f}')}, per repetition "
                   f"{_per_rep(raw, TARGET_CELL, PD, best, key)}: "
                   f"{verdict(v, None if b is None or b <= 0 else b * TTFT_SHARE)}")
    best = min(ext, key=lambda c: rows[(*TARGET_CELL, c)]["cpu_us_per_req"], default=None)
    b = rows[(*TARGET_CELL, best)]["cpu_us_per_req"] if best else None
    v = pd["cpu_us_per_req"] if pd else None
    out.append(f"  {size} c={conc}: {PD} CPU/request {fmt(v, '{:.0f}')} us <= {CPU_SHARE:.2f} x "
               f"the best ext_proc router's ({best}: {fmt(b, '{:.0f}')} us): ratio "
               f"{fmt(ratio(v, b), '{:.3f}')}, per repetition "
               f"{_per_rep(raw, TARGET_CELL, PD, best, 'cpu_us_per_req')}: "
               f"{verdict(v, None if b is None else b * CPU_SHARE)}")
    cpu = {c: (rows.get((*CPU_TARGET_CELL, c)) or {}).get("cpu_us_per_req")
           for c in (PD, MIN_PD, FLOOR, "pd-default")}
    r = ratio(cpu[PD], cpu[MIN_PD])
    out.append(f"  {CPU_TARGET_CELL[0]} c={CPU_TARGET_CELL[1]}: {PD} CPU/request "
               f"{fmt(cpu[PD], '{:.0f}')} us <= {CPU_TARGET_RATIO} x {MIN_PD}'s "
               f"{fmt(cpu[MIN_PD], '{:.0f}')} us: ratio {fmt(r, '{:.2f}')}, per repetition "
               f"{_per_rep(raw, CPU_TARGET_CELL, PD, MIN_PD, 'cpu_us_per_req')}: "
               f"{verdict(r, CPU_TARGET_RATIO)}")
    out.append(f"    beside it: {PD} / {FLOOR} (the same hand-off on the same mocks) "
               f"{fmt(ratio(cpu[PD], cpu[FLOOR]), '{:.2f}')}, pd-default / {MIN_PD} "
               f"{fmt(ratio(cpu['pd-default'], cpu[MIN_PD]), '{:.2f}')}, {FLOOR} / {MIN_PD} "
               f"{fmt(ratio(cpu[FLOOR], cpu[MIN_PD]), '{:.2f}')}")
    return out


def plot(rows: dict, sizes, concs, path: Path) -> None:
    """Added TTFT (p50 solid, p99 dashed) against concurrency, per router,
    one panel per body size; zero is the floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 4.4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        ax.axhline(0, color="grey", linewidth=0.8)
        for i, c in enumerate(ROUTERS):
            for q, style in (("p50", "-"), ("p99", "--")):
                pts = [(n, rows[(size, n, c)][f"added_{q}_ms"]) for n in concs
                       if (size, n, c) in rows and rows[(size, n, c)][f"added_{q}_ms"] is not None]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", color=f"C{i}", label=f"{c} {q}")
        ax.set_title(f"{size} prompts")
        ax.set_xlabel("concurrency")
        ax.set_ylabel(f"added TTFT over {FLOOR}, ms")
        ax.set_xticks(concs)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def read_raw(path: Path) -> list[dict]:
    """nohop-raw.csv back as records (numbers as numbers, blanks as None)."""
    text = ("body", "config", "first_error")
    with open(path, newline="") as f:
        return [{k: (v if k in text else (None if v == "" else float(v)))
                 for k, v in r.items()} | {"concurrency": int(r["concurrency"]),
                                           "rep": int(r["rep"])}
                for r in csv.DictReader(f)]


def replot(out: Path, sizes, concs, configs) -> None:
    """nohop.png again from nohop-raw.csv (no run)."""
    raw = read_raw(out / "nohop-raw.csv")
    rows = aggregate(raw, cells(sizes, concs, configs), {})
    plot(rows, sizes, concs, out / "nohop.png")
    log(f"wrote {out / 'nohop.png'}")


def write_results(a, raw, sizes, concs, configs, dead: dict, notes: list[str], wall_s: float,
                  ok: bool) -> int:
    grid = cells(sizes, concs, configs)
    add_ttft(raw)
    rows = aggregate(raw, grid, dead)
    a.out.mkdir(parents=True, exist_ok=True)
    write_csvs(a.out, raw, rows)
    text = [f"No-hop rows: {a.reps} repetitions of {a.warmup:g} s warm-up + {a.duration:g} s "
            f"windows at least (a slow row's longer: bench/README.md); medians. Added TTFT: latency minus {FLOOR}'s in the same repetition "
            "and cell. CPU: every process in the path, summed (parts in brackets).", ""]
    text += table(rows, grid) + [""] + targets(rows, raw)
    text += [""] + notes
    if dead:
        text += ["", "Not measured / failed:"] + [f"  {c}: {why}" for c, why in dead.items()]
    text += ["", f"Wall time: {wall_s / 60:.1f} min"]
    (a.out / "nohop.txt").write_text("\n".join(text) + "\n")
    try:
        plot(rows, sizes, concs, a.out / "nohop.png")
    except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
        log(f"plot failed: {e}")
    print("\n".join(text))
    log(f"wrote {a.out / 'nohop.txt'}, nohop.csv, nohop-raw.csv, nohop.png")
    return 0 if ok and not dead else 1

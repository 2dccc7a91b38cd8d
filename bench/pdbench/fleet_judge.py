"""The fleet simulation's repeated runs, judged: each configuration's figures
over its seeds (median and range), the default against each peer where the
ranges do not overlap, and TTFT by prompt-length bucket beside the unloaded
floor (bench/README.md, "Fleet simulation")."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from .fleet_metrics import BUCKETS, bucket_name

# key, header, format, sense: -1 lower is better, +1 higher, 0 no verdict.
METRICS = [
    ("hit_of_limit", "hit%lim", "{:.1%}", +1),
    ("ttft_p50", "ttft50", "{:.2f}", -1),
    ("ttft_p90", "ttft90", "{:.2f}", -1),
    ("ttft_p99", "ttft99", "{:.2f}", -1),
    ("pod_ttft_p50", "pod50", "{:.2f}", -1),
    ("pod_ttft_p99", "pod99", "{:.2f}", -1),
    ("output_tok_s", "out/s", "{:.0f}", +1),
    ("computed_tokens", "computed", "{:.3g}", -1),
    ("prefill_busy", "P busy", "{:.0%}", 0),
    ("prefill_load_max_mean", "P max/mn", "{:.2f}", -1),
    ("evicted_blocks", "evicted", "{:.0f}", 0),
    ("reloaded_tokens", "reloaded", "{:.3g}", 0),
]
# pd-router's default against each peer on the same sims: vLLM NIXL for
# vllm-router, SGLang for SMG (pd-sglang: pd-router's defaults on those).
PAIRS = [("pd-ttft", "vllm-router"), ("pd-ttft", "vllm-router-tuned"),
         ("pd-ttft", "epp-gie"), ("pd-ttft", "dynamo"), ("pd-ttft", "dynamo-tuned"),
         ("pd-ttft", "llmd"), ("pd-ttft", "llmd-tuned"),
         ("pd-sglang", "smg"), ("pd-sglang", "smg-tuned")]
# The targets fixed before the judged runs (bench/README.md): the default
# against the best peer, and its hit rate against the trace's limit.
# The pods' own TTFT (the router's real time left out) is judged beside the
# client's: on a busy machine the time scale multiplies the routers' time.
VERDICT_KEYS = ["ttft_p50", "ttft_p99", "pod_ttft_p50", "pod_ttft_p99", "output_tok_s",
                "hit_of_limit"]
HIT_TARGET = 0.97


def groups(results: dict) -> dict[tuple[str, str], list[dict]]:
    """The runs by (configuration with its variant, window), seeds together."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in results.values():
        out.setdefault((r["config"], r.get("window") or ""), []).append(r)
    return out


def spread(rows: list[dict], key: str) -> tuple[float, float, float] | None:
    """(median, min, max) of `key` over the runs that have it."""
    xs = [r[key] for r in rows if r.get(key) is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else None


def show(s: tuple | None, spec: str) -> str:
    if s is None:
        return "-"
    med, lo, hi = (spec.format(x) for x in s)
    return f"{med} [{lo}-{hi}]" if lo != hi else med


def verdict(a: tuple | None, b: tuple | None, sense: int) -> str:
    """`a` against `b`: better or worse where the ranges do not overlap."""
    if a is None or b is None:
        return "-"
    if a[2] < b[1]:
        return "better" if sense < 0 else "worse"
    if a[1] > b[2]:
        return "better" if sense > 0 else "worse"
    return "tie"


def table(results: dict) -> list[str]:
    g = groups(results)
    name_w = max([len(f"{c} {w}") for c, w in g] + [20])
    widths = [max(len(h), 22) for _, h, _, _ in METRICS]
    out = [f"{'config window':<{name_w}} {'n':>2}" + "".join(
        f" {h:>{wd}}" for (_, h, _, _), wd in zip(METRICS, widths))]
    out.append("-" * len(out[0]))
    for (c, w), rows in sorted(g.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        out.append(f"{c + ' ' + w:<{name_w}} {len(rows):>2}" + "".join(
            f" {show(spread(rows, k), spec):>{wd}}" for (k, _, spec, _), wd in zip(METRICS, widths)))
    return out


def verdicts(results: dict) -> list[str]:
    """The default against each peer in the same variant and window, and its
    hit rate against the target."""
    g = groups(results)
    out = []
    for (c, w), rows in sorted(g.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        base, _, suffix = c.partition("@")
        peers = [p for d, p in PAIRS if d == base]
        if not peers:
            continue
        hit = spread(rows, "hit_of_limit")
        hit_v = ("-" if hit is None else "met" if hit[1] >= HIT_TARGET else
                 "not met" if hit[2] < HIT_TARGET else "unclear")
        for peer in peers:
            other = g.get((peer + (f"@{suffix}" if suffix else ""), w))
            if not other:
                continue
            cells = [f"{k} {verdict(spread(rows, k), spread(other, k), s)}"
                     for k, _, _, s in METRICS if k in VERDICT_KEYS]
            out.append(f"  {w or 'all'} {c} vs {peer}: " + ", ".join(cells)
                       + f"; hit >= {HIT_TARGET:.0%} of the limit: {hit_v}")
    return out


def bucket_lines(results: dict) -> list[str]:
    """TTFT p50 / p99 per prompt-length bucket (medians over seeds) beside the
    unloaded floor's p50, per window."""
    g = groups(results)
    out = []
    for w in sorted({w for _, w in g}):
        configs = sorted(c for c, w_ in g if w_ == w)
        out.append(f"window {w or 'all'}: TTFT p50 / p99 by prompt length, modelled s (median "
                   "over seeds); floor: alone on idle pods holding the reusable prefix")
        out.append(f"  {'bucket':<10} {'n':>5} {'floor p50':>10}" + "".join(
            f" {c:>22}" for c in configs) + "".join(f" {c + ' p50/floor':>26}" for c in configs))
        for lo, hi in BUCKETS:
            b = bucket_name(lo, hi)
            first = next(iter(g[(configs[0], w)]), {}).get("buckets", {}).get(b, {})
            floor = first.get("floor_p50")
            cells, ratios = [], []
            for c in configs:
                rows = [r.get("buckets", {}).get(b, {}) for r in g[(c, w)]]
                p50 = med([x.get("ttft_p50") for x in rows])
                p99 = med([x.get("ttft_p99") for x in rows])
                cells.append(f"{fmt(p50)} / {fmt(p99)}")
                ratios.append(f"{p50 / floor:.1f}x" if p50 is not None and floor else "-")
            out.append(f"  {b:<10} {first.get('n', 0):>5} {fmt(floor):>10}" + "".join(
                f" {x:>22}" for x in cells) + "".join(f" {x:>26}" for x in ratios))
    return out


def med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def judge_report(results: dict, params: dict) -> str:
    out = [f"Over seeds {params['seeds']}: median [min-max] per configuration and window "
           f"(bytes per token {params['bytes_per_token']}, host tier {params['host_gbs']:g} GB/s)."]
    for n, w in sorted(params.get("windows", {}).items()):
        out.append(f"  window {n}: requests {w['first']}-{w['last']} after {w['warmup']} of "
                   f"warm-up; limit {w['limit_pct']:.1%} of their prompt tokens")
    out += [""] + table(results) + [""]
    out.append("Verdicts: better / worse where the ranges over seeds do not overlap, else tie "
               "(lower TTFT, higher out/s and hit rate are better).")
    out += verdicts(results) + [""] + bucket_lines(results)
    return "\n".join(out)


def write_judge_csv(path: Path, results: dict) -> None:
    """One row per configuration and window: each metric's median, min, max."""
    with open(path, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["config", "window", "runs"] + [f"{k}_{s}" for k, _, _, _ in METRICS
                                                    for s in ("median", "min", "max")])
        for (c, w), rows in sorted(groups(results).items()):
            row = [c, w, len(rows)]
            for k, _, _, _ in METRICS:
                row += list(spread(rows, k) or (None, None, None))
            wr.writerow(row)


def plot_judged(results: dict, path: Path, title: str) -> None:
    """Per window, each configuration's TTFT p50 and p99 (median, the range
    as error bars) and its hit rate of the limit."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = groups(results)
    keys = sorted(g, key=lambda k: (k[1], k[0]))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(keys) + 2), 8), sharex=True)
    xs = range(len(keys))

    def bars(ax, key, dx, wd, label, color, scale=1.0):
        s = [spread(g[k], key) or (0, 0, 0) for k in keys]
        ax.bar([x + dx for x in xs], [m * scale for m, _, _ in s], wd, label=label, color=color,
               yerr=[[(m - lo) * scale for m, lo, _ in s], [(hi - m) * scale for m, _, hi in s]],
               capsize=3)

    bars(ax1, "hit_of_limit", 0, 0.6, "hit, % of limit", "#1f4e9c", 100)
    ax1.set_ylabel("prefix-cache hit, % of the limit")
    ax1.axhline(100 * HIT_TARGET, color="grey", lw=0.8, ls="--")
    bars(ax2, "ttft_p50", -0.2, 0.4, "TTFT p50", "#3a86d4")
    bars(ax2, "ttft_p99", 0.2, 0.4, "TTFT p99", "#e06a6e")
    ax2.set_yscale("log")
    ax2.set_ylabel("TTFT, modelled s (log); bars: min-max over seeds")
    ax2.legend()
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels([f"{c}\n{w}" for c, w in keys], rotation=45, ha="right")
    for ax in (ax1, ax2):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

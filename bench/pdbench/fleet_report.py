"""The fleet simulation's report (fleet*.txt), CSV file and plot."""

from __future__ import annotations

import csv
from pathlib import Path

from .fleet_configs import VARIANTS, Run

# -------------------------------------------------------------------- report

COLUMNS = [
    # key, header, format, csv name
    ("hit_of_limit", "hit%lim", "{:.1%}", "hit_of_limit"),
    ("hit_of_prompt", "hit%prm", "{:.1%}", "hit_of_prompt"),
    ("pulled_of_limit", "pull%lim", "{:.1%}", "pulled_of_limit"),
    ("later_hit_of_limit", "hit%turn", "{:.1%}", "later_hit_of_limit"),
    ("same_pod_turns", "sticky", "{:.0%}", "same_pod_turns"),
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
        what = (f"{common.requests} requests a run, the first {common.warmup} of them warm-up"
                if common.window else f"the first {common.requests} requests")
        out.append(f"  {label:<10} load {common.load:g}, {common.prefill} prefill + "
                   f"{common.decode} decode pods, {what}, time "
                   f"scale {common.time_scale:g}" + (f" ({', '.join(other)})" if other else ""))
    return out


def report(results: dict, failed: dict, params: dict, runs: list[Run], wall_s: float) -> str:
    out = []
    w = out.append
    w("Fleet simulation (bench/fleet.py): the trace replayed through each router onto "
      "simulated pods. Times are modelled seconds.")
    if params.get("windows"):
        w(f"Trace: {params['trace']}, windows " + ", ".join(
            f"{n} (requests {x['first']}-{x['last']} after {x['warmup']} of warm-up)"
            for n, x in sorted(params["windows"].items())) + ". Load: the trace's rate times it. "
          "Time scale: modelled s per real s.")
    else:
        w(f"Trace: {params['trace']}, the first {params['requests']} requests "
          f"({params['trace_span_s']:.0f} s of the trace at load 1). Load: the trace's rate "
          "times it. Time scale: modelled s per real s.")
    w(f"Prompts: {params.get('bytes_per_token', 4)} bytes a token; host tier reload "
      f"{params.get('host_gbs', 25):g} GB/s; seeds {params.get('seeds', [0])}"
      + ("; each later turn's text extends the previous turn's (--extend-turns)."
         if params.get("extend_turns") else "."))
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
            what = failed[n] if failed[n].startswith("skipped:") else f"failed: {failed[n]}"
            w(f"{n:<{width}} ({what})"[:200])
    w("")
    w("hit%lim: prompt tokens found cached on the pod that computed the prompt (the prefill "
      "leg, or a request served whole) / the")
    w("  trace's limit (the tokens of each request's leading blocks seen in an earlier request "
      "of the run: an unbounded cache")
    w("  shared by the fleet); hit%prm: the same / all prompt tokens. The limit row is the "
      "first requests' (the @32p runs' too).")
    w("hit%turn: hit%lim over the requests that continue a conversation (the replayer's "
      "session: their hash ids begin with an earlier")
    w("  request's full blocks); sticky: the share of those computed on the pod that "
      "computed the conversation's previous turn.")
    w("pull%lim: prompt tokens the prefill pods pulled from the last turn's decode pod "
      "(vLLM's bidirectional NIXL transfer) instead of")
    w("  computing them / the trace's limit (can pass 100 %: the limit counts prompt "
      "blocks seen before, a pull also the last output).")
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
            what = ("cache_aware picks (prefill and decode)" if any(k.startswith("branch:") for k in d)
                    else "KV router: events applied, prefill overlap seen (best) and taken (picked)"
                    if any(k.startswith("kv_events:") for k in d)
                    else "prefill decisions")
            w(f"  {n}: {what} " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(d.items())))
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
    if params.get("windows"):
        return (f"Fleet simulation, windows {', '.join(sorted(params['windows']))} after their "
                f"warm-up, seeds {params['seeds']}: bench/results/{stem}.txt")
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

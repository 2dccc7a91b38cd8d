"""Where a fleet run's TTFT tail comes from: reads one run kept with
`bench/fleet.py --keep` (its records.json and the trace copy beside it) and
breaks the slowest requests' first token into its parts.

    bench/.venv/bin/python bench/fleet_tail.py /tmp/pd-fleet-XXXX/pd-ttft_w2k_s1 --skip 2000

For each request of the slowest 1 % (by the pods' TTFT: its prefill's
arrival to the decode leg's first token) it prints the prompt, the tokens
its prefill pod held and computed, how long it waited to be admitted, how
long its prefill ran, and what came after (the hand-off and the decode's
first step). Beside that, the prefill tokens queued on its pod when it
arrived (those of the prefills there that had arrived and not yet given
their first token) against the least any other prefill pod had queued,
and how many of its blocks the pod that had least queued held by then.
The last lines sum the same over the whole window: whether the tail is
waiting behind a pod's queue, and whether an idler pod was there."""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path

BLOCK = 512


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run's directory under a --keep scratch directory")
    ap.add_argument("--skip", type=int, default=0,
                    help="leave out the requests before trace index N (a window's warm-up)")
    ap.add_argument("--since-s", type=float, default=None,
                    help="instead of --skip, leave out the requests that arrived before this "
                         "modelled second (a router that renames requests, like Dynamo's)")
    ap.add_argument("--top", type=float, default=1.0, help="the slowest this many percent")
    a = ap.parse_args()
    trace_file = next(a.run.parent.glob("*.jsonl"))
    trace = [json.loads(line) for line in trace_file.open()]
    records = json.loads((a.run / "records.json").read_text())
    prefill = {r["user"]: r for r in records if r["role"] == "prefill" and r["first_token_s"]}
    decode = {r["user"]: r for r in records if r["role"] == "decode" and r["first_token_s"]}
    pods = sorted({r["pod"] for r in prefill.values()})

    # What each pod held when: a pod holds a request's blocks from its
    # prefill's first token on (the sims' rule), evictions ignored.
    index = {u: int(u[1:]) for u in prefill if u[:1] == "r" and u[1:].isdigit()}
    events = sorted((r["first_token_s"], r["pod"], index[u])
                    for u, r in prefill.items() if u in index)

    def held_by(t: float) -> dict[str, set]:
        held: dict[str, set] = collections.defaultdict(set)
        for when, pod, i in events:
            if when > t:
                break
            held[pod].update(trace[i]["hash_ids"])
        return held

    def queued(pod: str, t: float, me: str) -> int:
        return sum(r["computed_tokens"] for u, r in prefill.items()
                   if u != me and r["pod"] == pod and r["arrival_s"] <= t < r["first_token_s"])

    rows = []
    for u, p in prefill.items():
        if u not in decode:
            continue
        if (p["arrival_s"] < a.since_s) if a.since_s is not None else index.get(u, 0) < a.skip:
            continue
        rows.append((decode[u]["first_token_s"] - p["arrival_s"], u, p))
    rows.sort(reverse=True)
    n = max(1, round(len(rows) * a.top / 100))
    print(f"{len(rows)} requests; the slowest {n} ({a.top:g} %), modelled seconds:")
    print(f"{'req':>6} {'ttft':>6} {'prompt':>7} {'held':>7} {'comp':>7} {'wait':>6} {'prefill':>7}"
          f" {'after':>6} {'queued':>8} {'least other':>11} {'its blocks there':>16}")
    waits, behind, idler = [], 0, 0
    for ttft, u, p in rows[:n]:
        t = p["arrival_s"]
        here = queued(p["pod"], t, u)
        others = {q: queued(q, t, u) for q in pods if q != p["pod"]}
        least = min(others, key=others.get)
        blocks = trace[index[u]]["hash_ids"] if u in index else []
        there = len(set(blocks) & held_by(t)[least]) if blocks else -1
        wait = p["admitted_s"] - t
        waits.append(wait)
        behind += here > others[least]
        idler += others[least] == 0
        print(f"{u:>6} {ttft:6.2f} {p['prompt_tokens']:7d} {p['cached_tokens']:7d}"
              f" {p['computed_tokens']:7d} {wait:6.2f} {p['first_token_s'] - p['admitted_s']:7.2f}"
              f" {ttft - (p['first_token_s'] - t):6.2f} {here:8d} {others[least]:11d}"
              f" {there:>7d}/{len(blocks):<8d}")
    print(f"of the {n}: median wait to be admitted {statistics.median(waits):.2f} s; "
          f"{behind} had more queued on their pod than another pod had; "
          f"{idler} had a pod with nothing queued")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

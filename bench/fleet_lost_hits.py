"""Where a fleet run's prefix-cache hits went: reads one run kept with
`bench/fleet.py --keep` (its records.json and the trace copy beside it) and
replays the placements against what each pod had computed by then.

    bench/.venv/bin/python bench/fleet_lost_hits.py /tmp/pd-fleet-XXXX/pd-ttft_tune_s1 [--skip N]

It prints, in tokens of the trace's limit (each request's leading 512-token
blocks seen in an earlier request, capped at its prompt less one token):
- lost because no pod held them yet (a prefix still being computed);
- lost because the request went to a pod holding less than another did,
  and of those moves, how many had the last pod to serve the prefix among
  the holders (a load move) or not (the router's table named another);
- of the requests whose longest held prefix is one or two blocks held by
  several pods (a shared system prompt), how many went to the last pod to
  serve it: a router whose table knows only that pod piles them there.

A pod holds a request's blocks from its prefill's first token on (the
sims' rule: computed blocks only) and never drops them here, so what the
chosen pod had computed less what the sims found cached on it is what its
evictions took (a block evicted before the request's step came)."""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

BLOCK = 512


def load(run: Path):
    trace_file = next(run.parent.glob("*.jsonl"))
    trace = [json.loads(line) for line in trace_file.open()]
    records = json.loads((run / "records.json").read_text())
    computed = {r["user"]: r for r in records if r["role"] in ("prefill", "whole")}
    return trace, computed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run's directory under a --keep scratch directory")
    ap.add_argument("--skip", type=int, default=0,
                    help="leave out the requests before trace index N (a window's warm-up: "
                         "its first measured request, e.g. 6000 for t6k)")
    a = ap.parse_args()
    trace, computed = load(a.run)

    events = []
    for r in computed.values():
        i = int(r["user"][1:])
        events.append((r["arrival_s"], 0, r["pod"], i))
        events.append((r["first_token_s"], 1, r["pod"], i))
    events.sort()

    held: dict[str, set] = collections.defaultdict(set)
    last_served: dict[tuple, str] = {}
    seen: set = set()
    t = collections.Counter()
    for _, kind, pod, i in events:
        ids = trace[i]["hash_ids"]
        prefixes = [tuple(ids[:k]) for k in range(1, len(ids) + 1)]
        if kind == 1:
            held[pod].update(prefixes)
            continue
        n = trace[i]["input_length"]

        def depth(contains) -> int:
            d = 0
            while d < len(prefixes) and contains(prefixes[d]):
                d += 1
            return d

        cap = lambda blocks: min(blocks * BLOCK, n - 1)  # noqa: E731
        limit = cap(depth(seen.__contains__))
        seen.update(prefixes)
        by_pod = {p: depth(h.__contains__) for p, h in held.items()}
        best = max(by_pod.values(), default=0)
        holders = [p for p, d in by_pod.items() if d == best and best > 0]
        table = depth(last_served.__contains__)
        table_pod = last_served.get(prefixes[table - 1]) if table else None
        for p in prefixes:
            last_served[p] = pod
        if i < a.skip:
            continue
        mine = by_pod.get(pod, 0)
        t["requests"] += 1
        t["limit"] += limit
        t["best"] += min(cap(best), limit)
        t["chosen"] += min(cap(mine), limit)
        t["cached"] += computed[f"r{i}"]["cached_tokens"]
        if best > mine:
            t["moves"] += 1
            t["load moves" if table_pod in holders else "table named another"] += 1
        if 0 < best <= 2 and len(holders) > 1:
            t["shared short prefix"] += 1
            t["to the last pod to serve it"] += pod == table_pod

    lim = t["limit"] or 1
    print(f"{a.run}: {t['requests']} requests, limit {t['limit']} tokens")
    print(f"  cached on the chosen pod (the sims' count): {t['cached'] / lim:.1%} of the limit")
    print(f"  lost, no pod held it yet:                   {(t['limit'] - t['best']) / lim:.1%}")
    print(f"  lost on the chosen pod after it computed it: {(t['chosen'] - t['cached']) / lim:.1%}"
          " (evicted, or not yet computed when its step came)")
    print(f"  lost, sent to a pod holding less:           {(t['best'] - t['chosen']) / lim:.1%}"
          f" over {t['moves']} requests ({t['load moves']} load moves, "
          f"{t['table named another']} where the last pod to serve the prefix held less)")
    print(f"  a shared prefix of 1-2 blocks held by several pods: {t['shared short prefix']} requests, "
          f"{t['to the last pod to serve it']} to the last pod to serve it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The fleet simulation's figures: the trace and its limit (the tokens an
unbounded shared cache would reuse), and each run's summary from the
replayer's and the sim's records."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

# ------------------------------------------------------------------- the trace

def load_trace(path: Path, scratch: Path) -> tuple[Path, list[dict]]:
    """The trace as a plain file the replayer reads, and its lines."""
    if path.suffix == ".gz":
        plain = scratch / path.name.removesuffix(".gz")
        with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        plain = path
    lines = []
    with open(plain) as f:
        for line in f:
            if line.strip():
                lines.append(json.loads(line))
    return plain, lines


def block_tokens(t: dict, i: int) -> int:
    return max(0, min(512, t["input_length"] - 512 * i))


def reusable_tokens(trace: list[dict]) -> list[int]:
    """Per request: the tokens of its leading blocks already seen in an
    earlier request (an unbounded cache shared by the fleet), capped as a pod
    caps its hit (the last token is always computed)."""
    seen: set = set()
    out = []
    for t in trace:
        tokens = 0
        for i, h in enumerate(t["hash_ids"]):
            if h not in seen:
                break
            tokens += block_tokens(t, i)
        out.append(min(tokens, max(0, t["input_length"] - 1)))
        seen.update(t["hash_ids"])
    return out


# -------------------------------------------------------------------- metrics

def pct(xs: list[float], p: float) -> float | None:
    """The p-th percentile, linear between the closest ranks."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def max_over_mean(values: list[float]) -> float | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else None


def pod_ttft(legs: dict[str, list[dict]]) -> float | None:
    """The time to first token the pods alone take, on the sim's clock: the
    decode leg's (or the whole request's) arrival to its first token, plus
    the answered prefill leg's time on its pod before the decode arrived (a
    sequential hand-off's whole prefill; nothing for a concurrent one, whose
    decode waits for the KV on its pod). The router's and HTTP's real time,
    which the time scale multiplies, is left out."""
    def answered(role: str) -> dict | None:
        rs = [r for r in legs.get(role) or [] if r["status"] == 200]
        return max(rs, key=lambda r: r.get("finish_s") or 0) if rs else None
    last = answered("decode") or answered("whole")
    if last is None or last.get("first_token_s") is None:
        return None
    t = last["first_token_s"] - last["arrival_s"]
    pre = answered("prefill")
    if pre is not None and pre.get("finish_s") is not None:
        t += max(0.0, min(pre["finish_s"], last["arrival_s"]) - pre["arrival_s"])
    return t


def summarize(seen: list[dict], records: list[dict], pods: dict, trace: list[dict],
              reusable: list[int]) -> dict:
    by_user: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        by_user.setdefault(r["user"], {}).setdefault(r["role"], []).append(r)

    def computed_here(user: str) -> dict | None:
        """The record of the pod that computed the prompt: the prefill leg
        (the answered one if several), else a whole request."""
        legs = by_user.get(user, {})
        for role in ("prefill", "whole"):
            rs = legs.get(role) or []
            ok = [r for r in rs if r["status"] == 200 and r.get("finish_s") is not None]
            if ok or rs:
                return max(ok or rs, key=lambda r: r.get("finish_s") or 0)
        return None

    cached = pulled = 0
    overhead = []
    pod_times = []
    for s in seen:
        r = computed_here(s["user"])
        if r is not None:
            cached += r["cached_tokens"]
            # A prefill leg's transferred tokens: pulled from the last
            # turn's decode pod (vLLM's bidirectional transfer), not computed.
            pulled += r["transferred_tokens"] if r["role"] == "prefill" else 0
        # What the router and HTTP add to the time to first token (real
        # time, multiplied by the time scale): the client's TTFT minus the
        # pods' own, from the first leg's arrival to the first token.
        legs = [x for rs in by_user.get(s["user"], {}).values() for x in rs]
        firsts = [x["first_token_s"] for x in legs
                  if x["role"] in ("decode", "whole") and x.get("first_token_s") is not None]
        if legs and firsts and s.get("ttft_s") is not None and s["status"] == 200:
            overhead.append(s["ttft_s"] - (min(firsts) - min(x["arrival_s"] for x in legs)))
            t = pod_ttft(by_user.get(s["user"], {}))
            if t is not None:
                pod_times.append(t)
    prompt_tokens = sum(t["input_length"] for t in trace)
    limit = sum(reusable)
    good = [s for s in seen if s["status"] == 200 and not s.get("error")]
    ttft = [s["ttft_s"] for s in good if s.get("ttft_s") is not None]
    e2e = [s["e2e_s"] for s in good if s.get("e2e_s") is not None]
    ends = [s["arrival_s"] + s["late_s"] + s["e2e_s"] for s in seen if s.get("e2e_s") is not None]
    span = (max(ends) - min(s["arrival_s"] for s in seen)) if ends else None
    out_tokens = sum(s["output_tokens"] for s in good)
    timeouts = sum(1 for s in seen if s.get("error") == "timed out")
    errors = len(seen) - len(good)
    first_error = next((f"{s['status']}: {s.get('error') or ''}"[:200]
                        for s in seen if s not in good), "")

    # The prefill pods' run, on the sim's clock: from the first arrival to
    # the last prompt computed on a prefill pod (the decode tail after it
    # leaves them idle); the decode pods': to the last completion.
    role_pods = {role: [p for p in pods["pods"] if p["role"] == role]
                 for role in ("prefill", "decode")}
    on_prefill = {p["name"] for p in role_pods["prefill"]}
    starts = [r["arrival_s"] for r in records]
    p_end = [r["finish_s"] for r in records
             if r.get("finish_s") is not None and r["pod"] in on_prefill]
    d_end = [r["finish_s"] for r in records if r.get("finish_s") is not None]
    window = (max(p_end) - min(starts)) if starts and p_end else None
    d_window = (max(d_end) - min(starts)) if starts and d_end else None
    busy = [p["busy_s"] / window for p in role_pods["prefill"]] if window else []
    dbusy = [p["busy_s"] / d_window for p in role_pods["decode"]] if d_window else []
    late = [s["late_s"] for s in seen]
    return {
        "requests": len(seen),
        "answered": len(good),
        "hit_of_limit": cached / limit if limit else None,
        "hit_of_prompt": cached / prompt_tokens if prompt_tokens else None,
        "cached_tokens": cached,
        "pulled_of_limit": pulled / limit if limit else None,
        "pulled_tokens": pulled,
        "reusable_tokens": limit,
        "prompt_tokens": prompt_tokens,
        "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
        "e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99),
        "overhead_p50": pct(overhead, 50), "overhead_p99": pct(overhead, 99),
        "pod_ttft_p50": pct(pod_times, 50), "pod_ttft_p99": pct(pod_times, 99),
        "output_tokens": out_tokens,
        "span_s": span,
        "output_tok_s": out_tokens / span if span else None,
        "computed_tokens": sum(r["computed_tokens"] for r in records),
        "transferred_tokens": sum(r["transferred_tokens"] for r in records),
        "prefill_load_max_mean": max_over_mean([p["running_s"] for p in role_pods["prefill"]]),
        "decode_load_max_mean": max_over_mean([p["running_s"] for p in role_pods["decode"]]),
        "prefill_busy": sum(busy) / len(busy) if busy else None,
        "prefill_busy_max": max(busy) if busy else None,
        "decode_busy": sum(dbusy) / len(dbusy) if dbusy else None,
        "window_s": window,
        "errors": errors,
        "timeouts": timeouts,
        "first_error": first_error,
        "handoff_missing": sum(1 for r in records if r["handoff"] == "missing"),
        "handoff_expired": sum(1 for r in records if r["handoff"] == "expired"),
        "late_p99": pct(late, 99), "late_max": max(late) if late else None,
        "pods_prefill": len(role_pods["prefill"]), "pods_decode": len(role_pods["decode"]),
    }


def turn_stats(seen: list[dict], records: list[dict], reusable: list[int], warmup: int) -> dict:
    """Of the measured requests that are a conversation's later turn (begun
    by an earlier request: the replayer's `session`, fleet-sim's
    replay.rs `sessions`): how many, the share whose prompt was computed on
    the pod that computed the previous turn's, and their hit rate of their
    limit. `seen` and `reusable` span the whole replay, warm-up included."""
    computed_on = {r["user"]: r for r in records
                   if r["role"] in ("prefill", "whole") and r["status"] == 200}
    last: dict[str, str] = {}
    later = same = hit = limit = 0
    for s in sorted(seen, key=lambda s: s["index"]):
        session, r = s.get("session"), computed_on.get(s["user"])
        if session is None:
            continue
        if s["index"] >= warmup and session != "c" + s["user"][1:]:
            later += 1
            same += r is not None and last.get(session) == r["pod"]
            hit += r["cached_tokens"] if r is not None else 0
            limit += reusable[s["index"]]
        if r is not None:
            last[session] = r["pod"]
    return {"later_turns": later, "same_pod_turns": same / later if later else None,
            "later_hit_of_limit": hit / limit if limit else None}


# Prompt-length buckets of the per-bucket report, in tokens: [low, high).
BUCKETS = [(0, 4096), (4096, 8192), (8192, 16384), (16384, 32768), (32768, 1 << 30)]


def bucket_name(lo: int, hi: int) -> str:
    return f"{lo // 1024}k-{hi // 1024}k" if hi < 1 << 30 else f">={lo // 1024}k"


def bucket_stats(rows: list[tuple]) -> dict:
    """Per prompt-length bucket, from (prompt tokens, TTFT or None, floor):
    requests, TTFT p50/p99 over the answered, and the floor's p50/p99."""
    out = {}
    for lo, hi in BUCKETS:
        rs = [r for r in rows if lo <= r[0] < hi]
        ttft = [r[1] for r in rs if r[1] is not None]
        floor = [r[2] for r in rs if r[2] is not None]
        out[bucket_name(lo, hi)] = {"n": len(rs), "ttft_p50": pct(ttft, 50),
                                    "ttft_p99": pct(ttft, 99), "floor_p50": pct(floor, 50),
                                    "floor_p99": pct(floor, 99)}
    return out


def peer_decisions(pages: list[str]) -> dict:
    """A peer's routing outcomes from its metrics page: vllm-router's prefill
    ones (prefix_hit, prefix_miss, missing_tokens: no token ids within its
    budget, so by load alone); SMG's cache_aware branches, prefill and decode
    picks together (`branch:tree_match`: a worker's tree held at least the
    threshold's share of the prompt; `branch:expected_wait_fallback`: it did
    not, the least expected wait took it; `branch:spill`: the matched worker
    was over the spill thresholds); Dynamo's KV events as its router applied
    them (`kv_events:stored:ok`; any other status is an event it refused),
    and the prefill pods' cached prefix (tokens, its block's) it saw on the
    best pod for each request and on the pod it picked (`overlap:best`,
    `overlap:picked`)."""
    out: dict[str, float] = {}
    for page in pages:
        for line in page.splitlines():
            if (line.startswith("vllm_router_prefix_routing_decisions_total{")
                    and 'stage="prefill"' in line):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            elif line.startswith("smg_cache_aware_policy_branch_total{"):
                outcome = "branch:" + line.split('branch="', 1)[1].split('"', 1)[0]
            elif (line.startswith("dynamo_component_kv_cache_events_applied{")
                  and not line.endswith(" 0")):
                outcome = ("kv_events:" + line.split('event_type="', 1)[1].split('"', 1)[0]
                           + ":" + line.split('status="', 1)[1].split('"', 1)[0])
            elif (line.startswith("dynamo_component_router_kv_")
                  and "_cached_prefix_tokens_total{" in line and 'phase="prefill"' in line):
                outcome = ("overlap:best" if "best_eligible" in line.split("{", 1)[0]
                           else "overlap:picked")
            else:
                continue
            out[outcome] = out.get(outcome, 0) + float(line.rsplit(" ", 1)[1])
    return out

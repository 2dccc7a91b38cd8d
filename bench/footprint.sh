#!/usr/bin/env bash
# How much code and data one request's flow touches, counted by cachegrind
# (simulated caches, so it works where the VM exposes no hardware counters):
# benches/host_calls.rs runs the same requests with and without its cold
# phase (caches overwritten before every callback); the difference in
# last-level misses, over the cold requests, is the distinct cache lines of
# code and of data a request brings in from memory when it finds the core
# cold. The first run's L1 instruction misses, over its warm requests, say
# whether the flow's code fits a 32 KiB L1i.
#
#   bench/footprint.sh        (installs valgrind with apt if missing)
#
# Native x86-64 code, not the V8-compiled module: the counts rank the
# footprint, they do not give V8's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || {
  apt-get update -qq && apt-get install -y -qq --no-install-recommends valgrind >/dev/null
}
# Symbols and line tables kept, so `cg_annotate target/footprint/cg-cold.out`
# can name where the lines come from.
bin=$(CARGO_PROFILE_RELEASE_STRIP=none CARGO_PROFILE_BENCH_STRIP=none CARGO_PROFILE_BENCH_DEBUG=true \
  cargo bench --bench host_calls --no-run --target-dir target/footprint 2>&1 |
  sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -n1)
[ -x "$bin" ] || { echo "footprint: no bench binary built" >&2; exit 1; }

engines=4 warm=500 cold=50
for run in warm:0 cold:$cold; do
  COLD_ITERS=${run#*:} WARM_ITERS=$warm EVICT_MB=4 valgrind --tool=cachegrind --cache-sim=yes \
    --I1=32768,8,64 --D1=49152,12,64 --LL=1048576,16,64 \
    --cachegrind-out-file="target/footprint/cg-${run%%:*}.out" "$bin" --bench >/dev/null 2>&1
done
# Warm requests: 5 timed rounds and one counted request per engine.
python3 - target/footprint/cg-warm.out target/footprint/cg-cold.out \
  $((engines * (5 * warm + 1))) $((engines * cold)) <<'PY'
import sys

def totals(path):
    events = summary = None
    for line in open(path):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            summary = map(int, line.split()[1:])
    return dict(zip(events, summary))

warm, cold = totals(sys.argv[1]), totals(sys.argv[2])
n_warm, n_cold = int(sys.argv[3]), int(sys.argv[4])
code = (cold["ILmr"] - warm["ILmr"]) / n_cold
data = (cold["DLmr"] - warm["DLmr"]) / n_cold
print("one 1 KB request through the flow (native x86-64, cachegrind; mean of the four engines)")
print(f"  code brought in from memory, cold: {code:6.0f} lines ({code * 64 / 1024:.0f} KiB)")
print(f"  data read in from memory, cold:    {data:6.0f} lines ({data * 64 / 1024:.0f} KiB)")
print(f"  L1i misses per warm request:       {warm['I1mr'] / n_warm:6.0f}"
      " (more than a 32 KiB L1i holds: a warm request refetches its code from L2)")
PY

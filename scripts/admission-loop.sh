#!/usr/bin/env bash
# Runs the admission end-to-end tests (Envoy with four workers) RUNS times
# beside two CPU hogs, the way a flake shows itself: stops at the first
# failure. Not part of `just test` (it takes RUNS times half a minute).
set -euo pipefail
runs=${1:-20}
hogs=()
cleanup() { for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in 1 2; do
  # A busy loop per core: the tests' Envoy, mocks and clients compete for the CPU.
  bash -c 'while :; do :; done' &
  hogs+=("$!")
done
for i in $(seq 1 "$runs"); do
  echo "admission-loop: run $i of $runs"
  cargo test --quiet --test e2e -- --test-threads 1 admission:: 2>&1 | tail -n 3
done
echo "admission-loop: $runs of $runs passed beside two CPU hogs"

#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS seconds each, from its committed
# corpus (fuzz/corpus/<target>/seed-*, plus whatever earlier local runs added),
# then prints per target how long it ran, its speed, and whether it crashed.
# Exits non-zero if any target crashed. Used by `just fuzz` and `just fuzz-smoke`.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# Needs only rustup and network access to crates.io: cargo-fuzz and the
# named nightly toolchain below are installed on first use (cargo-fuzz passes
# nightly-only flags to rustc, -Zsanitizer and friends). The nightly is
# pinned so that a fuzz run means the same thing from day to day.
# FUZZ_SANITIZER=address (or leak, ...) turns a sanitizer on; the default is
# none: pd-router has no unsafe code, and without ASan the targets run about
# twice as fast (panics, debug assertions and overflow checks are on either way).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
cargo_fuzz_version=0.13.2
toolchain=nightly-2026-05-20
sanitizer=${FUZZ_SANITIZER:-none}

rustup toolchain list | grep -q "^$toolchain" ||
  rustup toolchain install "$toolchain" --profile minimal

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz $cargo_fuzz_version"
  cargo install cargo-fuzz --locked --version "$cargo_fuzz_version"
fi

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo "+$toolchain" fuzz list)
fi

start=$(date +%s)
cargo "+$toolchain" fuzz build --sanitizer "$sanitizer"
echo "built in $(($(date +%s) - start)) s"

logs=fuzz/target/logs
mkdir -p "$logs"
summary=()
failed=0
crashed=0
for t in "${targets[@]}"; do
  echo "=== $t: ${seconds} s"
  log="$logs/$t.log"
  t0=$(date +%s)
  # -timeout: one input taking over 10 s is a hang worth reporting.
  if cargo "+$toolchain" fuzz run --sanitizer "$sanitizer" "$t" -- \
      -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=CRASHED
    failed=1
    crashed=$((crashed + 1))
    # The panic (or sanitizer report) and where cargo-fuzz saved the input.
    grep -E -A3 "panicked at|ERROR: (libFuzzer|AddressSanitizer)|Test unit written to" "$log" | head -40 || true
    grep -E -A4 "^Reproduce with:|^Minimize test case with:" "$log" || true
  fi
  ran=$(($(date +%s) - t0))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  line=$(printf '%-14s %4s s  %10s execs  %7s exec/s  %s' "$t" "$ran" "${execs:-?}" "${rate:-?}" "$result")
  echo "$line"
  summary+=("$line")
done

echo
echo "=== fuzz summary (${seconds} s per target; logs in $logs/)"
printf '%s\n' "${summary[@]}"
echo "total $(($(date +%s) - start)) s"
# The plain closing line CI reads: targets that ran clean, targets that crashed.
echo "fuzz: $((${#targets[@]} - crashed)) passed, $crashed failed"
exit "$failed"

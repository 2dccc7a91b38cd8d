"""Envoy configurations for the benches, all from the shipped envoy.yaml:
pd-router's (plugin configuration replaced), the minimal PD filter's, and
Envoy without a filter forwarding (or mirroring) to static clusters."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from .common import REPO


def base_envoy(wasm: Path) -> dict:
    """The shipped envoy.yaml with kernel-chosen ports and the module's path."""
    cfg = yaml.safe_load((REPO / "envoy.yaml").read_text())
    cfg["admin"]["address"]["socket_address"]["port_value"] = 0
    for listener in cfg["static_resources"]["listeners"]:
        listener["address"]["socket_address"]["port_value"] = 0
    wasm_filter = find_wasm_filter(cfg)
    wasm_filter["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = str(wasm)
    return cfg


def hcm(cfg: dict) -> dict:
    for listener in cfg["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                if f["name"] == "envoy.filters.network.http_connection_manager":
                    return f["typed_config"]
    raise RuntimeError("envoy.yaml: no http_connection_manager")


def find_wasm_filter(cfg: dict) -> dict:
    for f in hcm(cfg)["http_filters"]:
        if f["name"] == "envoy.filters.http.wasm":
            return f
    raise RuntimeError("envoy.yaml: no envoy.filters.http.wasm filter")


def pd_envoy(wasm: Path, plugin_config: dict) -> dict:
    """(c): the shipped configuration, plugin configuration replaced (what the
    tests do between the BEGIN/END markers)."""
    cfg = base_envoy(wasm)
    find_wasm_filter(cfg)["typed_config"]["config"]["configuration"] = {
        "@type": "type.googleapis.com/google.protobuf.StringValue",
        "value": json.dumps(plugin_config),
    }
    return cfg


def min_pd_envoy(min_wasm: Path, prefill, decode, steps: str = "") -> dict:
    """(m): the shipped configuration with the module replaced by the minimal
    PD filter (bench/min-pd-filter) and its configuration; `prefill` and
    `decode` are mocks (pdbench.engines.Mock)."""
    cfg = base_envoy(min_wasm)
    wasm = find_wasm_filter(cfg)["typed_config"]["config"]
    wasm["name"] = wasm["root_id"] = wasm["vm_config"]["vm_id"] = "min-pd"
    plugin = {"prefill": prefill.address, "decode": decode.address, "steps": steps}
    if prefill.bootstrap is not None:
        plugin["bootstrap_port"] = str(prefill.bootstrap)
    wasm["configuration"] = {
        "@type": "type.googleapis.com/google.protobuf.StringValue",
        "value": json.dumps(plugin),
    }
    return cfg


def static_cluster(name: str, port: int) -> dict:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": port}}}}]}],
        },
    }


def forward_envoy(wasm: Path, primary: int, mirror: int | None, buffer: bool = False) -> dict:
    """(a)/(b)/(b')/(e): the shipped configuration without the filter, its route
    sent to a static cluster (port `primary` on 127.0.0.1), for (b) and (b')
    mirrored to a second one, and for (b') the whole body buffered first (as
    a PD filter must) by Envoy's buffer filter."""
    cfg = base_envoy(wasm)
    h = hcm(cfg)
    h["http_filters"] = [f for f in h["http_filters"] if f["name"] != "envoy.filters.http.wasm"]
    if buffer:
        h["http_filters"].insert(0, {
            "name": "envoy.filters.http.buffer",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                "max_request_bytes": 64 * 1024 * 1024,
            },
        })
    clusters = [static_cluster("bench_primary", primary)]
    for vh in h["route_config"]["virtual_hosts"]:
        for r in vh["routes"]:
            r["route"]["cluster"] = "bench_primary"
            if mirror is not None:
                r["route"]["request_mirror_policies"] = [{
                    "cluster": "bench_mirror",
                    "runtime_fraction": {"default_value": {"numerator": 100,
                                                           "denominator": "HUNDRED"}},
                }]
    if mirror is not None:
        clusters.append(static_cluster("bench_mirror", mirror))
    cfg["static_resources"]["clusters"] = clusters
    return cfg


def fleet_timeouts(cfg: dict) -> None:
    """Generous timeouts on `cfg`'s HTTP connection manager and routes: in the
    fleet simulation modelled minutes of queueing are real seconds."""
    h = hcm(cfg)
    h["stream_idle_timeout"] = "600s"
    for vh in h["route_config"]["virtual_hosts"]:
        for r in vh["routes"]:
            r["route"]["timeout"] = "0s"
            r["route"]["idle_timeout"] = "600s"


def fleet_envoy(wasm: Path, plugin: dict) -> dict:
    """The fleet simulation's: pd-router's (`pd_envoy`) with no circuit-breaker
    limits (an open-loop replay keeps more than Envoy's default 1024 requests
    in flight when pods queue) and generous timeouts."""
    cfg = pd_envoy(wasm, plugin)
    fleet_timeouts(cfg)
    big = {"max_connections": 1000000, "max_pending_requests": 1000000,
           "max_requests": 1000000, "max_retries": 1000000}
    for cl in cfg["static_resources"]["clusters"]:
        cl["circuit_breakers"] = {"thresholds": [dict(big, priority="DEFAULT"),
                                                 dict(big, priority="HIGH")]}
    return cfg

#!/usr/bin/env python3
"""Checks a running gateway's Envoy configuration after `kubectl apply`.

    python3 scripts/check-deploy.py CONFIG_DUMP.json

CONFIG_DUMP.json is Envoy's admin /config_dump (with ECDS), e.g.:

  plain Envoy:    kubectl -n llm port-forward deploy/pd-router 9901 &
                  curl -s localhost:9901/config_dump > dump.json
  Istio:          kubectl -n llm port-forward deploy/llm-gw-istio 15000 &
                  curl -s localhost:15000/config_dump > dump.json
  Envoy Gateway:  kubectl -n llm port-forward <envoy pod> 19000 &
                  curl -s localhost:19000/config_dump > dump.json

What the control planes may drop or rename without a word, and what makes
split requests hang or fail under load, checked where it ends up:
  - Envoy 1.36 or later (allow_on_headers_stop_iteration is from 1.35;
    Istio needs a >= 1.28 control plane to keep it);
  - pd-router's wasm filter is there, with allow_on_headers_stop_iteration
    and FAIL_RELOAD (an EnvoyFilter whose Istio predates the flag, or an
    EnvoyPatchPolicy whose names match nothing, leaves it out);
  - the route that carries requests to the decode cluster has no retries and
    no total timeout, and no route leads to the API server cluster;
  - the clusters the filter uses exist, with circuit breakers far above
    Envoy's 1,024 defaults; the API server cluster adds the token itself;
  - the listener buffers more than the filter's max_body_bytes.
Prints one line per check ("ok" or "FAIL") and exits 1 if any failed.
Needs only Python 3.
"""

import json
import sys

WASM = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
INJECTOR = "envoy.filters.http.credential_injector"
MIN_BREAKER = 1 << 20


def walk(node):
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def section(dump, kind):
    return [c for c in dump.get("configs", []) if c.get("@type", "").endswith(kind)]


def plugin_of(config):
    raw = ((config.get("configuration") or {}).get("value")) or "{}"
    plugin = json.loads(raw)
    return json.loads(plugin) if isinstance(plugin, str) else plugin


class Report:
    def __init__(self):
        self.failed = 0

    def check(self, ok, what, why=""):
        print(("ok:   " if ok else "FAIL: ") + what + ("" if ok or not why else f" ({why})"))
        self.failed += 0 if ok else 1


def envoy_version(dump):
    boot = (section(dump, "BootstrapConfigDump") or [{}])[0].get("bootstrap", {})
    v = ((boot.get("node") or {}).get("user_agent_build_version") or {}).get("version") or {}
    return v.get("major_number", 0), v.get("minor_number", 0), v.get("patch", 0)


def clusters(dump):
    out = {}
    for c in section(dump, "ClustersConfigDump"):
        for entry in c.get("static_clusters", []) + c.get("dynamic_active_clusters", []):
            cl = entry.get("cluster") or {}
            out[cl.get("name")] = cl
    return out


def wasm_filters(dump):
    """(filter config, listener) for every pd-router wasm filter, in
    listeners and in ECDS (Istio's EnvoyFilter delivers it by ECDS)."""
    found = []
    for l in section(dump, "ListenersConfigDump"):
        for node in walk(l):
            if isinstance(node, dict) and node.get("@type") == WASM and "pd-router" in json.dumps(node.get("config", {}).get("root_id", "")):
                found.append(node["config"])
    for e in section(dump, "EcdsConfigDump"):
        for node in walk(e):
            if isinstance(node, dict) and node.get("@type") == WASM:
                found.append(node["config"])
    return found


def routes(dump):
    """Every route of every route configuration (RDS or inline), in order."""
    out = []
    for r in section(dump, "RoutesConfigDump"):
        for node in walk(r):
            if isinstance(node, dict) and "virtual_hosts" in node:
                for vh in node["virtual_hosts"]:
                    out += vh.get("routes") or []
    for l in section(dump, "ListenersConfigDump"):
        for node in walk(l):
            if isinstance(node, dict) and node.get("@type") == HCM and "route_config" in node:
                for vh in node["route_config"].get("virtual_hosts") or []:
                    out += vh.get("routes") or []
    return out


def carries_filter(listener):
    """Whether a listener's HTTP filters include pd-router: inline, or by
    ECDS (Istio's EnvoyFilter: a config_discovery entry named pd-router)."""
    for node in walk(listener):
        if isinstance(node, dict) and isinstance(node.get("http_filters"), list):
            for f in node["http_filters"]:
                if (f.get("typed_config") or {}).get("@type") == WASM:
                    return True
                if "config_discovery" in f and "pd-router" in f.get("name", ""):
                    return True
    return False


def buffer_limits(dump):
    limits = []
    for l in section(dump, "ListenersConfigDump"):
        for entry in l.get("static_listeners", []) + l.get("dynamic_listeners", []):
            listener = entry.get("listener") or (entry.get("active_state") or {}).get("listener") or {}
            if carries_filter(listener):
                limits.append(int(listener.get("per_connection_buffer_limit_bytes", 1048576)))
    return limits


def check_cluster(rep, name, cl, role):
    if cl is None:
        rep.check(False, f"{role} cluster {name!r} exists", "the filter's calls through it would fail")
        return
    t = ((cl.get("circuit_breakers") or {}).get("thresholds") or [{}])[0]
    low = [k for k in ("max_connections", "max_pending_requests", "max_requests") if int(t.get(k, 1024)) < MIN_BREAKER]
    rep.check(not low, f"{role} cluster {name!r} has circuit breakers above Envoy's defaults",
              f"{', '.join(low)} at or near 1,024: concurrent generations past that get an instant 503")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        dump = json.load(f)
    rep = Report()
    version = envoy_version(dump)
    rep.check(version >= (1, 36, 0), f"Envoy {'.'.join(map(str, version))} is 1.36 or later",
              "pd-router needs allow_on_headers_stop_iteration (Envoy 1.35+); the gateways ship 1.36+")
    filters = wasm_filters(dump)
    rep.check(len(filters) >= 1, "pd-router's wasm filter is configured",
              "not in any listener or ECDS resource: check the EnvoyFilter / EnvoyPatchPolicy status")
    if not filters:
        return 1
    config = filters[0]
    rep.check(config.get("allow_on_headers_stop_iteration") is True, "the filter has allow_on_headers_stop_iteration",
              "dropped: every split request hangs (Istio needs a >= 1.28 control plane; on Envoy Gateway check "
              "that the EnvoyPatchPolicy's names match its xDS name scheme)")
    rep.check(config.get("failure_policy") == "FAIL_RELOAD", "the filter's failure_policy is FAIL_RELOAD",
              f"it is {config.get('failure_policy')!r}")
    plugin = plugin_of(config)
    all_clusters = clusters(dump)
    kube = (plugin.get("discovery") or {}).get("kubernetes") or {}
    api = kube.get("cluster")
    prefill = plugin.get("prefill_cluster", "pd_prefill")
    metrics = plugin.get("metrics_cluster", prefill)
    check_cluster(rep, prefill, all_clusters.get(prefill), "prefill")
    if metrics != prefill:
        check_cluster(rep, metrics, all_clusters.get(metrics), "metrics")
    all_routes = routes(dump)
    decode_routes = [r for r in all_routes if (r.get("route") or {}).get("cluster") in all_clusters
                     and (r.get("route") or {}).get("cluster") != api]
    rep.check(bool(decode_routes), "a route carries requests to a cluster", "no route: requests get 404")
    seen = []
    for r in decode_routes:
        if r.get("match") in seen:
            continue  # behind another route with the same match: never used
        seen.append(r.get("match"))
        action, name = r["route"], r.get("name") or json.dumps(r.get("match"))
        check_cluster(rep, action["cluster"], all_clusters.get(action["cluster"]), f"route {name}'s")
        retries = int((action.get("retry_policy") or {}).get("num_retries", 1 if action.get("retry_policy") else 0))
        rep.check(retries == 0, f"route {name} does not retry",
                  f"{retries} retries: a decode could be sent again after its hand-off was consumed")
        rep.check(action.get("timeout") in ("0s", "0"), f"route {name} has no total timeout",
                  f"{action.get('timeout', 'the 15 s default')}: generations longer than that are cut")
    to_api = [r for r in all_routes if api and (r.get("route") or {}).get("cluster") == api]
    rep.check(not to_api, "no route leads to the API server cluster", "clients would get the router's API rights")
    if api:
        cl = all_clusters.get(api)
        check_cluster(rep, api, cl, "API server")
        injector = cl is not None and INJECTOR in json.dumps(cl)
        rep.check(injector, f"cluster {api!r} adds the API token itself (credential_injector)",
                  "without it the filter's calls carry no token (unless token_env is set)")
    limits = buffer_limits(dump)
    max_body = int(plugin.get("max_body_bytes", 33554432))
    rep.check(bool(limits) and min(limits) > max_body, f"the listener buffers more than max_body_bytes ({max_body})",
              f"limit {min(limits) if limits else 'unknown'}: longer prompts get Envoy's 413")
    print(f"check-deploy: {rep.failed} check(s) failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())

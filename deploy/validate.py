#!/usr/bin/env python3
"""Validates every manifest under deploy/ (run by tests/e2e/deploy.rs).

    .venv/bin/python deploy/validate.py --out DIR --wasm PATH

For every YAML file under deploy/ and every document in it:
  * it parses;
  * core Kubernetes objects validate against the official JSON schemas of
    Kubernetes 1.37 (PyPI kubernetes-validate 1.37.0, strict: unknown fields
    are errors), and so do the Kubernetes types embedded in other objects (the
    Istio gateway Deployment patch, the EnvoyProxy container and pod fields);
  * Envoy Gateway objects validate against the hand-kept JSON Schemas in
    deploy/schemas/ (PyPI jsonschema);
  * Istio and Gateway API objects are written to DIR/node-docs.json for
    deploy/validate-istio.mjs.
Then, per way of deploying (plain Envoy, Istio, Envoy Gateway, Envoy Gateway
with override_host), it assembles the Envoy configuration the manifests
produce, with every patch applied, writes it to DIR/bootstrap-*.yaml for
`envoy --mode validate` (the module path rewritten to PATH, the API server CA
to this machine's CA bundle), and checks what Envoy cannot: the wasm filter's
flags, the clusters the plugin configuration names, that no route leads to
the API server cluster, the token variable and the Secret behind it, and that
every file the configuration names is mounted into the proxy container.

Prints one line per failure, naming file, document index, kind/name; writes
DIR/report.json (what was checked) for the Rust test; exits 1 on any failure.
"""

import argparse
import copy
import json
import os
import re
import ssl
import sys
from pathlib import Path

import jsonschema
import referencing
import yaml
from kubernetes_validate import utils as kv

DEPLOY = Path(__file__).resolve().parent
K8S = "1.37"

# What a user substitutes before applying (deploy/README.md).
PLACEHOLDERS = {"REGISTRY": "registry.example.com", "<MANIFEST-DIGEST>": "0" * 64}

WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
HCM_NAME = "envoy.filters.network.http_connection_manager"
ROUTER_NAME = "envoy.filters.http.router"
ROUTER = {"name": ROUTER_NAME, "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"
OVERRIDE_HOST_TYPE = "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"
HELM_VALUES = {"envoy-gateway/install/values.yaml"}

# The plugin configuration's defaults (docs/configuration.md).
DEFAULT_PREFILL_CLUSTER = "pd_prefill"
DEFAULT_MAX_BODY = 33554432
DEFAULT_TOKEN_ENV = "PD_ROUTER_KUBE_TOKEN"
DEFAULT_HEADER = {"original_dst": "x-envoy-original-dst-host", "override_host": "x-gateway-destination-endpoint"}

# ConfigMaps the manifests mount but do not carry, with the keys they hold.
EXTERNAL_CONFIGMAPS = {
    "kube-root-ca.crt": {"ca.crt"},  # published in every namespace by Kubernetes
    "pd-router-wasm": {"plugin.wasm"},  # kubectl create configmap (deploy/envoy/deployment.yaml)
}

VARIANTS = {
    "envoy": ["rbac.yaml", "envoy/*.yaml"],
    "istio": ["rbac.yaml", "model-service.yaml", "istio/*.yaml"],
    "envoy-gateway": ["rbac.yaml", "model-service.yaml", "envoy-gateway/install/values.yaml", "envoy-gateway/*.yaml"],
    "envoy-gateway/override-host": ["rbac.yaml", "model-service.yaml", "envoy-gateway/install/values.yaml",
                                    "envoy-gateway/envoyproxy.yaml", "envoy-gateway/gateway.yaml",
                                    "envoy-gateway/override-host/*.yaml"],
}


class Doc:
    def __init__(self, rel, index, obj):
        self.rel, self.index, self.obj = rel, index, obj
        self.checks = Checks()

    @property
    def kind(self):
        return self.obj.get("kind", "?") if isinstance(self.obj, dict) else "?"

    @property
    def name(self):
        meta = self.obj.get("metadata") if isinstance(self.obj, dict) else None
        return meta.get("name", "?") if isinstance(meta, dict) else "?"

    @property
    def ns(self):
        return (self.obj.get("metadata") or {}).get("namespace")

    @property
    def label(self):
        return f"deploy/{self.rel} document {self.index} ({self.kind}/{self.name})"


class Failures(list):
    """Failure lines, each once (documents shared by several ways of
    deploying are checked once per way)."""

    def append(self, line):
        if line not in self:
            super().append(line)

    def add(self, where, message):
        label = where.label if isinstance(where, Doc) else where
        self.append(f"{label}: {message}")


class Checks(list):
    def append(self, check):
        if check not in self:
            super().append(check)


# ---------------------------------------------------------------- loading


def substitute(value):
    if isinstance(value, dict):
        return {k: substitute(v) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v) for v in value]
    if isinstance(value, str):
        for placeholder, sample in PLACEHOLDERS.items():
            value = value.replace(placeholder, sample)
    return value


def load(failures):
    docs = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        rel = path.relative_to(DEPLOY).as_posix()
        try:
            parsed = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as e:
            failures.append(f"deploy/{rel}: YAML does not parse: {e}")
            docs[rel] = []
            continue
        docs[rel] = [Doc(rel, i, substitute(obj)) for i, obj in enumerate(parsed) if obj is not None]
        if not docs[rel]:
            failures.append(f"deploy/{rel}: no YAML document")
    return docs


# ------------------------------------------------------------ schema checks


def k8s_error(e):
    where = "/".join(str(p) for p in e.path)
    return f"{where or '(top)'}: {e.message}"


def validate_core(obj):
    """Errors of obj against Kubernetes 1.37's strict schema, or None."""
    try:
        kv.validate(obj, K8S, strict=True)
    except kv.ValidationError as e:
        return k8s_error(e)
    except kv.SchemaNotFoundError as e:
        return e.message
    return None


def eg_registry():
    resources = []
    for path in sorted((DEPLOY / "schemas").glob("*.json")):
        schema = json.loads(path.read_text())
        resources.append((schema["$id"], referencing.Resource.from_contents(schema)))
    return referencing.Registry().with_resources(resources)


def validate_schema(registry, schema_id, obj):
    schema = registry.contents(schema_id)
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
    return ["/".join(str(p) for p in e.path) + ": " + e.message for e in errors]


CORE_GROUPS = ("v1", "apps/v1", "rbac.authorization.k8s.io/v1")


def check_documents(docs, failures, node_docs):
    registry = eg_registry()
    for rel, items in docs.items():
        for doc in items:
            obj = doc.obj
            if rel in HELM_VALUES:
                errs = validate_schema(registry, "pd-router:envoygateway", obj)
                for err in errs:
                    failures.add(doc, f"schemas/envoygateway.json: {err}")
                doc.checks.append("deploy/schemas/envoygateway.json (Helm values, config.envoyGateway)")
                continue
            if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
                failures.add(doc, "not a Kubernetes object (no apiVersion/kind)")
                continue
            api = obj["apiVersion"]
            if api in CORE_GROUPS:
                err = validate_core(obj)
                if err:
                    failures.add(doc, f"Kubernetes {K8S} schema: {err}")
                doc.checks.append(f"kubernetes-validate {K8S} strict")
            elif api.startswith("gateway.envoyproxy.io/"):
                schema_id = "pd-router:" + doc.kind.lower()
                try:
                    registry.contents(schema_id)
                except referencing.exceptions.NoSuchResource:
                    failures.add(doc, f"no schema deploy/schemas/{doc.kind.lower()}.json")
                    continue
                for err in validate_schema(registry, schema_id, obj):
                    failures.add(doc, f"schemas/{doc.kind.lower()}.json: {err}")
                doc.checks.append(f"deploy/schemas/{doc.kind.lower()}.json")
            elif api.startswith("networking.istio.io/") or api.startswith("gateway.networking.k8s.io/"):
                node_docs.append({"label": doc.label, "object": obj})
                doc.checks.append("deploy/validate-istio.mjs (@kubernetes-models, unknown fields)")
            else:
                failures.add(doc, f"no validator for apiVersion {api}")


# ------------------------------------------------------ Kubernetes helpers


def strategic_merge(base, patch, key=None):
    """A strategic merge patch, enough for Deployment pod templates: lists of
    containers, volumes and env merge by name, volumeMounts by mountPath."""
    merge_keys = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
                  "volumeMounts": "mountPath", "ports": "containerPort"}
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in merge_keys:
        mk = merge_keys[key]
        out = list(base)
        for item in patch:
            i = next((j for j, b in enumerate(out) if isinstance(b, dict) and b.get(mk) == item.get(mk)), None)
            if i is None:
                out.append(copy.deepcopy(item))
            else:
                out[i] = strategic_merge(out[i], item)
        return out
    return copy.deepcopy(patch)


def skeleton_deployment(name, ns, container):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": container, "image": "proxy:generated"}]}}},
    }


class Proxy:
    """The proxy container as the manifests make it: where the token variable
    and the mounted files come from."""

    def __init__(self, where, ns, container, volumes):
        self.where, self.ns = where, ns
        self.env = container.get("env") or []
        self.mounts = container.get("volumeMounts") or []
        self.volumes = {v.get("name"): v for v in volumes or []}


# --------------------------------------------------------- Envoy helpers


def walk(node):
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def proto_merge(dst, src):
    """Istio's MERGE: protobuf merge semantics (messages merge, repeated fields
    append, scalars replace; setting one member of the route's cluster oneof
    clears the others)."""
    if not (isinstance(dst, dict) and isinstance(src, dict)):
        return copy.deepcopy(src)
    out = dict(dst)
    specifiers = {"cluster", "cluster_header", "weighted_clusters", "cluster_specifier_plugin"}
    if specifiers & src.keys():
        for k in specifiers - src.keys():
            out.pop(k, None)
    for k, v in src.items():
        if k in out and isinstance(out[k], dict) and isinstance(v, dict):
            out[k] = proto_merge(out[k], v)
        elif k in out and isinstance(out[k], list) and isinstance(v, list):
            out[k] = out[k] + copy.deepcopy(v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def wasm_local(vm_config, wasm):
    vm_config = copy.deepcopy(vm_config)
    vm_config["code"] = {"local": {"filename": str(wasm)}}
    return vm_config


def hcm(stat_prefix, route_config, filters, **extra):
    typed = {"@type": HCM_TYPE, "stat_prefix": stat_prefix, "route_config": route_config,
             "http_filters": filters}
    typed.update(extra)
    return {"name": HCM_NAME, "typed_config": typed}


def bootstrap(listeners, clusters, **extra):
    out = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "node": {"id": "pd-router-validate", "cluster": "pd-router-validate"},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }
    out.update(extra)
    return out


def dummy_cluster(name, **extra):
    c = {"name": name, "type": "STATIC", "connect_timeout": "2s",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
             "address": {"socket_address": {"address": "127.0.0.1", "port_value": 9}}}}]}]}}
    c.update(extra)
    return c


def strict(where, failures, value, allowed, what):
    """Only the listed keys: a key the assembler would not read is an error."""
    if not isinstance(value, dict):
        failures.add(where, f"{what}: expected a map")
        return {}
    for k in value:
        if k not in allowed:
            failures.add(where, f"{what}: unexpected field {k!r} (the assembler reads {sorted(allowed)})")
    return value


# ------------------------------------------------------------ JSON patch


def jsonpath_steps(expr):
    """The subset of RFC 9535 the EnvoyPatchPolicy uses: `..name`, `.name`,
    `[?(@.a.b=='v')]`, `[n]`, `[*]`."""
    steps, i = [], 0
    if expr.startswith("$"):
        i = 1
    name_re = re.compile(r"[A-Za-z_@][A-Za-z0-9_\-@]*")
    filter_re = re.compile(r"\[\?\(@((?:\.[A-Za-z0-9_\-]+)+)\s*==\s*(?:'([^']*)'|\"([^\"]*)\"|(true|false|-?\d+))\)\]")
    first = True
    while i < len(expr):
        if expr.startswith("..", i):
            m = name_re.match(expr, i + 2)
            if not m:
                raise ValueError(f"unsupported jsonPath at {expr[i:]!r}")
            steps.append(("desc", m.group(0)))
            i = m.end()
        elif expr.startswith(".", i) or (first and name_re.match(expr, i)):
            j = i + 1 if expr[i] == "." else i
            if expr.startswith("*", j):
                steps.append(("wild", None))
                i = j + 1
            else:
                m = name_re.match(expr, j)
                if not m:
                    raise ValueError(f"unsupported jsonPath at {expr[i:]!r}")
                steps.append(("child", m.group(0)))
                i = m.end()
        elif expr.startswith("[?", i):
            m = filter_re.match(expr, i)
            if not m:
                raise ValueError(f"unsupported jsonPath filter at {expr[i:]!r}")
            path = m.group(1).split(".")[1:]
            lit = m.group(2) if m.group(2) is not None else m.group(3)
            if lit is None:
                lit = json.loads(m.group(4))
            steps.append(("filter", (path, lit)))
            i = m.end()
        elif expr.startswith("[*]", i):
            steps.append(("wild", None))
            i += 3
        else:
            m = re.compile(r"\[(\d+)\]").match(expr, i)
            if not m:
                raise ValueError(f"unsupported jsonPath at {expr[i:]!r}")
            steps.append(("index", int(m.group(1))))
            i = m.end()
        first = False
    return steps


def jsonpath_locate(doc, expr):
    def descendants(path, node):
        yield path, node
        if isinstance(node, dict):
            for k, v in node.items():
                yield from descendants(path + (k,), v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from descendants(path + (i,), v)

    def children(path, node):
        if isinstance(node, dict):
            return [(path + (k,), v) for k, v in node.items()]
        if isinstance(node, list):
            return [(path + (i,), v) for i, v in enumerate(node)]
        return []

    def lookup(node, keys):
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return KeyError
            node = node[k]
        return node

    locs = [((), doc)]
    for kind, arg in jsonpath_steps(expr):
        found = []
        for path, node in locs:
            if kind == "child" and isinstance(node, dict) and arg in node:
                found.append((path + (arg,), node[arg]))
            elif kind == "desc":
                found += [(p + (arg,), n[arg]) for p, n in descendants(path, node)
                          if isinstance(n, dict) and arg in n]
            elif kind == "wild":
                found += children(path, node)
            elif kind == "index" and isinstance(node, list) and arg < len(node):
                found.append((path + (arg,), node[arg]))
            elif kind == "filter":
                keys, lit = arg
                found += [(p, n) for p, n in children(path, node) if lookup(n, keys) == lit]
        locs = found
    return ["".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in p) for p, _ in locs]


def pointer_tokens(pointer):
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer {pointer!r} must start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def json_patch(doc, op, pointer, value=None):
    """RFC 6902 add / replace / remove, creating missing parents on add
    (Envoy Gateway sets EnsurePathExistsOnAdd)."""
    tokens = pointer_tokens(pointer)
    if not tokens:
        raise ValueError("cannot patch the whole resource with a path")
    node = doc
    for t in tokens[:-1]:
        if isinstance(node, list):
            node = node[int(t)]
        elif t in node:
            node = node[t]
        elif op == "add":
            node[t] = {}
            node = node[t]
        else:
            raise ValueError(f"{pointer}: {t!r} does not exist")
    last = tokens[-1]
    if isinstance(node, list):
        idx = len(node) if last == "-" else int(last)
        if op == "add":
            node.insert(idx, copy.deepcopy(value))
        elif op == "replace":
            node[idx] = copy.deepcopy(value)
        else:
            del node[idx]
        return
    if op in ("replace", "remove") and last not in node:
        raise ValueError(f"{pointer}: nothing to {op}")
    if op == "remove":
        del node[last]
    else:
        node[last] = copy.deepcopy(value)


# ------------------------------------------------------------ assemblers


class Variant:
    def __init__(self, name, docs):
        self.name = name
        self.envoy_docs = []  # the documents the Envoy configuration is made of
        self.docs = []
        for pattern in VARIANTS[name]:
            for rel in sorted(docs):
                if Path(rel).match(pattern) and (pattern.count("/") == rel.count("/")):
                    self.docs += docs[rel]

    def made_of(self):
        """The documents of the Envoy configuration, compactly."""
        by_file = {}
        for d in self.envoy_docs:
            by_file.setdefault(d.rel, []).append(f"{d.index} ({d.kind}/{d.name})")
        return "; ".join(f"deploy/{rel} document{'s' if len(ix) > 1 else ''} {', '.join(ix)}"
                         for rel, ix in by_file.items())

    def all(self, kind):
        return [d for d in self.docs if isinstance(d.obj, dict) and d.obj.get("kind") == kind]

    def one(self, kind, failures, name=None):
        found = [d for d in self.all(kind) if name is None or d.name == name]
        if len(found) != 1:
            failures.append(f"{self.name}: expected one {kind}{' ' + name if name else ''}, found {len(found)}")
            return None
        return found[0]


def assemble_envoy(v, failures, wasm):
    cm = next((d for d in v.all("ConfigMap") if "envoy.yaml" in (d.obj.get("data") or {})), None)
    dep = v.one("Deployment", failures)
    if cm is None or dep is None:
        failures.append("envoy: needs a ConfigMap with data.envoy.yaml and a Deployment")
        return None, None
    try:
        conf = yaml.safe_load(cm.obj["data"]["envoy.yaml"])
    except yaml.YAMLError as e:
        failures.add(cm, f"data.envoy.yaml does not parse: {e}")
        return None, None
    cm.checks.append("data.envoy.yaml: envoy --mode validate")
    v.envoy_docs = [cm]
    pod = dep.obj["spec"]["template"]["spec"]
    container = pod["containers"][0]
    proxy = Proxy(dep, dep.ns, container, pod.get("volumes"))
    args = container.get("args") or []
    if "-c" not in args or args.index("-c") + 1 >= len(args):
        failures.add(dep, "the container's args name no configuration (-c)")
    else:
        proxy.config_file = args[args.index("-c") + 1]
    return conf, proxy


def assemble_istio(v, failures, wasm):
    ef = v.one("EnvoyFilter", failures)
    gw = v.one("Gateway", failures)
    route = v.one("HTTPRoute", failures)
    overlay_cm = v.one("ConfigMap", failures)
    if not (ef and gw and route and overlay_cm):
        return None, None
    spec = ef.obj["spec"]
    strict(ef, failures, spec, {"workloadSelector", "configPatches"}, "spec")
    selector = (spec.get("workloadSelector") or {}).get("labels")
    if selector != {"gateway.networking.k8s.io/gateway-name": gw.name}:
        failures.add(ef, f"workloadSelector.labels {selector} does not select Gateway {gw.name}'s pods")
    if ef.ns != gw.ns:
        failures.add(ef, f"namespace {ef.ns} is not the Gateway's ({gw.ns}): the workloadSelector would not apply")
    v.envoy_docs = [ef, gw, route]
    listener = gw.obj["spec"]["listeners"][0]
    port = listener["port"]
    rule = route.obj["spec"]["rules"][0]
    backend = rule["backendRefs"][0]
    route_name = rule.get("name") or f"{route.ns}.{route.name}.0"
    outbound = f"outbound|{backend['port']}||{backend['name']}.{route.ns}.svc.cluster.local"
    envoy_route = {"name": route_name, "match": {"prefix": rule["matches"][0]["path"]["value"]},
                   "route": {"cluster": outbound}}
    extensions, inserted, clusters, listener_merge = {}, [], [], {}
    route_merged = False
    for i, p in enumerate(spec.get("configPatches") or []):
        what = f"configPatches[{i}]"
        strict(ef, failures, p, {"applyTo", "match", "patch"}, what)
        patch = strict(ef, failures, p.get("patch") or {}, {"operation", "value"}, what + ".patch")
        match = p.get("match") or {}
        apply_to, op, value = p.get("applyTo"), patch.get("operation"), patch.get("value")
        if apply_to != "EXTENSION_CONFIG" and match.get("context") != "GATEWAY":
            failures.add(ef, f"{what}: match.context must be GATEWAY")
        if (apply_to, op) == ("EXTENSION_CONFIG", "ADD"):
            extensions[value.get("name")] = value
        elif (apply_to, op) == ("HTTP_FILTER", "INSERT_BEFORE"):
            lm = match.get("listener") or {}
            fc = (lm.get("filterChain") or {}).get("filter") or {}
            if lm.get("portNumber") != port:
                failures.add(ef, f"{what}: listener.portNumber {lm.get('portNumber')} is not the Gateway's port {port}")
            if fc.get("name") != HCM_NAME or (fc.get("subFilter") or {}).get("name") != ROUTER_NAME:
                failures.add(ef, f"{what}: must match the {HCM_NAME}'s {ROUTER_NAME}")
            inserted.append(value)
        elif (apply_to, op) == ("LISTENER", "MERGE"):
            if (match.get("listener") or {}).get("portNumber") != port:
                failures.add(ef, f"{what}: listener.portNumber is not the Gateway's port {port}")
            listener_merge = proto_merge(listener_merge, value)
        elif (apply_to, op) == ("CLUSTER", "ADD"):
            clusters.append(copy.deepcopy(value))
        elif (apply_to, op) == ("HTTP_ROUTE", "MERGE"):
            name = ((((match.get("routeConfiguration") or {}).get("vhost") or {}).get("route")) or {}).get("name")
            if name != route_name:
                failures.add(ef, f"{what}: matches route {name!r}, but Istio names the HTTPRoute's route {route_name!r}")
                continue
            envoy_route = proto_merge(envoy_route, value)
            route_merged = True
        else:
            failures.add(ef, f"{what}: {apply_to} {op} is not something the assembler models")
    if not route_merged:
        failures.add(ef, "no HTTP_ROUTE MERGE reaches the HTTPRoute's route")
    filters = []
    for value in inserted:
        discovery = value.get("config_discovery") or {}
        ext = extensions.get(value.get("name"))
        if ext is None:
            failures.add(ef, f"HTTP_FILTER {value.get('name')!r} names no EXTENSION_CONFIG")
            continue
        if ext["typed_config"].get("@type") not in discovery.get("type_urls", []):
            failures.add(ef, f"HTTP_FILTER {value.get('name')!r}: type_urls do not include the extension's @type")
        typed = copy.deepcopy(ext["typed_config"])
        remote = ((typed.get("config") or {}).get("vm_config") or {}).get("code", {}).get("remote") or {}
        uri = (remote.get("http_uri") or {}).get("uri", "")
        if not uri.startswith("oci://") or not re.fullmatch(r"[a-f0-9]{64}", remote.get("sha256", "")):
            failures.add(ef, "the wasm code must be remote oci://… with the manifest digest as sha256")
        typed["config"]["vm_config"] = wasm_local(typed["config"]["vm_config"], wasm)
        filters.append({"name": ext["name"], "typed_config": typed})
    route_config = {"name": f"http.{port}", "virtual_hosts": [
        {"name": f"*:{port}", "domains": ["*"], "routes": [envoy_route]}]}
    main = {"name": f"0.0.0.0_{port}",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [hcm(f"outbound_0.0.0.0_{port}", route_config, filters + [ROUTER])]}]}
    main = proto_merge(main, listener_merge)
    # The filter exactly as the HTTP_FILTER patch inserts it (ECDS).
    ecds = {"name": "ecds_form", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [hcm("ecds", {"name": "ecds", "virtual_hosts": [
                {"name": "ecds", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "direct_response": {"status": 503}}]}]},
                copy.deepcopy(inserted) + [ROUTER])]}]}
    xds = dummy_cluster("xds-grpc", typed_extension_protocol_options={
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}})
    conf = bootstrap([main, ecds], clusters + [dummy_cluster(outbound), xds], dynamic_resources={"ads_config": {
        "api_type": "GRPC", "transport_api_version": "V3",
        "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]}})
    # The gateway Deployment Istio generates, with the ConfigMap's patch.
    params = (gw.obj["spec"].get("infrastructure") or {}).get("parametersRef") or {}
    if params != {"group": "", "kind": "ConfigMap", "name": overlay_cm.name}:
        failures.add(gw, f"infrastructure.parametersRef must name ConfigMap {overlay_cm.name}")
    deployment = skeleton_deployment(f"{gw.name}-istio", gw.ns, "istio-proxy")
    try:
        deployment = strategic_merge(deployment, yaml.safe_load(overlay_cm.obj["data"]["deployment"]))
    except (KeyError, yaml.YAMLError, AttributeError) as e:
        failures.add(overlay_cm, f"data.deployment: {e}")
        return conf, None
    err = validate_core(deployment)
    if err:
        failures.add(overlay_cm, f"data.deployment applied to Istio's gateway Deployment: Kubernetes {K8S} schema: {err}")
    overlay_cm.checks.append(f"data.deployment patched into a Deployment: kubernetes-validate {K8S} strict")
    pod = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "istio-proxy")
    return conf, Proxy(overlay_cm, gw.ns, container, pod.get("volumes"))


def quantity(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", str(q))
    return int(m.group(1)) * units.get(m.group(2), 1)


def eg_route_timeouts(rule, ctp):
    """Envoy Gateway's route timeout and idle timeout (internal/xds/translator/route.go)."""
    out = {}
    request = (rule.get("timeouts") or {}).get("request")
    stream_idle = (((ctp.get("spec") or {}).get("timeout") or {}).get("http") or {}).get("streamIdleTimeout")
    if request is not None:
        out["timeout"] = request
        if stream_idle is None:
            out["idle_timeout"] = "0s" if re.fullmatch(r"0+(h|m|s|ms)", request) else "3600s"
    return out


def assemble_envoy_gateway(v, failures, wasm):
    gw = v.one("Gateway", failures)
    route = v.one("HTTPRoute", failures)
    eep = v.one("EnvoyExtensionPolicy", failures)
    ctp = v.one("ClientTrafficPolicy", failures)
    epp = v.one("EnvoyPatchPolicy", failures)
    proxy_doc = v.one("EnvoyProxy", failures)
    btps = v.all("BackendTrafficPolicy")
    if not (gw and route and eep and ctp and epp and proxy_doc):
        return None, None
    v.envoy_docs = [eep, epp, ctp] + btps + [gw, route]
    for policy, kind, name in [(eep, "HTTPRoute", route.name), (ctp, "Gateway", gw.name)] + \
            [(b, "HTTPRoute", route.name) for b in btps]:
        refs = policy.obj["spec"].get("targetRefs") or []
        if not any(r.get("kind") == kind and r.get("name") == name for r in refs):
            failures.add(policy, f"targetRefs do not name {kind} {name}")
    ref = epp.obj["spec"]["targetRef"]
    if (ref.get("kind"), ref.get("name")) != ("Gateway", gw.name):
        failures.add(epp, f"targetRef must be Gateway {gw.name}")
    params = (gw.obj["spec"].get("infrastructure") or {}).get("parametersRef") or {}
    if params != {"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": proxy_doc.name}:
        failures.add(gw, f"infrastructure.parametersRef must name EnvoyProxy {proxy_doc.name}")
    values = next((d for d in v.docs if d.rel in HELM_VALUES), None)
    deploy_type = ((((values.obj if values else {}).get("config") or {}).get("envoyGateway") or {})
                   .get("provider") or {}).get("kubernetes", {}).get("deploy", {}).get("type")
    proxy_ns = gw.ns if deploy_type == "GatewayNamespace" else "envoy-gateway-system"

    lname = f"{gw.ns}/{gw.name}/{gw.obj['spec']['listeners'][0]['name']}"
    rule = route.obj["spec"]["rules"][0]
    route_cluster = f"httproute/{route.ns}/{route.name}/rule/0"
    filters, per_route = [], {}
    for i, w in enumerate(eep.obj["spec"]["wasm"]):
        ir = f"envoyextensionpolicy/{eep.ns}/{eep.name}/wasm/{i}"
        vm = {"vm_id": ir, "runtime": "envoy.wasm.runtime.v8", "code": {"remote": {
            "http_uri": {"uri": f"https://envoy-gateway:18002/{w['code']['image'].get('sha256', 'x')}.wasm",
                         "cluster": "wasm_cluster", "timeout": "10s"},
            "sha256": "0" * 64}}}
        if (w.get("env") or {}).get("hostKeys"):
            vm["environment_variables"] = {"host_env_keys": w["env"]["hostKeys"]}
        config = {"name": w.get("name", ir), "vm_config": vm,
                  "configuration": {"@type": STRING_VALUE, "value": json.dumps(w.get("config", {}))}}
        if w.get("rootID"):
            config["root_id"] = w["rootID"]
        if w.get("failOpen"):
            config["fail_open"] = True
        name = f"envoy.filters.http.wasm/{ir}"
        filters.append({"name": name, "disabled": True, "typed_config": {"@type": WASM_TYPE, "config": config}})
        per_route[name] = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}
    ctp_spec = ctp.obj["spec"]
    buffer = quantity((ctp_spec.get("connection") or {}).get("bufferLimit", "32768"))
    hcm_extra = {}
    idle = ((ctp_spec.get("timeout") or {}).get("http") or {}).get("streamIdleTimeout")
    if idle:
        hcm_extra["stream_idle_timeout"] = idle
    listener = {"name": lname, "address": {"socket_address": {"address": "0.0.0.0", "port_value": 10080}},
                "per_connection_buffer_limit_bytes": buffer,
                "default_filter_chain": {"filters": [{"name": HCM_NAME, "typed_config": dict(
                    {"@type": HCM_TYPE, "stat_prefix": "http-10080",
                     "rds": {"route_config_name": lname, "config_source": {"ads": {}, "resource_api_version": "V3"}},
                     "http_filters": filters + [ROUTER]}, **hcm_extra)}]}}
    action = dict({"cluster": route_cluster}, **eg_route_timeouts(rule, ctp.obj))
    route_config = {"name": lname, "virtual_hosts": [{"name": f"{lname}/*", "domains": ["*"], "routes": [
        {"name": f"httproute/{route.ns}/{route.name}/rule/0/match/0/*",
         "match": {"prefix": rule["matches"][0]["path"]["value"]},
         "route": action, "typed_per_filter_config": per_route}]}]}
    backend_cluster = dummy_cluster(route_cluster)
    for b in btps:
        lb = b.obj["spec"].get("loadBalancer") or {}
        sources = [{"header": e["header"]} for e in (lb.get("endpointOverride") or {}).get("extractFrom", [])]
        if sources:
            fallback = {"RoundRobin": "round_robin", "LeastRequest": "least_request", "Random": "random"}[lb["type"]]
            fallback_type = {"round_robin": "round_robin.v3.RoundRobin", "least_request": "least_request.v3.LeastRequest",
                             "random": "random.v3.Random"}[fallback]
            backend_cluster["load_balancing_policy"] = {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.override_host",
                "typed_config": {"@type": OVERRIDE_HOST_TYPE, "override_host_sources": sources,
                                 "fallback_policy": {"policies": [{"typed_extension_config": {
                                     "name": f"envoy.load_balancing_policies.{fallback}",
                                     "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                                                      + fallback_type}}}]}}}}]}
    resources = {"type.googleapis.com/envoy.config.listener.v3.Listener": {lname: listener},
                 "type.googleapis.com/envoy.config.route.v3.RouteConfiguration": {lname: route_config},
                 "type.googleapis.com/envoy.config.cluster.v3.Cluster": {route_cluster: backend_cluster}}
    for i, p in enumerate(epp.obj["spec"]["jsonPatches"]):
        what = f"jsonPatches[{i}] ({p['name']})"
        op = p["operation"]
        table = resources.get(p["type"])
        if table is None:
            failures.add(epp, f"{what}: the assembler models no {p['type']}")
            continue
        if op["op"] == "add" and not op.get("path") and not op.get("jsonPath"):
            value = copy.deepcopy(op.get("value"))
            if not isinstance(value, dict) or value.get("name") != p["name"]:
                failures.add(epp, f"{what}: a whole-resource add must carry a resource named {p['name']!r}")
                continue
            table[p["name"]] = value
            continue
        target = table.get(p["name"])
        if target is None:
            failures.add(epp, f"{what}: Envoy Gateway generates no {p['type'].rsplit('.', 1)[-1]} named {p['name']!r}")
            continue
        try:
            pointers = ([ptr + (op.get("path") or "") for ptr in jsonpath_locate(target, op["jsonPath"])]
                        if op.get("jsonPath") else [op.get("path", "")])
            if not pointers:
                failures.add(epp, f"{what}: jsonPath {op['jsonPath']!r} selects nothing in what Envoy Gateway generates")
            for ptr in pointers:
                json_patch(target, op["op"], ptr, op.get("value"))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            failures.add(epp, f"{what}: {e}")
    epp.checks.append("patches applied to Envoy Gateway's generated listener/route/clusters: envoy --mode validate")
    eep.checks.append("generated wasm filter: envoy --mode validate")
    # The bootstrap: Envoy Gateway's resources, the route configuration inline.
    listener = resources["type.googleapis.com/envoy.config.listener.v3.Listener"][lname]
    for f in walk(listener):
        if isinstance(f, dict) and f.get("@type") == HCM_TYPE:
            f.pop("rds", None)
            f["route_config"] = resources["type.googleapis.com/envoy.config.route.v3.RouteConfiguration"][lname]
        if isinstance(f, dict) and f.get("@type") == WASM_TYPE:
            f["config"]["vm_config"] = wasm_local(f["config"]["vm_config"], wasm)
    listener["address"] = {"socket_address": {"address": "127.0.0.1", "port_value": 0}}
    conf = bootstrap([listener], list(resources["type.googleapis.com/envoy.config.cluster.v3.Cluster"].values()))
    # The Envoy container as EnvoyProxy shapes it.
    kube = proxy_doc.obj["spec"]["provider"]["kubernetes"]["envoyDeployment"]
    container = dict(kube.get("container") or {}, name="envoy")
    volumes = (kube.get("pod") or {}).get("volumes") or []
    deployment = skeleton_deployment(f"envoy-{gw.ns}-{gw.name}", proxy_ns, "envoy")
    pod = deployment["spec"]["template"]["spec"]
    pod["containers"][0].update(container)
    pod["volumes"] = volumes
    err = validate_core(deployment)
    if err:
        failures.add(proxy_doc, f"envoyDeployment container/pod fields as a Deployment: Kubernetes {K8S} schema: {err}")
    proxy_doc.checks.append(f"container env/volumeMounts and pod volumes: kubernetes-validate {K8S} strict")
    return conf, Proxy(proxy_doc, proxy_ns, pod["containers"][0], volumes)


# ------------------------------------------------------ bootstrap checks


def plugin_of(config):
    return json.loads(((config.get("configuration") or {}).get("value")) or "{}")


def check_bootstrap(v, conf, proxy, failures, local_files):
    """What `envoy --mode validate` cannot see. `local_files`: paths on this
    machine the assembler put in (the module), not meant to be mounted."""
    where = f"{v.name}: the Envoy configuration of {v.made_of()}"
    static = conf.get("static_resources") or {}
    clusters = {c.get("name"): c for c in static.get("clusters") or []}
    wasm_filters, routes, hcms = [], [], []
    for listener in static.get("listeners") or []:
        for node in walk(listener):
            if isinstance(node, dict) and node.get("@type") == HCM_TYPE and "route_config" in node:
                hcms.append((listener, node))
    for listener, h in hcms:
        for f in h.get("http_filters") or []:
            if (f.get("typed_config") or {}).get("@type") == WASM_TYPE:
                wasm_filters.append((listener, h, f))
    if len(wasm_filters) != 1:
        failures.append(f"{where}: expected one pd-router wasm filter, found {len(wasm_filters)}")
        return
    listener, h, f = wasm_filters[0]
    config = f["typed_config"]["config"]
    if config.get("allow_on_headers_stop_iteration") is not True:
        failures.append(f"{where}: the wasm filter lacks allow_on_headers_stop_iteration: true (split requests would hang)")
    if config.get("failure_policy") != "FAIL_RELOAD":
        failures.append(f"{where}: the wasm filter's failure_policy is {config.get('failure_policy')!r}, not FAIL_RELOAD")
    try:
        plugin = plugin_of(config)
    except json.JSONDecodeError as e:
        failures.append(f"{where}: the plugin configuration is not JSON: {e}")
        return
    kube = (plugin.get("discovery") or {}).get("kubernetes") or {}
    api_cluster = kube.get("cluster")
    token_env = kube.get("token_env", DEFAULT_TOKEN_ENV)
    routing = plugin.get("routing", "original_dst")
    header = plugin.get("routing_header", DEFAULT_HEADER.get(routing))
    prefill = plugin.get("prefill_cluster", DEFAULT_PREFILL_CLUSTER)
    metrics = plugin.get("metrics_cluster", prefill)
    keys = ((config.get("vm_config") or {}).get("environment_variables") or {}).get("host_env_keys") or []
    if api_cluster and token_env not in keys:
        failures.append(f"{where}: vm_config.environment_variables.host_env_keys {keys} lacks {token_env}")
    for role, name in [("prefill_cluster", prefill), ("metrics_cluster", metrics),
                       ("discovery.kubernetes.cluster", api_cluster)]:
        if name and name not in clusters:
            failures.append(f"{where}: the plugin's {role} {name!r} is not a cluster")
    if api_cluster in clusters:
        tls = (clusters[api_cluster].get("transport_socket") or {}).get("name")
        if tls != "envoy.transport_sockets.tls":
            failures.append(f"{where}: cluster {api_cluster} must speak TLS to the API server")
    limit = listener.get("per_connection_buffer_limit_bytes", 1048576)
    if limit <= plugin.get("max_body_bytes", DEFAULT_MAX_BODY):
        failures.append(f"{where}: listener buffer limit {limit} is not above max_body_bytes")
    for _, other in hcms:
        for vh in other["route_config"].get("virtual_hosts") or []:
            for r in vh.get("routes") or []:
                action = r.get("route") or {}
                targets = [action.get("cluster")] + [c.get("name") for c in
                                                     (action.get("weighted_clusters") or {}).get("clusters", [])]
                if api_cluster in targets:
                    failures.append(f"{where}: route {r.get('name') or json.dumps(r.get('match'))} leads to {api_cluster}: "
                                    "every client would get the router's API-server credentials")
    for vh in h["route_config"].get("virtual_hosts") or []:
        routes += vh.get("routes") or []
    for r in routes:
        action = r.get("route") or {}
        if f.get("disabled") and f["name"] not in (r.get("typed_per_filter_config") or {}):
            failures.append(f"{where}: route {r.get('name') or json.dumps(r.get('match'))} does not enable the (disabled) wasm filter")
        decode = action.get("cluster")
        if decode not in clusters:
            continue
        if action.get("timeout") not in ("0s", "0"):
            failures.append(f"{where}: route {r.get('name') or json.dumps(r.get('match'))} has a total timeout {action.get('timeout')!r} (want 0s)")
        check_routing(where, routing, header, clusters, [prefill, decode], failures)
    if proxy is not None:
        check_proxy(v, conf, proxy, token_env if api_cluster else None, kube.get("namespace"), failures,
                    local_files)


def check_routing(where, routing, header, clusters, names, failures):
    for name in names:
        c = clusters.get(name) or {}
        if routing == "original_dst":
            odst = c.get("original_dst_lb_config") or {}
            if c.get("type") != "ORIGINAL_DST" or not odst.get("use_http_header") \
                    or odst.get("http_header_name", "x-envoy-original-dst-host") != header:
                failures.append(f"{where}: cluster {name} must be ORIGINAL_DST, use_http_header, header {header}")
        elif routing == "override_host":
            srcs = [n.get("override_host_sources") for n in walk(c)
                    if isinstance(n, dict) and n.get("@type") == OVERRIDE_HOST_TYPE]
            if not srcs or {"header": header} not in srcs[0]:
                failures.append(f"{where}: cluster {name} must override the host from header {header}")
        else:
            failures.append(f"{where}: unknown routing {routing!r}")


def check_proxy(v, conf, proxy, token_env, namespace, failures, local_files):
    where = proxy.where
    if token_env:
        env = next((e for e in proxy.env if e.get("name") == token_env), None)
        ref = (((env or {}).get("valueFrom") or {}).get("secretKeyRef")) or {}
        secret = next((d for d in v.all("Secret") if d.name == ref.get("name")), None)
        if env is None or ref.get("key") != "token" or secret is None:
            failures.add(where, f"the proxy container must set {token_env} from a token Secret's key `token`")
        else:
            sa = (secret.obj.get("metadata", {}).get("annotations") or {}).get("kubernetes.io/service-account.name")
            if secret.obj.get("type") != "kubernetes.io/service-account-token" or secret.ns != proxy.ns:
                failures.add(secret, f"must be a kubernetes.io/service-account-token Secret in {proxy.ns} (the proxy's namespace)")
            check_rbac(v, secret, sa, namespace, failures)
    # Every file the configuration reads must be mounted.
    files = [n["filename"] for n in walk(conf) if isinstance(n, dict) and isinstance(n.get("filename"), str)]
    files += [proxy.config_file] if getattr(proxy, "config_file", None) else []
    for path in files:
        if path in local_files:
            continue
        mount = next((m for m in proxy.mounts if path.startswith(m.get("mountPath", "").rstrip("/") + "/")), None)
        volume = proxy.volumes.get((mount or {}).get("name"))
        cm_name = ((volume or {}).get("configMap") or {}).get("name")
        if cm_name is None:
            failures.add(where, f"{path} is not in a ConfigMap volume mounted into the proxy container")
            continue
        key = path[len(mount["mountPath"].rstrip("/")) + 1:]
        carried = next((d for d in v.all("ConfigMap") if d.name == cm_name), None)
        keys = set((carried.obj.get("data") or {}) | (carried.obj.get("binaryData") or {})) if carried \
            else EXTERNAL_CONFIGMAPS.get(cm_name)
        if keys is None or key not in keys:
            failures.add(where, f"{path}: ConfigMap {cm_name} holds no key {key!r}")


def check_rbac(v, secret, sa_name, namespace, failures):
    sa = next((d for d in v.all("ServiceAccount") if d.name == sa_name and d.ns == secret.ns), None)
    if sa is None:
        failures.add(secret, f"names ServiceAccount {sa_name!r}, which deploy/ does not create in {secret.ns}")
        return
    granted = False
    for rb in v.all("RoleBinding"):
        if rb.ns != namespace:
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa.name and s.get("namespace") == sa.ns
                   for s in rb.obj.get("subjects") or []):
            continue
        role = next((d for d in v.all("Role") if d.name == rb.obj["roleRef"]["name"] and d.ns == namespace), None)
        for rule in (role.obj.get("rules") if role else []) or []:
            if "" in rule.get("apiGroups", []) and "pods" in rule.get("resources", []) \
                    and {"get", "list", "watch"} <= set(rule.get("verbs", [])):
                granted = True
    if not granted:
        failures.add(sa, f"no RoleBinding in {namespace} grants it get/list/watch on pods")


def ssl_ca_bundle():
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and os.path.exists(candidate):
            return candidate
    import pip._vendor.certifi as certifi  # always in a venv's pip

    return certifi.where()


def for_validation(conf):
    """The assembled configuration as this machine can load it: the API
    server's CA replaced by a local CA bundle, listeners on loopback port 0."""
    conf = copy.deepcopy(conf)
    for node in walk(conf):
        if isinstance(node, dict) and isinstance(node.get("trusted_ca"), dict) and "filename" in node["trusted_ca"]:
            node["trusted_ca"]["filename"] = ssl_ca_bundle()
    for listener in [conf.get("admin", {})] + (conf.get("static_resources") or {}).get("listeners", []):
        if "address" in listener:
            listener["address"] = {"socket_address": {"address": "127.0.0.1", "port_value": 0}}
    return conf


def rewrite_plain(conf, wasm):
    conf = copy.deepcopy(conf)
    for node in walk(conf):
        if isinstance(node, dict) and node.get("@type") == WASM_TYPE:
            node["config"]["vm_config"] = wasm_local(node["config"]["vm_config"], wasm)
    return conf


# ------------------------------------------------------------------ main


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--wasm", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failures = Failures()
    docs = load(failures)
    node_docs = []
    check_documents(docs, failures, node_docs)
    (args.out / "node-docs.json").write_text(json.dumps(node_docs, indent=1))
    bootstraps = []
    assemblers = {"envoy": assemble_envoy, "istio": assemble_istio, "envoy-gateway": assemble_envoy_gateway,
                  "envoy-gateway/override-host": assemble_envoy_gateway}
    for name, assemble in assemblers.items():
        v = Variant(name, docs)
        try:
            conf, proxy = assemble(v, failures, args.wasm.resolve())
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            failures.append(f"{name}: cannot assemble its Envoy configuration: {type(e).__name__} {e}")
            continue
        if conf is None:
            continue
        check_bootstrap(v, conf, proxy, failures, {str(args.wasm.resolve())})
        if name == "envoy":
            conf = rewrite_plain(conf, args.wasm.resolve())
        path = args.out / f"bootstrap-{name.replace('/', '-')}.yaml"
        path.write_text(yaml.safe_dump(for_validation(conf), sort_keys=False))
        bootstraps.append({"variant": name, "path": str(path),
                           "made_of": v.made_of()})
    report = {
        "files": {f"deploy/{rel}": [{"index": d.index, "kind": d.kind, "name": d.name, "checks": d.checks}
                                    for d in items] for rel, items in docs.items()},
        "bootstraps": bootstraps,
        "node_docs": len(node_docs),
        "failures": list(failures),
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    for f in failures:
        print(f)
    print(f"validate.py: {sum(len(i) for i in docs.values())} document(s) in {len(docs)} file(s), "
          f"{len(bootstraps)} Envoy configuration(s), {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

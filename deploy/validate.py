#!/usr/bin/env python3
"""Validates every manifest under deploy/ (run by tests/e2e/deploy.rs).

    .venv/bin/python deploy/validate.py --out DIR --wasm PATH

deploy/ is a kustomize package: the overlays (envoy/, istio/,
envoy-gateway/, envoy-gateway/override-host/,
envoy-gateway/xds-name-scheme-v2/) render every manifest from one set of
values (deploy/values/). Each overlay is rendered with `kubectl kustomize`
(kustomize v5), and every rendered object is checked as below. Every YAML
file under deploy/ must parse and be part of an overlay (or be one of the
install files of Envoy Gateway, checked as they are).

For every rendered document:
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
import shutil
import ssl
import subprocess
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
HELM_VALUES = {"envoy-gateway/install/values.yaml", "envoy-gateway/install/values-xds-name-scheme-v2.yaml"}
INSTALL_FILES = HELM_VALUES | {"envoy-gateway/install/gatewayclass.yaml"}
CREDENTIAL_INJECTOR = "envoy.filters.http.credential_injector"
# Far above Envoy's default thresholds (1,024), which would refuse the
# 1,025th concurrent generation.
MIN_BREAKER = 1 << 20
# What Istio puts on every route it translates (route/retry/retry.go).
ISTIO_DEFAULT_RETRY = {"num_retries": 2, "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
                       "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
                           "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
                       "host_selection_retry_max_attempts": "5"}

# The plugin configuration's defaults (docs/configuration.md).
DEFAULT_PREFILL_CLUSTER = "pd_prefill"
DEFAULT_MAX_BODY = 33554432
DEFAULT_TOKEN_ENV = "PD_ROUTER_KUBE_TOKEN"
DEFAULT_HEADER = {"original_dst": "x-envoy-original-dst-host", "override_host": "x-gateway-destination-endpoint"}

# ConfigMaps the manifests mount but do not carry, with the keys they hold.
EXTERNAL_CONFIGMAPS = {
    "kube-root-ca.crt": {"ca.crt"},  # published in every namespace by Kubernetes
    "pd-router-wasm": {"plugin.wasm.gz"},  # kubectl create configmap (deploy/envoy/deployment.yaml)
}

# The overlays, and the install files each goes with.
VARIANTS = {
    "envoy": [],
    "envoy-epp": [],
    "istio": [],
    "envoy-gateway": ["envoy-gateway/install/values.yaml", "envoy-gateway/install/gatewayclass.yaml"],
    "envoy-gateway/override-host": ["envoy-gateway/install/values.yaml", "envoy-gateway/install/gatewayclass.yaml"],
    "envoy-gateway/xds-name-scheme-v2": ["envoy-gateway/install/values-xds-name-scheme-v2.yaml",
                                         "envoy-gateway/install/gatewayclass.yaml"],
    "inference-pool": [],
}
ROUTING_KEYS = {"routing", "prefill_cluster", "metrics_cluster", "routing_header", "placement"}
PICKER_HEADERS = {"x-gateway-destination-endpoint", "x-prefiller-host-port",
                  "x-kv-cache-source-host-port", "x-encoder-hosts-ports"}
# What a variant's own plugin configuration may change in discovery.
POOL_KEYS = {"labels", "inference_pool", "label_selector"}
# The InferencePool CRDs a pool must pass (deploy/schemas/crd-to-schema.py
# made both from GIE's config/crd/bases at the tag).
INFERENCEPOOL_SCHEMAS = [("inferencepool-v1.5.0", "GIE v1.5.0's CRD, llm-d's"),
                         ("inferencepool", "GIE v1.6.0's CRD")]
# Overlays of example engines: rendered and checked, no Envoy in them.
WORKLOADS = ["workload/vllm", "workload/mock"]


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
    """Every YAML file under deploy/, parsed (the raw package)."""
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


def kustomize_files(directory, seen=None):
    """The files a kustomization directory reads: itself, its resources,
    patches and generators' files, and those of the directories (bases,
    components) it names, recursively."""
    seen = set() if seen is None else seen
    k = yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}
    seen.add(directory / "kustomization.yaml")
    names = list(k.get("resources") or []) + list(k.get("components") or [])
    names += [p["path"] for p in k.get("patches") or [] if isinstance(p, dict) and "path" in p]
    for gen in k.get("configMapGenerator") or []:
        names += [f.split("=", 1)[-1] for f in gen.get("files") or []]
    for name in names:
        target = (directory / name).resolve()
        if target.is_dir():
            if target / "kustomization.yaml" not in seen:
                kustomize_files(target, seen)
        else:
            seen.add(target)
    return seen


def render(overlay, out, failures):
    """The overlay rendered by kustomize: (documents, the file written)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        failures.append("kubectl not found: deploy/ is a kustomize package, rendered with `kubectl kustomize` "
                        "(kustomize v5; kubectl 1.27 or later)")
        return [], None
    run = subprocess.run([kubectl, "kustomize", str(DEPLOY / overlay)], capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"deploy/{overlay}: kubectl kustomize fails: {run.stderr.strip()}")
        return [], None
    path = out / f"rendered-{overlay.replace('/', '-')}.yaml"
    path.write_text(run.stdout)
    rel = f"rendered/{overlay}"
    return [Doc(rel, i, substitute(obj)) for i, obj in enumerate(yaml.safe_load_all(run.stdout)) if obj is not None], path


def values_literals():
    """deploy/values/kustomization.yaml's literals (model, image, digest)."""
    k = yaml.safe_load((DEPLOY / "values" / "kustomization.yaml").read_text())
    gen = next(g for g in k["configMapGenerator"] if g["name"] == "pd-router-values")
    return dict(lit.split("=", 1) for lit in gen.get("literals") or [])


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


CORE_GROUPS = ("v1", "apps/v1", "rbac.authorization.k8s.io/v1", "policy/v1")


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
            elif api == "inference.networking.k8s.io/v1":
                # llm-d installs GIE v1.5.0's CRDs (llm-d-router
                # deploy/components/crds-gie), which require endpointPickerRef;
                # v1.6.0's no longer do. A pool must pass both.
                for schema, what in INFERENCEPOOL_SCHEMAS:
                    for err in validate_schema(registry, "pd-router:" + schema, obj):
                        failures.add(doc, f"schemas/{schema}.json ({what}): {err}")
                    doc.checks.append(f"deploy/schemas/{schema}.json ({what} schema)")
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
            elif api.split("/")[0] in ("networking.istio.io", "security.istio.io", "gateway.networking.k8s.io"):
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

    def __init__(self, where, ns, container, volumes, service_account=None, others=()):
        self.where, self.ns, self.service_account = where, ns, service_account
        # Who creates the ServiceAccount when deploy/ does not (Istio's
        # gateway controller creates <gateway>-<class> with the Deployment).
        self.service_account_creator = None
        # Files Envoy reads that the configuration does not name (Istio's
        # ISTIO_BOOTSTRAP_OVERRIDE).
        self.extra_files = []
        # The pod's other containers (a sidecar may write what Envoy reads).
        self.others = list(others)
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
        self.docs = docs

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
    others = [c for c in pod.get("initContainers", []) + pod["containers"] if c is not container]
    proxy = Proxy(dep, dep.ns, container, pod.get("volumes"), pod.get("serviceAccountName", "default"), others)
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
    if not (ef and gw and route):
        return None, None
    params = (gw.obj["spec"].get("infrastructure") or {}).get("parametersRef") or {}
    overlay_cm = v.one("ConfigMap", failures, params.get("name"))
    if overlay_cm is None:
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
    # Istio's name for the rule's route: the rule's `name` exists only in
    # Gateway API >= 1.4 CRDs (older ones prune it); nothing here matches it.
    route_name = rule.get("name") or f"{route.ns}.{route.name}.0"
    # An InferencePool backend: Istio's shadow Service, port 54321.
    outbound = f"outbound|{backend.get('port', 54321)}||{backend['name']}.{route.ns}.svc.cluster.local"
    envoy_route = {"name": route_name, "match": {"prefix": rule["matches"][0]["path"]["value"]},
                   "route": {"cluster": outbound, "retry_policy": copy.deepcopy(ISTIO_DEFAULT_RETRY)}}
    vhost_name = f"*:{port}"
    extensions, inserted, clusters, listener_merge = {}, [], [], {}
    first_routes = []
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
        elif (apply_to, op) == ("HTTP_ROUTE", "INSERT_FIRST"):
            rc = match.get("routeConfiguration") or {}
            vhost = rc.get("vhost") or {}
            if rc.get("portNumber") != port or vhost.get("name") != vhost_name or "route" in vhost:
                failures.add(ef, f"{what}: must match port {port}'s virtual host {vhost_name!r} and no route "
                                 "(a route match would depend on Istio's route names)")
                continue
            first_routes.insert(0, copy.deepcopy(value))
        elif apply_to == "BOOTSTRAP":
            # istiod accepts it (its webhook builds the message) but nothing
            # applies it: bootstrap delivery over xDS (BDS) was removed in
            # Istio 1.21 (commit f6337a9d, releasenotes/notes/bds-removal.yaml).
            failures.add(ef, f"{what}: a BOOTSTRAP patch never applies on Istio >= 1.21 (BDS removed): "
                             "use ISTIO_BOOTSTRAP_OVERRIDE with a mounted file (the gateway Deployment's patch)")
        else:
            failures.add(ef, f"{what}: {apply_to} {op} is not something the assembler models")
    if not first_routes:
        failures.add(ef, "no HTTP_ROUTE INSERT_FIRST puts pd-router's own route first")
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
        {"name": vhost_name, "domains": ["*"], "routes": first_routes + [envoy_route]}]}
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
    # pilot-agent passes ISTIO_BOOTSTRAP_OVERRIDE's file to Envoy as
    # --config-yaml, merged into its bootstrap (pkg/envoy/proxy.go).
    override = next((e.get("value") for e in container.get("env") or []
                     if e.get("name") == "ISTIO_BOOTSTRAP_OVERRIDE"), None)
    extra_files = []
    if override:
        text = configmap_file(v, override)
        if text is None:
            failures.add(overlay_cm, f"ISTIO_BOOTSTRAP_OVERRIDE {override}: no ConfigMap of the overlay holds it")
        else:
            conf = proto_merge(conf, yaml.safe_load(text))
            extra_files.append(override)
    if "overload_manager" not in conf:
        failures.add(overlay_cm, "the gateway's Envoy gets no overload manager (long prompts are buffered whole: "
                                 "an OOM kill would end every stream); ISTIO_BOOTSTRAP_OVERRIDE with a mounted file")
    # Istio's gateway runs as <gateway>-<class> unless the Gateway names one;
    # either way Istio renders that ServiceAccount with an ownerReference to
    # the Gateway (kube-gateway.yaml), so it must not be one deploy/ creates:
    # deleting the Gateway would delete it.
    named = (gw.obj["metadata"].get("annotations") or {}).get("gateway.istio.io/service-account")
    sa = named or f"{gw.name}-{gw.obj['spec']['gatewayClassName']}"
    if any(d.name == sa and d.ns == gw.ns for d in v.all("ServiceAccount")):
        failures.add(gw, f"the gateway runs as ServiceAccount {sa}, which deploy/ creates: Istio adds an "
                         "ownerReference to the Gateway to it, and deleting the Gateway deletes it; "
                         "bind the Role to Istio's own <gateway>-<class> instead")
    others = [c for c in pod.get("initContainers", []) + pod["containers"] if c is not container]
    proxy = Proxy(overlay_cm, gw.ns, container, pod.get("volumes"), sa, others)
    proxy.service_account_creator = "Istio's gateway controller"
    proxy.extra_files = extra_files
    return conf, proxy


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

    flags = (((((values.obj if values else {}).get("config") or {}).get("envoyGateway") or {})
              .get("runtimeFlags") or {}).get("enabled") or [])
    port = gw.obj["spec"]["listeners"][0]["port"]
    if "XDSNameSchemeV2" in flags:
        # internal/xds/translator/listener.go: by external port.
        lname, rname = f"tcp-{port}", f"http-{port}"
    else:
        lname = rname = f"{gw.ns}/{gw.name}/{gw.obj['spec']['listeners'][0]['name']}"
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
    # internal/xds/translator/listener.go: Envoy Gateway always normalizes
    # paths, merges slashes unless told not to, and maps the escaped-slash
    # action by name (its own default: UnescapeAndRedirect).
    path = ctp_spec.get("path") or {}
    hcm_extra["normalize_path"] = True
    hcm_extra["merge_slashes"] = not path.get("disableMergeSlashes", False)
    hcm_extra["path_with_escaped_slashes_action"] = {
        "KeepUnchanged": "KEEP_UNCHANGED", "RejectRequest": "REJECT_REQUEST",
        "UnescapeAndForward": "UNESCAPE_AND_FORWARD", "UnescapeAndRedirect": "UNESCAPE_AND_REDIRECT",
    }[path.get("escapedSlashesAction", "UnescapeAndRedirect")]
    listener = {"name": lname, "address": {"socket_address": {"address": "0.0.0.0", "port_value": 10080}},
                "per_connection_buffer_limit_bytes": buffer,
                "default_filter_chain": {"filters": [{"name": HCM_NAME, "typed_config": dict(
                    {"@type": HCM_TYPE, "stat_prefix": "http-10080",
                     "rds": {"route_config_name": rname, "config_source": {"ads": {}, "resource_api_version": "V3"}},
                     "http_filters": filters + [ROUTER]}, **hcm_extra)}]}}
    action = dict({"cluster": route_cluster}, **eg_route_timeouts(rule, ctp.obj))
    route_config = {"name": rname, "virtual_hosts": [{"name": "*" if "XDSNameSchemeV2" in flags else f"{lname}/*",
                                                       "domains": ["*"], "routes": [
        {"name": f"httproute/{route.ns}/{route.name}/rule/0/match/0/*",
         "match": {"prefix": rule["matches"][0]["path"]["value"]},
         "route": action, "typed_per_filter_config": per_route}]}]}
    backend_cluster = dummy_cluster(route_cluster)
    for b in btps:
        cb = b.obj["spec"].get("circuitBreaker") or {}
        if cb:
            # internal/xds/translator/cluster.go buildXdsClusterCircuitBreaker.
            backend_cluster["circuit_breakers"] = {"thresholds": [{k: v for k, v in {
                "max_connections": cb.get("maxConnections"), "max_pending_requests": cb.get("maxPendingRequests"),
                "max_requests": cb.get("maxParallelRequests"), "max_retries": cb.get("maxParallelRetries")}.items()
                if v is not None}]}
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
                 "type.googleapis.com/envoy.config.route.v3.RouteConfiguration": {rname: route_config},
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
            f["route_config"] = resources["type.googleapis.com/envoy.config.route.v3.RouteConfiguration"][rname]
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
    sa = (((proxy_doc.obj["spec"]["provider"]["kubernetes"].get("envoyServiceAccount") or {}).get("name"))
          or f"envoy-{gw.ns}-{gw.name}")
    return conf, Proxy(proxy_doc, proxy_ns, pod["containers"][0], volumes, sa)


# ------------------------------------------------------ bootstrap checks


def plugin_of(config):
    """The plugin configuration; a JSON string holding it (Envoy Gateway's
    string `config`) is read as its content, as the filter reads it."""
    plugin = json.loads(((config.get("configuration") or {}).get("value")) or "{}")
    return json.loads(plugin) if isinstance(plugin, str) else plugin


def check_values(rendered, failures):
    """The values agree with themselves: the model is one of plugin.json's,
    discovery lists the namespace everything renders into, and the
    override-host variant's own plugin configuration differs from
    plugin.json only in the routing keys."""
    try:
        plugin = json.loads((DEPLOY / "values" / "plugin.json").read_text())
    except json.JSONDecodeError as e:
        failures.append(f"deploy/values/plugin.json: not JSON: {e}")
        return
    model = values_literals().get("model")
    if model not in [m.get("name") for m in plugin.get("models") or []]:
        failures.append(f"deploy/values/kustomization.yaml: model {model!r} is not one of plugin.json's models")
    for rel, docs in rendered.items():
        spaces = {d.ns for d in docs if d.ns}
        ns = ((plugin.get("discovery") or {}).get("kubernetes") or {}).get("namespace", "default")
        if spaces and spaces != {ns}:
            failures.append(f"deploy/{rel}: objects render into {sorted(spaces)}, but plugin.json's discovery lists {ns!r}")
        for d in docs:
            if (d.obj.get("metadata", {}).get("annotations") or {}).get("pd-router.io/own-plugin-config") != "true":
                continue
            if d.kind == "EnvoyExtensionPolicy":
                own = json.loads(d.obj["spec"]["wasm"][0]["config"])
            elif d.kind == "ConfigMap":
                conf = yaml.safe_load(d.obj["data"]["envoy.yaml"])
                own = next(plugin_of(n["config"]) for n in walk(conf)
                           if isinstance(n, dict) and n.get("@type") == WASM_TYPE)
            else:
                own = json.loads(d.obj["spec"]["configPatches"][0]["patch"]["value"]["typed_config"]["config"]
                                 ["configuration"]["value"])
            if strip_variant(own) != strip_variant(plugin):
                failures.add(d, "its own plugin configuration differs from deploy/values/plugin.json "
                                "in more than the routing keys and where discovery finds the pods")


def strip_variant(plugin):
    """A plugin configuration without what a variant may change."""
    out = {k: v for k, v in plugin.items() if k not in ROUTING_KEYS}
    kube = dict(((out.get("discovery") or {}).get("kubernetes") or {}))
    for k in POOL_KEYS:
        kube.pop(k, None)
    if "discovery" in out:
        out["discovery"] = dict(out["discovery"], kubernetes=kube)
    return out


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
    token_env = kube.get("token_env", DEFAULT_TOKEN_ENV)  # must not reach the VM
    routing = plugin.get("routing", "original_dst")
    header = plugin.get("routing_header", DEFAULT_HEADER.get(routing))
    prefill = plugin.get("prefill_cluster", DEFAULT_PREFILL_CLUSTER)
    metrics = plugin.get("metrics_cluster", prefill)
    keys = ((config.get("vm_config") or {}).get("environment_variables") or {}).get("host_env_keys") or []
    if api_cluster and token_env in keys:
        failures.append(f"{where}: host_env_keys hands the VM {token_env}: the API token belongs to Envoy "
                        "(a credential_injector on the API cluster), not to the VM")
    for role, name in [("prefill_cluster", prefill), ("metrics_cluster", metrics),
                       ("discovery.kubernetes.cluster", api_cluster)]:
        if name and name not in clusters:
            failures.append(f"{where}: the plugin's {role} {name!r} is not a cluster")
        elif name:
            check_breakers(where, name, clusters[name], failures)
    token_files = []
    if api_cluster in clusters:
        tls = (clusters[api_cluster].get("transport_socket") or {}).get("name")
        if tls != "envoy.transport_sockets.tls":
            failures.append(f"{where}: cluster {api_cluster} must speak TLS to the API server")
        token_files = check_injector(v, where, api_cluster, clusters[api_cluster], failures)
    if plugin.get("placement") == "epp":
        check_picker_chain(where, h.get("http_filters") or [], f, clusters, failures)
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
    seen = []
    for r in routes:
        # A route after one with the same match never gets a request (Istio's
        # own route behind pd-router's inserted one).
        if r.get("match") in seen:
            continue
        seen.append(r.get("match"))
        action = r.get("route") or {}
        if f.get("disabled") and f["name"] not in (r.get("typed_per_filter_config") or {}):
            failures.append(f"{where}: route {r.get('name') or json.dumps(r.get('match'))} does not enable the (disabled) wasm filter")
        decode = action.get("cluster")
        if decode not in clusters:
            continue
        check_breakers(where, decode, clusters[decode], failures)
        retries = (action.get("retry_policy") or {}).get("num_retries", 1 if action.get("retry_policy") else 0)
        if retries:
            failures.append(f"{where}: route {r.get('name') or json.dumps(r.get('match'))} retries {retries} times: "
                            "a decode must never be sent twice (its hand-off may be consumed)")
        if action.get("timeout") not in ("0s", "0"):
            failures.append(f"{where}: route {r.get('name') or json.dumps(r.get('match'))} has a total timeout {action.get('timeout')!r} (want 0s)")
        check_routing(where, routing, header, clusters, [prefill, decode], failures)
    if proxy is not None:
        # ModelAdapters are read by default under AIBrix's labels.
        adapters = kube.get("model_adapters", kube.get("labels", "aibrix") == "aibrix")
        check_proxy(v, conf, proxy, kube.get("namespace", "default") if api_cluster else None, failures,
                    local_files, token_files, adapters)


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


# How llm-d's EPP must be called: the request body streamed to it, and the
# response's headers, body and trailers too (its accounting, the served
# endpoint, usage and completion hooks read them; with response headers
# SKIPped and no response body the stream ends at the response headers).
# GIE v1.5.0 config/charts/standalone/values.yaml and test/testdata/envoy.yaml,
# llm-d-router v0.9.0 deploy/environments/dev/e2e-infra/envoy.yaml; Istio
# 1.28's per-route override for pools (route.go) sets the same modes.
EPP_PROCESSING_MODE = {"request_header_mode": "SEND", "response_header_mode": "SEND",
                       "request_body_mode": "FULL_DUPLEX_STREAMED", "response_body_mode": "FULL_DUPLEX_STREAMED",
                       "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"}
EPP_MESSAGE_TIMEOUT = "1000s"


def check_picker_chain(where, filters, wasm, clusters, failures):
    """Executor mode: the client's copies of the picker's headers are
    removed before the picker (ext_proc) runs, and pd-router comes after it;
    the picker is called as llm-d's EPP needs (its modes, TLS), and a
    broken picker is an error, not a silent fallback."""
    names = [f.get("name") for f in filters]
    strip = next((i for i, f in enumerate(filters) if PICKER_HEADERS <= {
        m.get("remove") for m in (((f.get("typed_config") or {}).get("mutations") or {}).get("request_mutations") or [])}),
        None)
    picker = next((i for i, f in enumerate(filters) if "ext_proc" in (f.get("name") or "")), None)
    mine = names.index(wasm.get("name"))
    if strip is None or (picker is not None and strip > picker) or strip > mine:
        failures.append(f"{where}: placement epp: no filter before the picker removes the client's "
                        f"{' and '.join(sorted(PICKER_HEADERS))} (a client could pick the pods)")
    if picker is None or picker > mine:
        failures.append(f"{where}: placement epp: no endpoint picker (ext_proc) before pd-router")
        return
    ext = filters[picker].get("typed_config") or {}
    mode = ext.get("processing_mode") or {}
    wrong = {k: mode.get(k, "(default)") for k, want in EPP_PROCESSING_MODE.items() if mode.get(k) != want}
    if wrong:
        failures.append(f"{where}: the picker's ext_proc processing_mode {wrong}: llm-d's EPP needs "
                        f"{EPP_PROCESSING_MODE} (its response hooks never run otherwise)")
    if ext.get("message_timeout") != EPP_MESSAGE_TIMEOUT:
        failures.append(f"{where}: the picker's ext_proc message_timeout {ext.get('message_timeout')!r}: "
                        f"llm-d's and GIE's Envoy use {EPP_MESSAGE_TIMEOUT} (streamed bodies)")
    if ext.get("failure_mode_allow"):
        failures.append(f"{where}: the picker's ext_proc fails open: a broken picker connection (a TLS mismatch "
                        "among them) would go unseen, every pick made by pd-router instead")
    cluster = (((ext.get("grpc_service") or {}).get("envoy_grpc") or {}).get("cluster_name"))
    if cluster in clusters:
        # Each request holds one ext_proc stream for its whole life (the
        # answer streams through the picker too).
        check_breakers(where, cluster, clusters[cluster], failures)
    tls = ((clusters.get(cluster) or {}).get("transport_socket") or {}).get("name")
    if tls != "envoy.transport_sockets.tls":
        failures.append(f"{where}: the picker's cluster {cluster} speaks plaintext: llm-d's EPP serves TLS "
                        "by default (--secure-serving=true, llm-d-router pkg/epp/server/options.go)")


def check_breakers(where, name, cluster, failures):
    """The cluster's circuit breakers are far above Envoy's defaults."""
    t = ((cluster.get("circuit_breakers") or {}).get("thresholds") or [{}])[0]
    low = [k for k in ("max_connections", "max_pending_requests", "max_requests") if int(t.get(k, 1024)) < MIN_BREAKER]
    if low:
        failures.append(f"{where}: cluster {name}: circuit breakers {', '.join(low)} at Envoy's default or low "
                        "(the 1,025th concurrent generation would get an instant 503)")


def check_injector(v, where, name, cluster, failures):
    """The API cluster adds the token itself: a credential_injector whose
    file-based SDS source is watched (kubelet swaps the projected token).
    Returns the token files the SDS file names."""
    opts = ((cluster.get("typed_extension_protocol_options") or {})
            .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions") or {})
    inj = next((f for f in opts.get("http_filters") or [] if f.get("name") == CREDENTIAL_INJECTOR), None)
    if inj is None:
        failures.append(f"{where}: cluster {name} has no {CREDENTIAL_INJECTOR}: nothing adds the API token")
        return []
    sds = [n["path_config_source"] for n in walk(inj) if isinstance(n, dict) and "path_config_source" in n]
    if not sds or "watched_directory" not in sds[0]:
        failures.append(f"{where}: cluster {name}: the token's SDS source must be a file with a watched_directory "
                        "(kubelet rotates the token by swapping a symlink)")
        return []
    text = configmap_file(v, sds[0].get("path", ""))
    if text is None:
        failures.append(f"{where}: no ConfigMap holds the SDS file {sds[0].get('path')}")
        return []
    files = [n["filename"] for n in walk(yaml.safe_load(text)) if isinstance(n, dict) and "filename" in n]
    for f in files:
        if not f.startswith(sds[0]["watched_directory"]["path"].rstrip("/") + "/"):
            failures.append(f"{where}: the token {f} is not in the watched directory")
    return [sds[0].get("path")] + files


def check_proxy(v, conf, proxy, namespace, failures, local_files, token_files, adapters):
    where = proxy.where
    if namespace is not None:
        if proxy.ns != namespace:
            failures.add(where, f"the proxy runs in {proxy.ns}, but discovery lists {namespace}: the Role binds there")
        check_rbac(v, proxy, namespace, failures, adapters)
    # Every file the configuration reads must be mounted: ConfigMaps, and the
    # token from a projected ServiceAccount token volume.
    files = [n["filename"] for n in walk(conf) if isinstance(n, dict) and isinstance(n.get("filename"), str)]
    files += [proxy.config_file] if getattr(proxy, "config_file", None) else []
    files += proxy.extra_files
    files += token_files
    for path in files:
        if path in local_files:
            continue
        mount = next((m for m in proxy.mounts if path.startswith(m.get("mountPath", "").rstrip("/") + "/")), None)
        volume = proxy.volumes.get((mount or {}).get("name")) or {}
        key = path[len((mount or {}).get("mountPath", "").rstrip("/")) + 1:]
        sources = (volume.get("projected") or {}).get("sources")
        if sources is not None:
            token = any((src.get("serviceAccountToken") or {}).get("path") == key for src in sources)
            cm = next((src["configMap"] for src in sources if "configMap" in src
                       and any(i.get("path") == key for i in src["configMap"].get("items") or [])), None)
            if token:
                t = next(src["serviceAccountToken"] for src in sources if "serviceAccountToken" in src)
                if t.get("audience"):
                    failures.add(where, f"{path}: the token's audience must be the API server's (no `audience`)")
                continue
            if cm is not None and key in (EXTERNAL_CONFIGMAPS.get(cm["name"]) or set()):
                continue
            failures.add(where, f"{path}: the projected volume {mount['name']} holds no such file")
            continue
        if "emptyDir" in volume:
            # Written by a sidecar that reads a projected token, or unpacked
            # by an init container from a ConfigMap key it mounts (the
            # gzipped module).
            writers = [c for c in proxy.others if any(m.get("name") == mount["name"] for m in c.get("volumeMounts") or [])]
            from_token = any(any("serviceAccountToken" in str(proxy.volumes.get(m.get("name"), {}).get("projected"))
                                 for m in c.get("volumeMounts") or []) for c in writers)
            unpacked = any(unpacks(c, key, proxy.volumes) for c in writers)
            if not from_token and not unpacked:
                failures.add(where, f"{path}: emptyDir {mount['name']} has no container that writes it from a projected token or a ConfigMap")
            continue
        cm_name = (volume.get("configMap") or {}).get("name")
        if cm_name is None:
            failures.add(where, f"{path} is not in a ConfigMap or projected volume mounted into the proxy container")
            continue
        carried = next((d for d in v.all("ConfigMap") if d.name == cm_name), None)
        keys = set((carried.obj.get("data") or {}) | (carried.obj.get("binaryData") or {})) if carried \
            else EXTERNAL_CONFIGMAPS.get(cm_name)
        if keys is None or key not in keys:
            failures.add(where, f"{path}: ConfigMap {cm_name} holds no key {key!r}")


def unpacks(container, key, volumes):
    """Whether `container` gunzips `key` out of a ConfigMap key it mounts
    that the manifests expect (EXTERNAL_CONFIGMAPS)."""
    script = " ".join(container.get("command") or []) + " " + " ".join(container.get("args") or [])
    for m in container.get("volumeMounts") or []:
        cm = (volumes.get(m.get("name")) or {}).get("configMap") or {}
        for k in EXTERNAL_CONFIGMAPS.get(cm.get("name"), set()):
            src = m.get("mountPath", "").rstrip("/") + "/" + k
            if k == key + ".gz" and f"gunzip -c {src}" in script and key in script:
                return True
    return False


# What discovery calls (src/discovery): a LIST then bounded watches of pods
# (kube.rs list_path, watch_path), a GET of its InferencePool (pool.rs), a
# LIST of ModelAdapters (kube.rs adapters_path). A Role grants no more.
DISCOVERY_VERBS = {("", "pods"): {"list", "watch"},
                   ("inference.networking.k8s.io", "inferencepools"): {"get"},
                   ("model.aibrix.ai", "modeladapters"): {"list"}}


def check_rbac(v, proxy, namespace, failures, adapters):
    """The proxy's ServiceAccount may list and watch pods there, and list
    AIBrix's ModelAdapters when discovery reads them; its Roles grant
    nothing discovery does not use."""
    sa_name = proxy.service_account
    sa = next((d for d in v.all("ServiceAccount") if d.name == sa_name and d.ns == proxy.ns), None)
    if sa is None and proxy.service_account_creator:
        sa = Doc(f"(ServiceAccount {sa_name} of {proxy.service_account_creator})", 0,
                 {"kind": "ServiceAccount", "metadata": {"name": sa_name, "namespace": proxy.ns}})
    if sa is None:
        failures.add(proxy.where, f"runs as ServiceAccount {sa_name!r}, which deploy/ does not create in {proxy.ns}")
        return
    needed = [("", "pods", DISCOVERY_VERBS[("", "pods")])]
    if adapters:
        needed.append(("model.aibrix.ai", "modeladapters", {"list"}))
    granted = set()
    for rb in v.all("RoleBinding"):
        if rb.ns != namespace:
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa.name and s.get("namespace") == sa.ns
                   for s in rb.obj.get("subjects") or []):
            continue
        role = next((d for d in v.all("Role") if d.name == rb.obj["roleRef"]["name"] and d.ns == namespace), None)
        for rule in (role.obj.get("rules") if role else []) or []:
            for group, resource, verbs in needed:
                if group in rule.get("apiGroups", []) and resource in rule.get("resources", []) \
                        and verbs <= set(rule.get("verbs", [])):
                    granted.add(resource)
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    used = DISCOVERY_VERBS.get((group, resource), set())
                    extra = set(rule.get("verbs", [])) - used
                    if extra:
                        failures.add(role, f"grants {'/'.join(sorted(extra))} on {resource}, which discovery "
                                           "never uses (it calls: "
                                           f"{'/'.join(sorted(used)) or 'nothing'})")
    for group, resource, verbs in needed:
        if resource not in granted:
            failures.add(sa, f"no RoleBinding in {namespace} grants it {'/'.join(sorted(verbs))} on {resource}")


def ssl_ca_bundle():
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and os.path.exists(candidate):
            return candidate
    import pip._vendor.certifi as certifi  # always in a venv's pip

    return certifi.where()


def for_validation(conf, v, scratch):
    """The assembled configuration as this machine can load it: the API
    server's CA replaced by a local CA bundle, listeners on loopback port 0,
    file-based SDS (the API token) read from `scratch`: the SDS file as its
    ConfigMap holds it, pointing at a stand-in token."""
    conf = copy.deepcopy(conf)
    for node in walk(conf):
        if isinstance(node, dict) and isinstance(node.get("trusted_ca"), dict) and "filename" in node["trusted_ca"]:
            node["trusted_ca"]["filename"] = ssl_ca_bundle()
        if isinstance(node, dict) and isinstance(node.get("path_config_source"), dict):
            scratch.mkdir(parents=True, exist_ok=True)
            src = node["path_config_source"]
            sds = yaml.safe_load(configmap_file(v, src.get("path", "")) or "resources: []")
            for n in walk(sds):
                if isinstance(n, dict) and isinstance(n.get("filename"), str):
                    token = scratch / Path(n["filename"]).name
                    token.write_text("validate-token")
                    n["filename"] = str(token)
            local = scratch / Path(src.get("path", "sds.yaml")).name
            local.write_text(yaml.safe_dump(sds))
            src["path"] = str(local)
            if "watched_directory" in src:
                src["watched_directory"] = {"path": str(scratch)}
    for listener in [conf.get("admin", {})] + (conf.get("static_resources") or {}).get("listeners", []):
        if "address" in listener:
            listener["address"] = {"socket_address": {"address": "127.0.0.1", "port_value": 0}}
    return conf


def configmap_file(v, path):
    """The text a ConfigMap of the variant holds for a file the proxy
    mounts from it (None if none does)."""
    for d in v.all("ConfigMap"):
        for key, text in (d.obj.get("data") or {}).items():
            if path.endswith("/" + key):
                return text
    return None


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
    raw = load(failures)
    node_docs = []
    rendered, install = {}, {rel: raw.get(rel, []) for rel in INSTALL_FILES}
    packaged = {}
    for overlay in list(VARIANTS) + WORKLOADS:
        docs, path = render(overlay, args.out, failures)
        rendered[f"rendered/{overlay}"] = docs
        if path is not None:
            for f in kustomize_files(DEPLOY / overlay):
                packaged.setdefault(f.relative_to(DEPLOY).as_posix(), []).append(overlay)
    check_documents(dict(rendered, **install), failures, node_docs)
    for rel, items in raw.items():
        if rel in INSTALL_FILES:
            continue
        for d in items:
            if rel in packaged:
                d.checks.append("parsed; rendered by kubectl kustomize into " + ", ".join(sorted(set(packaged[rel]))))
            else:
                failures.add(d, "part of no overlay (no kustomization.yaml reaches it): nothing checks it")
    check_values(rendered, failures)
    (args.out / "node-docs.json").write_text(json.dumps(node_docs, indent=1))
    bootstraps = []
    assemblers = {"envoy": assemble_envoy, "envoy-epp": assemble_envoy, "istio": assemble_istio,
                  "inference-pool": assemble_istio,
                  "envoy-gateway": assemble_envoy_gateway,
                  "envoy-gateway/override-host": assemble_envoy_gateway,
                  "envoy-gateway/xds-name-scheme-v2": assemble_envoy_gateway}
    for name, assemble in assemblers.items():
        v = Variant(name, rendered[f"rendered/{name}"] + [d for rel in VARIANTS[name] for d in install[rel]])
        try:
            conf, proxy = assemble(v, failures, args.wasm.resolve())
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            failures.append(f"{name}: cannot assemble its Envoy configuration: {type(e).__name__} {e}")
            continue
        if conf is None:
            continue
        check_bootstrap(v, conf, proxy, failures, {str(args.wasm.resolve())})
        if name in ("envoy", "envoy-epp"):
            conf = rewrite_plain(conf, args.wasm.resolve())
        stem = name.replace("/", "-")
        path = args.out / f"bootstrap-{stem}.yaml"
        path.write_text(yaml.safe_dump(for_validation(conf, v, args.out / stem), sort_keys=False))
        bootstraps.append({"variant": name, "path": str(path),
                           "made_of": v.made_of()})
    files = dict(raw, **rendered)
    report = {
        "files": {f"deploy/{rel}": [{"index": d.index, "kind": d.kind, "name": d.name, "checks": d.checks}
                                    for d in items] for rel, items in files.items()},
        "bootstraps": bootstraps,
        "node_docs": len(node_docs),
        "failures": list(failures),
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    for f in failures:
        print(f)
    print(f"validate.py: {sum(len(i) for i in raw.values())} document(s) in {len(raw)} file(s), "
          f"{len(rendered)} overlay(s) rendered, {len(bootstraps)} Envoy configuration(s), {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

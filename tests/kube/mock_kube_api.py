#!/usr/bin/env python3
"""A mock Kubernetes API server for pd-router's end-to-end tests.

It serves Pod LISTs the way kube-apiserver does (see /work/notes/k8s.md
§1.1-1.4 for the facts it follows), with answers shaped by the official
Python client's models (PyPI `kubernetes`), and lets a test replace the pod
set (and the InferencePools and AIBrix ModelAdapters), inject failures and
read back what the filter asked.

    python mock_kube_api.py --listen 127.0.0.1:0 --token TOKEN

prints one line `READY {"port": N}` on stdout, then serves on that address
only. Logs go to stderr.

API (bearer token required; every path outside /_mock/):
  GET /api/v1/namespaces/{ns}/pods, GET /api/v1/pods
      labelSelector (the apimachinery grammar, including `>`/`<`),
      fieldSelector (metadata.name/namespace, spec.nodeName/restartPolicy/
      schedulerName/serviceAccountName, status.phase/podIP), limit, continue,
      resourceVersion, resourceVersionMatch.
      resourceVersion=0: watch-cache semantics, limit ignored, no continue.
      resourceVersion unset or "": consistent read of the latest state; with
      limit, pages over the snapshot of the first page's resourceVersion.
      continue with a resourceVersion other than "" or "0": 400, as the API
      server does (it lets "0" through; the cache then ignores limit).
      Items are in etcd key order ("ns/name"), and a page that reaches limit
      carries a continue token whenever items remain in scope, matching or
      not, so a last page can be empty, as with etcd and the watch cache.
  GET ...?watch=1 (or true): a watch, as the API server's cacher serves it:
      200, chunked, one JSON event per line ({"type", "object"}, the object
      with its kind and apiVersion). From resourceVersion R: every change
      after R (each change of a PUT /_mock/pods has its own resourceVersion,
      as in etcd); from "" or "0": ADDED for every current pod first. With
      selectors, a pod that stops matching comes as DELETED (its previous
      state at the change's resourceVersion), one that starts as ADDED.
      timeoutSeconds ends the body normally (default 1800). With
      allowWatchBookmarks=true a BOOKMARK (only metadata.resourceVersion)
      goes out just before the end. A resourceVersion older than the kept
      history: an ERROR event (Status 410 Expired, "too old resource
      version") inside the 200, then the end.
Modes (API paths only, never /_mock/): network and proxy faults come before
authentication, API server answers after it:
  reset        read the request, close with an RST, no answer
  garbage      200 application/json, a body that is not JSON
  unavailable  503 Status ServiceUnavailable
  slow         wait delay_ms (default 5000), then answer as in `ok`
  unauthorized 401 whatever the token
  forbidden    403 Status naming system:serviceaccount:default:pd-router
  too_many_requests  429, Retry-After: 1, the unready-cache Status
  expire_continue    any request with continue: 410 Expired (+ fresh token)
  truncated    the normal answer with its full Content-Length, half the
               body, then close; a watch: its headers and first events,
               then close without the last chunk (a watch cut)
  gone         watches answer HTTP 410 Expired (lists as in `ok`)
  no_bookmarks watches send no BOOKMARK (the API server never promises one)
Control (no auth):
  PUT    /_mock/pods      [{name, namespace, labels, annotations, ip, port,
                            phase, ready, terminating}] -> {"resourceVersion"}
  GET    /_mock/pods      the current simplified pod set and resourceVersion
  PUT    /_mock/mode      {"mode": M, "delay_ms": N}; GET /_mock/mode
  GET    /_mock/requests  the API requests received, oldest first
  DELETE /_mock/requests  clears that log
  PUT    /_mock/pools     [{name, namespace, matchLabels, targetPorts}]: the
                          InferencePools (inference.networking.k8s.io/v1)
                          served at GET /apis/inference.networking.k8s.io/
                          v1/namespaces/{ns}/inferencepools/{name} (404
                          NotFound when absent); replaces them all
  PUT    /_mock/adapters  [{name, namespace, baseModel, instances, artifactURL}]:
                          AIBrix's ModelAdapters (model.aibrix.ai/v1alpha1,
                          its CRD installed from then on), replacing them
                          all, listed at GET /apis/model.aibrix.ai/v1alpha1/
                          [namespaces/{ns}/]modeladapters (resourceVersion
                          checked, selectors ignored, one answer, no watch:
                          400); before the first PUT, or after DELETE
                          /_mock/adapters (the CRD removed), those paths
                          are 404 NotFound, as for any unknown resource
  PUT    /_mock/token     {"token": T}: the bearer token accepted from now on
                          (a rotated ServiceAccount token)
  POST   /_mock/compact   the history restarts after now (etcd compacted, a
                          restarted API server's watch cache): open watches
                          end with a 410 ERROR event, and so does any watch
                          from a resourceVersion before the returned one
"""

import argparse
import base64
import binascii
import datetime
import hashlib
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kubernetes import client as k8s
from kubernetes.client import ApiClient

SERVICE_ACCOUNT = "system:serviceaccount:default:pd-router"
IMAGE = "vllm/vllm-openai:v0.11.0"
IMAGE_ID = "docker.io/vllm/vllm-openai@sha256:" + "0" * 64
NODE_NAME = "kind-worker"
HOST_IP = "172.18.0.2"
FIRST_RV = 1000
SNAPSHOTS_KEPT = 256
MAX_BODY = 16 << 20

MODES = (
    "ok",
    "unauthorized",
    "forbidden",
    "unavailable",
    "garbage",
    "truncated",
    "reset",
    "slow",
    "expire_continue",
    "too_many_requests",
    "gone",
    "no_bookmarks",
)
HISTORY_KEPT = 10000
DEFAULT_WATCH_SECONDS = 1800

POD_KEYS = {
    "name",
    "namespace",
    "labels",
    "annotations",
    "ip",
    "port",
    "phase",
    "ready",
    "terminating",
}
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token "
    "in this response to retrieve the remainder of the results. Continuing with the "
    "provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may "
    "show up in the list."
)

GARBAGE = (
    b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},'
    b'"items":[{"metadata":{"name":"x"}},,<html>upstream garbage</html>\n'
)


def log(msg):
    sys.stderr.write("mock_kube_api: %s\n" % msg)
    sys.stderr.flush()


class _ApiClient(ApiClient):
    """The official serialiser, with times in the API server's own form
    (`2026-01-02T03:04:05Z`, not Python's `+00:00`)."""

    def sanitize_for_serialization(self, obj):
        if isinstance(obj, datetime.datetime):
            if obj.tzinfo is None:
                obj = obj.replace(tzinfo=datetime.timezone.utc)
            return obj.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return super().sanitize_for_serialization(obj)


API = _ApiClient()


def serialise(model):
    return API.sanitize_for_serialization(model)


def utc(ts):
    return datetime.datetime.fromtimestamp(int(ts), tz=datetime.timezone.utc)


# --------------------------------------------------------------------------
# Label selectors: apimachinery pkg/labels/selector.go (Lexer, Parser,
# NewRequirement, Requirement.Matches), error texts included.
# --------------------------------------------------------------------------


class SelectorError(ValueError):
    pass


_SPECIAL = "=!(),<>"
_WHITESPACE = " \t\r\n"
_STRING_TO_TOKEN = {
    ")": "CLOSE",
    ",": "COMMA",
    "!": "NOT",
    "==": "EQEQ",
    "=": "EQ",
    ">": "GT",
    "in": "IN",
    "<": "LT",
    "!=": "NE",
    "notin": "NOTIN",
    "(": "OPEN",
}
_BINARY_OPERATORS = "in, notin, =, ==, !=, gt, lt"
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_GO_INT = re.compile(r"^[+-]?[0-9]+$")


def _lex(s):
    items = []
    i, n = 0, len(s)
    while True:
        while i < n and s[i] in _WHITESPACE:
            i += 1
        if i >= n or s[i] == "\0":
            items.append(("EOS", ""))
            return items
        if s[i] in _SPECIAL:
            buf, last = "", None
            while i < n and s[i] in _SPECIAL:
                if buf + s[i] in _STRING_TO_TOKEN:
                    buf += s[i]
                    last = (_STRING_TO_TOKEN[buf], buf)
                    i += 1
                elif last is not None:
                    break
                else:  # unreachable: every special symbol is a token alone
                    buf += s[i]
                    i += 1
            items.append(last if last else ("ERROR", "error expected: keyword found '%s'" % buf))
        else:
            j = i
            while j < n and s[j] not in _SPECIAL and s[j] not in _WHITESPACE and s[j] != "\0":
                j += 1
            lit = s[i:j]
            i = j
            items.append((_STRING_TO_TOKEN.get(lit, "IDENT"), lit))


def _validate_key(key):
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            raise SelectorError('key: Invalid value: "%s": prefix part must be non-empty' % key)
        if len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
            raise SelectorError(
                'key: Invalid value: "%s": prefix part a lowercase RFC 1123 subdomain must consist of '
                "lower case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character" % key
            )
    else:
        raise SelectorError(
            'key: Invalid value: "%s": a qualified name must consist of alphanumeric characters, '
            "'-', '_' or '.', and must start and end with an alphanumeric character with an "
            "optional DNS subdomain prefix and '/'" % key
        )
    if not name:
        raise SelectorError('key: Invalid value: "%s": name part must be non-empty' % key)
    if len(name) > 63:
        raise SelectorError('key: Invalid value: "%s": name part must be no more than 63 characters' % key)
    if not _QUALIFIED_NAME.match(name):
        raise SelectorError(
            'key: Invalid value: "%s": name part must consist of alphanumeric characters, '
            "'-', '_' or '.', and must start and end with an alphanumeric character" % key
        )


class _Parser:
    def __init__(self, s):
        self.items = _lex(s)
        self.pos = 0

    def _tok(self, values, advance):
        tok, lit = self.items[min(self.pos, len(self.items) - 1)]
        if advance and self.pos < len(self.items) - 1:
            self.pos += 1
        if values and tok in ("IN", "NOTIN"):
            tok = "IDENT"
        return tok, lit

    def lookahead(self, values=True):
        return self._tok(values, False)

    def consume(self, values=True):
        return self._tok(values, True)

    def parse(self):
        reqs = []
        while True:
            tok, lit = self.lookahead()
            if tok in ("IDENT", "NOT"):
                try:
                    r = self.requirement()
                except SelectorError as e:
                    raise SelectorError("unable to parse requirement: %s" % e) from None
                reqs.append(r)
                t, l = self.consume()
                if t == "EOS":
                    return reqs
                if t == "COMMA":
                    t2, l2 = self.lookahead()
                    if t2 not in ("IDENT", "NOT"):
                        raise SelectorError("found '%s', expected: identifier after ','" % l2)
                else:
                    raise SelectorError("found '%s', expected: ',' or 'end of string'" % l)
            elif tok == "EOS":
                return reqs
            else:
                raise SelectorError("found '%s', expected: !, identifier, or 'end of string'" % lit)

    def requirement(self):
        op = None
        tok, lit = self.consume()
        if tok == "NOT":
            op = "!"
            tok, lit = self.consume()
        if tok != "IDENT":
            raise SelectorError("found '%s', expected: identifier" % lit)
        key = lit
        _validate_key(key)
        if self.lookahead()[0] in ("EOS", "COMMA") and op is None:
            op = "exists"
        if op is not None:
            return (key, op, ())
        tok, lit = self.consume(values=False)
        ops = {"IN": "in", "NOTIN": "notin", "EQ": "=", "EQEQ": "==", "NE": "!=", "GT": "gt", "LT": "lt"}
        if tok not in ops:
            raise SelectorError("found '%s', expected: %s" % (lit, _BINARY_OPERATORS))
        op = ops[tok]
        values = self.set_values() if op in ("in", "notin") else self.exact_value()
        vals = sorted(values)
        if op in ("in", "notin") and not vals:
            raise SelectorError("values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty")
        if op in ("=", "==", "!=") and len(vals) != 1:
            raise SelectorError("values: Invalid value: exact-match compatibility requires one single value")
        if op in ("gt", "lt"):
            if not _GO_INT.match(vals[0]) or not -(2**63) <= int(vals[0]) < 2**63:
                raise SelectorError(
                    "values[0]: Invalid value: \"%s\": for 'Gt', 'Lt' operators, the value must be an integer"
                    % vals[0]
                )
        for i, v in enumerate(vals):
            if len(v) > 63 or not _LABEL_VALUE.match(v):
                raise SelectorError(
                    "values[%d][%s]: Invalid value: \"%s\": a valid label must be an empty string or "
                    "consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
                    "an alphanumeric character" % (i, key, v)
                )
        return (key, op, tuple(vals))

    def exact_value(self):
        tok, _ = self.lookahead()
        if tok in ("EOS", "COMMA"):
            return {""}
        tok, lit = self.consume()
        if tok == "IDENT":
            return {lit}
        raise SelectorError("found '%s', expected: identifier" % lit)

    def set_values(self):
        tok, lit = self.consume()
        if tok != "OPEN":
            raise SelectorError("found '%s' expected: '('" % lit)
        tok, lit = self.lookahead()
        if tok in ("IDENT", "COMMA"):
            s = self.identifiers()
            tok, _ = self.consume()
            if tok != "CLOSE":
                raise SelectorError("found '%s', expected: ')'" % lit)
            return s
        if tok == "CLOSE":
            self.consume()
            return {""}
        raise SelectorError("found '%s', expected: ',', ')' or identifier" % lit)

    def identifiers(self):
        s = set()
        while True:
            tok, lit = self.consume()
            if tok == "IDENT":
                s.add(lit)
                tok2, lit2 = self.lookahead()
                if tok2 == "COMMA":
                    continue
                if tok2 == "CLOSE":
                    return s
                raise SelectorError("found '%s', expected: ',' or ')'" % lit2)
            if tok == "COMMA":
                if not s:
                    s.add("")
                tok2, _ = self.lookahead()
                if tok2 == "CLOSE":
                    s.add("")
                    return s
                if tok2 == "COMMA":
                    self.consume()
                    s.add("")
                continue
            raise SelectorError("found '%s', expected: ',', or identifier" % lit)


def parse_label_selector(s):
    """The requirements of `s`: (key, op, values) with op one of exists, !,
    =, ==, !=, in, notin, gt, lt. Raises SelectorError."""
    return _Parser(s).parse()


def _matches_one(labels, req):
    key, op, vals = req
    has = key in labels
    if op == "exists":
        return has
    if op == "!":
        return not has
    if op in ("in", "=", "=="):
        return has and labels[key] in vals
    if op in ("notin", "!="):
        return not has or labels[key] not in vals
    if not has or not _GO_INT.match(labels[key]):
        return False
    v = int(labels[key])
    if not -(2**63) <= v < 2**63:
        return False
    return v > int(vals[0]) if op == "gt" else v < int(vals[0])


def selector_matches(labels, reqs):
    return all(_matches_one(labels, r) for r in reqs)


# Field selectors (apimachinery pkg/fields), for the pod fields kube-apiserver
# supports (pkg/registry/core/pod/strategy.go ToSelectableFields, in part).
POD_FIELDS = (
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "status.phase",
    "status.podIP",
)


def _split_unescaped(s, sep):
    out, cur, i = [], "", 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            cur += s[i : i + 2]
            i += 2
            continue
        if s[i] == sep:
            out.append(cur)
            cur = ""
        else:
            cur += s[i]
        i += 1
    out.append(cur)
    return out


def _unescape_field(v):
    out, i = "", 0
    while i < len(v):
        if v[i] == "\\":
            if i + 1 >= len(v) or v[i + 1] not in "\\,=":
                raise SelectorError("invalid field selector: invalid escape sequence")
            out += v[i + 1]
            i += 2
        else:
            out += v[i]
            i += 1
    return out


def parse_field_selector(s):
    reqs = []
    if not s:
        return reqs
    for term in _split_unescaped(s, ","):
        if not term:
            continue
        for op in ("!=", "==", "="):
            idx = term.find(op)
            if idx > 0:
                key, val = term[:idx], _unescape_field(term[idx + len(op) :])
                break
        else:
            raise SelectorError("invalid selector: '%s'; can't understand '%s'" % (s, term))
        if key not in POD_FIELDS:
            raise SelectorError('field label not supported: %s' % key)
        reqs.append((key, "!=" if op == "!=" else "=", val))
    return reqs


def fields_match(fields, reqs):
    for key, op, val in reqs:
        if (fields.get(key, "") == val) != (op == "="):
            return False
    return True


# --------------------------------------------------------------------------
# Status bodies (apimachinery pkg/api/errors), built with V1Status.
# --------------------------------------------------------------------------


def status_body(code, reason, message, details=None, list_meta=None):
    st = k8s.V1Status(
        api_version="v1",
        kind="Status",
        metadata=list_meta or k8s.V1ListMeta(),
        status="Failure",
        message=message,
        reason=reason,
        details=details,
        code=code,
    )
    return serialise(st)


def unauthorized():
    return 401, status_body(401, "Unauthorized", "Unauthorized")


def forbidden(namespace, resource="pods", group=""):
    where = 'in the namespace "%s"' % namespace if namespace is not None else "at the cluster scope"
    qualified = "%s.%s" % (resource, group) if group else resource
    msg = '%s is forbidden: User "%s" cannot list resource "%s" in API group "%s" %s' % (
        qualified, SERVICE_ACCOUNT, resource, group, where)
    details = k8s.V1StatusDetails(kind=resource, group=group or None)
    return 403, status_body(403, "Forbidden", msg, details)


def bad_request(message):
    return 400, status_body(400, "BadRequest", message)


def invalid_list_options(message):
    return 422, status_body(
        422,
        "Invalid",
        'ListOptions.meta.k8s.io "" is invalid: %s' % message,
        k8s.V1StatusDetails(
            group="meta.k8s.io",
            kind="ListOptions",
            causes=[k8s.V1StatusCause(reason="FieldValueForbidden", message=message.split(": ", 2)[-1], field="resourceVersionMatch")],
        ),
    )


def not_found():
    return 404, status_body(404, "NotFound", "the server could not find the requested resource", k8s.V1StatusDetails())


def method_not_allowed():
    return 405, status_body(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", k8s.V1StatusDetails()
    )


def expired(message, new_continue=None):
    meta = k8s.V1ListMeta(_continue=new_continue) if new_continue else None
    return 410, status_body(410, "Expired", message, list_meta=meta)


def too_large_rv(requested, current):
    return 504, status_body(
        504,
        "Timeout",
        "Timeout: Too large resource version: %d, current: %d" % (requested, current),
        k8s.V1StatusDetails(
            causes=[k8s.V1StatusCause(reason="ResourceVersionTooLarge", message="Too large resource version")],
            retry_after_seconds=1,
        ),
    )


# --------------------------------------------------------------------------
# Continue tokens (apiserver pkg/storage: EncodeContinue / DecodeContinue).
# --------------------------------------------------------------------------


def encode_continue(start, rv):
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_continue(token):
    """(start, rv) of a token; raises ValueError with the server's text."""
    try:
        if "=" in token:
            raise binascii.Error("illegal base64 data")
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        c = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError) as e:
        raise ValueError("continue key is not valid: %s" % e) from None
    if not isinstance(c, dict) or c.get("v") != "meta.k8s.io/v1":
        raise ValueError("continue key is not valid: server does not recognize this encoded version")
    start, rv = c.get("start"), c.get("rv")
    if not isinstance(start, str) or not start:
        raise ValueError("continue key is not valid: encoded start key empty")
    if not isinstance(rv, int) or isinstance(rv, bool):
        raise ValueError("continue key is not valid: incorrect encoded start resourceVersion")
    if rv == 0:
        raise ValueError("0 continue resource version is not allowed when using continue")
    if ".." in start.split("/"):
        raise ValueError("continue key is not valid: path traversal")
    return start, rv


# --------------------------------------------------------------------------
# The pod set.
# --------------------------------------------------------------------------


def normalise_pod(p, i):
    if not isinstance(p, dict):
        raise ValueError("pods[%d]: not an object" % i)
    extra = set(p) - POD_KEYS
    if extra:
        raise ValueError("pods[%d]: unknown fields %s" % (i, sorted(extra)))
    name = p.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("pods[%d]: name must be a non-empty string" % i)
    out = {
        "name": name,
        "namespace": p.get("namespace", "default"),
        "labels": p.get("labels") or {},
        "annotations": p.get("annotations") or {},
        "ip": p.get("ip"),
        "port": p.get("port", 8000),
        "phase": p.get("phase", "Running"),
        "ready": p.get("ready", True),
        "terminating": p.get("terminating", False),
    }
    if not isinstance(out["namespace"], str) or not out["namespace"]:
        raise ValueError("pods[%d]: namespace must be a non-empty string" % i)
    for k in ("labels", "annotations"):
        m = out[k]
        if not isinstance(m, dict) or not all(isinstance(a, str) and isinstance(b, str) for a, b in m.items()):
            raise ValueError("pods[%d]: %s must map strings to strings" % (i, k))
    if out["ip"] is not None and (not isinstance(out["ip"], str) or not out["ip"]):
        raise ValueError("pods[%d]: ip must be a non-empty string or null" % i)
    if not isinstance(out["port"], int) or isinstance(out["port"], bool) or not 1 <= out["port"] <= 65535:
        raise ValueError("pods[%d]: port must be an integer in 1..65535" % i)
    if out["phase"] not in PHASES:
        raise ValueError("pods[%d]: phase must be one of %s" % (i, ", ".join(PHASES)))
    for k in ("ready", "terminating"):
        if not isinstance(out[k], bool):
            raise ValueError("pods[%d]: %s must be a boolean" % (i, k))
    return out


def container_state(phase, t):
    """The engine container's state in a pod of `phase`."""
    if phase == "Running":
        return k8s.V1ContainerState(running=k8s.V1ContainerStateRunning(started_at=t))
    if phase in ("Succeeded", "Failed"):
        ok = phase == "Succeeded"
        return k8s.V1ContainerState(
            terminated=k8s.V1ContainerStateTerminated(
                exit_code=0 if ok else 1, reason="Completed" if ok else "Error", started_at=t, finished_at=t
            )
        )
    if phase == "Pending":
        return k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason="ContainerCreating"))
    return k8s.V1ContainerState()


def pod_status(p, uid, t):
    """The status kube-apiserver would show for the simplified pod `p`."""
    ip, phase, ready = p["ip"], p["phase"], p["ready"]

    def cond(kind, ok, reason=None, message=None):
        return k8s.V1PodCondition(
            type=kind,
            status="True" if ok else "False",
            last_transition_time=t,
            reason=None if ok else reason,
            message=None if ok else message,
        )

    unready = "containers with unready status: [engine]"
    conditions = [
        cond("PodReadyToStartContainers", ip is not None),
        cond("Initialized", True),
        cond("Ready", ready, "ContainersNotReady", unready),
        cond("ContainersReady", ready, "ContainersNotReady", unready),
        cond("PodScheduled", True),
    ]
    started = phase not in ("Pending", "Unknown")
    container_status = k8s.V1ContainerStatus(
        name="engine",
        image=IMAGE,
        image_id=IMAGE_ID if started else "",
        container_id="containerd://" + hashlib.sha256(uid.encode()).hexdigest() if started else None,
        ready=ready,
        restart_count=0,
        started=phase == "Running",
        state=container_state(phase, t),
    )
    return k8s.V1PodStatus(
        phase=phase,
        conditions=conditions,
        host_ip=HOST_IP,
        host_ips=[k8s.V1HostIP(ip=HOST_IP)],
        pod_ip=ip,
        pod_ips=[k8s.V1PodIP(ip=ip)] if ip is not None else None,
        start_time=t,
        container_statuses=[container_status],
        qos_class="BestEffort",
    )


def pod_spec(p):
    """The spec of the simplified pod `p`, with the API server's defaults."""
    return k8s.V1PodSpec(
        containers=[
            k8s.V1Container(
                name="engine",
                image=IMAGE,
                image_pull_policy="IfNotPresent",
                ports=[k8s.V1ContainerPort(container_port=p["port"], name="http", protocol="TCP")],
                resources=k8s.V1ResourceRequirements(),
                termination_message_path="/dev/termination-log",
                termination_message_policy="File",
            )
        ],
        dns_policy="ClusterFirst",
        enable_service_links=True,
        node_name=NODE_NAME,
        preemption_policy="PreemptLowerPriority",
        priority=0,
        restart_policy="Always",
        scheduler_name="default-scheduler",
        security_context=k8s.V1PodSecurityContext(),
        service_account="default",
        service_account_name="default",
        termination_grace_period_seconds=30,
    )


def build_pod(p, uid, rv, created, deleted):
    """The Pod object kube-apiserver would show for the simplified pod `p`."""
    t = utc(created)
    meta = k8s.V1ObjectMeta(
        name=p["name"],
        namespace=p["namespace"],
        uid=uid,
        resource_version=str(rv),
        creation_timestamp=t,
        labels=dict(p["labels"]) or None,
        annotations=dict(p["annotations"]) or None,
        deletion_timestamp=utc(deleted + 30) if deleted is not None else None,
        deletion_grace_period_seconds=30 if deleted is not None else None,
    )
    pod = k8s.V1Pod(api_version="v1", kind="Pod", metadata=meta, spec=pod_spec(p), status=pod_status(p, uid, t))
    obj = serialise(pod)
    # Items of a list carry no kind/apiVersion on the wire.
    obj.pop("kind", None)
    obj.pop("apiVersion", None)
    fields = {
        "metadata.name": p["name"],
        "metadata.namespace": p["namespace"],
        "spec.nodeName": NODE_NAME,
        "spec.restartPolicy": "Always",
        "spec.schedulerName": "default-scheduler",
        "spec.serviceAccountName": "default",
        "status.phase": p["phase"],
        "status.podIP": p["ip"] or "",
    }
    return obj, fields


def with_kind(obj, rv=None):
    """A pod as a watch event carries it: kind and apiVersion first."""
    out = {"kind": "Pod", "apiVersion": "v1"}
    out.update(obj)
    if rv is not None:
        out["metadata"] = dict(out["metadata"], resourceVersion=str(rv))
    return out


def watch_event(rv, old, new, reqs, freqs):
    """The cacher's conversion (apiserver storage/cacher cacheWatcher
    convertToWatchEvent): ADDED when the pod starts to pass the selectors,
    MODIFIED while it passes, DELETED (the previous state, at the change's
    resourceVersion) when it stops passing or is deleted."""

    def passes(e):
        return e is not None and selector_matches(e.labels, reqs) and fields_match(e.fields, freqs)

    cur, prev = passes(new), passes(old)
    if cur and not prev:
        return ("ADDED", with_kind(new.obj))
    if cur and prev:
        return ("MODIFIED", with_kind(new.obj))
    if prev:
        return ("DELETED", with_kind(old.obj, rv))
    return None


def build_pool(p, i):
    """An InferencePool as the API server stores it (GIE v1.6.0's CRD:
    selector.matchLabels, targetPorts[].number, endpointPickerRef)."""
    labels, ports = p["matchLabels"], p["targetPorts"]
    if not isinstance(labels, dict) or not labels or not isinstance(ports, list) or not 1 <= len(ports) <= 8:
        raise ValueError("pools[%d]: matchLabels (non-empty) and 1 to 8 targetPorts" % i)
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": p["name"], "namespace": p.get("namespace", "default"), "generation": 1,
                     "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, p["name"])), "resourceVersion": "1"},
        "spec": {"selector": {"matchLabels": dict(labels)},
                 "targetPorts": [{"number": int(n)} for n in ports],
                 "endpointPickerRef": {"group": "", "kind": "Service", "name": p["name"] + "-epp",
                                       "port": {"number": 9002}, "failureMode": "FailClose"}},
        "status": {"parents": []},
    }


ADAPTER_KEYS = {"name", "namespace", "baseModel", "instances", "artifactURL"}
ADAPTER_API = "model.aibrix.ai/v1alpha1"


def build_adapter(a, i, rv, created):
    """A ModelAdapter as AIBrix's controller leaves it (vllm-project/aibrix
    api/model/v1alpha1/modeladapter_types.go, its CRD's schema): the pods
    it loaded the adapter on in status.instances (omitted when none), the
    phase Running once it is loaded somewhere. Custom resources keep kind
    and apiVersion in a list's items."""
    if not isinstance(a, dict) or set(a) - ADAPTER_KEYS:
        raise ValueError("adapters[%d]: an object with keys from %s" % (i, sorted(ADAPTER_KEYS)))
    name, ns = a["name"], a.get("namespace", "default")
    base, instances = a.get("baseModel"), a.get("instances", [])
    if not isinstance(name, str) or not name or not isinstance(ns, str) or not ns:
        raise ValueError("adapters[%d]: name and namespace must be non-empty strings" % i)
    if not isinstance(instances, list) or not all(isinstance(p, str) and p for p in instances):
        raise ValueError("adapters[%d]: instances must be a list of pod names" % i)
    selector = {"model.aibrix.ai/name": base} if base else {"adapter.model.aibrix.ai/enabled": "true"}
    spec = {"podSelector": {"matchLabels": selector},
            "artifactURL": a.get("artifactURL", "huggingface://example/%s" % name),
            "schedulerName": "default", "replicas": 1}
    if base is not None:
        spec["baseModel"] = base
    status = {"phase": "Running" if instances else "Pending", "candidates": len(instances), "desiredReplicas": 1}
    if instances:
        status["instances"] = list(instances)
        status["readyReplicas"] = len(instances)
    return {
        "apiVersion": ADAPTER_API,
        "kind": "ModelAdapter",
        "metadata": {"name": name, "namespace": ns, "generation": 1, "resourceVersion": str(rv),
                     "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "%s/%s" % (ns, name))),
                     "creationTimestamp": utc(created).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "spec": spec,
        "status": status,
    }


def bookmark(rv):
    return ("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}})


class Entry:
    """One pod in a snapshot: its etcd key under /pods/, labels, fields, JSON."""

    __slots__ = ("key", "namespace", "labels", "fields", "obj")

    def __init__(self, key, namespace, labels, fields, obj):
        self.key, self.namespace, self.labels, self.fields, self.obj = key, namespace, labels, fields, obj


class State:
    def __init__(self, token):
        self.token = token
        self.lock = threading.Lock()
        self.rv = FIRST_RV
        self.records = {}  # key -> dict(spec, uid, rv, created, deleted, entry)
        self.snapshots = OrderedDict([(self.rv, [])])  # rv -> [Entry] sorted by key
        self.mode = "ok"
        self.delay_ms = 5000
        self.requests = []
        # Watch history: (rv, key, old Entry or None, new Entry or None),
        # oldest first; a watch can start at compacted_rv or later.
        self.history = []
        self.compacted_rv = self.rv
        self.changed = threading.Condition(self.lock)
        self.pools = {}  # (namespace, name) -> InferencePool object
        # (namespace, name) -> ModelAdapter object; None: no such resource
        # (AIBrix's CRD not installed). Their own resourceVersions.
        self.adapters = None
        self.adapters_rv = FIRST_RV

    def set_adapters(self, adapters):
        now = time.time()
        with self.lock:
            self.adapters_rv += 1
            built = {}
            for i, a in enumerate(adapters):
                obj = build_adapter(a, i, self.adapters_rv, now)
                key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
                if key in built:
                    raise ValueError("duplicate adapter %s/%s" % key)
                built[key] = obj
            self.adapters = built
            return self.adapters_rv

    def list_adapters(self, namespace, q):
        """(code, JSON object) for a ModelAdapter LIST in `namespace` (None: all)."""
        rv_param = q.get("resourceVersion", "")
        if rv_param and not re.fullmatch(r"[0-9]+", rv_param):
            return bad_request('invalid resource version: strconv.ParseUint: parsing "%s": invalid syntax' % rv_param)
        if q.get("watch", "") in ("1", "true", "True"):
            return bad_request("this mock serves no watch of modeladapters")
        with self.lock:
            if self.adapters is None:
                return not_found()
            items = [o for k, o in sorted(self.adapters.items()) if namespace is None or k[0] == namespace]
            rv = self.adapters_rv
        return 200, {"apiVersion": ADAPTER_API, "items": items, "kind": "ModelAdapterList",
                     "metadata": {"continue": "", "resourceVersion": str(rv)}}

    def set_pods(self, pods):
        specs = [normalise_pod(p, i) for i, p in enumerate(pods)]
        now = time.time()
        with self.lock:
            keys = {}
            for s in specs:
                key = "%s/%s" % (s["namespace"], s["name"])
                if key in keys:
                    raise ValueError("duplicate pod %s" % key)
                keys[key] = s
            records = {}
            # etcd gives every write its own revision: one per changed pod.
            for key in sorted(set(keys) | set(self.records)):
                old, s = self.records.get(key), keys.get(key)
                if s is None:
                    self.rv += 1
                    self._record_event(key, old["entry"], None)
                    continue
                if old is not None and old["spec"] == s:
                    records[key] = old
                    continue
                self.rv += 1
                uid = old["uid"] if old else str(uuid.uuid4())
                created = old["created"] if old else now
                deleted = (old["deleted"] if old and old["deleted"] is not None else now) if s["terminating"] else None
                obj, fields = build_pod(s, uid, self.rv, created, deleted)
                records[key] = {
                    "spec": s,
                    "uid": uid,
                    "created": created,
                    "deleted": deleted,
                    "entry": Entry(key, s["namespace"], s["labels"], fields, obj),
                }
                self._record_event(key, old["entry"] if old else None, records[key]["entry"])
            if self.snapshots and next(reversed(self.snapshots)) == self.rv:
                self.rv += 1  # nothing changed: the list's version still grows
            self.records = records
            self.snapshots[self.rv] = [records[k]["entry"] for k in sorted(records)]
            while len(self.snapshots) > SNAPSHOTS_KEPT:
                self.snapshots.popitem(last=False)
            self.changed.notify_all()
            return self.rv

    def _record_event(self, key, old, new):
        self.history.append((self.rv, key, old, new))
        if len(self.history) > HISTORY_KEPT:
            dropped = self.history.pop(0)
            self.compacted_rv = dropped[0]

    def compact(self):
        with self.lock:
            self.history = []
            self.rv += 1
            self.compacted_rv = self.rv
            self.snapshots[self.rv] = list(self.snapshots[next(reversed(self.snapshots))])
            self.changed.notify_all()
            return self.rv

    def watch_events(self, prefix, reqs, freqs, cursor, wait_until):
        """(events, cursor, expired): the changes after `cursor` in scope as
        (type, object) pairs, waiting until `wait_until` for one; `expired`
        when `cursor` is older than the history kept."""
        with self.lock:
            while True:
                if cursor < self.compacted_rv:
                    return [], cursor, True
                out = []
                for rv, key, old, new in self.history:
                    if rv <= cursor or not key.startswith(prefix):
                        continue
                    cursor = rv
                    ev = watch_event(rv, old, new, reqs, freqs)
                    if ev is not None:
                        out.append(ev)
                cursor = max(cursor, self.rv)
                remaining = wait_until - time.time()
                if out or remaining <= 0:
                    return out, cursor, False
                self.changed.wait(remaining)

    def pod_specs(self):
        with self.lock:
            return self.rv, [self.records[k]["spec"] for k in sorted(self.records)]

    def set_mode(self, mode, delay_ms):
        with self.lock:
            self.mode = mode
            if delay_ms is not None:
                self.delay_ms = delay_ms

    def get_mode(self):
        with self.lock:
            return self.mode, self.delay_ms

    def log_request(self, entry):
        with self.lock:
            self.requests.append(entry)

    def requests_copy(self):
        with self.lock:
            return [dict(r) for r in self.requests]

    def clear_requests(self):
        with self.lock:
            n = len(self.requests)
            self.requests = []
            return n

    def snapshot(self, rv):
        with self.lock:
            if rv is None:
                return self.rv, self.snapshots[self.rv]
            entries = self.snapshots.get(rv)
            return (rv, entries) if entries is not None else (rv, None)

    def current_rv(self):
        with self.lock:
            return self.rv

    # -- LIST ------------------------------------------------------------

    def list_pods(self, namespace, q, mode):
        """(code, JSON object) for a Pod LIST in `namespace` (None: all)."""
        rv_param = q.get("resourceVersion", "")
        match = q.get("resourceVersionMatch", "")
        cont = q.get("continue", "")
        try:
            limit = int(q.get("limit", "0") or "0")
        except ValueError:
            return bad_request('strconv.ParseInt: parsing "%s": invalid syntax' % q.get("limit"))
        try:
            reqs = parse_label_selector(q.get("labelSelector", ""))
        except SelectorError as e:
            return bad_request(str(e))
        try:
            freqs = parse_field_selector(q.get("fieldSelector", ""))
        except SelectorError as e:
            return bad_request(str(e))
        if match:
            if not rv_param:
                return invalid_list_options(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
                )
            if cont:
                return invalid_list_options(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided"
                )
            if match not in ("Exact", "NotOlderThan"):
                return invalid_list_options(
                    'resourceVersionMatch: Unsupported value: "%s": supported values: "Exact", "NotOlderThan"' % match
                )
            if match == "Exact" and rv_param == "0":
                return invalid_list_options(
                    'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
                )
        requested_rv = None
        if rv_param:
            if not re.fullmatch(r"[0-9]+", rv_param):
                return bad_request('invalid resource version: strconv.ParseUint: parsing "%s": invalid syntax' % rv_param)
            requested_rv = int(rv_param)
        prefix = "%s/" % namespace if namespace is not None else ""
        # Where the answer comes from, and whether limit holds (cacher.go
        # computeListLimit: "the limit is ignored for requests that set RV == 0").
        use_limit = limit > 0 and rv_param != "0"
        start = ""
        if cont:
            if rv_param not in ("", "0"):
                return bad_request("specifying resource version is not allowed when using continue")
            try:
                start, token_rv = decode_continue(cont)
            except ValueError as e:
                return bad_request("invalid continue token: %s" % e)
            if mode == "expire_continue":
                return expired(CONTINUE_EXPIRED, encode_continue(start, -1))
            snap_rv, entries = self.snapshot(None if token_rv == -1 else token_rv)
            if entries is None:
                return expired(CONTINUE_EXPIRED, encode_continue(start, -1))
        else:
            current = self.current_rv()
            exact = match == "Exact" or (match == "" and limit > 0 and rv_param not in ("", "0"))
            if requested_rv is not None and requested_rv > current:
                return too_large_rv(requested_rv, current)
            if exact:
                snap_rv, entries = self.snapshot(requested_rv)
                if entries is None:
                    return expired("The resourceVersion for the provided list is too old.")
            else:
                snap_rv, entries = self.snapshot(None)
        scoped = [e for e in entries if e.key.startswith(prefix) and e.key[len(prefix) :] >= start]
        items, last_key, more, remaining = [], None, False, 0
        for i, e in enumerate(scoped):
            if selector_matches(e.labels, reqs) and fields_match(e.fields, freqs):
                items.append(e.obj)
                last_key = e.key
                if use_limit and len(items) >= limit:
                    # Like etcd and the cache: more items in scope, matching
                    # or not, mean a continue token (the next page may be empty).
                    more = i < len(scoped) - 1
                    remaining = len(scoped) - 1 - i
                    break
        token = encode_continue(last_key[len(prefix) :] + "\0", snap_rv) if more else None
        meta = k8s.V1ListMeta(
            resource_version=str(snap_rv),
            _continue=token,
            remaining_item_count=remaining if more and not reqs and not freqs else None,
        )
        body = serialise(k8s.V1PodList(api_version="v1", kind="PodList", metadata=meta, items=[]))
        body["items"] = items
        return 200, body


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------

NAMESPACED = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
ADAPTERS = re.compile(r"^/apis/model\.aibrix\.ai/v1alpha1/(?:namespaces/([^/]+)/)?modeladapters$")
POOL = re.compile(r"^/apis/inference\.networking\.k8s\.io/v1/namespaces/([^/]+)/inferencepools/([^/]+)$")
CLUSTER = "/api/v1/pods"


class BadRequestBody(Exception):
    pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock-kube-apiserver"

    state: State  # set on the subclass made by serve()

    # -- plumbing ----------------------------------------------------------

    def version_string(self):
        return self.server_version

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's name)
        log("%s %s" % (self.address_string(), format % args))

    def send_response(self, code, message=None):
        self._responded = True
        super().send_response(code, message)

    def _read_body(self):
        te = self.headers.get("Transfer-Encoding")
        if te is not None:
            if te.strip().lower() != "chunked":
                raise BadRequestBody("unsupported Transfer-Encoding %r" % te)
            body = b""
            while True:
                line = self.rfile.readline(1024)
                if not line.endswith(b"\n"):
                    raise BadRequestBody("bad chunk size line")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise BadRequestBody("bad chunk size line %r" % line) from None
                if size == 0:
                    while True:  # trailers, up to the empty line
                        t = self.rfile.readline(8192)
                        if t in (b"\r\n", b"\n", b""):
                            return body
                if len(body) + size > MAX_BODY:
                    raise BadRequestBody("body too large")
                chunk = self.rfile.read(size)
                if len(chunk) != size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    raise BadRequestBody("short chunk")
                body += chunk
        cl = self.headers.get("Content-Length")
        if cl is None:
            return b""
        if not cl.strip().isdigit() or int(cl) > MAX_BODY:
            raise BadRequestBody("bad Content-Length %r" % cl)
        n = int(cl)
        body = self.rfile.read(n)
        if len(body) != n:
            raise BadRequestBody("short body")
        return body

    def _send(self, code, body, content_type="application/json", headers=()):
        if isinstance(body, (dict, list)):
            body = (json.dumps(body, separators=(",", ":")) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _dispatch(self):
        self._responded = False
        try:
            try:
                body = self._read_body()
            except BadRequestBody as e:
                self.close_connection = True
                self._send(400, {"error": str(e)})
                return
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/_mock" or url.path.startswith("/_mock/"):
                self._control(url.path, body)
            else:
                self._api(url.path, url.query)
        except (BrokenPipeError, ConnectionResetError) as e:
            log("client went away during %s %s: %s" % (self.command, self.path, e))
            self.close_connection = True
        except Exception:  # noqa: BLE001: logged, answered, connection closed
            log("error in %s %s:\n%s" % (self.command, self.path, traceback.format_exc()))
            self.close_connection = True
            if not self._responded:
                try:
                    self._send(500, status_body(500, "InternalError", "mock kube api: internal error"))
                except OSError:
                    pass

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch

    # -- control API ---------------------------------------------------------

    def _control(self, path, body):
        st = self.state
        m = self.command

        def parse_json():
            try:
                return json.loads(body or b"null")
            except ValueError as e:
                raise BadRequestBody("body is not JSON: %s" % e) from None

        try:
            if path == "/_mock/pods" and m == "PUT":
                pods = parse_json()
                if not isinstance(pods, list):
                    raise BadRequestBody("expected a JSON array of pods")
                try:
                    rv = st.set_pods(pods)
                except ValueError as e:
                    raise BadRequestBody(str(e)) from None
                return self._send(200, {"resourceVersion": str(rv)})
            if path == "/_mock/pods" and m == "GET":
                rv, pods = st.pod_specs()
                return self._send(200, {"resourceVersion": str(rv), "pods": pods})
            if path == "/_mock/mode" and m == "PUT":
                req = parse_json()
                if not isinstance(req, dict) or set(req) - {"mode", "delay_ms"}:
                    raise BadRequestBody('expected {"mode": M, "delay_ms": N}')
                mode, delay = req.get("mode"), req.get("delay_ms")
                if mode not in MODES:
                    raise BadRequestBody("mode must be one of %s" % ", ".join(MODES))
                if delay is not None and (not isinstance(delay, int) or isinstance(delay, bool) or delay < 0):
                    raise BadRequestBody("delay_ms must be a non-negative integer")
                st.set_mode(mode, delay)
                mode, delay = st.get_mode()
                return self._send(200, {"mode": mode, "delay_ms": delay})
            if path == "/_mock/mode" and m == "GET":
                mode, delay = st.get_mode()
                return self._send(200, {"mode": mode, "delay_ms": delay})
            if path == "/_mock/requests" and m == "GET":
                return self._send(200, st.requests_copy())
            if path == "/_mock/requests" and m == "DELETE":
                return self._send(200, {"cleared": st.clear_requests()})
            if path == "/_mock/pools" and m == "PUT":
                pools = parse_json()
                if not isinstance(pools, list):
                    raise BadRequestBody("expected a JSON array of pools")
                try:
                    built = {(p.get("namespace", "default"), p["name"]): build_pool(p, i) for i, p in enumerate(pools)}
                except (KeyError, TypeError, ValueError) as e:
                    raise BadRequestBody("pools: %s" % e) from None
                with st.lock:
                    st.pools = built
                return self._send(200, {"pools": len(built)})
            if path == "/_mock/adapters" and m == "PUT":
                adapters = parse_json()
                if not isinstance(adapters, list):
                    raise BadRequestBody("expected a JSON array of adapters")
                try:
                    rv = st.set_adapters(adapters)
                except (KeyError, TypeError, ValueError) as e:
                    raise BadRequestBody("adapters: %s" % e) from None
                return self._send(200, {"resourceVersion": str(rv)})
            if path == "/_mock/adapters" and m == "DELETE":
                with st.lock:
                    st.adapters = None
                return self._send(200, {"adapters": None})
            if path == "/_mock/token" and m == "PUT":
                req = parse_json()
                if not isinstance(req, dict) or not isinstance(req.get("token"), str) or not req["token"]:
                    raise BadRequestBody('expected {"token": "<non-empty string>"}')
                with st.lock:
                    st.token = req["token"]
                return self._send(200, {"token": "set"})
            if path == "/_mock/compact" and m == "POST":
                return self._send(200, {"compactedResourceVersion": str(st.compact())})
        except BadRequestBody as e:
            return self._send(400, {"error": str(e)})
        if path in ("/_mock/pods", "/_mock/mode", "/_mock/requests", "/_mock/compact", "/_mock/token", "/_mock/pools",
                    "/_mock/adapters"):
            return self._send(*method_not_allowed())
        return self._send(*not_found())

    # -- Kubernetes API ------------------------------------------------------

    def _authorized(self):
        auth = self.headers.get("Authorization", "")
        parts = auth.strip().split(" ")
        # authenticator/token/bearertoken: scheme case-insensitive, one space.
        with self.state.lock:
            token = self.state.token
        return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == token and parts[1] != ""

    def _api(self, path, query):
        st = self.state
        q = {}
        for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True):
            q.setdefault(k, v)  # Go's conversion takes the first value
        authorized = self._authorized()
        entry = {
            "t": time.time(),
            "method": self.command,
            "path": path,
            "query": dict(q),
            "authorized": authorized,
            "status": None,
        }
        st.log_request(entry)
        mode, delay_ms = st.get_mode()

        if mode == "reset":
            # Read (done), then close with an RST and no answer at all.
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # detach: the fd is closed now, not when the handler's files are.
            os.close(self.connection.detach())
            return
        if mode == "slow":
            time.sleep(delay_ms / 1000.0)
        if mode == "garbage":
            return self._answer(entry, 200, GARBAGE)
        if mode == "unavailable":
            return self._answer(
                entry, 503, status_body(503, "ServiceUnavailable", "the server is currently unable to handle the request")
            )

        namespace = None
        m = NAMESPACED.match(path)
        if m:
            namespace = urllib.parse.unquote(m.group(1))
        pool = POOL.match(path)
        adapters = ADAPTERS.match(path)
        if adapters:
            namespace = urllib.parse.unquote(adapters.group(1)) if adapters.group(1) else None
        if mode == "unauthorized" or not authorized:
            code, body = unauthorized()
        elif pool and self.command == "GET" and mode not in ("forbidden", "too_many_requests"):
            key = (urllib.parse.unquote(pool.group(1)), urllib.parse.unquote(pool.group(2)))
            with st.lock:
                obj = st.pools.get(key)
            if obj is None:
                code, body = 404, status_body(
                    404, "NotFound", 'inferencepools.inference.networking.k8s.io "%s" not found' % key[1],
                    k8s.V1StatusDetails(name=key[1], group="inference.networking.k8s.io", kind="inferencepools"))
            else:
                code, body = 200, obj
        elif not m and path != CLUSTER and not adapters:
            code, body = not_found()
        elif self.command not in ("GET", "HEAD"):
            code, body = method_not_allowed()
        elif mode == "forbidden" and adapters:
            code, body = forbidden(namespace, "modeladapters", "model.aibrix.ai")
        elif mode == "forbidden":
            code, body = forbidden(namespace)
        elif mode == "too_many_requests":
            code, body = 429, status_body(
                429, "TooManyRequests", "storage is (re)initializing", k8s.V1StatusDetails(retry_after_seconds=1)
            )
            return self._answer(entry, code, body, [("Retry-After", "1")])
        elif adapters:
            code, body = st.list_adapters(namespace, q)
        elif q.get("watch", "") in ("1", "true", "True"):
            if mode == "gone":
                code, body = expired("too old resource version: %s (%d)" % (q.get("resourceVersion", ""), st.compacted_rv))
            else:
                return self._watch(entry, namespace, q, mode)
        else:
            code, body = st.list_pods(namespace, q, mode)

        if mode == "truncated":
            data = (json.dumps(body, separators=(",", ":")) + "\n").encode()
            self.close_connection = True
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            return
        return self._answer(entry, code, body)

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, kind, obj):
        self._chunk((json.dumps({"type": kind, "object": obj}, separators=(",", ":")) + "\n").encode())

    def _watch(self, entry, namespace, q, mode):
        """A watch, streamed as the API server streams it (see the module doc)."""
        st = self.state
        try:
            reqs = parse_label_selector(q.get("labelSelector", ""))
            freqs = parse_field_selector(q.get("fieldSelector", ""))
        except SelectorError as e:
            return self._answer(entry, *bad_request(str(e)))
        rv_param = q.get("resourceVersion", "")
        if rv_param and not re.fullmatch(r"[0-9]+", rv_param):
            return self._answer(
                entry, *bad_request('invalid resource version: strconv.ParseUint: parsing "%s": invalid syntax' % rv_param)
            )
        timeout = q.get("timeoutSeconds", "")
        if timeout and not re.fullmatch(r"[0-9]+", timeout):
            return self._answer(entry, *bad_request('strconv.ParseInt: parsing "%s": invalid syntax' % timeout))
        deadline = time.time() + (int(timeout) if timeout else DEFAULT_WATCH_SECONDS)
        bookmarks = q.get("allowWatchBookmarks", "") in ("1", "true", "True") and mode != "no_bookmarks"
        prefix = "%s/" % namespace if namespace is not None else ""
        # The body ends with its last chunk; the connection stays (Go's
        # net/http keeps it), but a cut watch takes it down.
        self.close_connection = mode == "truncated"
        self.send_response(200)
        for k, v in (
            ("Audit-Id", str(uuid.uuid4())),
            ("Cache-Control", "no-cache, private"),
            ("Content-Type", "application/json"),
            ("Transfer-Encoding", "chunked"),
        ):
            self.send_header(k, v)
        self.end_headers()
        self.wfile.flush()
        if rv_param in ("", "0"):
            # Legacy semantics: the current state as ADDED, then changes.
            cursor, entries = st.snapshot(None)
            for e in entries:
                if e.key.startswith(prefix) and selector_matches(e.labels, reqs) and fields_match(e.fields, freqs):
                    self._event("ADDED", with_kind(e.obj))
        else:
            cursor = int(rv_param)
        sent = 0
        while True:
            events, cursor, too_old = st.watch_events(prefix, reqs, freqs, cursor, deadline)
            if too_old:
                self._event(
                    "ERROR",
                    status_body(410, "Expired", "too old resource version: %d (%d)" % (cursor, st.compacted_rv)),
                )
                break
            for kind, obj in events:
                self._event(kind, obj)
                sent += 1
                if mode == "truncated":
                    # A watch cut: no terminating chunk, the connection goes.
                    self.wfile.flush()
                    return
            if time.time() >= deadline:
                if mode == "truncated":
                    return
                if bookmarks:
                    self._event(*bookmark(cursor))
                break
        # As in _answer: logged before the terminating chunk goes.
        entry["status"] = 200
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            entry["status"] = None
            raise

    def _answer(self, entry, code, body, headers=()):
        hs = [
            ("Audit-Id", str(uuid.uuid4())),
            ("Cache-Control", "no-cache, private"),
            ("X-Content-Type-Options", "nosniff"),
        ]
        hs.extend(headers)
        # Logged before the last byte goes: a client that has its answer
        # may read the log at once. A write that fails leaves it unanswered.
        entry["status"] = code
        try:
            self._send(code, body, headers=hs)
        except OSError:
            entry["status"] = None
            raise


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # Port 0 is the norm here; never take over a port another process holds.
    allow_reuse_address = False


def serve(listen, token):
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit("--listen must be HOST:PORT, got %r" % listen)
    handler = type("BoundHandler", (Handler,), {"state": State(token)})
    server = Server((host.strip("[]"), int(port)), handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    sys.stdout.write("READY %s\n" % json.dumps({"port": server.server_address[1]}))
    sys.stdout.flush()
    log("listening on %s:%d" % (host, server.server_address[1]))
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="HOST:PORT (port 0: the kernel picks)")
    ap.add_argument("--token", required=True, help="the bearer token API requests must carry")
    args = ap.parse_args()
    serve(args.listen, args.token)


if __name__ == "__main__":
    main()

"""Self-test of the mock Kubernetes API server, over real HTTP.

    .venv/bin/python -m unittest tests/kube/test_mock_kube_api.py

Needs PyPI kubernetes==37.0.2 (the server's models) and
kubernetes-validate==1.37.0 (the schema check) in the interpreter's env.
"""

import base64
import http.client
import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "mock_kube_api.py")
TOKEN = "s3cr3t-token"
SA = "system:serviceaccount:default:pd-router"
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}
EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token "
    "in this response to retrieve the remainder of the results. Continuing with the "
    "provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may "
    "show up in the list."
)

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def pod(name, ip="10.0.0.1", **kw):
    p = {"name": name, "ip": ip}
    p.update(kw)
    return p


def decode_token(token):
    return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))


class MockKubeApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stderr = tempfile.TemporaryFile()
        cls.proc = subprocess.Popen(
            [sys.executable, SERVER, "--listen", "127.0.0.1:0", "--token", TOKEN],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=cls.stderr,
        )
        ready, _, _ = select.select([cls.proc.stdout], [], [], 20)
        line = cls.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("READY "):
            cls.proc.kill()
            cls.stderr.seek(0)
            raise RuntimeError("no READY line (%r); stderr:\n%s" % (line, cls.stderr.read().decode()))
        cls.port = json.loads(line[len("READY ") :])["port"]

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        try:
            cls.proc.wait(5)
        except subprocess.TimeoutExpired:
            cls.proc.kill()
            cls.proc.wait()
        cls.proc.stdout.close()
        cls.stderr.seek(0)
        errors = [l for l in cls.stderr.read().decode().splitlines() if "Traceback" in l or "error in" in l]
        cls.stderr.close()
        assert not errors, "the server logged errors: %s" % errors

    def setUp(self):
        self.control("PUT", "/_mock/mode", {"mode": "ok"})
        self.put_pods([])
        self.control("DELETE", "/_mock/adapters")
        self.control("DELETE", "/_mock/requests")

    # -- helpers -------------------------------------------------------------

    def url(self, path, query=None):
        u = "http://127.0.0.1:%d%s" % (self.port, path)
        if query:
            u += "?" + (query if isinstance(query, str) else urllib.parse.urlencode(query))
        return u

    def http(self, method, path, query=None, body=None, headers=None):
        req = urllib.request.Request(self.url(path, query), data=body, method=method, headers=headers or {})
        try:
            with OPENER.open(req, timeout=10) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            with e:
                return e.code, e.headers, e.read()

    def api(self, path, query=None, token=TOKEN, headers=None):
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = "Bearer " + token
        return self.http("GET", path, query, headers=h)

    def api_json(self, path, query=None, **kw):
        code, headers, body = self.api(path, query, **kw)
        return code, json.loads(body)

    def pods(self, path="/api/v1/namespaces/default/pods", query=None):
        code, body = self.api_json(path, query)
        self.assertEqual(code, 200, body)
        self.assertEqual((body["kind"], body["apiVersion"]), ("PodList", "v1"))
        return body

    def names(self, body):
        return [i["metadata"]["name"] for i in body["items"]]

    def control(self, method, path, obj=None):
        body = json.dumps(obj).encode() if obj is not None else None
        code, _, data = self.http(method, path, body=body, headers={"Content-Type": "application/json"})
        self.assertEqual(code, 200, data)
        return json.loads(data)

    def put_pods(self, pods):
        return self.control("PUT", "/_mock/pods", pods)["resourceVersion"]

    def mode(self, mode, delay_ms=None):
        req = {"mode": mode}
        if delay_ms is not None:
            req["delay_ms"] = delay_ms
        self.control("PUT", "/_mock/mode", req)

    def requests_log(self):
        return self.control("GET", "/_mock/requests")

    def raw(self, data, timeout=5):
        """Sends raw bytes, returns (everything read until EOF, reset?)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        out, reset = b"", False
        try:
            s.sendall(data)
            while True:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    reset = True
                    break
                if not chunk:
                    break
                out += chunk
        finally:
            s.close()
        return out, reset

    def raw_get(self, path):
        return self.raw(
            (
                "GET %s HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer %s\r\n\r\n" % (path, TOKEN)
            ).encode()
        )

    # -- watch ---------------------------------------------------------------

    def watch(self, query, timeout=10):
        """(status, headers, [events]) of a watch read to its end."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(
                "GET",
                "/api/v1/namespaces/default/pods?" + urllib.parse.urlencode(query),
                headers={"Authorization": "Bearer " + TOKEN},
            )
            r = conn.getresponse()
            body = r.read()
            return r.status, r.headers, [json.loads(l) for l in body.splitlines() if l.strip()]
        finally:
            conn.close()

    def test_watch_streams_changes_as_json_lines_with_a_bookmark(self):
        rv = self.put_pods([pod("a", labels={"app": "x"}), pod("b", labels={"app": "x"})])
        # Changes while the watch is open, from another thread's PUT.
        import threading

        def change():
            time.sleep(0.3)
            self.put_pods(
                [
                    pod("a", ip="10.0.0.9", labels={"app": "x"}),  # modified
                    pod("c", labels={"app": "x"}),  # added
                    pod("d", labels={"app": "y"}),  # out of the selector: unseen
                ]  # b deleted
            )

        t = threading.Thread(target=change)
        t.start()
        code, headers, events = self.watch(
            {"watch": "1", "resourceVersion": rv, "labelSelector": "app=x", "allowWatchBookmarks": "true",
             "timeoutSeconds": "1"}
        )
        t.join()
        self.assertEqual(code, 200)
        self.assertEqual(headers["Transfer-Encoding"], "chunked")
        kinds = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
        self.assertEqual(kinds, [("MODIFIED", "a"), ("DELETED", "b"), ("ADDED", "c"), ("BOOKMARK", None)])
        for e in events:
            self.assertEqual((e["object"]["kind"], e["object"]["apiVersion"]), ("Pod", "v1"))
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        self.assertEqual(rvs, sorted(rvs), "one resourceVersion per change, in order")
        self.assertGreater(rvs[0], int(rv))
        self.assertEqual(events[0]["object"]["status"]["podIP"], "10.0.0.9")
        self.assertEqual(set(events[-1]["object"]["metadata"]), {"resourceVersion"})
        # From the bookmark: nothing new, and no bookmark without asking.
        code, _, events = self.watch({"watch": "1", "resourceVersion": rvs[-1], "timeoutSeconds": "1"})
        self.assertEqual((code, events), (200, []))

    def test_watch_selector_transitions_and_initial_events(self):
        rv = self.put_pods([pod("a", phase="Running"), pod("b", phase="Pending")])
        self.put_pods([pod("a", phase="Failed"), pod("b", phase="Running")])
        code, _, events = self.watch(
            {"watch": "true", "resourceVersion": rv, "fieldSelector": "status.phase=Running", "timeoutSeconds": "1"}
        )
        self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in events], [("DELETED", "a"), ("ADDED", "b")])
        self.assertEqual(events[0]["object"]["status"]["phase"], "Running", "the previous state")
        code, _, events = self.watch({"watch": "1", "timeoutSeconds": "1"})
        self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in events], [("ADDED", "a"), ("ADDED", "b")])

    def test_watch_too_old_gone_and_cut(self):
        rv = self.put_pods([pod("a")])
        self.put_pods([pod("a"), pod("b")])
        self.assertEqual(self.control("POST", "/_mock/compact")["compactedResourceVersion"], str(int(rv) + 2))
        code, _, events = self.watch({"watch": "1", "resourceVersion": rv, "timeoutSeconds": "5"})
        self.assertEqual(code, 200, "the error comes inside the stream")
        self.assertEqual([e["type"] for e in events], ["ERROR"])
        self.assertEqual((events[0]["object"]["code"], events[0]["object"]["reason"]), (410, "Expired"))
        self.assertIn("too old resource version", events[0]["object"]["message"])
        self.mode("gone")
        code, _, body = self.api("/api/v1/namespaces/default/pods", {"watch": "1", "resourceVersion": rv})
        self.assertEqual((code, json.loads(body)["code"]), (410, 410))
        self.assertEqual(self.api("/api/v1/namespaces/default/pods")[0], 200, "lists are fine")
        self.mode("truncated")
        cur = self.put_pods([pod("a")])
        out, _ = self.raw_get("/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1&resourceVersion=%s" % cur)
        self.assertIn(b"Transfer-Encoding: chunked", out)
        self.assertFalse(out.endswith(b"0\r\n\r\n"), "no terminating chunk")

    # -- auth ----------------------------------------------------------------

    def test_auth(self):
        for token in (None, "wrong", ""):
            code, headers, body = self.api("/api/v1/namespaces/default/pods", token=token)
            self.assertEqual(code, 401)
            self.assertEqual(json.loads(body), UNAUTHORIZED)
            self.assertEqual(headers["Content-Type"], "application/json")
        code, _, _ = self.api("/api/v1/pods", headers={"Authorization": "bearer " + TOKEN}, token=None)
        self.assertEqual(code, 200, "the scheme is case-insensitive")
        code, _, _ = self.api("/api/v1/pods", headers={"Authorization": "Basic " + TOKEN}, token=None)
        self.assertEqual(code, 401)
        code, _, _ = self.api("/api/v1/pods")
        self.assertEqual(code, 200)
        log = self.requests_log()
        self.assertEqual([r["authorized"] for r in log], [False, False, False, True, False, True])
        self.assertEqual([r["status"] for r in log], [401, 401, 401, 200, 401, 200])

    # -- selectors -----------------------------------------------------------

    def test_label_selectors(self):
        self.put_pods(
            [
                pod("p1", labels={"app": "llm", "role-name": "prefill", "tier": "1"}),
                pod("p2", labels={"app": "llm", "role-name": "decode", "tier": "5"}),
                pod("p3", labels={"app": "other", "role-name": "prefill"}),
                pod("p4"),
                pod("p5", labels={"app": "llm", "model.aibrix.ai/name": "llama"}),
            ]
        )
        cases = {
            "": ["p1", "p2", "p3", "p4", "p5"],
            "app": ["p1", "p2", "p3", "p5"],
            "!app": ["p4"],
            "app=llm": ["p1", "p2", "p5"],
            "app==llm": ["p1", "p2", "p5"],
            "app!=llm": ["p3", "p4"],
            "role-name in (prefill,decode)": ["p1", "p2", "p3"],
            "role-name in ( prefill , decode )": ["p1", "p2", "p3"],
            "role-name notin (prefill)": ["p2", "p4", "p5"],
            "app=llm,role-name in (prefill,decode)": ["p1", "p2"],
            "app=llm,!role-name": ["p5"],
            "model.aibrix.ai/name": ["p5"],
            "model.aibrix.ai/name=llama,app": ["p5"],
            " app = llm , role-name = decode ": ["p2"],
            "tier>2": ["p2"],
            "tier<2": ["p1"],
            "app=": [],
            "app in ()": [],
            "app notin (llm,other)": ["p4"],
            "in": [],
        }
        for sel, want in cases.items():
            for encode in (urllib.parse.quote_plus, urllib.parse.quote):
                with self.subTest(selector=sel, encoding=encode.__name__):
                    q = "labelSelector=" + encode(sel, safe="")
                    self.assertEqual(self.names(self.pods(query=q)), want)
        for bad in (
            "app in prefill",
            "=x",
            "app=llm,",
            "!app=x",
            "app llm",
            "tier>x",
            "app=-bad",
            "app=a=b",
            "a/b/c",
            "app in (a",
            "UPPER.Prefix/x",
        ):
            with self.subTest(bad=bad):
                code, body = self.api_json("/api/v1/namespaces/default/pods", {"labelSelector": bad})
                self.assertEqual(code, 400, body)
                self.assertEqual((body["kind"], body["reason"], body["code"]), ("Status", "BadRequest", 400))

    def test_field_selectors(self):
        self.put_pods([pod("a"), pod("b", ip=None, phase="Pending"), pod("c", namespace="other")])
        self.assertEqual(self.names(self.pods(query={"fieldSelector": "status.phase=Running"})), ["a"])
        self.assertEqual(self.names(self.pods(query={"fieldSelector": "status.phase!=Running"})), ["b"])
        self.assertEqual(self.names(self.pods(query={"fieldSelector": "metadata.name==b"})), ["b"])
        got = self.pods("/api/v1/pods", {"fieldSelector": "metadata.namespace=other"})
        self.assertEqual(self.names(got), ["c"])
        code, body = self.api_json("/api/v1/pods", {"fieldSelector": "spec.bogus=x"})
        self.assertEqual((code, body["reason"]), (400, "BadRequest"))

    # -- resourceVersion, limit, continue -----------------------------------

    def test_rv0_ignores_limit(self):
        self.put_pods([pod("p%d" % i) for i in range(5)])
        body = self.pods(query={"limit": "2", "resourceVersion": "0"})
        self.assertEqual(self.names(body), ["p0", "p1", "p2", "p3", "p4"])
        self.assertNotIn("continue", body["metadata"])
        self.assertNotIn("remainingItemCount", body["metadata"])

    def test_paging_consistent_snapshot(self):
        rv1 = self.put_pods(
            [pod(n, labels={"v": "1"}) for n in ("a", "b", "c", "d", "e")] + [pod("z", namespace="other")]
        )
        for rv_param in ({}, {"resourceVersion": ""}):
            first = self.pods(query=dict(limit="2", **rv_param))
            self.assertEqual(self.names(first), ["a", "b"])
            self.assertEqual(first["metadata"]["resourceVersion"], rv1)
            self.assertEqual(first["metadata"]["remainingItemCount"], 3)
        token = first["metadata"]["continue"]
        self.assertEqual(decode_token(token)["rv"], int(rv1))
        # The pod set changes between pages: the pages stay at rv1.
        rv2 = self.put_pods(
            [pod(n, labels={"v": "2"}) for n in ("a", "b", "bb", "d", "e")] + [pod("z", namespace="other")]
        )
        self.assertGreater(int(rv2), int(rv1))
        second = self.pods(query={"limit": "2", "continue": token})
        self.assertEqual(self.names(second), ["c", "d"])
        self.assertEqual(second["metadata"]["resourceVersion"], rv1)
        self.assertEqual([i["metadata"]["labels"]["v"] for i in second["items"]], ["1", "1"])
        third = self.pods(query={"limit": "2", "continue": second["metadata"]["continue"]})
        self.assertEqual(self.names(third), ["e"])
        self.assertNotIn("continue", third["metadata"])
        self.assertEqual(third["metadata"]["resourceVersion"], rv1)
        fresh = self.pods()
        self.assertEqual(self.names(fresh), ["a", "b", "bb", "d", "e"])
        self.assertEqual(fresh["metadata"]["resourceVersion"], rv2)
        # continue with a resourceVersion: 400, but "0" is let through, and
        # then the cache ignores limit.
        code, body = self.api_json(
            "/api/v1/namespaces/default/pods", {"limit": "2", "continue": token, "resourceVersion": rv1}
        )
        self.assertEqual((code, body["reason"]), (400, "BadRequest"), body)
        self.assertEqual(body["message"], "specifying resource version is not allowed when using continue")
        rest = self.pods(query={"limit": "1", "continue": token, "resourceVersion": "0"})
        self.assertEqual(self.names(rest), ["c", "d", "e"])
        self.assertNotIn("continue", rest["metadata"])
        code, body = self.api_json("/api/v1/namespaces/default/pods", {"limit": "2", "continue": "bm90LWpzb24"})
        self.assertEqual((code, body["reason"]), (400, "BadRequest"), body)

    def test_paging_all_namespaces_and_selector(self):
        self.put_pods(
            [
                pod("x", namespace="b-ns", labels={"app": "llm"}),
                pod("y", namespace="b", labels={"app": "llm"}),
                pod("a", namespace="b", labels={"app": "llm"}),
                pod("c", namespace="b", labels={"app": "llm"}),
                pod("q", namespace="b"),
                pod("z", namespace="b"),
            ]
        )
        seen, query, pages = [], {"limit": "2", "labelSelector": "app=llm"}, 0
        while True:
            body = self.pods("/api/v1/pods", query)
            pages += 1
            self.assertNotIn("remainingItemCount", body["metadata"], "not with a selector")
            seen += ["%s/%s" % (i["metadata"]["namespace"], i["metadata"]["name"]) for i in body["items"]]
            if "continue" not in body["metadata"]:
                break
            query = dict(query, **{"continue": body["metadata"]["continue"]})
        # etcd key order ("b-ns/x" < "b/a": '-' sorts before '/'), and a
        # trailing page that may be empty: items remained, none matched.
        self.assertEqual(seen, ["b-ns/x", "b/a", "b/c", "b/y"])
        self.assertEqual(pages, 3)
        self.assertEqual(body["items"], [])

    def test_resource_version_variants(self):
        old = self.put_pods([pod("a")])
        new = self.put_pods([pod("a"), pod("b")])
        # Legacy exact match: limit with a specific resourceVersion.
        self.assertEqual(self.names(self.pods(query={"limit": "5", "resourceVersion": old})), ["a"])
        self.assertEqual(
            self.names(self.pods(query={"resourceVersion": old, "resourceVersionMatch": "Exact"})), ["a"]
        )
        got = self.pods(query={"resourceVersion": old, "resourceVersionMatch": "NotOlderThan"})
        self.assertEqual((self.names(got), got["metadata"]["resourceVersion"]), (["a", "b"], new))
        got = self.pods(query={"resourceVersion": old})
        self.assertEqual(self.names(got), ["a", "b"])
        code, body = self.api_json("/api/v1/namespaces/default/pods", {"limit": "5", "resourceVersion": "1"})
        self.assertEqual((code, body["reason"]), (410, "Expired"))
        self.assertEqual(body["message"], "The resourceVersion for the provided list is too old.")
        code, body = self.api_json("/api/v1/namespaces/default/pods", {"resourceVersion": str(int(new) + 10)})
        self.assertEqual((code, body["reason"]), (504, "Timeout"))
        code, body = self.api_json("/api/v1/namespaces/default/pods", {"resourceVersionMatch": "NotOlderThan"})
        self.assertEqual((code, body["reason"]), (422, "Invalid"))
        code, body = self.api_json("/api/v1/namespaces/default/pods", {"resourceVersion": "abc"})
        self.assertEqual((code, body["reason"]), (400, "BadRequest"))

    def test_expire_continue(self):
        self.put_pods([pod("p%d" % i) for i in range(4)])
        first = self.pods(query={"limit": "2"})
        token = first["metadata"]["continue"]
        self.mode("expire_continue")
        self.assertEqual(self.names(self.pods(query={"limit": "2"})), ["p0", "p1"], "first pages still work")
        code, body = self.api_json("/api/v1/namespaces/default/pods", {"limit": "2", "continue": token})
        self.assertEqual(code, 410)
        fresh = body["metadata"].pop("continue")
        self.assertEqual(
            body,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": EXPIRED_MESSAGE,
                "reason": "Expired",
                "code": 410,
            },
        )
        self.assertEqual(decode_token(fresh), dict(decode_token(token), rv=-1))
        # The fresh token continues, inconsistently, at the latest version.
        self.mode("ok")
        rv = self.put_pods([pod("p%d" % i) for i in range(5)])
        rest = self.pods(query={"limit": "10", "continue": fresh})
        self.assertEqual(self.names(rest), ["p2", "p3", "p4"])
        self.assertEqual(rest["metadata"]["resourceVersion"], rv)

    # -- modes ---------------------------------------------------------------

    def test_modes(self):
        self.put_pods([pod("a")])
        ns_path, all_path = "/api/v1/namespaces/team-a/pods", "/api/v1/pods"

        self.mode("unauthorized")
        code, body = self.api_json(ns_path)
        self.assertEqual((code, body), (401, UNAUTHORIZED))

        self.mode("forbidden")
        code, body = self.api_json(ns_path)
        self.assertEqual(code, 403)
        self.assertEqual(
            body,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": 'pods is forbidden: User "%s" cannot list resource "pods" in API group "" '
                'in the namespace "team-a"' % SA,
                "reason": "Forbidden",
                "details": {"kind": "pods"},
                "code": 403,
            },
        )
        code, body = self.api_json(all_path)
        self.assertEqual(code, 403)
        self.assertTrue(body["message"].endswith('in API group "" at the cluster scope'), body["message"])
        code, body = self.api_json(ns_path, token="wrong")
        self.assertEqual(code, 401, "authentication comes before authorization")

        self.mode("unavailable")
        code, body = self.api_json(ns_path)
        self.assertEqual((code, body["kind"], body["reason"], body["code"]), (503, "Status", "ServiceUnavailable", 503))

        self.mode("garbage")
        code, headers, data = self.api(ns_path)
        self.assertEqual((code, headers["Content-Type"]), (200, "application/json"))
        with self.assertRaises(ValueError):
            json.loads(data)

        self.mode("too_many_requests")
        code, headers, data = self.api(ns_path)
        self.assertEqual((code, headers["Retry-After"]), (429, "1"))
        self.assertEqual(
            json.loads(data),
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "storage is (re)initializing",
                "reason": "TooManyRequests",
                "details": {"retryAfterSeconds": 1},
                "code": 429,
            },
        )

        self.mode("slow", delay_ms=300)
        start = time.monotonic()
        body = self.pods()
        self.assertGreaterEqual(time.monotonic() - start, 0.3)
        self.assertEqual(self.names(body), ["a"])
        self.mode("slow")
        self.assertEqual(self.control("GET", "/_mock/mode"), {"mode": "slow", "delay_ms": 300})

        self.mode("truncated")
        data, reset = self.raw_get("/api/v1/namespaces/default/pods")
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200 "), head)
        length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
        self.assertFalse(reset)
        self.assertLess(len(body), length)
        self.assertGreater(len(body), 0)

        self.mode("reset")
        data, reset = self.raw_get("/api/v1/namespaces/default/pods")
        self.assertEqual(data, b"")
        self.assertTrue(reset, "closed with an RST")
        # The control API is never affected.
        log = self.requests_log()
        self.assertEqual(
            [(r["path"], r["status"]) for r in log],
            [
                (ns_path, 401),
                (ns_path, 403),
                (all_path, 403),
                (ns_path, 401),
                (ns_path, 503),
                (ns_path, 200),
                (ns_path, 429),
                ("/api/v1/namespaces/default/pods", 200),
                ("/api/v1/namespaces/default/pods", None),
                ("/api/v1/namespaces/default/pods", None),
            ],
        )

    def test_the_mode_is_read_back_and_an_unknown_one_refused(self):
        for m in ("unauthorized", "garbage", "unavailable", "too_many_requests"):
            self.mode(m)
            self.assertEqual(self.control("GET", "/_mock/mode")["mode"], m)
        bad = self.http("PUT", "/_mock/mode", body=b'{"mode": "nope"}')
        self.assertEqual(bad[0], 400)

    # -- pod objects -----------------------------------------------------------

    def test_pod_shape(self):
        rv = self.put_pods(
            [
                pod("ready", ip="10.1.0.5", port=8100, labels={"role-name": "prefill"}, annotations={"k": "v"}),
                pod("noip", ip=None, phase="Pending", ready=False),
                pod("dying", ip="10.1.0.7", terminating=True),
                pod("unready", ip="10.1.0.8", ready=False),
            ]
        )
        body = self.pods()
        self.assertEqual(body["metadata"]["resourceVersion"], rv)
        pods = {i["metadata"]["name"]: i for i in body["items"]}
        self.assertEqual(sorted(pods), ["dying", "noip", "ready", "unready"])
        for name, p in pods.items():
            meta, spec, status = p["metadata"], p["spec"], p["status"]
            self.assertEqual(meta["namespace"], "default")
            self.assertRegex(meta["uid"], r"^[0-9a-f-]{36}$")
            self.assertIsInstance(meta["resourceVersion"], str)
            self.assertRegex(meta["creationTimestamp"], TIME)
            self.assertEqual(("deletionTimestamp" in meta), name == "dying", name)
            self.assertEqual(spec["containers"][0]["name"], "engine")
            self.assertTrue(spec["containers"][0]["image"])
            conds = {c["type"]: c["status"] for c in status["conditions"]}
            self.assertEqual(
                set(conds), {"PodScheduled", "Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers"}
            )
            for c in status["conditions"]:
                self.assertRegex(c["lastTransitionTime"], TIME)
            want_ready = "False" if name in ("noip", "unready") else "True"
            self.assertEqual((conds["Ready"], conds["ContainersReady"]), (want_ready, want_ready), name)
        r = pods["ready"]
        self.assertEqual(
            r["spec"]["containers"][0]["ports"], [{"containerPort": 8100, "name": "http", "protocol": "TCP"}]
        )
        self.assertEqual(r["metadata"]["labels"], {"role-name": "prefill"})
        self.assertEqual(r["metadata"]["annotations"], {"k": "v"})
        self.assertEqual((r["status"]["podIP"], r["status"]["podIPs"]), ("10.1.0.5", [{"ip": "10.1.0.5"}]))
        self.assertEqual(r["status"]["phase"], "Running")
        n = pods["noip"]
        self.assertNotIn("podIP", n["status"])
        self.assertNotIn("podIPs", n["status"])
        self.assertEqual(n["status"]["phase"], "Pending")
        self.assertNotIn("labels", n["metadata"])
        self.assertEqual(n["spec"]["containers"][0]["ports"][0]["containerPort"], 8000)
        d = pods["dying"]["metadata"]
        self.assertRegex(d["deletionTimestamp"], TIME)
        self.assertEqual(d["deletionGracePeriodSeconds"], 30)
        # A pod that did not change keeps its uid and resourceVersion; a
        # changed one keeps its uid and gets the new resourceVersion.
        rv2 = self.put_pods(
            [
                pod("ready", ip="10.1.0.5", port=8100, labels={"role-name": "prefill"}, annotations={"k": "v"}),
                pod("noip", ip="10.1.0.6"),
            ]
        )
        again = {i["metadata"]["name"]: i for i in self.pods()["items"]}
        self.assertEqual(sorted(again), ["noip", "ready"])
        self.assertEqual(again["ready"]["metadata"], pods["ready"]["metadata"])
        self.assertEqual(again["noip"]["metadata"]["uid"], pods["noip"]["metadata"]["uid"])
        # Its own revision (one per write, as in etcd), at most the list's.
        noip_rv = int(again["noip"]["metadata"]["resourceVersion"])
        self.assertGreater(noip_rv, int(pods["noip"]["metadata"]["resourceVersion"]))
        self.assertLessEqual(noip_rv, int(rv2))
        self.assertEqual(again["noip"]["status"]["podIP"], "10.1.0.6")
        for bad in ([{"ip": "1.2.3.4"}], [{"name": "a", "bogus": 1}], [{"name": "a", "port": "80"}], {"name": "a"}):
            code, _, _ = self.http("PUT", "/_mock/pods", body=json.dumps(bad).encode())
            self.assertEqual(code, 400, bad)

    def test_schema(self):
        try:
            from kubernetes_validate import utils
        except ImportError:  # pragma: no cover
            self.fail("pip install kubernetes-validate==1.37.0")
        self.put_pods(
            [
                pod("a", ip="10.0.0.1", labels={"app": "x"}, annotations={"a": "b"}),
                pod("b", ip=None, phase="Pending", ready=False),
                pod("c", terminating=True, phase="Failed"),
                pod("d", namespace="other", phase="Succeeded"),
                pod("e", phase="Unknown"),
            ]
        )
        for query in ({"limit": "2"}, {}):
            body = self.pods("/api/v1/pods", query)
            self.assertEqual(utils.validate(body, "1.37", strict=True), "1.37")
        broken = self.pods("/api/v1/pods")
        broken["items"][0]["status"]["podIPs"] = [{"addr": "10.0.0.1"}]
        with self.assertRaises(utils.ValidationError):
            utils.validate(broken, "1.37", strict=True)
        # Status bodies: utils.validate finds status-meta-v1.json only for
        # apiVersion "meta/v1", which that schema's own enum (["v1"]) then
        # rejects; so validate against that file directly.
        validate_status = status_validator(utils)
        self.mode("forbidden")
        validate_status(self.api_json("/api/v1/pods")[1])
        self.mode("too_many_requests")
        validate_status(self.api_json("/api/v1/pods")[1])
        self.mode("ok")
        validate_status(self.api_json("/api/v1/pods", token="x")[1])

    # -- ModelAdapters (AIBrix's CRD) ------------------------------------------

    def test_model_adapters(self):
        path = "/apis/model.aibrix.ai/v1alpha1/namespaces/default/modeladapters"
        everywhere = "/apis/model.aibrix.ai/v1alpha1/modeladapters"
        code, body = self.api_json(path)
        self.assertEqual((code, body["kind"], body["reason"]), (404, "Status", "NotFound"), "no CRD yet")
        rv = self.control("PUT", "/_mock/adapters", [
            {"name": "sql", "baseModel": "llama", "instances": ["llama-1", "llama-0"]},
            {"name": "chat", "namespace": "team-a", "baseModel": "llama"},
            {"name": "other"},
        ])["resourceVersion"]
        for query in ({}, {"resourceVersion": "0"}):
            code, body = self.api_json(path, query)
            self.assertEqual(code, 200, body)
            self.assertEqual(
                (body["apiVersion"], body["kind"], body["metadata"]),
                ("model.aibrix.ai/v1alpha1", "ModelAdapterList", {"continue": "", "resourceVersion": rv}),
            )
            self.assertEqual(self.names(body), ["other", "sql"], "in key order")
        sql = body["items"][1]
        self.assertEqual((sql["kind"], sql["apiVersion"]), ("ModelAdapter", "model.aibrix.ai/v1alpha1"))
        self.assertEqual(sql["spec"]["baseModel"], "llama")
        self.assertEqual(sql["spec"]["podSelector"], {"matchLabels": {"model.aibrix.ai/name": "llama"}})
        self.assertEqual(
            (sql["status"]["phase"], sql["status"]["instances"]), ("Running", ["llama-1", "llama-0"])
        )
        other = body["items"][0]
        self.assertNotIn("instances", other["status"], "omitempty, as AIBrix's type says")
        self.assertNotIn("baseModel", other["spec"])
        import jsonschema
        for item in body["items"]:
            jsonschema.validate(item, MODEL_ADAPTER_SCHEMA)
            self.assertTrue(TIME.match(item["metadata"]["creationTimestamp"]))
        code, body = self.api_json(everywhere)
        self.assertEqual(
            [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in body["items"]],
            [("default", "other"), ("default", "sql"), ("team-a", "chat")],
        )
        self.assertEqual(self.api_json(path, {"resourceVersion": "x"})[0], 400)
        self.assertEqual(self.api_json(path, {"watch": "1"})[0], 400)
        self.assertEqual(self.api_json(path, token="nope")[0], 401)
        self.mode("forbidden")
        code, body = self.api_json(path)
        self.assertEqual(code, 403)
        self.assertEqual(
            body["message"],
            'modeladapters.model.aibrix.ai is forbidden: User "%s" cannot list resource "modeladapters" '
            'in API group "model.aibrix.ai" in the namespace "default"' % SA,
        )
        self.assertEqual(body["details"], {"group": "model.aibrix.ai", "kind": "modeladapters"})
        self.mode("ok")
        code, _, _ = self.http("POST", path, body=b"{}", headers={"Authorization": "Bearer " + TOKEN})
        self.assertEqual(code, 405)
        for bad in ([{"name": "a", "bogus": 1}], [{"name": "a"}, {"name": "a"}], [{"name": "a", "instances": "p"}]):
            code, _, _ = self.http("PUT", "/_mock/adapters", body=json.dumps(bad).encode())
            self.assertEqual(code, 400, bad)
        self.control("DELETE", "/_mock/adapters")
        self.assertEqual(self.api_json(path)[0], 404, "the CRD removed")
        self.assertEqual(
            [(r["path"], r["status"]) for r in self.requests_log()][:2], [(path, 404), (path, 200)]
        )

    # -- HTTP/1.1 --------------------------------------------------------------

    def test_keep_alive_and_bodies(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.connect()
        sock = conn.sock
        body = json.dumps([pod("a")]).encode()
        conn.request("PUT", "/_mock/pods", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        r.read()
        conn.request("GET", "/api/v1/pods", headers={"Authorization": "Bearer " + TOKEN})
        r = conn.getresponse()
        self.assertEqual((r.status, r.getheader("Content-Type")), (200, "application/json"))
        self.assertEqual(json.loads(r.read())["items"][0]["metadata"]["name"], "a")
        conn.request("PUT", "/_mock/mode", body=b"not json")
        r = conn.getresponse()
        self.assertEqual(r.status, 400)
        r.read()
        conn.request("GET", "/api/v1/nodes", headers={"Authorization": "Bearer " + TOKEN})
        r = conn.getresponse()
        self.assertEqual((r.status, json.loads(r.read())["reason"]), (404, "NotFound"))
        conn.request("GET", "/_mock/nothing")
        r = conn.getresponse()
        self.assertEqual(r.status, 404)
        r.read()
        conn.request("POST", "/api/v1/namespaces/default/pods", body=b"{}", headers={"Authorization": "Bearer " + TOKEN})
        r = conn.getresponse()
        self.assertEqual(r.status, 405)
        r.read()
        self.assertIs(conn.sock, sock, "one connection throughout")
        conn.close()
        # A chunked body on the control API, then Connection: close.
        chunked = json.dumps([pod("b"), pod("c")]).encode()
        req = (
            b"PUT /_mock/pods HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunked), chunked)
            + b"GET /_mock/pods HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n"
        )
        data, reset = self.raw(req)
        self.assertFalse(reset)
        self.assertEqual(data.count(b"HTTP/1.1 200 "), 2, data)
        self.assertIn(b"\r\nConnection: close\r\n", data)
        self.assertEqual([p["name"] for p in self.control("GET", "/_mock/pods")["pods"]], ["b", "c"])
        # A broken body length: 400, the connection closed, the server fine.
        data, _ = self.raw(b"PUT /_mock/pods HTTP/1.1\r\nHost: k\r\nContent-Length: x\r\n\r\n")
        self.assertTrue(data.startswith(b"HTTP/1.1 400 "), data)
        self.assertEqual(self.names(self.pods()), ["b", "c"])

    def test_request_log(self):
        self.api("/api/v1/namespaces/ns1/pods", "labelSelector=app%3Dx&limit=5&limit=6&resourceVersion=")
        self.api("/api/v1/pods", token="nope")
        log = self.requests_log()
        self.assertEqual(len(log), 2)
        a, b = log
        self.assertEqual(
            {k: a[k] for k in ("method", "path", "query", "authorized", "status")},
            {
                "method": "GET",
                "path": "/api/v1/namespaces/ns1/pods",
                "query": {"labelSelector": "app=x", "limit": "5", "resourceVersion": ""},
                "authorized": True,
                "status": 200,
            },
        )
        self.assertEqual((b["path"], b["query"], b["authorized"], b["status"]), ("/api/v1/pods", {}, False, 401))
        self.assertLessEqual(a["t"], b["t"])
        self.assertLess(abs(a["t"] - time.time()), 60)
        self.control("GET", "/_mock/mode")  # control requests are not logged
        self.assertEqual(len(self.requests_log()), 2)
        self.control("DELETE", "/_mock/requests")
        self.assertEqual(self.requests_log(), [])


# The schema of AIBrix's ModelAdapter CRD (vllm-project/aibrix
# config/crd/model/model.aibrix.ai_modeladapters.yaml, openAPIV3Schema; its
# descriptions and the conditions' item schema left out).
MODEL_ADAPTER_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["artifactURL", "podSelector"],
            "additionalProperties": False,
            "properties": {
                "additionalConfig": {"type": "object", "additionalProperties": {"type": "string"}},
                "artifactURL": {"type": "string"},
                "baseModel": {"type": "string"},
                "credentialsSecretRef": {"type": "object", "properties": {"name": {"type": "string"}}},
                "podSelector": {
                    "type": "object",
                    "properties": {
                        "matchExpressions": {"type": "array"},
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                },
                "replicas": {"type": "integer", "enum": [1]},
                "schedulerName": {"type": "string"},
            },
        },
        "status": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "candidates": {"type": "integer"},
                "conditions": {"type": "array"},
                "desiredReplicas": {"type": "integer"},
                "instances": {"type": "array", "items": {"type": "string"}},
                "phase": {"type": "string"},
                "readyReplicas": {"type": "integer"},
            },
        },
    },
}


def status_validator(utils):
    """A validator for Status objects against kubernetes-validate's
    status-meta-v1.json (see test_schema)."""
    import jsonschema
    from referencing import Registry, Resource

    folder = "kubernetes-json-schema/v1.37.0-local-strict"
    schema = utils.schema_contents("%s/status-meta-v1.json" % folder, "1.37")
    defs = utils.schema_contents("%s/_definitions.json" % folder, "1.37")
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    validator = jsonschema.validators.Draft202012Validator(schema, registry=registry)
    return validator.validate


if __name__ == "__main__":
    unittest.main()

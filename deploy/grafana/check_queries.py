#!/usr/bin/env python3
"""Runs a Grafana dashboard's PromQL against a real Prometheus.

    node deploy/grafana/validate.mjs > /tmp/queries.json
    python3 deploy/grafana/check_queries.py [--require-data] [--allow-empty REGEX]... \\
        http://127.0.0.1:9090 /tmp/queries.json          # or `-` for stdin

QUERIES.json is validate.mjs's output: {"variables": [...], "queries": [...]}.

Before a query runs, every dashboard variable except the data source one
(`$pd_model`, `${pd_pod}`, `[[envoy_hcm]]`, ...) becomes `.*`, and Grafana's
built-ins become fixed values: `$__rate_interval` -> 1m, `$__interval` -> 15s,
`$__range` -> 1h (table BUILTINS).

- each panel target's `expr` runs through /api/v1/query;
- each `label_values(SELECTOR, LABEL)` variable runs through /api/v1/series
  (the last hour) and LABEL must be on the series found; `label_values(LABEL)`
  uses /api/v1/label/LABEL/values; `query_result(EXPR)` runs EXPR.

Any answer whose `status` is not `success` fails. With --require-data, a query
over pd-router series (its text contains `pd_router_`) also fails when it
returns nothing: an empty result, only NaN samples (a histogram quantile over
no observations), or a variable with no values. --allow-empty REGEX (repeatable)
exempts queries whose expr matches REGEX.

Output (stdout), one line per query: `OK`, `EMPTY` (no data, allowed) or
`FAIL` (an error, or no data under --require-data), then
`panel <id> "<title>" <refId>` or `variable <name>`, then the detail. Failures are listed again at the end.
Exit 0 if none failed, 1 if some did, 2 on usage or connection errors.
Standard library only.
"""

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

BUILTINS = {
    "__rate_interval": "1m",
    "__rate_interval_ms": "60000",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}

VAR_REF = re.compile(
    r"\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\[\[([A-Za-z0-9_]+)(?::[^\]]*)?\]\]|\$([A-Za-z0-9_]+)"
)
LABEL_VALUES_2 = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)
LABEL_VALUES_1 = re.compile(r"^\s*label_values\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)


class Unreachable(Exception):
    pass


def substitute(text, variables):
    def one(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        if name in variables:
            return ".*"
        raise ValueError(f"unknown variable ${name}")

    return VAR_REF.sub(one, text)


def api(base, path, params, timeout):
    """POSTs form params to the Prometheus HTTP API; returns its JSON answer."""
    data = urllib.parse.urlencode(params, doseq=True).encode()
    req = urllib.request.Request(
        base.rstrip("/") + path,
        data=data,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:  # 400 / 422 / 503 carry a JSON error body
        body = e.read()
        try:
            return json.loads(body)
        except ValueError:
            return {"status": "error", "error": f"HTTP {e.code}: {body[:200]!r}"}
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"{base}{path}: {e}") from e
    try:
        return json.loads(body)
    except ValueError:
        return {"status": "error", "error": f"not JSON: {body[:200]!r}"}


def error_text(ans):
    return f"{ans.get('errorType', 'error')}: {ans.get('error', json.dumps(ans)[:200])}"


def samples(result_type, result):
    if result_type == "vector":
        return [float(r["value"][1]) for r in result]
    if result_type == "matrix":
        return [float(v[1]) for r in result for v in r["values"]]
    if result_type == "scalar":
        return [float(result[1])]
    return [0.0] * len(result)  # string


def run_expr(base, expr, timeout):
    """Returns (failure or None, number of series, has a non-NaN sample)."""
    ans = api(base, "/api/v1/query", {"query": expr}, timeout)
    if ans.get("status") != "success":
        return error_text(ans), 0, False
    data = ans.get("data", {})
    result = data.get("result", [])
    rtype = data.get("resultType")
    n = len(result) if rtype in ("vector", "matrix") else 1
    real = any(not math.isnan(v) for v in samples(rtype, result))
    return None, n, real


def check_variable(base, query, timeout, window_s=3600):
    """Returns (failure or None, values found)."""
    m = LABEL_VALUES_2.match(query)
    if m:
        selector, label = m.group(1), m.group(2)
        now = time.time()
        ans = api(
            base,
            "/api/v1/series",
            {"match[]": selector, "start": f"{now - window_s:.3f}", "end": f"{now:.3f}"},
            timeout,
        )
        if ans.get("status") != "success":
            return error_text(ans), []
        series = ans.get("data", [])
        values = sorted({s[label] for s in series if label in s})
        if series and not values:
            return f"{len(series)} series match {selector} but none has label {label}", []
        return None, values
    m = LABEL_VALUES_1.match(query)
    if m:
        ans = api(base, f"/api/v1/label/{urllib.parse.quote(m.group(1))}/values", {}, timeout)
        if ans.get("status") != "success":
            return error_text(ans), []
        return None, ans.get("data", [])
    m = QUERY_RESULT.match(query)
    if m:
        err, n, _ = run_expr(base, m.group(1), timeout)
        return err, list(range(n))
    return "unsupported variable query (label_values(SELECTOR, LABEL), label_values(LABEL) or query_result(EXPR))", []


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prometheus", help="base URL, e.g. http://127.0.0.1:9090")
    ap.add_argument("queries", help="validate.mjs output (JSON), or - for stdin")
    ap.add_argument("--require-data", action="store_true", help="fail on pd-router queries that return no data")
    ap.add_argument(
        "--allow-empty",
        action="append",
        default=[],
        metavar="REGEX",
        help="with --require-data: queries matching REGEX may be empty (repeatable)",
    )
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per HTTP request (default 10)")
    args = ap.parse_args(argv)

    try:
        doc = json.load(sys.stdin if args.queries == "-" else open(args.queries, encoding="utf-8"))
        variables = {v["name"]: v for v in doc.get("variables", []) if v.get("type") != "datasource"}
        queries = doc["queries"]
        allow = [re.compile(r) for r in args.allow_empty]
    except (OSError, ValueError, KeyError, TypeError, re.error) as e:
        print(f"check_queries: bad input: {e}", file=sys.stderr)
        return 2

    def must_have_data(text):
        return args.require_data and "pd_router_" in text and not any(r.search(text) for r in allow)

    failed, empty, ok = [], [], 0

    def report(kind, what, detail):
        print(f"{kind:<5} {what}: {detail}", flush=True)

    try:
        for name, v in variables.items():
            if v.get("type") != "query" or not v.get("query"):
                continue
            what = f"variable {name}"
            try:
                q = substitute(v["query"], variables)
            except ValueError as e:
                failed.append(what)
                report("FAIL", what, e)
                continue
            err, values = check_variable(args.prometheus, q, args.timeout)
            if err:
                failed.append(what)
                report("FAIL", what, f"{q}: {err}")
            elif not values:
                empty.append(what)
                if must_have_data(q):
                    failed.append(what)
                report("FAIL" if must_have_data(q) else "EMPTY", what, f"{q}: no values")
            else:
                ok += 1
                shown = ", ".join(map(str, values[:8])) + (", ..." if len(values) > 8 else "")
                report("OK", what, f"{len(values)} values ({shown})")

        for t in queries:
            what = f'panel {t.get("panel_id")} "{t.get("panel", "")}" {t.get("refId", "")}'
            try:
                expr = substitute(t["expr"], variables)
            except ValueError as e:
                failed.append(what)
                report("FAIL", what, e)
                continue
            err, n, real = run_expr(args.prometheus, expr, args.timeout)
            if err:
                failed.append(what)
                report("FAIL", what, f"{expr}: {err}")
            elif n == 0 or not real:
                empty.append(what)
                if must_have_data(expr):
                    failed.append(what)
                report(
                    "FAIL" if must_have_data(expr) else "EMPTY",
                    what,
                    f"{expr}: " + ("empty result" if n == 0 else f"{n} series, only NaN"),
                )
            else:
                ok += 1
                report("OK", what, f"{n} series")
    except Unreachable as e:
        print(f"check_queries: Prometheus unreachable: {e}", file=sys.stderr)
        return 2

    print(f"{ok} with data, {len(empty)} without, {len(failed)} failed", flush=True)
    if failed:
        print("failed:", file=sys.stderr)
        for f in failed:
            print(f"  {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

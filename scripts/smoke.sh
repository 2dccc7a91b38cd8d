#!/usr/bin/env bash
# One split request through a deployed gateway, and the pods that served it.
#
#   scripts/smoke.sh URL [MODEL]
#
# URL: the gateway, e.g. http://localhost:8080 after
#   kubectl -n llm port-forward svc/llm-gw-istio 8080:80       (Istio)
#   kubectl -n llm port-forward svc/pd-router 8080:10000       (plain Envoy)
# MODEL: a model of plugin.json (default qwen3-8b).
#
# pd-router names the pods in the answer's headers: `prefill-target-pod` and
# `decode-target-pod` (it overwrites any an upstream sent). Exits 0 when the
# request was split across two pods, 1 otherwise, saying what to look at.
set -euo pipefail

url=${1:?usage: scripts/smoke.sh URL [MODEL]}
model=${2:-qwen3-8b}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

body=$(printf '{"model": "%s", "prompt": "pd-router smoke test: say hello", "max_tokens": 8}' "$model")
code=$(curl -sS --max-time 120 -o "$tmp/body" -D "$tmp/headers" -w '%{http_code}' \
  -H 'content-type: application/json' -d "$body" "${url%/}/v1/completions") || {
  echo "smoke: no answer from ${url} within 120 s."
  echo "  A request that hangs is the signature of a wasm filter without allow_on_headers_stop_iteration:"
  echo "  run scripts/check-deploy.py on the gateway's config_dump (docs/deploy.md, Troubleshooting)."
  exit 1
}
header() { tr -d '\r' < "$tmp/headers" | awk -v h="$1" 'tolower($1) == tolower(h) ":" { print $2 }' | tail -n1; }
prefill=$(header prefill-target-pod)
decode=$(header decode-target-pod)

echo "status:  $code"
echo "prefill: ${prefill:-(none)}"
echo "decode:  ${decode:-(none)}"
head -c 400 "$tmp/body"; echo

if [ "$code" != 200 ]; then
  echo "smoke: the gateway answered $code (the body above says why; docs/deploy.md, Troubleshooting)."
  exit 1
fi
if [ -z "$decode" ]; then
  echo "smoke: no decode-target-pod header: the answer did not pass through pd-router (is the route the EnvoyFilter's / patched one?)."
  exit 1
fi
if [ -z "$prefill" ]; then
  echo "smoke: served whole by $decode, not split (a combined pod, the model's decider, or no prefill pod ready)."
  exit 1
fi
echo "smoke: split: prefill on $prefill, decode on $decode."

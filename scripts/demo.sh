#!/usr/bin/env bash
# The demo: mock engines on the ports envoy.yaml names, Envoy with the built
# filter, and real requests through it, showing what each leg received.
# `scripts/demo.sh --serve` keeps everything running until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN=${ENVOY_BIN:-.venv/bin/envoy}
MOCK=${MOCK_ENGINE_BIN:-target/debug/mock-engine}
URL=http://127.0.0.1:10000
ADMIN=http://127.0.0.1:9901

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

bold() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
pretty() { python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin), indent=2, ensure_ascii=False))'; }

for port in 10000 9901 8100 8200 8101 8201 8102 8202 18998; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is in use on 127.0.0.1; the demo needs the ports of envoy.yaml" >&2
    exit 1
  fi
done

start_mock() {
  local name=$1; shift
  "$MOCK" --name "$name" "$@" >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q '^READY' "$work/$name.out" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "mock $name did not start:" >&2; cat "$work/$name.log" >&2; exit 1
}

bold "Starting mock engines (they enforce each engine's hand-off contract)"
start_mock vllm-prefill-0 --engine vllm --role prefill --listen 127.0.0.1:8100 --model demo/vllm
start_mock vllm-decode-0 --engine vllm --role decode --listen 127.0.0.1:8200 --model demo/vllm
start_mock sglang-prefill-0 --engine sglang --role prefill --listen 127.0.0.1:8101 --bootstrap-listen 127.0.0.1:18998 --model demo/sglang
start_mock sglang-decode-0 --engine sglang --role decode --listen 127.0.0.1:8201 --model demo/sglang
start_mock trtllm-ctx-0 --engine trtllm --role prefill --listen 127.0.0.1:8102 --model demo/trtllm
start_mock trtllm-gen-0 --engine trtllm --role decode --listen 127.0.0.1:8202 --model demo/trtllm
echo "vLLM 8100/8200, SGLang 8101/8201 (bootstrap 18998), TensorRT-LLM 8102/8202"

bold "Starting Envoy with pd-router (envoy.yaml)"
"$ENVOY_BIN" -c envoy.yaml --disable-hot-restart --concurrency 1 -l warning --log-path "$work/envoy.log" &
pids+=($!)
for _ in $(seq 200); do
  curl -fs "$ADMIN/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs "$ADMIN/ready" >/dev/null || { echo "Envoy did not start:" >&2; cat "$work/envoy.log" >&2; exit 1; }
echo "listening on $URL (admin $ADMIN)"

last_body() { curl -s "http://127.0.0.1:$1/debug/requests" | python3 -c 'import json,sys; r=json.load(sys.stdin)[-1]; print(r["body"])'; }

demo_request() {
  local title=$1 path=$2 body=$3 prefill_port=$4 decode_port=$5
  bold "$title"
  echo "client → POST $path"
  echo "$body" | pretty
  echo
  echo "response (headers and body, streamed as it arrives):"
  curl -sN -D - "$URL$path" -H 'content-type: application/json' -H 'authorization: Bearer demo' -d "$body" \
    | grep -viE '^(date|server|x-envoy-upstream-service-time):'
  echo
  echo "-- what the prefill pod received (shortened request, hand-off fields):"
  last_body "$prefill_port" | pretty
  echo "-- what the decode pod received (client's values plus the hand-off):"
  last_body "$decode_port" | pretty
}

demo_request "vLLM (NIXL): chat, streaming" /v1/chat/completions \
  '{"model":"demo/vllm","messages":[{"role":"user","content":"Explain prefill/decode disaggregation."}],"max_tokens":5,"stream":true}' 8100 8200
demo_request "SGLang (bootstrap rooms, legs run concurrently): completions" /v1/completions \
  '{"model":"demo/sglang","prompt":"The KV cache moves from prefill to decode","max_tokens":4}' 8101 8201
demo_request "TensorRT-LLM (context_only / generation_only): completions" /v1/completions \
  '{"model":"demo/trtllm","prompt":"Snowflake ids above 2^53 survive","max_tokens":4}' 8102 8202

bold "A client error: unknown model"
curl -s -w '\nHTTP %{http_code}\n' "$URL/v1/completions" -H 'content-type: application/json' -d '{"model":"nope","prompt":"x"}'

bold "pd-router stats as Prometheus scrapes them (labels from envoy.yaml's stats_tags)"
# Histograms reach the exporter at Envoy's next stats flush (5 s by default).
sleep 5
curl -s "$ADMIN/stats/prometheus" | grep -E '^pd_router_(split|unsplit|local_reply|replies|pod_selected|prefill_duration_count|first_byte_duration_count|routing_duration_(count|sum))' 

if [ "${1:-}" = "--serve" ]; then
  bold "Serving on $URL until Ctrl-C"
  wait
fi

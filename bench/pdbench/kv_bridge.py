"""Publishes the simulated pods' KV events to llm-d's endpoint picker the way
vLLM's ZMQ event publisher does (the fleet's `llmd` peer, bench/README.md).

Run by bench/pdbench/fleet.py with bench/.venv's Python:

    python -m pdbench.kv_bridge --sim http://POD --endpoint tcp://127.0.0.1:PORT \
        --model MODEL --block-size BYTES

The sims (`mock-engine sim --kv-events`) keep each pod's cache changes,
keyed as llm-d keys prompts (fleet-sim/src/sim/kv_events.rs); this process
long-polls them (`/sim/kv_events`) and sends each batch as vLLM v0.11's
`ZmqEventPublisher` does: a PUB socket connected to the picker's bound SUB
socket, three frames per message (topic `kv@<pod ip>@<model>`, an 8-byte
big-endian sequence number, and the msgpack `EventBatch` [ts, events,
data_parallel_rank]), each event a tagged array:
`["BlockStored", hashes, parent hash, token ids, block size, lora id,
medium]` or `["BlockRemoved", hashes, medium]`.

The one departure: BlockStored's token ids are sent empty (the sims have no
token ids past the keys). llm-d v0.4.0 reads only the hashes
(llm-d-kv-cache-manager `kvevents/pool.go` `digestEvents`).

It prints READY once connected (after a pause: a PUB socket drops what it
sends before the subscriber's connection is up); on stderr, every 10 s and
at the end, the batches and keys it sent.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import urllib.request

import msgpack
import zmq


def events_of(batch: dict, block_size: int) -> list:
    """One sim batch as vLLM's tagged events."""
    out = []
    if batch["stored"]:
        out.append(["BlockStored", batch["stored"], batch["parent"], [], block_size, None, None])
    if batch["removed"]:
        out.append(["BlockRemoved", batch["removed"], None])
    return out


def message(batch: dict, model: str, seq: int, block_size: int) -> list[bytes]:
    """The three frames vLLM's publisher sends for one batch."""
    payload = msgpack.packb([batch["ts"], events_of(batch, block_size), None])
    return [f"kv@{batch['pod']}@{model}".encode(), seq.to_bytes(8, "big"), payload]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", required=True, help="a sim pod's base URL (any: they share the log)")
    ap.add_argument("--endpoint", required=True, help="the picker's kvEventsConfig.zmqEndpoint")
    ap.add_argument("--model", required=True)
    ap.add_argument("--block-size", type=int, required=True,
                    help="tokens per key, as the picker's tokenProcessorConfig.blockSize")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(a.endpoint)
    time.sleep(0.5)
    print("READY", flush=True)
    after, batches, stored, removed = 0, 0, 0, 0
    last_report = time.monotonic()

    def report() -> None:
        print(f"sent {batches} batches: {stored} blocks stored, {removed} removed",
              file=sys.stderr, flush=True)

    try:
        while True:
            url = f"{a.sim}/sim/kv_events?after={after}&wait_ms=1000"
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    got = json.loads(r.read())["batches"]
            except OSError as e:
                print(f"reading {url}: {e}", file=sys.stderr, flush=True)
                time.sleep(0.5)
                continue
            for b in got:
                sock.send_multipart(message(b, a.model, b["seq"], a.block_size))
                after = b["seq"]
                batches += 1
                stored += len(b["stored"])
                removed += len(b["removed"])
            if time.monotonic() - last_report > 10:
                report()
                last_report = time.monotonic()
    finally:
        report()


if __name__ == "__main__":
    main()

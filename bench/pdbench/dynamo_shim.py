"""Makes the fleet benchmark's simulated vLLM NIXL pods look like Dynamo vLLM
workers to Dynamo's KV router (the fleet's `dynamo` peer, bench/README.md).

Run by bench/pdbench/fleet.py with bench/.venv-dynamo's Python:

    python dynamo_shim.py --model-dir DIR --prefill HOST:PORT ... --decode HOST:PORT ...

One process serves every pod of the run: one Dynamo DistributedRuntime per
pod (each its own worker instance id in file discovery), each registering a
`generate` endpoint (dynamo.prefill.generate for a prefill pod,
dynamo.backend.generate for a decode pod) and the model (worker type Prefill
or Decode). A request arrives as token ids; the shim turns them back into
the prompt's text (the char tokenizer in dynamo_model/: one token a byte, so
the sims read the same block ids from it) and forwards it to its pod over
HTTP, with vLLM NIXL's kv_transfer_params: the prefill leg `max_tokens` 1,
`do_remote_decode`, its answer's kv_transfer_params handed to the decode leg,
which streams (`stream: true`): each chunk's tokens are yielded as they
arrive, so the client's TTFT is the pod's.

KV events. The sims publish none (they are HTTP servers with a cache model,
not vLLM), so the shim publishes what vLLM's KV event publisher would: a
BlockStored event for the whole blocks of the prompt that the pod now holds
and the router has not been told of (those it computed, in the main), once
it holds them: a prefill pod when it answers, a decode pod when its first
token arrives (vLLM's decode holds the blocks it pulled over NIXL, or
computed when the hand-off failed, in its prefix cache too; Dynamo's decode
routing does not read them). Block hashes are chained (a block's hash covers
its parent's), computed once per block, linear in the prompt. Evictions
(BlockRemoved) are NOT published: the sims do not say which blocks they
evict, and at the bench's settings (a host tier of 4x the GPU's KV per pod)
they keep nearly all; /sim/pods' evicted_blocks says how many they evicted in
a run (bench/results/HISTORY.md).

Names. The frontend does not pass the client's `user` on to the worker, and
the sims record requests by it, so the shim sends each pod a name made from
the prompt (`request_key`); the bench gives the records the replayer's names
back from it (bench/pdbench/dynamo_peer.py).

Load: each pod's WorkerMetricsPublisher publishes its active blocks (the
whole-or-partial blocks of the prompts it is serving) whenever they change.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys


MODEL = "sim-model"
# The char tokenizer's ids are the bytes, 256 its end of sequence, and 257
# one output token of the sims ("x "), so the frontend's token counts are the
# sims'.
X_ID = 257
NIXL_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}


def prompt_bytes(token_ids: list[int]) -> bytes:
    """The prompt's bytes back from the char tokenizer's ids (one a byte)."""
    try:
        return bytes(token_ids)
    except ValueError:  # an id past the bytes (none in the sims' prompts)
        return bytes(t for t in token_ids if t < 256)


def request_key(prompt: bytes, block: int) -> str:
    """What the sims record as the request's `user`, from its prompt alone.

    Dynamo's frontend does not hand the client's `user` (the replayer's
    request name, r<index>) to the worker, so the shim names each request by
    its prompt's length and the trace block ids its whole blocks start with
    (`#<hex id>;`, fleet-sim/src/sim/text.rs); bench/pdbench/dynamo_peer.py
    names the replayer's requests the same way from the trace, and gives the
    sims' records their replayer's names back (equal names in arrival order)."""
    ids = []
    for i in range(len(prompt) // block):
        head = prompt[i * block:i * block + 24]
        end = head.find(b";")
        if not head.startswith(b"#") or end < 2:
            break
        ids.append(head[1:end].decode("ascii", "replace"))
    return key_of(len(prompt), ids)


def key_of(prompt_bytes: int, hex_ids: list[str]) -> str:
    """A request's name from its prompt's length and its blocks' ids (hex)."""
    h = hashlib.blake2b(f"{prompt_bytes}:{','.join(hex_ids)}".encode(), digest_size=10)
    return "k" + h.hexdigest()


def chained_hashes(data: bytes, block: int, n: int) -> list[int]:
    """The first `n` whole blocks' hashes, each covering its parent's (signed
    64-bit, as KvEventPublisher takes them)."""
    out, parent = [], b""
    for i in range(n):
        d = hashlib.blake2b(parent + data[i * block:(i + 1) * block], digest_size=8).digest()
        out.append(int.from_bytes(d, "little", signed=True))
        parent = d
    return out


class Pod:
    """One simulated pod as one Dynamo worker."""

    def __init__(self, loop, address: str, role: str, block: int, session):
        from dynamo._core import DistributedRuntime
        from dynamo.llm import KvEventPublisher, WorkerMetricsPublisher
        self.url = f"http://{address}/v1/completions"
        self.address, self.role, self.block, self.session = address, role, block, session
        self.runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
        component = "prefill" if role == "prefill" else "backend"
        self.endpoint = self.runtime.endpoint(f"dynamo.{component}.generate")
        self.kv = KvEventPublisher(self.endpoint, kv_block_size=block)
        self.metrics = WorkerMetricsPublisher()
        self.active_blocks = 0
        self.told: set[int] = set()  # block hashes published as stored

    async def register(self, model_dir: str, kv_blocks: int, batched_tokens: int) -> None:
        from dynamo.llm import (ModelInput, ModelRuntimeConfig, ModelType, WorkerType,
                                register_model)
        await self.metrics.create_endpoint(self.endpoint)
        rc = ModelRuntimeConfig()
        rc.total_kv_blocks = kv_blocks
        rc.max_num_seqs = 256
        rc.max_num_batched_tokens = batched_tokens
        rc.kv_event_publishing_enabled = True
        if self.role == "prefill":
            await register_model(ModelInput.Tokens, ModelType.Prefill, self.endpoint, model_dir,
                                 MODEL, worker_type=WorkerType.Prefill,
                                 needs=[[WorkerType.Decode]], kv_cache_block_size=self.block,
                                 runtime_config=rc)
        else:
            await register_model(ModelInput.Tokens, ModelType.Completions, self.endpoint,
                                 model_dir, MODEL, worker_type=WorkerType.Decode,
                                 needs=[[WorkerType.Prefill]], kv_cache_block_size=self.block,
                                 runtime_config=rc)

    def _load(self, delta: int) -> None:
        self.active_blocks += delta
        self.metrics.publish(0, self.active_blocks, None)

    def _stored(self, toks: list[int], data: bytes) -> None:
        """BlockStored for the whole blocks of the prompt that the router has
        not been told this pod holds, from the first such block on (its
        parent named). The pod holds every whole block of the prompt once it
        answers; which of them it computed is not what the router needs, and
        answers that finish together may come in any order, so the shim
        tracks what it told the router (it never tells it of an eviction)."""
        n = len(toks) // self.block
        if n == 0:
            return
        hashes = chained_hashes(data, self.block, n)
        first = next((i for i, h in enumerate(hashes) if h not in self.told), n)
        if first == n:
            return
        self.told.update(hashes[first:])
        self.kv.publish_stored(toks[first * self.block:n * self.block], [self.block] * (n - first),
                               hashes[first:], hashes[first - 1] if first else None)

    async def generate(self, request, context=None):
        toks = request["token_ids"]
        sc = request.get("stop_conditions") or {}
        data = prompt_bytes(toks)
        body = {"model": MODEL, "prompt": data.decode("latin-1"),
                "user": request_key(data, self.block), "max_tokens": sc.get("max_tokens") or 16}
        blocks = -(-len(toks) // self.block)
        self._load(blocks)
        try:
            if self.role == "prefill":
                async for out in self._prefill(toks, data, body):
                    yield out
            else:
                async for out in self._decode(toks, data, body, request):
                    yield out
        finally:
            self._load(-blocks)

    async def _prefill(self, toks: list[int], data: bytes, body: dict):
        body.update(max_tokens=1, stream=False, kv_transfer_params=NIXL_PREFILL)
        async with self.session.post(self.url, json=body) as r:
            out = await r.json(content_type=None)
        if r.status != 200:
            yield {"token_ids": [], "finish_reason": "error",
                   "text": json.dumps(out)[:300]}
            return
        self._stored(toks, data)
        yield {"token_ids": [X_ID], "finish_reason": None,
               "disaggregated_params": {"kv_transfer_params": out.get("kv_transfer_params")},
               "completion_usage": {"prompt_tokens": len(toks), "completion_tokens": 1,
                                    "total_tokens": len(toks) + 1}}

    async def _decode(self, toks: list[int], data: bytes, body: dict, request: dict):
        kvtp = ((request.get("prefill_result") or {}).get("disaggregated_params") or {}).get(
            "kv_transfer_params")
        if kvtp:
            body["kv_transfer_params"] = kvtp
        body["stream"] = True
        n = 0
        async with self.session.post(self.url, json=body) as r:
            if r.status != 200:
                yield {"token_ids": [], "finish_reason": "error",
                       "text": (await r.text())[:300]}
                return
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    c = json.loads(event[6:])
                    ch = (c.get("choices") or [{}])[0]
                    k = (ch.get("text") or "").count("x ")
                    if n == 0 and k:
                        self._stored(toks, data)
                    n += k
                    fin = ch.get("finish_reason")
                    if k or fin:
                        yield {"token_ids": [X_ID] * k, "finish_reason": fin and "length",
                               **({"completion_usage": {
                                   "prompt_tokens": len(toks), "completion_tokens": n,
                                   "total_tokens": len(toks) + n}} if fin else {})}


async def main() -> None:
    import aiohttp
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefill", nargs="*", default=[], help="prefill pods, HOST:PORT")
    ap.add_argument("--decode", nargs="*", default=[], help="decode pods, HOST:PORT")
    ap.add_argument("--model-dir", required=True, help="the char tokenizer's model directory")
    ap.add_argument("--block", type=int, default=2048,
                    help="Dynamo's KV block in tokens (= bytes): one sim block of 512 tokens "
                         "of 4 bytes")
    ap.add_argument("--kv-blocks", type=int, default=859,
                    help="a pod's KV room on the GPU, blocks (the sim's --kv-blocks)")
    a = ap.parse_args()
    loop = asyncio.get_running_loop()
    # No pool limit: the router, not the shim, decides how many requests a pod
    # gets at once.
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=None))
    pods = [Pod(loop, addr, "prefill", a.block, session) for addr in a.prefill]
    pods += [Pod(loop, addr, "decode", a.block, session) for addr in a.decode]
    serving = []
    for p in pods:
        # vLLM's default max_num_batched_tokens (8192 tokens) in bytes.
        await p.register(a.model_dir, a.kv_blocks, 8192 * 4)
        serving.append(asyncio.ensure_future(p.endpoint.serve_endpoint(p.generate)))
    await asyncio.sleep(0.5)
    for p in pods:
        print(f"shim {p.role} {p.address} instance {p.endpoint.connection_id()}",
              file=sys.stderr, flush=True)
    print("READY", flush=True)
    await asyncio.gather(*serving)


if __name__ == "__main__":
    import uvloop
    os.environ.setdefault("DYN_DISCOVERY_BACKEND", "file")
    uvloop.run(main())

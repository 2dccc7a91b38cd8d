"""NVIDIA Dynamo 1.6.1's KV router as a peer of the fleet benchmark
(`--configs dynamo`, bench/README.md "Dynamo").

What runs, per run, in the run's scratch directory, on 127.0.0.1 only:

- dynamo_shim.py (bench/.venv-dynamo's Python): every simulated vLLM NIXL
  pod as a Dynamo worker (prefill or decode), forwarding to the pod over
  HTTP, publishing the KV events and load the sims do not;
- `python -m dynamo.frontend --router-mode kv`: Dynamo's OpenAI frontend
  with its KV router; it tokenizes the replayer's text prompts with the char
  tokenizer in dynamo_model/ (a token a byte, so a Dynamo block of 2,048
  tokens is one sim block of 512 tokens of 4 bytes), picks a prefill worker
  and then a decode worker.

They find each other by file discovery (DYN_FILE_KV, a directory of the
run's own), the request plane TCP, the event plane ZMQ: no etcd, no NATS.
Both are started in process groups of their own and stopped with the run's
other processes, also when the run fails.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from .common import BENCH, Procs, free_port, http_get, log, read_line, wait_until
from .dynamo_shim import key_of, request_key

VENV = BENCH / ".venv-dynamo"
MODEL_DIR = Path(__file__).resolve().parent / "dynamo_model"
SHIM = Path(__file__).resolve().parent / "dynamo_shim.py"
MODEL = "sim-model"


def ensure_venv(venv: Path = VENV) -> None:
    """bench/.venv-dynamo, installed when missing: requirements-dynamo.txt,
    then ai-dynamo itself with --no-deps (its aisimulate dependency needs
    pypi.nvidia.com; see the requirements file)."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import dynamo.frontend, dynamo.llm"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return
    log(f"installing Dynamo into {venv} (bench/requirements-dynamo.txt, ~350 MB)")
    if not py.exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(pip + ["-r", str(BENCH / "requirements-dynamo.txt")], check=True)
    subprocess.run(pip + ["--no-deps", "-r", str(BENCH / "requirements-dynamo-nodeps.txt")],
                   check=True)
    subprocess.run(check, check=True)


def dynamo_env(scratch: Path) -> dict:
    """The shim's and the frontend's environment: file discovery in the run's
    directory, every listener on 127.0.0.1, the frontend's model-card cache
    (~/.cache/dynamo/mdc) and temporary files in the run's directory too."""
    home, tmp = scratch / "dynamo-home", scratch / "dynamo-tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    return {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(scratch / "dynamo-kv"),
            "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
            "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_SYSTEM_HOST": "127.0.0.1",
            "DYN_LOG": "warn", "HOME": str(home), "TMPDIR": str(tmp)}


def start_dynamo(procs: Procs, c, sim: dict, bytes_per_token: int, venv: Path = VENV) -> int:
    """The shim for the sim's pods and the frontend in front of them, once
    the frontend sees every pod's worker and the model. The frontend's port
    (its /metrics is on it too)."""
    env = dynamo_env(procs.scratch)
    block = 512 * bytes_per_token
    py = str(venv / "bin" / "python")
    shim = [py, str(SHIM), "--model-dir", str(MODEL_DIR), "--block", str(block),
            "--kv-blocks", str(sim.get("kv_blocks") or 859),
            "--prefill", *[p["address"] for p in sim["prefill"]],
            "--decode", *[p["address"] for p in sim["decode"]]]
    p = procs.start("dynamo-shim", shim, env=env, stdout=subprocess.PIPE)
    line = read_line(p, 90)
    if line != "READY":
        raise RuntimeError(f"dynamo shim did not start: {line!r}\n"
                           f"{procs.log_tail('dynamo-shim')}")
    port = free_port()
    argv = [py, "-m", "dynamo.frontend", "--router-mode", "kv", "--http-host", "127.0.0.1",
            "--http-port", str(port), "--kv-cache-block-size", str(block), *c.peer_args]
    fe = procs.start("dynamo-frontend", argv, env=env)
    want = {"prefill": len(sim["prefill"]), "backend": len(sim["decode"])}

    def ready() -> bool:
        s, body = http_get(f"http://127.0.0.1:{port}/health", 2)
        if s != 200:
            return False
        seen: dict[str, int] = {}
        for i in json.loads(body).get("instances", []):
            seen[i.get("component")] = seen.get(i.get("component"), 0) + 1
        s, models = http_get(f"http://127.0.0.1:{port}/v1/models", 2)
        return all(seen.get(k, 0) >= n for k, n in want.items()) and s == 200 and (
            MODEL in [m.get("id") for m in json.loads(models).get("data", [])])

    try:
        wait_until("dynamo frontend", ready, 90, fe)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{procs.log_tail('dynamo-frontend')}") from None
    # The prefill worker set joins the model just after the decode one.
    time.sleep(1.0)
    return port


def give_names_back(records: list[dict], seen: list[dict], trace: list[dict],
                    bytes_per_token: int) -> list[dict]:
    """The sims' records with the replayer's request names (`user`) in place
    of the shim's (dynamo_shim.request_key): a name made from the prompt
    names the replayer's requests of that prompt; the k-th record of a role
    with it is the k-th of them to arrive."""
    block = 512 * bytes_per_token
    names: dict[str, list[str]] = {}
    for s in sorted(seen, key=lambda s: s["index"]):
        t = trace[s["index"]]
        n = t["input_length"] * bytes_per_token
        ids = [format(i, "x") for i in t["hash_ids"][:n // block]]
        names.setdefault(key_of(n, ids), []).append(s["user"])
    taken: dict[tuple[str, str], int] = {}
    out = []
    for r in sorted(records, key=lambda r: r["arrival_s"]):
        k = (r["user"], r["role"])
        users = names.get(r["user"], [])
        i = taken.get(k, 0)
        taken[k] = i + 1
        out.append(dict(r, user=users[i]) if i < len(users) else r)
    return out


__all__ = ["VENV", "ensure_venv", "start_dynamo", "give_names_back", "request_key"]

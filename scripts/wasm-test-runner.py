#!/usr/bin/env python3
"""Runs a wasm32-wasip1 test binary (cargo's target runner for
`cargo test --target wasm32-wasip1`), so the unit tests run inside the
target the filter ships as: 32-bit usize, no threads, WASI randomness.

    CARGO_TARGET_WASM32_WASIP1_RUNNER="python scripts/wasm-test-runner.py"

The lib's test binary links the proxy-wasm shell, so it imports Envoy's
host functions (`proxy_*`). No unit test may reach one: each is defined here
as a function that traps, naming itself, so a test that strays into the host
fails loudly instead of passing on a fake. WASI is wasmtime's own; the
package directory (cargo runs tests from it) is visible read-only at its own
path, for tests that read the shipped configurations.
"""

import os
import sys

import wasmtime


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: wasm-test-runner.py TEST.wasm [ARGS...]", file=sys.stderr)
        return 2
    path, args = sys.argv[1], sys.argv[2:]
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    wasi = wasmtime.WasiConfig()
    wasi.argv = [path, *args]
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.inherit_env()
    cwd = os.getcwd()
    wasi.preopen_dir(cwd, cwd, False)
    store.set_wasi(wasi)
    module = wasmtime.Module.from_file(engine, path)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    for imp in module.imports:
        if imp.module.startswith("wasi_"):
            continue
        ty = imp.type
        if not isinstance(ty, wasmtime.FuncType):
            print(f"unexpected non-function import {imp.module}.{imp.name}", file=sys.stderr)
            return 2

        def trap(*_args, _name=f"{imp.module}.{imp.name}"):
            raise wasmtime.Trap(f"unit test reached the host: {_name}")

        linker.define(store, imp.module, imp.name, wasmtime.Func(store, ty, trap))
    instance = linker.instantiate(store, module)
    start = instance.exports(store)["_start"]
    try:
        start(store)
    except wasmtime.ExitTrap as e:
        return e.code
    except wasmtime.Trap as e:
        print(f"trap: {e}", file=sys.stderr)
        return 101
    return 0


if __name__ == "__main__":
    sys.exit(main())

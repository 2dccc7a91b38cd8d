#!/usr/bin/env python3
"""Runs a wasm32-wasip1 test binary (cargo's target runner for
`cargo test --target wasm32-wasip1`), so the unit tests run inside the
target the filter ships as: 32-bit usize, no threads, WASI randomness.

    CARGO_TARGET_WASM32_WASIP1_RUNNER="python scripts/wasm-test-runner.py"

The lib's test binary links the proxy-wasm shell, so it imports Envoy's
host functions (`proxy_*`). No unit test may reach one by accident: each
traps, naming itself, so a test that strays into the host fails loudly
instead of passing on a fake. The shell's own tests (src/shell/tests.rs)
open a fake Envoy on purpose with the `pd_test` imports: between
`pd_test.begin` and `pd_test.end` the calls in FakeEnvoy answer as Envoy
would, one of them can be made to answer an error status, and the local
reply is kept for the test to read. WASI is wasmtime's own; the package
directory (cargo runs tests from it) is visible read-only at its own path,
for tests that read the shipped configurations.
"""

import os
import struct
import sys

import wasmtime


def u32s(data: bytes, at: int, n: int):
    return struct.unpack_from("<" + "I" * n, data, at)


def parse_pairs(data: bytes):
    """A header map in the ABI's layout: count, lengths, NUL-ended strings."""
    if not data:
        return []
    (n,) = u32s(data, 0, 1)
    sizes = u32s(data, 4, 2 * n)
    p, out = 4 + 8 * n, []
    for i in range(n):
        k, v = sizes[2 * i], sizes[2 * i + 1]
        out.append((data[p:p + k], data[p + k + 1:p + k + 1 + v]))
        p += k + v + 2
    return out


def serialize_pairs(pairs) -> bytes:
    out = struct.pack("<I", len(pairs))
    for k, v in pairs:
        out += struct.pack("<II", len(k), len(v))
    for k, v in pairs:
        out += k + b"\0" + v + b"\0"
    return out


class FakeEnvoy:
    """The host calls a shell test makes, answered as Envoy would."""

    def __init__(self):
        self.active = False
        self.headers = []
        self.fail = {}
        self.reply = None
        self.metrics = 0

    def mem(self, caller):
        return caller["memory"]

    def read(self, caller, ptr, size) -> bytes:
        return bytes(self.mem(caller).read(caller, ptr, ptr + size))

    def put_u32(self, caller, ptr, value):
        self.mem(caller).write(caller, struct.pack("<I", value), ptr)

    def put_u64(self, caller, ptr, value):
        self.mem(caller).write(caller, struct.pack("<Q", value), ptr)

    def give(self, caller, data: bytes, ret_data, ret_size):
        """Hands the module a buffer it owns, from its own allocator."""
        ptr = caller["proxy_on_memory_allocate"](caller, len(data))
        self.mem(caller).write(caller, data, ptr)
        self.put_u32(caller, ret_data, ptr)
        self.put_u32(caller, ret_size, len(data))

    def status(self, name):
        return self.fail.get(name, 0)

    # env.* ---------------------------------------------------------------
    def proxy_get_header_map_pairs(self, caller, _kind, ret_data, ret_size):
        self.give(caller, serialize_pairs(self.headers), ret_data, ret_size)
        return self.status("proxy_get_header_map_pairs")

    def proxy_remove_header_map_value(self, caller, _kind, key, key_size):
        if self.status("proxy_remove_header_map_value"):
            return self.status("proxy_remove_header_map_value")
        name = self.read(caller, key, key_size)
        self.headers = [(k, v) for k, v in self.headers if k != name]
        return 0

    def proxy_replace_header_map_value(self, caller, _kind, key, key_size, value, value_size):
        if self.status("proxy_replace_header_map_value"):
            return self.status("proxy_replace_header_map_value")
        name = self.read(caller, key, key_size)
        self.headers = [(k, v) for k, v in self.headers if k != name]
        self.headers.append((name, self.read(caller, value, value_size)))
        return 0

    def proxy_get_current_time_nanoseconds(self, caller, ret):
        self.put_u64(caller, ret, 1_700_000_000_000_000_000)
        return 0

    def proxy_log(self, caller, _level, _ptr, _size):
        return 0

    def proxy_get_log_level(self, caller, ret):
        self.put_u32(caller, ret, 2)
        return 0

    def proxy_define_metric(self, caller, _kind, _name, _size, ret_id):
        self.metrics += 1
        self.put_u32(caller, ret_id, self.metrics)
        return 0

    def proxy_increment_metric(self, caller, _id, _offset):
        return 0

    def proxy_record_metric(self, caller, _id, _value):
        return 0

    def proxy_set_effective_context(self, caller, context_id):
        if self.status("proxy_set_effective_context"):
            return self.status("proxy_set_effective_context")
        return 0

    def proxy_send_local_response(self, caller, status, _d, _ds, body, body_size, _h, _hs, _grpc):
        if self.status("proxy_send_local_response"):
            return self.status("proxy_send_local_response")
        self.reply = (status, self.read(caller, body, body_size))
        return 0

    # pd_test.* -----------------------------------------------------------
    def begin(self, caller, headers, size):
        self.active = True
        self.headers = parse_pairs(self.read(caller, headers, size))
        self.fail = {}
        self.reply = None

    def fail_call(self, caller, name, size, status):
        self.fail[self.read(caller, name, size).decode()] = status

    def reply_status(self, caller):
        return self.reply[0] if self.reply else 0

    def reply_body(self, caller, out, cap):
        body = self.reply[1] if self.reply else b""
        self.mem(caller).write(caller, body[:cap], out)
        return len(body)

    def end(self, caller):
        self.active = False


FAKE_ENV = {n for n in dir(FakeEnvoy) if n.startswith("proxy_")}
TEST_CONTROL = {"begin": "begin", "fail": "fail_call", "reply_status": "reply_status",
                "reply_body": "reply_body", "end": "end"}


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
    envoy = FakeEnvoy()
    for imp in module.imports:
        if imp.module.startswith("wasi_"):
            continue
        ty = imp.type
        if not isinstance(ty, wasmtime.FuncType):
            print(f"unexpected non-function import {imp.module}.{imp.name}", file=sys.stderr)
            return 2
        name = f"{imp.module}.{imp.name}"
        if imp.module == "pd_test" and imp.name in TEST_CONTROL:
            func = getattr(envoy, TEST_CONTROL[imp.name])
        else:
            fake = getattr(envoy, imp.name) if imp.module == "env" and imp.name in FAKE_ENV else None

            def func(caller, *args, _name=name, _fake=fake):
                if _fake is None or not envoy.active:
                    raise wasmtime.Trap(f"unit test reached the host: {_name}")
                return _fake(caller, *args)

        linker.define(store, imp.module, imp.name, wasmtime.Func(store, ty, func, access_caller=True))
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

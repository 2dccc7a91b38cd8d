// Runs a wasm32-wasip1 bench binary (e.g. `cargo bench --bench request
// --target wasm32-wasip1`'s target/wasm32-wasip1/release/deps/request-*.wasm)
// under Node.js's V8 instead of wasmtime: with `--no-liftoff` V8 compiles
// the module with TurboFan only, as Envoy's V8 does, so the bench's
// figures are closer to what Envoy runs. The proxy-wasm host functions the
// lib links are stubbed (the benches never call them). The bench's own
// header still says "wasmtime": it is fixed when the bench is compiled.
//
//   node --no-liftoff --no-warnings bench/v8-runner.mjs FILE.wasm
//
// Optional (not part of `just bench`: a fresh machine need not have Node.js).
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, env } from 'node:process';

const wasi = new WASI({ version: 'preview1', args: [argv[2], '--bench'], env, preopens: {} });
const module = await WebAssembly.compile(await readFile(argv[2]));
const imports = wasi.getImportObject();
imports.env = {};
for (const imp of WebAssembly.Module.imports(module)) {
  if (imp.module === 'env' && imp.kind === 'function') {
    imports.env[imp.name] = () => {
      throw new Error(`host call ${imp.name} outside Envoy`);
    };
  }
}
const instance = await WebAssembly.instantiate(module, imports);
// The module exports `_initialize` too (the proxy-wasm lib), which Node's
// WASI refuses beside `_start`: hand it only what a command needs.
wasi.start({ exports: { memory: instance.exports.memory, _start: instance.exports._start } });

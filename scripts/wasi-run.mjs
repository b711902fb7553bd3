#!/usr/bin/env node
// Runs a wasm32-wasip1 program (a cargo test binary) in Node's WASI, so that lean-quant's
// simd128 kernels are tested against the scalar references outside a browser:
//   CARGO_TARGET_WASM32_WASIP1_RUNNER="node scripts/wasi-run.mjs" \
//   RUSTFLAGS="-C target-feature=+simd128" cargo test -p lean-quant --target wasm32-wasip1
// The current directory is preopened (tests read their data files relative to it).
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import process from 'node:process';

const [file, ...args] = process.argv.slice(2);
const wasi = new WASI({
  version: 'preview1',
  args: [file, ...args],
  env: process.env,
  preopens: { '/': '/', '.': process.cwd() },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exitCode = wasi.start(instance);

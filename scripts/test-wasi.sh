#!/usr/bin/env bash
# lean-quant's tests built for wasm32-wasip1 with simd128 and run by Node's WASI
# (scripts/wasi-run.mjs): the browser builds' SIMD kernels against the scalar references, on the
# same awkward sizes as the native paths. Arguments go to `cargo test` (e.g. `-- --nocapture`).
# The kernels' speed under Node:
#   CARGO_TARGET_WASM32_WASIP1_RUNNER="node scripts/wasi-run.mjs" RUSTFLAGS="-C target-feature=+simd128" \
#   cargo run --release -p lean-quant --no-default-features --target wasm32-wasip1 --example kernel_bench -- --threads 1 --no-matmul
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings $root/scripts/wasi-run.mjs"
# Its own target dir: other RUSTFLAGS would rebuild the workspace's artifacts each time.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/wasi"
export RUSTFLAGS="-C target-feature=+simd128"
cd "$root"
cargo test --locked -p lean-quant --no-default-features --target wasm32-wasip1 "$@"

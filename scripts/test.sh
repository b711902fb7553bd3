#!/usr/bin/env bash
# Runs every test: fetches the test models (cached), then the Rust workspace's tests (unit,
# kernels vs scalar references, malformed GGUFs, tokenizer/chat vs transformers, greedy and
# teacher-forced parity with the HF fixtures on all five model files), then checks that the
# library crates build for wasm32 (+simd128).
set -euo pipefail
cd "$(dirname "$0")/.."
export LEAN_MODELS=${LEAN_MODELS:-$PWD/models}

scripts/setup.sh
scripts/fetch-test-models.sh "$LEAN_MODELS"

echo "== cargo test (workspace)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"

echo "== wasm32 (+simd128) check of the library crates"
RUSTFLAGS='-C target-feature=+simd128 --cfg getrandom_backend="wasm_js"' \
  cargo check --locked --target wasm32-unknown-unknown -p lean-gguf -p lean-quant -p lean-tokenizer -p lean --no-default-features
# One closing line over all the test binaries (cargo prints one per binary, the last often a
# doc-test run with 0 tests).
awk '/^test result:/ { p += $4; f += $6 } END { printf "rust: %d passed, %d failed\n", p, f }' "$log"

#!/usr/bin/env bash
# The conversation benchmark of BENCHMARKS.md: a 10-turn chat (about 40 new tokens a turn, 64
# generated) and each turn's time to first token, with the KV cache carried across turns and
# dropped before each: natively (lean-cli bench-chat, 1 and 2 threads) and in headless Chromium
# through lean-js (simd, threads). A benchmark, not a test: CI does not run it.
#   scripts/bench-chat.sh [MODEL_FILE_STEM] [TURNS] [GEN_TOKENS]
# Default model qwen2.5-coder-0.5b-instruct-q4_k_m (needs scripts/fetch-test-models.sh, the wasm
# builds, lean-js's build and playwright's npm install, as scripts/test-browser.sh makes them).
set -euo pipefail
cd "$(dirname "$0")/.."
export LEAN_MODELS=${LEAN_MODELS:-$PWD/models}
stem=${1:-qwen2.5-coder-0.5b-instruct-q4_k_m}
turns=${2:-10}
gen=${3:-64}
tokenizer=$(python3 -c "import json,sys; print(json.load(open('fixtures/hf/$stem.json'))['tokenizer'])")
cargo build --release --locked -p lean-cli >&2
cli=${CARGO_TARGET_DIR:-target}/release/lean-cli
for threads in 1 2; do
  for reuse in "" --no-reuse; do
    "$cli" bench-chat -m "$LEAN_MODELS/$stem.gguf" --threads "$threads" --turns "$turns" --gen-tokens "$gen" $reuse 2>/dev/null
  done
done
(cd playwright && node bench-chat.mjs "$stem" "$tokenizer" "$turns" "$gen")

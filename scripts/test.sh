#!/usr/bin/env bash
# Runs every test: fetches the test models (cached), then
#   1. the Rust workspace's tests (unit, kernels vs scalar references, malformed GGUFs,
#      tokenizer/chat vs transformers, greedy and teacher-forced parity with the HF fixtures on
#      all five model files on the CPU and on the GPU backend — lavapipe when no GPU is there),
#   1b. lean-cli serve through the official openai client (npm, rust/lean-cli/tests/openai-client),
#   2. a wasm32 (+simd128) check of the library crates,
#   3. both WebAssembly builds (scripts/build.sh) and lean-js's unit tests (vitest),
#   3b. the README's first command (scripts/demo.sh) from an empty cargo registry and npm cache,
#      serving the demo (scripts/check-demo-fresh.sh),
#   4. the browser tests (Playwright: Chromium and Firefox × simd/threads × every model).
set -euo pipefail
cd "$(dirname "$0")/.."
export LEAN_MODELS=${LEAN_MODELS:-$PWD/models}

scripts/setup.sh
scripts/fetch-test-models.sh "$LEAN_MODELS"

echo "== cargo test (workspace)"
log=$(mktemp)
trap 'rm -f "$log" "$log.js" "$log.browser" "$log.openai"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"

echo "== lean-cli serve through the official openai client (npm)"
openai_status=0
npm ci --prefix rust/lean-cli/tests/openai-client --no-audit --no-fund
LEAN_CLI=${CARGO_TARGET_DIR:-$PWD/target}/debug/lean-cli \
  node --test rust/lean-cli/tests/openai-client/openai-client.test.mjs 2>&1 | tee "$log.openai" || openai_status=$?

echo "== wasm32 (+simd128) check of the library crates"
RUSTFLAGS='-C target-feature=+simd128 --cfg getrandom_backend="wasm_js"' \
  cargo check --locked --target wasm32-unknown-unknown -p lean-gguf -p lean-quant -p lean-tokenizer -p lean --no-default-features

echo "== WebAssembly builds and lean-js (vitest)"
scripts/build.sh
npm ci --no-audit --no-fund
npm test 2>&1 | tee "$log.js"

echo "== the README's first command (scripts/demo.sh) from an empty cargo registry and npm cache"
demo_status=0
scripts/check-demo-fresh.sh || demo_status=$?

echo "== browsers (Playwright)"
browser_status=0
scripts/test-browser.sh 2>&1 | tee "$log.browser" || browser_status=$?

# One closing line over all the test binaries (cargo prints one per binary, the last often a
# doc-test run with 0 tests), then lean-js's and the browsers'.
awk '/^test result:/ { p += $4; f += $6 } END { printf "rust: %d passed, %d failed\n", p, f }' "$log"
sed 's/\x1b\[[0-9;]*m//g' "$log.js" | grep -E '^ +Tests +' | tail -1 | sed 's/^ */lean-js: /' || true
awk '/^(ℹ|#) pass / { p = $3 } /^(ℹ|#) fail / { f = $3 } END { printf "openai client: %d passed, %d failed\n", p, f }' "$log.openai"
grep -E '^browser: ' "$log.browser" | tail -1 || true
[ "$demo_status" = 0 ] || echo "check-demo-fresh: the README's first command failed (above)"
[ "$browser_status" = 0 ] || exit "$browser_status"
[ "$openai_status" = 0 ] || exit "$openai_status"
exit "$demo_status"

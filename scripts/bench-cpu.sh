#!/usr/bin/env bash
# CPU benchmark table for BENCHMARKS.md: lean-cli bench (prefill 512, decode 64, median of 3
# after a warm-up) on every test model with 1 and 2 threads. Run on a quiet machine.
#   scripts/bench-cpu.sh [MODELS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
models=${1:-${LEAN_MODELS:-$PWD/models}}
cargo build --release --locked -p lean-cli >&2
bin=${CARGO_TARGET_DIR:-target}/release/lean-cli
echo "| model | threads | prefill 512 tok/s | decode 64 tok/s | file MiB | KV MiB | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|"
for m in smollm2-135m-instruct-q4_0 smollm2-135m-instruct-q8_0 smollm2-135m-instruct-q4_1 \
         qwen2.5-coder-0.5b-instruct-q4_k_m qwen2.5-coder-0.5b-instruct-q4_0; do
  for t in 1 2; do
    out=$("$bin" bench -m "$models/$m.gguf" -t "$t" --prompt-tokens 512 --gen-tokens 64 --reps 3 --warmup 1 --json)
    python3 - "$m" "$out" <<'PY'
import json, sys
r, M = json.loads(sys.argv[2]), 1 << 20
print(f"| {sys.argv[1]} | {r['threads']} | {r['prefill_tokens_per_second']:.0f} | {r['decode_tokens_per_second']:.1f} "
      f"| {r['file_bytes'] / M:.0f} | {r['kv_cache_bytes'] / M:.0f} | {r['peak_rss_bytes'] / M:.0f} |")
PY
  done
done

#!/usr/bin/env bash
# lean vs llama.cpp on the CPU, side by side on this machine: prefill 512 tokens, and decode 64
# tokens at two depths — from an empty context (llama-bench's plain tg64) and after a 512-token
# prompt (llama-bench -d 512; lean-cli bench's own tg64 follows its prompt) — on every test model
# file at 1 and 2 threads, the two engines interleaved (lean, llama.cpp, lean, llama.cpp…) for
# ROUNDS rounds on the same files, ratios last. A benchmark, not a test: CI does not run it; run it
# on a quiet machine. BENCHMARKS.md keeps only figures measured this way.
#
# Why two depths: decode reads the KV cache as well as the weights, and after 512 positions a
# small model's cache is a third of its weights' bytes (SmolLM2-135M: 25 MiB of f32 keys and
# values against 72 MiB of Q4_0 weights; llama.cpp keeps f16). Comparing lean's tg64 after its
# 512-token prompt with llama-bench's tg64 from an empty context (as this script did before
# 2026-12-04) compared two different workloads.
#
#   scripts/bench-vs-llama-cpp.sh [MODELS_DIR]      (default $LEAN_MODELS or ./models)
#   env: ROUNDS (default 2), REPS (default 3: repetitions inside each run), THREADS ("1 2"),
#        FILES (model file stems, default all five)
#
# llama.cpp: the copy in PyPI's llama-cpp-python 0.3.36 sdist, built once by
# scripts/llama-cpp-build.sh (its ISA flags are spelled out there).
# lean: `lean-cli bench` (release), median of REPS after a warm-up. llama.cpp: `llama-bench -r REPS`
# (mean of REPS). Each cell is the median over the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
models=${1:-${LEAN_MODELS:-$PWD/models}}
rounds=${ROUNDS:-2}
reps=${REPS:-3}
threads=${THREADS:-"1 2"}
files=${FILES:-"smollm2-135m-instruct-q4_0 smollm2-135m-instruct-q8_0 smollm2-135m-instruct-q4_1 qwen2.5-coder-0.5b-instruct-q4_k_m qwen2.5-coder-0.5b-instruct-q4_0"}
py=${PYTHON:-python3}

# --- llama.cpp's llama-bench, built once ---------------------------------------------------------
bench="$(scripts/llama-cpp-build.sh llama-bench)/llama-bench"
"$bench" --help >/dev/null 2>&1 || { echo "bench-vs-llama-cpp: $bench does not run" >&2; exit 1; }
"$bench" -m "$models/smollm2-135m-instruct-q4_0.gguf" -p 8 -n 2 -r 1 >/dev/null 2>&1 ||
  { echo "bench-vs-llama-cpp: $bench fails on a model (an instruction this CPU lacks?)" >&2; exit 1; }

# --- lean ---------------------------------------------------------------------------------------
cargo build --release --locked -p lean-cli >&2
lean=${CARGO_TARGET_DIR:-target}/release/lean-cli

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq 1 "$rounds"); do
  for f in $files; do
    for t in $threads; do
      model="$models/$f.gguf"
      [ -f "$model" ] || { echo "bench-vs-llama-cpp: $model missing (scripts/fetch-test-models.sh)" >&2; exit 1; }
      echo "round $round: $f, $t thread(s)" >&2
      # lean: pp512 and tg64 at depth 512 in one run, tg64 at depth ~0 (a 1-token prompt) in another.
      field='import json,sys; r=json.load(sys.stdin); print(r[sys.argv[1]])'
      out=$("$lean" bench -m "$model" -t "$t" --prompt-tokens 512 --gen-tokens 64 --reps "$reps" --warmup 1 --json)
      pp=$(echo "$out" | "$py" -c "$field" prefill_tokens_per_second)
      tg512=$(echo "$out" | "$py" -c "$field" decode_tokens_per_second)
      out=$("$lean" bench -m "$model" -t "$t" --prompt-tokens 1 --gen-tokens 64 --reps "$reps" --warmup 1 --json)
      tg0=$(echo "$out" | "$py" -c "$field" decode_tokens_per_second)
      echo "lean $f $t $pp $tg0 $tg512" >>"$results"
      # llama.cpp: pp512 and tg64 from an empty context, then tg64 at depth 512.
      out=$("$bench" -m "$model" -t "$t" -p 512 -n 64 -r "$reps" -o json 2>/dev/null)
      out512=$("$bench" -m "$model" -t "$t" -p 0 -n 64 -d 512 -r "$reps" -o json 2>/dev/null)
      echo "llama.cpp $f $t $(echo "$out" | "$py" -c '
import json, sys
rows = json.load(sys.stdin)
pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
print(pp, tg)') $(echo "$out512" | "$py" -c '
import json, sys
print(next(r["avg_ts"] for r in json.load(sys.stdin) if r["n_gen"] > 0 and r["n_depth"] == 512))')" >>"$results"
    done
  done
done

"$py" - "$results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
cell = {}
for engine, f, t, *values in rows:
    cell.setdefault((engine, f, t), []).append([float(v) for v in values])
def med(engine, f, t, i):
    return statistics.median(v[i] for v in cell[(engine, f, t)])
print("| model | threads | lean pp512 / tg64@0 / tg64@512 | llama.cpp pp512 / tg64@0 / tg64@512 | prefill | decode @0 | decode @512 |")
print("|---|---|---|---|---|---|---|")
seen = []
for engine, f, t, *_ in rows:
    if (f, t) in seen:
        continue
    seen.append((f, t))
    lean = [med("lean", f, t, i) for i in range(3)]
    cpp = [med("llama.cpp", f, t, i) for i in range(3)]
    ratios = " | ".join(f"{a / b:.2f}×" for a, b in zip(lean, cpp))
    print(f"| {f} | {t} | {lean[0]:.0f} / {lean[1]:.1f} / {lean[2]:.1f} | {cpp[0]:.0f} / {cpp[1]:.1f} / {cpp[2]:.1f} | {ratios} |")
PY

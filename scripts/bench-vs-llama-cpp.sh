#!/usr/bin/env bash
# lean vs llama.cpp on the CPU, side by side on this machine: prefill 512 and decode 64 tokens on
# every test model file at 1 and 2 threads, the two engines interleaved (lean, llama.cpp, lean,
# llama.cpp…) for ROUNDS rounds on the same files, ratios last. A benchmark, not a test: CI does not
# run it; run it on a quiet machine. BENCHMARKS.md keeps only figures measured this way.
#
#   scripts/bench-vs-llama-cpp.sh [MODELS_DIR]      (default $LEAN_MODELS or ./models)
#   env: ROUNDS (default 2), REPS (default 3: repetitions inside each run), THREADS ("1 2"),
#        FILES (model file stems, default all five)
#
# llama.cpp: the copy in PyPI's llama-cpp-python 0.3.36 sdist, built once into
# $LEAN_CACHE/llama.cpp-0.3.36 (cmake and ninja from apt). GGML_NATIVE=ON dies with an illegal
# instruction on these VMs (the CPU reports AMX that the VM does not run), so the ISA is spelled
# out: AVX, AVX2, FMA, F16C, AVX-512 (+VBMI, VNNI, BF16) on, AVX-VNNI where /proc/cpuinfo has it;
# AMX off.
# lean: `lean-cli bench` (release), median of REPS after a warm-up. llama.cpp: `llama-bench -r REPS`
# (mean of REPS). Each cell is the median over the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
models=${1:-${LEAN_MODELS:-$PWD/models}}
cache=${LEAN_CACHE:-$HOME/.cache/lean}
rounds=${ROUNDS:-2}
reps=${REPS:-3}
threads=${THREADS:-"1 2"}
files=${FILES:-"smollm2-135m-instruct-q4_0 smollm2-135m-instruct-q8_0 smollm2-135m-instruct-q4_1 qwen2.5-coder-0.5b-instruct-q4_k_m qwen2.5-coder-0.5b-instruct-q4_0"}
py=${PYTHON:-python3}

# --- llama.cpp's llama-bench, built once ---------------------------------------------------------
version=0.3.36
src="$cache/llama.cpp-$version"
bench="$src/build/bin/llama-bench"
if [ ! -x "$bench" ]; then
  for tool in cmake:cmake ninja:ninja-build; do
    command -v "${tool%%:*}" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool##*:}"; }
  done
  mkdir -p "$cache/sdist"
  tarball=$(ls "$cache/sdist"/llama_cpp_python-$version.tar.gz 2>/dev/null || true)
  if [ -z "$tarball" ]; then
    "$py" -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$cache/sdist" "llama-cpp-python==$version" >&2
    tarball=$(ls "$cache/sdist"/llama_cpp_python-$version.tar.gz)
  fi
  # AVX-VNNI (the VEX form) only where the CPU has it: these VMs have AVX512-VNNI but not AVX-VNNI,
  # and a build with it dies with an illegal instruction.
  avx_vnni=OFF
  grep -qw avx_vnni /proc/cpuinfo && avx_vnni=ON
  [ -f "$src/CMakeLists.txt" ] || { mkdir -p "$src" && tar -xzf "$tarball" -C "$src" --strip-components=3 "llama_cpp_python-$version/vendor/llama.cpp"; }
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=ON \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
    -DGGML_AVX_VNNI=$avx_vnni -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >&2
  cmake --build "$src/build" --target llama-bench -j "$(nproc)" >&2
fi
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
      out=$("$lean" bench -m "$model" -t "$t" --prompt-tokens 512 --gen-tokens 64 --reps "$reps" --warmup 1 --json)
      echo "lean $f $t $(echo "$out" | "$py" -c 'import json,sys; r=json.load(sys.stdin); print(r["prefill_tokens_per_second"], r["decode_tokens_per_second"])')" >>"$results"
      out=$("$bench" -m "$model" -t "$t" -p 512 -n 64 -r "$reps" -o json 2>/dev/null)
      echo "llama.cpp $f $t $(echo "$out" | "$py" -c '
import json, sys
rows = json.load(sys.stdin)
pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
print(pp, tg)')" >>"$results"
    done
  done
done

"$py" - "$results" "$(uname -m)" "$(nproc)" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
cell = {}
for engine, f, t, pp, tg in rows:
    cell.setdefault((engine, f, t), []).append((float(pp), float(tg)))
def med(engine, f, t, i):
    return statistics.median(v[i] for v in cell[(engine, f, t)])
print("| model | threads | lean pp512 / tg64 | llama.cpp pp512 / tg64 | prefill | decode |")
print("|---|---|---|---|---|---|")
seen = []
for engine, f, t, *_ in rows:
    if (f, t) in seen:
        continue
    seen.append((f, t))
    lp, lt = med("lean", f, t, 0), med("lean", f, t, 1)
    cp, ct = med("llama.cpp", f, t, 0), med("llama.cpp", f, t, 1)
    print(f"| {f} | {t} | {lp:.0f} / {lt:.1f} | {cp:.0f} / {ct:.1f} | {lp / cp:.2f}× | {lt / ct:.2f}× |")
PY

#!/usr/bin/env bash
# Speculative decoding on a lent GPU machine (the `run` tool's NVIDIA H200) with real test models,
# which do not fit one upload (64 MiB): they travel in parts over several calls, kept outside the
# tree there (/tmp survives between calls while the machine stays warm, 30 s).
#
#   scripts/device-spec.sh prepare [MODEL...]   here: release lean-cli, gpu_bench and lean-gpu's
#                                 test binaries into .devspec/bin, the Vulkan loader .debs into .gl (as
#                                 device-gpu.sh), the models cut into .devspec/part-NN (≤ 55 MiB)
#   scripts/device-spec.sh stash  there, once per part (carry [".devspec/part-NN"]; the first call
#                                 also carries .devspec/bin and .gl): copies what came to /tmp/spec
#   scripts/device-spec.sh run    there, after the last part: joins the models, then lean-gpu's
#                                 parity tests of those models with LEAN_GPU_PARITY=full (speculative
#                                 verification included) and `lean-cli bench-spec` on the GPU and
#                                 on the CPU's 16 cores; JSON into $OUT
#   scripts/device-spec.sh run-constrained   there, instead of `run`: decode with and without a
#                                 JSON-schema constraint (issue 24's order_items schema),
#                                 interleaved, 5 reps each, GPU and CPU; JSON lines into $OUT
#   scripts/device-spec.sh exec CMD...   there, instead of `run`: CMD after the set-up (models
#                                 joined into $LEAN_MODELS, the Vulkan loader installed; the
#                                 binaries in /tmp/spec/bin), for one-off measurements
#   scripts/device-spec.sh run-verify   there, instead of `run`: the GPU's verification passes
#                                 (VERIFY_PASSES: shaped, shaped-all, baseline, baseline-all, matmul = the
#                                 prefill-shaped LEAN_GPU_VERIFY_MATMUL=1) in `bench-spec`, and
#                                 plain decode of this build against LEAN_CLI_BASELINE's lean-cli
#                                 (prepare copies it to .devspec/bin/lean-cli-baseline), 3 rounds
#                                 interleaved, and lookup guessing every step with both builds;
#                                 lean-gpu's kernel and verification-pass tests first; a
#                                 LEAN_GPU_PROFILE run of each model into $OUT/profile-MODEL.txt
#   scripts/device-spec.sh run-llama   there, instead of `run`: lean against llama.cpp (its Vulkan
#                                 build, brought by `LLAMA_VULKAN_BIN=DIR prepare`) on the GPU:
#                                 scripts/bench-spec-vs-llama-cpp.sh with BACKEND=gpu (prompt
#                                 lookup on the four tasks, 16 threads, 2 rounds x 3 reps; table
#                                 into $OUT/spec-vs-llama-cpp.md, rows into .json), then plain
#                                 prefill 512 + decode 128, `llama-bench -ngl 99` against
#                                 `lean-cli bench --backend gpu`, per model ($OUT/decode-*.json)
#   scripts/device-spec.sh run-inflated   there, instead of `run`: speculative decoding at a 3B
#                                 model's cost per step. `lean-cli inflate` grows INFLATE_SOURCE
#                                 (qwen2.5-coder-0.5b-instruct-q4_0.gguf) to INFLATE_SHAPE
#                                 (qwen2.5-3b): the same function, added weights zero. Then plain
#                                 decode of it beside `bench --synthetic` of that shape, and
#                                 `bench-spec --backend gpu` (lookup; 128 and 512 tokens, ROUNDS=2;
#                                 the source as a draft model once, an upper bound; the same with
#                                 LEAN_CLI_BASELINE's lean-cli, interleaved, where it came), and with
#                                 WITH_LLAMA=1 and llama.cpp's binaries, bench-spec-vs-llama-cpp.sh
#                                 on it (with all the rest, more than one call's 10 minutes)
#
# prepare with LLAMA_VULKAN_BIN=DIR (e.g. the output of LLAMA_VULKAN=1 scripts/llama-cpp-build.sh
# llama-bench llama-lookup) also brings llama.cpp's llama-bench and llama-lookup, stripped, in one
# tar.xz cut into pieces like the models (.devspec/llama-vulkan.tar.xz.NN); setup_there unpacks
# them into /tmp/spec/llama.
#
# .devspec/ is git-ignored through .git/info/exclude and travels only as `carry`.
set -uo pipefail
cd "$(dirname "$0")/.."
stash=/tmp/spec

prepare() {
    set -e
    local exclude models target
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.devspec/' "$exclude" 2>/dev/null || echo /.devspec/ >>"$exclude"
    target=${CARGO_TARGET_DIR:-$HOME/.cache/lean/target-gpu}
    models=${LEAN_MODELS:-$HOME/.cache/lean/models}
    CARGO_TARGET_DIR=$target nice -n 19 cargo test --release -p lean-gpu --no-run
    CARGO_TARGET_DIR=$target nice -n 19 cargo build --release -p lean-cli
    CARGO_TARGET_DIR=$target nice -n 19 cargo build --release -p lean-gpu --example gpu_bench
    rm -rf .devspec && mkdir -p .devspec/bin
    # the newest build of each test binary (deps/ keeps older hashes too)
    for name in parity lean_gpu kernels; do
        cp "$(ls -t "$target"/release/deps/$name-* | grep -v '\.d$' | head -1)" .devspec/bin/$name
    done
    cp "$target/release/lean-cli" "$target/release/examples/gpu_bench" .devspec/bin/
    [ -z "${LEAN_CLI_BASELINE:-}" ] || cp "$LEAN_CLI_BASELINE" .devspec/bin/lean-cli-baseline
    strip .devspec/bin/* 2>/dev/null || true
    [ $# -gt 0 ] || set -- smollm2-135m-instruct-q4_0.gguf smollm2-135m-instruct-q8_0.gguf \
        qwen2.5-coder-0.5b-instruct-q4_0.gguf
    # Each model cut into pieces of 54 MiB, the pieces packed into parts of at most 55 MiB (the
    # upload also holds the tree, ~8 MiB); `run` joins them by name.
    for m in "$@"; do
        split -b 54M -d -a 2 "$models/$m" ".devspec/$m."
        sha256sum "$models/$m" | sed "s|  .*/|  |" >>.devspec/bin/SHA256SUMS
    done
    if [ -n "${LLAMA_VULKAN_BIN:-}" ]; then
        # ggml-vulkan embeds its SPIR-V shaders: tens of MiB a binary, a few once xz'd.
        mkdir -p .devspec/llama
        for t in llama-bench llama-lookup; do
            strip -o ".devspec/llama/$t" "$LLAMA_VULKAN_BIN/$t"
        done
        tar -C .devspec -cf - llama | xz -T2 -6 >.devspec/llama-vulkan.tar.xz
        rm -r .devspec/llama
        split -b 54M -d -a 2 .devspec/llama-vulkan.tar.xz .devspec/llama-vulkan.tar.xz.
        rm .devspec/llama-vulkan.tar.xz
    fi
    python3 scripts/pack-parts.py .devspec
    scripts/device-gpu.sh prepare-gl
    du -sh .devspec/bin .devspec/part-* .gl
}

stash_parts() {
    mkdir -p "$stash"
    for d in .devspec/bin .devspec/part-* .gl; do
        [ -d "$d" ] && cp -r "$d"/. "$stash/$(basename "$d")/"
    done
    du -sh "$stash"/* | tr '\n' ' '
    echo
}

# Joins the models that came in parts into $LEAN_MODELS and installs the Vulkan loader.
setup_there() {
    stash_parts
    for f in "$stash"/.gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
    export LEAN_MODELS=$stash/models
    mkdir -p "$LEAN_MODELS"
    local names
    names=$(cd "$stash" && ls part-*/ | grep -o '^.*\.gguf' | sort -u)
    for m in $names; do
        # the pieces in their order (.00, .01, …), whichever parts carried them
        find "$stash" -path '*/part-*' -name "$m.*" | awk -F/ '{print $NF "\t" $0}' | sort |
            cut -f2 | xargs cat >"$LEAN_MODELS/$m"
    done
    # (models not brought this time are skipped; a part missing fails)
    (cd "$LEAN_MODELS" && sha256sum -c --ignore-missing "$stash/bin/SHA256SUMS") || return 1
    names_there=$names
    # llama.cpp's Vulkan binaries, where prepare brought them (python's tarfile: no xz needed there)
    if find "$stash" -path '*/part-*' -name 'llama-vulkan.tar.xz.*' | grep -q .; then
        find "$stash" -path '*/part-*' -name 'llama-vulkan.tar.xz.*' | awk -F/ '{print $NF "\t" $0}' |
            sort | cut -f2 | xargs cat >"$stash/llama-vulkan.tar.xz"
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
            "$stash/llama-vulkan.tar.xz" "$stash" || return 1
        chmod +x "$stash"/llama/*
    fi
    # The test binary finds fixtures/ by the path it was built at, and the models folder by the
    # q4_1 file (not brought: its test is not run).
    [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
    touch "$LEAN_MODELS/smollm2-135m-instruct-q4_1.gguf"
}

run_there() {
    setup_there || return 1
    local status=0 out=${OUT:-/tmp}
    # Greedy ids and speculative verification against the HF fixtures, every case in full.
    echo "=== lean-gpu parity (LEAN_GPU_PARITY=full)"
    local tests=()
    case "$names_there" in *smollm2-135m-instruct-q4_0*) tests+=(smollm2_q4_0) ;; esac
    case "$names_there" in *smollm2-135m-instruct-q8_0*) tests+=(smollm2_q8_0_drafted_by_q4_0) ;; esac
    case "$names_there" in *qwen2.5-coder-0.5b-instruct-q4_0*) tests+=(qwen25_coder_q4_0) ;; esac
    for t in "${tests[@]}"; do
        LEAN_GPU_PARITY=full CI=1 "$stash/bin/parity" --exact "$t" --nocapture --test-threads=1 || status=1
    done

    # Plain vs prompt lookup (vs a draft model: SmolLM2's Q4_0 file for its Q8_0 file) on the
    # four tasks (extract under a JSON schema), on the GPU and on the CPU's 16 cores.
    for m in $names_there; do
        local draft=()
        [ "$m" = smollm2-135m-instruct-q8_0.gguf ] && [ -f "$LEAN_MODELS/smollm2-135m-instruct-q4_0.gguf" ] &&
            draft=(--draft "$LEAN_MODELS/smollm2-135m-instruct-q4_0.gguf")
        for backend in gpu cpu; do
            echo "=== bench-spec $m $backend ${draft[*]}"
            "$stash/bin/lean-cli" bench-spec -m "$LEAN_MODELS/$m" --tokenizer gguf --backend $backend \
                --threads 16 --lookup 8 --gen-tokens 128 --reps 3 "${draft[@]}" --json |
                tee -a "$out/bench-spec.jsonl" || status=1
        done
    done
    return $status
}

# Free vs JSON-schema-constrained decode of the same chat prompt, interleaved: the constrained
# reply ends on its own after 96 tokens, as long as the free one, so the rates compare like for like.
run_constrained() {
    setup_there || return 1
    local status=0 out=${OUT:-/tmp} prompt="Write a small shopping order as JSON."
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["schema"]))' \
        rust/lean-constraint/tests/schemas/order_items.json >/tmp/order.schema.json
    for m in $names_there; do
        for backend in gpu cpu; do
            for rep in 0 1 2 3 4 5; do # rep 0 warms up
                for mode in free constrained; do
                    local args=(-n 96)
                    [ $mode = constrained ] && args=(-n 120 --json-schema /tmp/order.schema.json)
                    "$stash/bin/lean-cli" -m "$LEAN_MODELS/$m" --tokenizer gguf --backend $backend \
                        --threads 16 -p "$prompt" "${args[@]}" --json 2>/dev/null |
                        python3 -c 'import json,sys; r=json.load(sys.stdin); t=r["timings"]; print(json.dumps({"model":sys.argv[1],"backend":sys.argv[2],"mode":sys.argv[3],"rep":int(sys.argv[4]),"tokens":t["generated_tokens"],"finish":r["finish_reason"],"decode_tok_s":t["decode_tokens_per_second"],"prefill_s":t["prefill_seconds"]}))' \
                            "$m" $backend $mode $rep | tee -a "$out/constrained.jsonl" || status=1
                done
            done
        done
    done
    return $status
}

# The GPU's verification passes and plain decode, this build against the earlier one, after the
# kernel tests and the bit-for-bit verification-pass test on this GPU.
run_verify() {
    setup_there || return 1
    local status=0 out=${OUT:-/tmp}
    echo "=== lean-gpu tests on this GPU"
    # (full logs in $OUT; here the failures and the counts)
    for t in lean_gpu kernels; do
        CI=1 "$stash/bin/$t" --test-threads=1 >"$out/test-$t.log" 2>&1 || status=1
        grep -E "panicked|^test .* FAILED|^test result" "$out/test-$t.log" | head -20
    done
    for m in $names_there; do
        echo "=== $m"
        for round in 1 2 3; do
            for build in baseline new; do
                local cli=$stash/bin/lean-cli
                [ $build = baseline ] && cli=$stash/bin/lean-cli-baseline
                [ -x "$cli" ] || continue
                "$cli" bench -m "$LEAN_MODELS/$m" --backend gpu --gen-tokens 256 \
                    --reps 3 --json 2>/dev/null |
                    python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"model":sys.argv[1],"build":sys.argv[2],"round":int(sys.argv[3]),"bench":r}))' \
                        "$m" $build $round | tee -a "$out/decode.jsonl" | cut -c1-400 || status=1
            done
            # shaped-all: guessing at every step (no cost check); baseline: the cost check of
            # LEAN_CLI_BASELINE's build; baseline-all: that build guessing at every step; matmul:
            # the prefill-shaped pass (VERIFY_PASSES=matmul)
            for pass in ${VERIFY_PASSES:-shaped shaped-all baseline-all}; do
                local env=() flags=() cli=$stash/bin/lean-cli
                [ $pass = matmul ] && env=(LEAN_GPU_VERIFY_MATMUL=1)
                [ $pass = shaped-all ] && flags=(--no-cost-check)
                [ $pass = baseline ] && cli=$stash/bin/lean-cli-baseline
                [ $pass = baseline-all ] && flags=(--no-cost-check) && cli=$stash/bin/lean-cli-baseline
                [ -x "$cli" ] || continue
                echo "--- bench-spec $m round $round, $pass verification"
                env "${env[@]}" "$cli" bench-spec -m "$LEAN_MODELS/$m" --tokenizer gguf \
                    --backend gpu --lookup 8 --gen-tokens 128 --reps 3 "${flags[@]}" --json |
                    python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"model":sys.argv[1],"pass":sys.argv[2],"round":int(sys.argv[3]),"spec":r}))' \
                        "$m" $pass $round | tee -a "$out/bench-spec.jsonl" | cut -c1-600 || status=1
            done
        done
        # GPU time per dispatch of plain steps and of passes (timestamp queries)
        LEAN_GPU_PROFILE=1 "$stash/bin/lean-cli" bench-spec -m "$LEAN_MODELS/$m" --tokenizer gguf \
            --backend gpu --lookup 8 --gen-tokens 128 --reps 1 --no-cost-check --json \
            >/dev/null 2>"$out/profile-$m.txt" || status=1
    done
    return $status
}

# lean against llama.cpp's Vulkan build on this GPU: prompt lookup on the three tasks, then plain
# prefill and decode.
run_llama() {
    setup_there || return 1
    local status=0 out=${OUT:-/tmp} files=""
    if [ ! -x "$stash/llama/llama-bench" ] || [ ! -x "$stash/llama/llama-lookup" ]; then
        echo "run-llama: no llama.cpp binaries came (prepare with LLAMA_VULKAN_BIN=DIR)" >&2
        return 1
    fi
    for m in $names_there; do files="$files ${m%.gguf}"; done
    echo "=== bench-spec-vs-llama-cpp.sh, BACKEND=gpu:$files"
    BACKEND=gpu LEAN_CLI=$stash/bin/lean-cli LLAMA_BIN=$stash/llama THREADS=16 ROUNDS=2 REPS=3 \
        FILES="$files" JSON_OUT=$out/spec-vs-llama-cpp.json \
        scripts/bench-spec-vs-llama-cpp.sh "$LEAN_MODELS" | tee "$out/spec-vs-llama-cpp.md" || status=1
    for m in $names_there; do
        echo "=== plain decode $m: llama-bench -ngl 99 -p 512 -n 128 vs lean-cli bench --backend gpu"
        "$stash/llama/llama-bench" -m "$LEAN_MODELS/$m" -ngl 99 -t 16 -p 512 -n 128 -r 3 -o json \
            >"$out/decode-llama-cpp-$m.json" 2>"$out/decode-llama-cpp-$m.log" || status=1
        "$stash/bin/lean-cli" bench -m "$LEAN_MODELS/$m" --backend gpu --threads 16 \
            --prompt-tokens 512 --gen-tokens 128 --reps 3 --json \
            >"$out/decode-lean-$m.json" 2>"$out/decode-lean-$m.log" || status=1
        python3 - "$out/decode-llama-cpp-$m.json" "$out/decode-lean-$m.json" <<'PY' || status=1
import json, sys
llama, lean = (json.load(open(f)) for f in sys.argv[1:3])
pp = next(r for r in llama if r["n_prompt"] > 0)
tg = next(r for r in llama if r["n_gen"] > 0)
print(f"llama.cpp ({tg.get('backends', '')}, {tg.get('gpu_info', '')}): prefill {pp['avg_ts']:.1f} tok/s, "
      f"decode {tg['avg_ts']:.1f} tok/s")
print(f"lean ({lean['backend']}): prefill {lean['prefill_tokens_per_second']:.1f} tok/s, "
      f"decode {lean['decode_tokens_per_second']:.1f} tok/s "
      f"(lean/llama.cpp decode {lean['decode_tokens_per_second'] / tg['avg_ts']:.2f}x)")
PY
    done
    return $status
}

run_inflated() {
    setup_there || return 1
    local status=0 out=${OUT:-/tmp} cli=$stash/bin/lean-cli
    local src=${INFLATE_SOURCE:-qwen2.5-coder-0.5b-instruct-q4_0.gguf} shape=${INFLATE_SHAPE:-qwen2.5-3b}
    local big=${src%.gguf}-as-$shape.gguf
    "$cli" inflate -m "$LEAN_MODELS/$src" --shape "$shape" -o "$LEAN_MODELS/$big" || return 1
    # The most wanted first: a call cut short by its time limit still returns what $OUT holds.
    local round tokens build
    for round in $(seq "${ROUNDS:-2}"); do
        [ "$round" = 1 ] && "$cli" bench -m "$LEAN_MODELS/$big" --backend gpu --gen-tokens 256 \
            --reps 3 --json >"$out/decode-inflated.json"
        for tokens in 128 512; do
            # LEAN_CLI_BASELINE's build (prepare copies it) beside this one, where it came
            for build in lean-cli lean-cli-baseline; do
                [ -x "$stash/bin/$build" ] || continue
                echo "=== $build bench-spec --lookup 8 --gen-tokens $tokens, round $round"
                "$stash/bin/$build" bench-spec -m "$LEAN_MODELS/$big" --tokenizer gguf --backend gpu \
                    --lookup 8 --gen-tokens $tokens --reps 3 --json \
                    >"$out/spec${build#lean-cli}-$tokens-r$round.json" || status=1
            done
        done
        if [ "$round" = 1 ]; then
            echo "=== a random-weight $shape's plain decode (the same shapes), the draft model run"
            "$cli" bench --synthetic "$shape" --backend gpu --gen-tokens 256 --reps 3 --json \
                >"$out/decode-synthetic.json" || status=1
            # The source as the draft model: the same function, so an upper bound.
            "$cli" bench-spec -m "$LEAN_MODELS/$big" --tokenizer gguf --backend gpu --lookup 8 \
                --draft "$LEAN_MODELS/$src" --gen-tokens 128 --reps 3 --json \
                >"$out/spec-draft.json" || status=1
        fi
    done
    python3 -c 'import json, sys
for f in sys.argv[1:]:
    print(f.split("/")[-1], "decode tok/s", json.load(open(f))["decode_tokens_per_second"])' "$out"/decode-*.json
    python3 - "$out"/spec-*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    for t in json.load(open(f))["tasks"]:
        row = (f"{f.split('/')[-1]:18} {t['task']:8} {t['generated_tokens']:4} tokens: plain "
               f"{t['plain_decode_tokens_per_second']:7.1f}, lookup {t['lookup_decode_tokens_per_second']:7.1f} "
               f"({t['speedup']:.2f}x, {t['accepted_tokens']}/{t['drafted_tokens']}, paused {t['paused_steps']})")
        d = t.get("draft_model")
        if d:
            row += (f", draft {d['decode_tokens_per_second']:7.1f} ({d['speedup']:.2f}x, "
                    f"{d['accepted_tokens']}/{d['drafted_tokens']})")
        print(row + ("" if t["same_tokens"] else "  TOKENS DIFFER"))
PY
    if [ "${WITH_LLAMA:-0}" = 1 ] && [ -x "$stash/llama/llama-lookup" ]; then
        echo "=== bench-spec-vs-llama-cpp.sh, BACKEND=gpu: ${big%.gguf}"
        BACKEND=gpu LEAN_CLI=$cli LLAMA_BIN=$stash/llama THREADS=16 ROUNDS=2 REPS=3 \
            FILES="${big%.gguf}" JSON_OUT=$out/spec-vs-llama-cpp.json \
            scripts/bench-spec-vs-llama-cpp.sh "$LEAN_MODELS" | tee "$out/spec-vs-llama-cpp.md" || status=1
    fi
    return $status
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    stash) stash_parts ;;
    run) run_there ;;
    run-constrained) run_constrained ;;
    run-verify) run_verify ;;
    run-llama) run_llama ;;
    run-inflated) run_inflated ;;
    exec) shift; setup_there && "$@" ;;
    *) echo "usage: $0 prepare [MODEL...] | stash | run | run-constrained | run-verify | run-llama | run-inflated | exec CMD..." >&2; exit 2 ;;
esac

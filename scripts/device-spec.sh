#!/usr/bin/env bash
# Speculative decoding on a lent GPU machine (the `run` tool's NVIDIA H200) with real test models,
# which do not fit one upload (64 MiB): they travel in parts over several calls, kept outside the
# tree there (/tmp survives between calls while the machine stays warm, 30 s).
#
#   scripts/device-spec.sh prepare [MODEL...]   here: release lean-cli and lean-gpu's parity test
#                                 into .devspec/bin, the Vulkan loader .debs into .gl (as
#                                 device-gpu.sh), the models cut into .devspec/part-NN (≤ 55 MiB)
#   scripts/device-spec.sh stash  there, once per part (carry [".devspec/part-NN"]; the first call
#                                 also carries .devspec/bin and .gl): copies what came to /tmp/spec
#   scripts/device-spec.sh run    there, after the last part: joins the models, then lean-gpu's
#                                 parity tests of those models with LEAN_GPU_PARITY=full (speculative
#                                 verification included) and `lean-cli bench-spec` on the GPU and
#                                 on the CPU's 16 cores; JSON into $OUT
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
    CARGO_TARGET_DIR=$target nice -n 19 cargo test --release -p lean-gpu --test parity --no-run
    CARGO_TARGET_DIR=$target nice -n 19 cargo build --release -p lean-cli
    rm -rf .devspec && mkdir -p .devspec/bin
    cp "$(ls -t "$target"/release/deps/parity-* | grep -v '\.d$' | head -1)" .devspec/bin/parity
    cp "$target/release/lean-cli" .devspec/bin/
    strip .devspec/bin/* 2>/dev/null || true
    [ $# -gt 0 ] || set -- smollm2-135m-instruct-q4_0.gguf smollm2-135m-instruct-q8_0.gguf \
        qwen2.5-coder-0.5b-instruct-q4_0.gguf
    # Each model cut into pieces of 54 MiB, the pieces packed into parts of at most 55 MiB (the
    # upload also holds the tree, ~8 MiB); `run` joins them by name.
    for m in "$@"; do
        split -b 54M -d -a 2 "$models/$m" ".devspec/$m."
        sha256sum "$models/$m" | sed "s|  .*/|  |" >>.devspec/bin/SHA256SUMS
    done
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

run_there() {
    stash_parts
    local status=0 out=${OUT:-/tmp}
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
    (cd "$LEAN_MODELS" && sha256sum -c "$stash/bin/SHA256SUMS") || return 1
    # The test binary finds fixtures/ by the path it was built at, and the models folder by the
    # q4_1 file (not brought: its test is not run).
    [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
    touch "$LEAN_MODELS/smollm2-135m-instruct-q4_1.gguf"

    # Greedy ids and speculative verification against the HF fixtures, every case in full.
    echo "=== lean-gpu parity (LEAN_GPU_PARITY=full)"
    local tests=()
    case "$names" in *smollm2-135m-instruct-q4_0*) tests+=(smollm2_q4_0) ;; esac
    case "$names" in *smollm2-135m-instruct-q8_0*) tests+=(smollm2_q8_0_drafted_by_q4_0) ;; esac
    case "$names" in *qwen2.5-coder-0.5b-instruct-q4_0*) tests+=(qwen25_coder_q4_0) ;; esac
    for t in "${tests[@]}"; do
        LEAN_GPU_PARITY=full CI=1 "$stash/bin/parity" --exact "$t" --nocapture --test-threads=1 || status=1
    done

    # Plain vs prompt lookup (vs a draft model: SmolLM2's Q4_0 file for its Q8_0 file) on the
    # three tasks, on the GPU and on the CPU's 16 cores.
    for m in $names; do
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

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    stash) stash_parts ;;
    run) run_there ;;
    *) echo "usage: $0 prepare [MODEL...] | stash | run" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# lean-gpu's tests and GPU benchmark on a lent GPU machine (the `run` tool's NVIDIA H200), which
# has no Rust toolchain, no Vulkan loader and no network.
#
#   scripts/device-gpu.sh prepare   here: build the release test binaries and the benchmark into
#                                   .devbin/, cut the parts of the test models that
#                                   real_models.rs reads, download the loader .debs into .gl/
#   scripts/device-gpu.sh           there (run with carry [".gl", ".devbin"]): unpack the loaders,
#                                   rebuild the model files, run every test, then the benchmark
#
# .devbin/ and .gl/ are git-ignored (.git/info/exclude, .gitignore) and travel only as `carry`.
set -uo pipefail
cd "$(dirname "$0")/.."

prepare() {
    set -e
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.devbin/' "$exclude" 2>/dev/null || echo /.devbin/ >>"$exclude"
    local target=${CARGO_TARGET_DIR:-/work/cache/target-gpu}
    CARGO_TARGET_DIR=$target nice -n 19 cargo test --release -p lean-gpu --no-run
    CARGO_TARGET_DIR=$target nice -n 19 cargo build --release -p lean-cli -p lean-gpu --examples --bins
    rm -rf .devbin && mkdir -p .devbin/models
    # the newest build of each test binary (deps/ keeps older hashes too)
    for name in lean_gpu kernels real_models; do
        cp "$(ls -t "$target"/release/deps/$name-* | grep -v '\.d$' | head -1)" .devbin/$name
    done
    cp "$target/release/examples/gpu_bench" "$target/release/examples/coop_probe" \
        "$target/release/lean-cli" .devbin/
    # The header and the first 512 KiB of the first 2-D tensor of each type, as real_models.rs
    # reads them: a few MB instead of the 0.6 GB of files (the carry limit is 64 MiB).
    "${LEAN_PYTHON:-$HOME/.cache/lean/venv/bin/python}" - models .devbin/models <<'EOF'
import os, sys
from gguf import GGUFReader
src, out = sys.argv[1], sys.argv[2]
supported = {"F32", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}
for name in ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "smollm2-135m-instruct-q4_1.gguf", "smollm2-135m-instruct-q4_0.gguf"]:
    path = os.path.join(src, name)
    reader = GGUFReader(path)
    ranges = [(0, min(t.data_offset for t in reader.tensors))]
    seen = set()
    for t in reader.tensors:
        ty = t.tensor_type.name
        if len(t.shape) == 2 and ty in supported and ty not in seen:
            seen.add(ty)
            ranges.append((t.data_offset, min(int(t.n_bytes), 512 << 10)))
    d = os.path.join(out, name)
    os.makedirs(d)
    with open(path, "rb") as f:
        for offset, n in ranges:
            f.seek(offset)
            with open(os.path.join(d, str(offset)), "wb") as part:
                part.write(f.read(n))
    with open(os.path.join(d, "size"), "w") as size:
        size.write(str(os.path.getsize(path)))
EOF
    prepare_gl
    du -sh .devbin .gl
}

# The Vulkan loader and libglvnd .debs into .gl/ (the machine there has neither).
prepare_gl() {
    if ! ls .gl/*.deb >/dev/null 2>&1; then
        mkdir -p .gl /tmp/amd64/partial
        local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
        apt-get $o update >/dev/null
        (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    fi
}

run_there() {
    # The Vulkan loader and libglvnd, which the NVIDIA ICD (libGLX_nvidia) needs.
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv

    # Sparse model files of the original sizes holding the carried byte ranges.
    export LEAN_MODELS=/tmp/lean-models
    mkdir -p "$LEAN_MODELS"
    for d in .devbin/models/*/; do
        file=$LEAN_MODELS/$(basename "$d")
        truncate -s "$(cat "$d/size")" "$file"
        for part in "$d"[0-9]*; do
            dd if="$part" of="$file" bs=1M seek="$(basename "$part")" oflag=seek_bytes conv=notrunc status=none
        done
    done

    # CI=1: a missing adapter or model fails instead of skipping.
    local status=0
    for t in lean_gpu kernels real_models; do
        echo "=== $t"
        CI=1 .devbin/$t --nocapture --test-threads=1 || status=1
    done
    # Whole-model speed on random weights of real shapes (lean-cli bench --synthetic): prefill
    # of 512 tokens, decode of 128, on the GPU; JSON lines into $OUT when set.
    local out=${OUT:-/tmp}
    for shape in ${SHAPES:-qwen2.5-0.5b smollm2-1.7b qwen2.5-3b smollm2-360m}; do
        for weights in ${WEIGHTS:-q4_0 q8_0}; do
            echo "=== bench $shape $weights"
            .devbin/lean-cli bench --synthetic "$shape" --weights "$weights" --backend gpu \
                --prompt-tokens 512 --gen-tokens 128 --reps 3 --warmup 1 --json \
                | tee -a "$out/bench-gpu.jsonl" || status=1
        done
    done
    # After the models, with the GPU's clocks up: the read bandwidth the roofline fractions use
    # (run first on an idle GPU it once measured 1.9 instead of 4.6 TB/s), then matvec alone.
    echo "=== gpu_bench"
    .devbin/gpu_bench ${GPU_BENCH_ARGS:-} || status=1
    # What tensor cores through wgpu's experimental cooperative matrices would give (a probe
    # for planning: its failure does not fail the run).
    echo "=== coop_probe"
    .devbin/coop_probe || echo "coop_probe failed"
    return $status
}

case "${1:-run}" in
    prepare) prepare ;;
    prepare-gl) set -e; prepare_gl ;;
    run) run_there ;;
    *) echo "usage: $0 [prepare|prepare-gl|run]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# lean's WebGPU backend in headless Chromium on a lent GPU machine (the `run` tool's NVIDIA H200),
# beside native lean-gpu on the same GPU in the same call (issue 25 §3). That machine has no
# browser, no Node and no network: Chromium (this machine's Debian build with the libraries it
# links), the wasm package and the models travel in parts of at most 55 MiB over several calls,
# kept in /tmp there while the machine stays warm (30 s between calls).
#
#   scripts/device-browser.sh prepare [MODEL...]  here: .devbrowser/bin (lean-cli release),
#                                 .devbrowser/pkg (rust/lean-wasm/pkg: run scripts/build.sh
#                                 first), the Vulkan loader .debs into .gl, and Chromium + the
#                                 models cut into .devbrowser/part-NN
#   scripts/device-browser.sh stash   there, once per part (carry [".devbrowser/part-NN"]; the
#                                 first call also carries .devbrowser/bin, .devbrowser/pkg, .gl)
#   scripts/device-browser.sh run [probe]   there, after the last part: Chromium opens
#                                 scripts/device-browser/bench.html (served by server.py), which
#                                 runs lean-js's WebGPU worker on each model; then lean-cli bench
#                                 on the GPU natively, with and without wgpu's runtime checks
#                                 (LEAN_GPU_RUNTIME_CHECKS=1: what a browser keeps), the same
#                                 prompt length and tokens. `probe`: Chromium reports its adapter
#                                 only (no models needed). JSON and logs into $OUT.
# Env for `run` (an A/B of two builds in one call): LEAN_BROWSER_PKG (the wasm package, default
# the carried one), LEAN_BROWSER_CLI (lean-cli), LEAN_BROWSER_TAG (a suffix for the output
# files), LEAN_BROWSER_PROFILE=0 (no per-kernel profiles).
set -uo pipefail
cd "$(dirname "$0")/.."
stash=/tmp/browser
port=8799
gen_tokens=128
reps=3

prepare() {
    set -e
    local exclude target models lib
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.devbrowser/' "$exclude" 2>/dev/null || echo /.devbrowser/ >>"$exclude"
    target=${CARGO_TARGET_DIR:-$HOME/.cache/lean/target-gpu}
    models=${LEAN_MODELS:-$HOME/.cache/lean/models}
    [ -f rust/lean-wasm/pkg/lean_wasm_bg.wasm ] || { echo "run scripts/build.sh first" >&2; exit 1; }
    CARGO_TARGET_DIR=$target nice -n 19 cargo build --release -p lean-cli
    rm -rf .devbrowser && mkdir -p .devbrowser/bin .devbrowser/pkg .devbrowser/chromium/lib
    cp "$target/release/lean-cli" .devbrowser/bin/ && strip .devbrowser/bin/lean-cli
    cp rust/lean-wasm/pkg/lean_wasm.js rust/lean-wasm/pkg/lean_wasm_bg.wasm .devbrowser/pkg/
    cp -r rust/lean-wasm/pkg/snippets .devbrowser/pkg/ 2>/dev/null || true

    # Chromium: the browser's files, and every library it links but glibc's (run_there uses
    # only those the GPU machine lacks); NSS's dlopened modules beside them.
    local c=.devbrowser/chromium
    (cd /usr/lib/chromium && cp -a chromium chrome_crashpad_handler ./*.pak icudtl.dat ./*.bin \
        libEGL.so libGLESv2.so libvulkan.so.1 libvk_swiftshader.so vk_swiftshader_icd.json "$OLDPWD/$c/")
    mkdir -p "$c/locales" && cp /usr/lib/chromium/locales/en-US.pak "$c/locales/"
    ldd /usr/lib/chromium/chromium | awk '$3 ~ /^\// {print $3}' |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv)\.so|ld-linux' |
        while read -r lib; do cp -L "$lib" "$c/lib/"; done
    cp -L /usr/lib/x86_64-linux-gnu/nss/*.so "$c/lib/" 2>/dev/null || true
    tar -C .devbrowser -cf - chromium | nice -n 19 xz -T2 -6 >.devbrowser/chromium.tar.xz
    rm -rf "$c"
    split -b 54M -d -a 2 .devbrowser/chromium.tar.xz .devbrowser/chromium.tar.xz.
    rm .devbrowser/chromium.tar.xz
    sha256sum .devbrowser/chromium.tar.xz.* | sed "s|  .*/|  |" >.devbrowser/bin/SHA256SUMS.pieces

    [ $# -gt 0 ] || set -- smollm2-135m-instruct-q4_0.gguf qwen3-0.6b-random-q4_0.gguf
    for m in "$@"; do
        split -b 54M -d -a 2 "$models/$m" ".devbrowser/$m."
        sha256sum "$models/$m" | sed "s|  .*/|  |" >>.devbrowser/bin/SHA256SUMS
    done
    # Pieces packed into parts of at most 55 MiB (the upload also holds the tree).
    python3 scripts/pack-parts.py .devbrowser
    scripts/device-gpu.sh prepare-gl
    du -sh .devbrowser/bin .devbrowser/pkg .devbrowser/part-* .gl
}

stash_parts() {
    mkdir -p "$stash"
    for d in .devbrowser/*/ .gl; do
        d=${d%/}
        [ -d "$d" ] && cp -r "$d"/. "$stash/$(basename "$d")/"
    done
    du -sh "$stash"/* | tr '\n' ' '
    echo
}

# The pieces of `name` in their order (.00, .01, …), whichever parts carried them.
join_pieces() {
    find "$stash" -path '*/part-*' -name "$1.*" | awk -F/ '{print $NF "\t" $0}' | sort | cut -f2 | xargs cat
}

# Chromium on bench.html with the models of $1 (comma-separated), its log into $2, more flags after.
browse() {
    local list=$1 log=$2
    shift 2
    python3 scripts/device-browser/server.py $port "${LEAN_BROWSER_PKG:-$stash/pkg}" "${LEAN_MODELS:-/nonexistent}" "${OUT:-/tmp}" "${LEAN_BROWSER_TAG:-}" &
    local server=$!
    sleep 1
    rm -rf /tmp/chromium-profile
    LD_LIBRARY_PATH="$stash/chromium/missing" timeout 540 "$stash/chromium/chromium" \
        --headless=new --no-sandbox --no-zygote --disable-gpu-compositing --disable-dev-shm-usage --use-angle=vulkan \
        --enable-features=Vulkan --disable-vulkan-surface --enable-unsafe-webgpu \
        --ignore-gpu-blocklist --no-first-run --disable-background-networking \
        --disable-component-update --disable-sync --user-data-dir=/tmp/chromium-profile \
        --enable-logging=stderr --v=0 "$@" \
        "http://127.0.0.1:$port/bench.html?models=$list&gen=$gen_tokens&reps=$reps" >"$log" 2>&1 &
    local browser=$!
    # Until the page posts its result (the server then ends) or the browser exits.
    while kill -0 $server 2>/dev/null && kill -0 $browser 2>/dev/null; do sleep 1; done
    sleep 2
    kill $browser $server 2>/dev/null
    wait $browser $server 2>/dev/null
}

run_there() {
    local mode=${1:-bench}
    stash_parts
    local out=${OUT:-/tmp} status=0
    for f in "$stash"/.gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv

    # Chromium, with only the libraries this machine lacks on its path.
    if [ ! -x "$stash/chromium/chromium" ]; then
        (cd "$stash" && join_pieces chromium.tar.xz | tee chromium.tar.xz | sha256sum | cut -c1-16)
        tar -C "$stash" -xJf "$stash/chromium.tar.xz" && rm "$stash/chromium.tar.xz"
    fi
    ldconfig -p | sed -n 2,3p
    rm -rf "$stash/chromium/missing" && mkdir -p "$stash/chromium/missing"
    for lib in "$stash"/chromium/lib/*.so*; do
        name=$(basename "$lib")
        ldconfig -p | grep -qE "^\s$name " || ln -sf "$lib" "$stash/chromium/missing/$name"
    done
    echo "libraries brought: $(ls "$stash/chromium/missing" | tr '\n' ' ')"

    local models=()
    if [ "$mode" != probe ]; then
        export LEAN_MODELS=$stash/models
        mkdir -p "$LEAN_MODELS"
        for m in $(cd "$stash" && ls part-*/ | grep -o '^.*\.gguf' | sort -u); do
            [ -f "$LEAN_MODELS/$m" ] || join_pieces "$m" >"$LEAN_MODELS/$m"
            models+=("$m")
        done
        (cd "$LEAN_MODELS" && sha256sum -c "$stash/bin/SHA256SUMS") || return 1
    fi

    echo "=== Chromium: WebGPU (${models[*]:-adapter only})"
    local list
    list=$(IFS=,; echo "${models[*]:-}")
    local tag=${LEAN_BROWSER_TAG:-} cli=${LEAN_BROWSER_CLI:-$stash/bin/lean-cli}
    browse "$list" "$out/chromium$tag.log"
    grep -a -v 'dbus\|font\|HarfBuzz\|GLib\|Identity\|zygote' "$out/chromium$tag.log" | cut -c1-300 | head -30
    [ -s "$out/browser$tag.json" ] || { echo "no result from the browser"; status=1; }
    [ "$mode" = probe ] && return $status

    # Native lean-gpu on the same models, the browser's prompt length and tokens: as shipped
    # (trusted matvec/matmul/attention shaders) and with wgpu's runtime checks everywhere.
    for m in "${models[@]}"; do
        local prompt
        prompt=$(python3 -c "import json,sys; r=[r for r in json.load(open(sys.argv[1]))['rows'] if r['model']==sys.argv[2]]; print(r[0]['runs'][-1]['promptTokens'] if r else 512)" "$out/browser$tag.json" "$m")
        for checks in 0 1; do
            echo "=== native $m, runtime checks $checks, $prompt prompt tokens"
            LEAN_GPU_RUNTIME_CHECKS=$checks "$cli" bench -m "$LEAN_MODELS/$m" --backend gpu \
                --prompt-tokens "$prompt" --gen-tokens $gen_tokens --reps $reps --json |
                sed "s/^{/{\"file\":\"$m\",\"runtime_checks\":$checks,/" | tee -a "$out/native$tag.jsonl" || status=1
        done
        [ "${LEAN_BROWSER_PROFILE:-1}" = 0 ] && continue
        LEAN_GPU_PROFILE=1 "$cli" bench -m "$LEAN_MODELS/$m" --backend gpu \
            --prompt-tokens "$prompt" --gen-tokens 32 --reps 1 --warmup 0 >/dev/null 2>"$out/profile-$m.txt"
        LEAN_GPU_PROFILE=1 LEAN_GPU_RUNTIME_CHECKS=1 "$cli" bench -m "$LEAN_MODELS/$m" --backend gpu \
            --prompt-tokens "$prompt" --gen-tokens 32 --reps 1 --warmup 0 >/dev/null 2>"$out/profile-checks-$m.txt"
    done
    return $status
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    stash) stash_parts ;;
    run) shift; run_there "$@" ;;
    *) echo "usage: $0 prepare [MODEL...] | stash | run [probe]" >&2; exit 2 ;;
esac

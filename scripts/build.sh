#!/usr/bin/env bash
# Builds lean's two WebAssembly packages from rust/lean-wasm, each through wasm-bindgen and
# wasm-opt, and prints each .wasm's size:
#   st  stable Rust, +simd128, one thread:
#         rust/lean-wasm/pkg/       wasm-bindgen --target web    (browsers, bundlers)
#         rust/lean-wasm/pkg-node/  wasm-bindgen --target nodejs (Node: rust/lean-wasm/tests)
#   mt  nightly Rust, +atomics,+bulk-memory,+mutable-globals,+simd128, -Z build-std, feature
#       `threads` (rayon on Web Workers through wasm-bindgen-rayon; needs COOP/COEP):
#         rust/lean-wasm/pkg-mt/    wasm-bindgen --target web
# Usage: scripts/build.sh [st|mt|all]   (default all)
# Installs what is missing the first time (needs crates.io, static.rust-lang.org and npm):
# the wasm32 target, the nightly toolchain with rust-src, wasm-bindgen-cli pinned to the
# crate's wasm-bindgen (cargo install), binaryen's wasm-opt pinned (npm). After that it runs
# offline.
# Env: CARGO_TARGET_DIR (default rust/lean-wasm/target; the mt build uses its mt/ subdirectory,
# since build-std artifacts would evict the st ones), LEAN_NIGHTLY (the toolchain of the mt
# build), LEAN_WASM_CACHE (where binaryen is npm-installed; default ~/.cache/lean/wasm-tools).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
crate="$root/rust/lean-wasm"
target_dir="${CARGO_TARGET_DIR:-$crate/target}"
# A dated nightly: build-std and the threads link flags change between nightlies.
nightly="${LEAN_NIGHTLY:-nightly-2026-05-19}"
tools="${LEAN_WASM_CACHE:-$HOME/.cache/lean/wasm-tools}"
bindgen_version="0.2.130" # must equal the crate's `wasm-bindgen = "=…"` pin
binaryen_version="132.0.0"
what="${1:-all}"
case "$what" in st | mt | all) ;; *)
    echo "usage: scripts/build.sh [st|mt|all]" >&2
    exit 2
    ;;
esac

# --- tools ---------------------------------------------------------------------------------
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    rustup target add wasm32-unknown-unknown
fi
if [ "$what" != st ]; then
    # build-std compiles std from source: the nightly toolchain and its rust-src are enough.
    if ! rustup run "$nightly" rustc --version >/dev/null 2>&1; then
        rustup toolchain install "$nightly" --profile minimal --component rust-src
    elif ! rustup component list --installed --toolchain "$nightly" | grep -q '^rust-src'; then
        rustup component add rust-src --toolchain "$nightly"
    fi
fi

# wasm-bindgen-cli must match the library version exactly, or the generated glue is refused.
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$bindgen_version" ]; then
    echo "installing wasm-bindgen-cli $bindgen_version (takes several minutes)" >&2
    # --locked pins the CLI's own dependencies; fall back when the index lacks one of them.
    nice -n 19 cargo install wasm-bindgen-cli --version "$bindgen_version" --locked ||
        nice -n 19 cargo install wasm-bindgen-cli --version "$bindgen_version"
fi

wasm_opt="$tools/node_modules/.bin/wasm-opt"
if [ "$("$wasm_opt" --version 2>/dev/null | awk '{print $3}')" != "${binaryen_version%%.*}" ]; then
    command -v npm >/dev/null || {
        echo "npm not found: it installs binaryen's wasm-opt" >&2
        exit 1
    }
    mkdir -p "$tools"
    (cd "$tools" && npm install --no-save --no-audit --no-fund "binaryen@$binaryen_version" >&2)
fi

# --- builds ----------------------------------------------------------------------------------
# getrandom (pulled in by tokenizers) needs its wasm_js backend chosen by cfg on this target.
getrandom_cfg='--cfg getrandom_backend="wasm_js"'
# Features that rustc enables by default on wasm32 must be allowed too, or wasm-opt rejects
# the module.
opt_features=(--enable-simd --enable-bulk-memory --enable-sign-ext
    --enable-nontrapping-float-to-int --enable-mutable-globals --enable-multivalue
    --enable-reference-types)

# optimize WASM FEATURES...: wasm-opt -O3 in place.
optimize() {
    local wasm="$1"
    shift
    "$wasm_opt" -O3 "$@" "$wasm" -o "$wasm.opt"
    mv "$wasm.opt" "$wasm"
}

# A package made from a .wasm records that input's sha256 and this script's own (its flags), so
# that a build that changed nothing skips wasm-bindgen and wasm-opt -O3 (~1.5 min a package;
# scripts/test.sh builds three times).
inputs_sha() { cat "$1" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1; }
# up_to_date WASM PKG...: every PKG was made from this WASM by this script.
up_to_date() {
    local wasm="$1" want pkg
    shift
    want=$(inputs_sha "$wasm")
    for pkg in "$@"; do
        [ "$(cat "$pkg/.built-from" 2>/dev/null)" = "$want" ] || return 1
        [ -f "$pkg/lean_wasm_bg.wasm" ] || return 1
    done
}
stamp() {
    local wasm="$1" sha pkg
    shift
    sha=$(inputs_sha "$wasm")
    for pkg in "$@"; do echo "$sha" >"$pkg/.built-from"; done
}

built=()
# Every crate of the lock file, for every platform: `fetch --target wasm32-unknown-unknown` leaves
# out crates that the offline build below still reads (it failed from an empty cargo registry).
# fetch downloads only what is missing: nothing (and no network) once cached.
(cd "$crate" && cargo fetch --locked >&2)
if [ "$what" != mt ]; then
    st_flags="-C target-feature=+simd128 $getrandom_cfg"
    (cd "$crate" && CARGO_TARGET_DIR="$target_dir" RUSTFLAGS="$st_flags" nice -n 19 \
        cargo build --offline --locked --release --target wasm32-unknown-unknown)
    wasm="$target_dir/wasm32-unknown-unknown/release/lean_wasm.wasm"
    if up_to_date "$wasm" "$crate/pkg" "$crate/pkg-node"; then
        echo "pkg/, pkg-node/: up to date with $wasm" >&2
    else
        rm -rf "$crate/pkg" "$crate/pkg-node"
        wasm-bindgen --target web --out-dir "$crate/pkg" "$wasm"
        wasm-bindgen --target nodejs --out-dir "$crate/pkg-node" "$wasm"
        # Both targets get the same .wasm (only the JS glue differs): optimise it once.
        if cmp -s "$crate/pkg/lean_wasm_bg.wasm" "$crate/pkg-node/lean_wasm_bg.wasm"; then
            optimize "$crate/pkg/lean_wasm_bg.wasm" "${opt_features[@]}"
            cp "$crate/pkg/lean_wasm_bg.wasm" "$crate/pkg-node/lean_wasm_bg.wasm"
        else
            optimize "$crate/pkg/lean_wasm_bg.wasm" "${opt_features[@]}"
            optimize "$crate/pkg-node/lean_wasm_bg.wasm" "${opt_features[@]}"
        fi
        stamp "$wasm" "$crate/pkg" "$crate/pkg-node"
    fi
    built+=("$crate/pkg/lean_wasm_bg.wasm" "$crate/pkg-node/lean_wasm_bg.wasm")
fi
if [ "$what" != st ]; then
    build_std=(-Z build-std=panic_abort,std)
    # rustc no longer adds the linker flags of threads itself (rust-lang/rust#147225): one
    # shared memory that JS imports into every worker, able to grow to 4 GiB (the wasm32
    # limit), and the TLS hooks that wasm-bindgen's thread transform calls (kept from GC).
    mt_flags="-C target-feature=+atomics,+bulk-memory,+mutable-globals,+simd128 $getrandom_cfg"
    for arg in --shared-memory --import-memory --max-memory=4294967296 \
        --export=__wasm_init_tls --export=__tls_size --export=__tls_align --export=__tls_base; do
        mt_flags+=" -C link-arg=$arg"
    done
    (cd "$crate" && cargo "+$nightly" fetch --locked --target wasm32-unknown-unknown \
        "${build_std[@]}" >&2)
    (cd "$crate" && CARGO_TARGET_DIR="$target_dir/mt" RUSTFLAGS="$mt_flags" nice -n 19 \
        cargo "+$nightly" build --offline --locked --release --target wasm32-unknown-unknown \
        "${build_std[@]}" --features threads)
    wasm="$target_dir/mt/wasm32-unknown-unknown/release/lean_wasm.wasm"
    if up_to_date "$wasm" "$crate/pkg-mt"; then
        echo "pkg-mt/: up to date with $wasm" >&2
    else
        rm -rf "$crate/pkg-mt"
        wasm-bindgen --target web --out-dir "$crate/pkg-mt" "$wasm"
        # Without shared memory the module would load and silently run on one thread.
        if ! grep -q 'shared: *true' "$crate/pkg-mt/lean_wasm.js"; then
            echo "the threads build has no shared memory (check the linker flags above)" >&2
            exit 1
        fi
        optimize "$crate/pkg-mt/lean_wasm_bg.wasm" "${opt_features[@]}" --enable-threads
        stamp "$wasm" "$crate/pkg-mt"
    fi
    built+=("$crate/pkg-mt/lean_wasm_bg.wasm")
fi

echo "sizes:"
for f in "${built[@]}"; do
    printf '  %9d bytes (%8d gzipped)  %s\n' "$(stat -c %s "$f")" "$(gzip -9c "$f" | wc -c)" \
        "${f#"$root"/}"
done

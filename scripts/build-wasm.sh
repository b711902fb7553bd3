#!/usr/bin/env bash
# Builds the WebAssembly package of lean (single thread, simd128) from rust/lean-wasm:
#   rust/lean-wasm/pkg/       wasm-bindgen --target web    (browsers, bundlers)
#   rust/lean-wasm/pkg-node/  wasm-bindgen --target nodejs (the Node smoke test)
# then optimises each .wasm with wasm-opt when it is available, and prints the sizes.
# Offline: the crates must already be in cargo's cache (run once online to fetch them).
# Env: CARGO_TARGET_DIR (default rust/lean-wasm/target), LEAN_WASM_CACHE (where binaryen is
# npm-installed when wasm-opt is not on PATH; default ~/.cache/lean/wasm-tools).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
crate="$root/rust/lean-wasm"
target_dir="${CARGO_TARGET_DIR:-$crate/target}"
tools="${LEAN_WASM_CACHE:-$HOME/.cache/lean/wasm-tools}"
bindgen_version="0.2.130" # must equal the crate's `wasm-bindgen = "=…"` pin

# wasm-bindgen-cli must match the library version exactly, or the generated glue is refused.
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$bindgen_version" ]; then
    echo "installing wasm-bindgen-cli $bindgen_version (takes several minutes)" >&2
    # --locked pins the CLI's own dependencies; fall back when the index lacks one of them.
    nice -n 19 cargo install wasm-bindgen-cli --version "$bindgen_version" --locked ||
        nice -n 19 cargo install wasm-bindgen-cli --version "$bindgen_version"
fi

# getrandom (pulled in by tokenizers) needs its wasm_js backend chosen by cfg on this target.
export RUSTFLAGS="-C target-feature=+simd128 --cfg getrandom_backend=\"wasm_js\""
(cd "$crate" && nice -n 19 cargo build --offline --release --target wasm32-unknown-unknown)
wasm="$target_dir/wasm32-unknown-unknown/release/lean_wasm.wasm"

rm -rf "$crate/pkg" "$crate/pkg-node"
wasm-bindgen --target web --out-dir "$crate/pkg" "$wasm"
wasm-bindgen --target nodejs --out-dir "$crate/pkg-node" "$wasm"

wasm_opt="$(command -v wasm-opt || true)"
if [ -z "$wasm_opt" ] && [ -x "$tools/node_modules/.bin/wasm-opt" ]; then
    wasm_opt="$tools/node_modules/.bin/wasm-opt"
fi
if [ -z "$wasm_opt" ] && command -v npm >/dev/null; then
    mkdir -p "$tools"
    if (cd "$tools" && npm install --no-save --no-audit --no-fund binaryen >&2); then
        wasm_opt="$tools/node_modules/.bin/wasm-opt"
    fi
fi
for out in "$crate/pkg/lean_wasm_bg.wasm" "$crate/pkg-node/lean_wasm_bg.wasm"; do
    if [ -n "$wasm_opt" ]; then
        # The features rustc enables by default on wasm32 must be allowed too, or wasm-opt
        # rejects the module (bulk memory, sign-ext, non-trapping float-to-int, ...).
        "$wasm_opt" -O3 --enable-simd --enable-bulk-memory --enable-sign-ext \
            --enable-nontrapping-float-to-int --enable-mutable-globals \
            --enable-multivalue --enable-reference-types \
            "$out" -o "$out.opt"
        mv "$out.opt" "$out"
    fi
done
[ -n "$wasm_opt" ] || echo "wasm-opt not found (npm package binaryen or apt binaryen): skipped" >&2

echo "sizes:"
for f in "$wasm" "$crate/pkg/lean_wasm_bg.wasm" "$crate/pkg-node/lean_wasm_bg.wasm"; do
    printf '  %10d bytes  %s\n' "$(stat -c %s "$f")" "$f"
done

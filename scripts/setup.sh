#!/usr/bin/env bash
# Installs what building and testing lean needs on a fresh Debian machine with rustup:
# system packages (the browsers and Vulkan drivers of the browser tests included), the wasm32
# targets (wasm32-wasip1: lean-quant's simd128 kernel tests under Node, scripts/test-wasi.sh). Idempotent and quiet when everything is there. (scripts/build.sh installs the nightly
# toolchain, wasm-bindgen-cli and wasm-opt that the WebAssembly builds need.)
set -euo pipefail
need_apt=()
for cmd in unzip:unzip sha256sum:coreutils cc:gcc pkg-config:pkg-config; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || need_apt+=("${cmd##*:}")
done
# Playwright drives the system's browsers (its own downloads are not used); WebGPU runs on
# SwiftShader in Chromium and on lavapipe (mesa-vulkan-drivers) in Firefox.
for pkg in chromium firefox-esr mesa-vulkan-drivers; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || need_apt+=("$pkg")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust with rustup first" >&2
  exit 1
fi
for target in wasm32-unknown-unknown wasm32-wasip1; do
  rustup target list --installed | grep -qx "$target" || rustup target add "$target"
done

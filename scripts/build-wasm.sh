#!/usr/bin/env bash
# The single-thread WebAssembly packages only (rust/lean-wasm/pkg and pkg-node): kept for the
# commands that call it; scripts/build.sh builds both packages and documents the details.
exec "$(dirname "${BASH_SOURCE[0]}")/build.sh" st "$@"

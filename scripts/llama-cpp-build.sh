#!/usr/bin/env bash
# Builds llama.cpp's tools once, for the side-by-side benchmarks (bench-vs-llama-cpp.sh,
# bench-spec-vs-llama-cpp.sh), and prints the directory that holds them.
#
#   scripts/llama-cpp-build.sh TARGET...      e.g. llama-bench llama-lookup
#
# llama.cpp: the copy in PyPI's llama-cpp-python 0.3.36 sdist, built into
# $LEAN_CACHE/llama.cpp-0.3.36 (cmake and ninja from apt). GGML_NATIVE=ON dies with an illegal
# instruction on these VMs (the CPU reports AMX that the VM does not run), so the ISA is spelled
# out: AVX, AVX2, FMA, F16C, AVX-512 (+VBMI, VNNI, BF16) on, AVX-VNNI where /proc/cpuinfo has it;
# AMX off. Targets already built are kept.
set -euo pipefail
cache=${LEAN_CACHE:-$HOME/.cache/lean}
py=${PYTHON:-python3}
version=0.3.36
src="$cache/llama.cpp-$version"
missing=()
for target in "$@"; do
  [ -x "$src/build/bin/$target" ] || missing+=("$target")
done
if [ ${#missing[@]} -gt 0 ]; then
  for tool in cmake:cmake ninja:ninja-build; do
    command -v "${tool%%:*}" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool##*:}"; } >&2
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
  cmake --build "$src/build" --target "${missing[@]}" -j "$(nproc)" >&2
fi
echo "$src/build/bin"

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
#
# LLAMA_VULKAN=1: the Vulkan variant instead, in $src/build-vulkan (-DGGML_VULKAN=ON), for a GPU
# machine that has no CUDA toolkit and no compilers: the binaries are carried there. Static ggml
# (BUILD_SHARED_LIBS=OFF), no OpenMP, no OpenSSL, so they need only libvulkan.so.1 and libc/libstdc++/libm/
# libgcc_s at run time; the CPU part is portable (AVX, AVX2, FMA, F16C, BMI2; no AVX-512, no
# GGML_NATIVE), as the GPU host's CPU is not known. Debian bookworm's Vulkan headers (1.3.239) are
# too old for this ggml-vulkan (vk::LayerSettingEXT, VK_EXT_layer_settings, is missing) and its
# glslc (shaderc 2023.2) knows none of the shader extensions llama.cpp probes for, so the matrix
# shaders would have no cooperative-matrix (tensor core) or integer-dot variants. So the headers
# (libvulkan-dev, spirv-headers) and glslc (shaderc 2025.2) come from Debian trixie, unpacked into
# $LEAN_CACHE/vulkan-trixie (apt-get download with a private source list; nothing installed); its
# glslc needs glibc 2.38, so it runs through trixie's own ld.so, libc and libstdc++ there (a
# wrapper script). With it cmake finds GL_KHR_cooperative_matrix, GL_NV_cooperative_matrix2 and
# GL_EXT_integer_dot_product (not GL_EXT_bfloat16, float e2m1/e4m3). The link library is
# bookworm's libvulkan-dev (apt).
set -euo pipefail
cache=${LEAN_CACHE:-$HOME/.cache/lean}
py=${PYTHON:-python3}
version=0.3.36
src="$cache/llama.cpp-$version"
vulkan=${LLAMA_VULKAN:-0}
build="$src/build"
[ "$vulkan" = 1 ] && build="$src/build-vulkan"
missing=()
for target in "$@"; do
  [ -x "$build/bin/$target" ] || missing+=("$target")
done
if [ ${#missing[@]} -gt 0 ]; then
  for tool in cmake:cmake ninja:ninja-build; do
    command -v "${tool%%:*}" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool##*:}"; } >&2
  done
  if [ "$vulkan" = 1 ]; then
    [ -e /usr/lib/x86_64-linux-gnu/libvulkan.so ] ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libvulkan-dev; } >&2
    vk="$cache/vulkan-trixie"
    if [ ! -x "$vk/glslc" ]; then
      rm -rf "$vk" && mkdir -p "$vk/debs" "$vk/apt/lists/partial" "$vk/apt/cache/archives/partial"
      echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$vk/apt/sources.list"
      apt_o=(-o "Dir::Etc::SourceList=$vk/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
             -o "Dir::State::Lists=$vk/apt/lists" -o "Dir::Cache=$vk/apt/cache" -o APT::Architectures=amd64)
      apt-get "${apt_o[@]}" update -qq >&2
      (cd "$vk/debs" && apt-get "${apt_o[@]}" download libvulkan-dev spirv-headers glslc libshaderc1 \
        libc6 libstdc++6 libgcc-s1) >&2
      for f in "$vk"/debs/*.deb; do dpkg -x "$f" "$vk/root"; done
      cat >"$vk/glslc.tmp" <<EOF
#!/bin/sh
r=$vk/root
exec "\$r/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "\$r/usr/lib/x86_64-linux-gnu" "\$r/usr/bin/glslc" "\$@"
EOF
      chmod +x "$vk/glslc.tmp" && "$vk/glslc.tmp" --version >&2 && mv "$vk/glslc.tmp" "$vk/glslc"
    fi
  fi
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
  if [ "$vulkan" = 1 ]; then
    # Shader compilation is long: niced, two jobs.
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=OFF \
      -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR="$vk/root/usr/include" -DVulkan_GLSLC_EXECUTABLE="$vk/glslc" \
      -DCMAKE_PREFIX_PATH="$vk/root/usr" -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON \
      -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF \
      -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >&2
    nice -n 10 cmake --build "$build" --target "${missing[@]}" -j 2 >&2
  else
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=ON \
      -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
      -DGGML_AVX_VNNI=$avx_vnni -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >&2
    cmake --build "$build" --target "${missing[@]}" -j "$(nproc)" >&2
  fi
fi
echo "$build/bin"

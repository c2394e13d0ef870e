#!/usr/bin/env bash
# Assembles CUDA toolkit roots (include/ and lib/ side by side) from NVIDIA's PyPI wheels:
#   .cuda/13.0  <- nvidia-cuda-runtime==13.0.*  + nvidia-cuda-crt==13.0.*
#   .cuda/12.9  <- nvidia-cuda-runtime-cu12==12.9.* + the crt headers of nvidia-cuda-nvcc-cu12==12.9.*
#   .cuda/12.3  <- the same wheels of 12.3, the oldest headers the crates support; that wheel has
#                  no static runtime (build with CUDA_GRAPH_CUDART=dynamic)
# Enough for bindgen, the ABI probe and linking the runtime; no nvcc, no driver.
# Usage: ci/fetch-cuda.sh [13.0|12.9|12.3]...   (default: 13.0 12.9). Cached: a root that exists
# is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cuda
mkdir -p "$dest/wheels"

fetch() { # fetch <spec>...: download wheels into the cache
  python3 -m pip download -q --no-deps --only-binary=:all: --dest "$dest/wheels" "$@"
}

unpack() { # unpack <wheel glob> <member prefix> <target root>
  local wheel
  wheel=$(ls $1 | sort | tail -n 1)
  local tmp
  tmp=$(mktemp -d)
  python3 -m zipfile -e "$wheel" "$tmp"
  mkdir -p "$3"
  cp -a "$tmp/$2/." "$3/"
  rm -rf "$tmp"
}

build_13() {
  local root=$dest/13.0
  [ -f "$root/include/cuda.h" ] && [ -f "$root/lib/libcudart_static.a" ] && return
  fetch 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-crt==13.0.*'
  unpack "$dest/wheels/nvidia_cuda_runtime-13.0.*.whl" nvidia/cu13 "$root.tmp"
  unpack "$dest/wheels/nvidia_cuda_crt-13.0.*.whl" nvidia/cu13 "$root.tmp"
  mv "$root.tmp" "$root"
}

build_12() { # build_12 <12.x>
  local root=$dest/$1
  [ -f "$root/include/cuda.h" ] && [ -d "$root/lib" ] && return
  fetch "nvidia-cuda-runtime-cu12==$1.*" "nvidia-cuda-nvcc-cu12==$1.*"
  unpack "$dest/wheels/nvidia_cuda_runtime_cu12-$1.*.whl" nvidia/cuda_runtime "$root.tmp"
  unpack "$dest/wheels/nvidia_cuda_nvcc_cu12-$1.*.whl" nvidia/cuda_nvcc/include "$root.tmp/include"
  rm -rf "$root.tmp/include/nvvm" "$root.tmp/bin"
  # Wheels without the static runtime carry only the versioned shared library.
  if [ ! -e "$root.tmp/lib/libcudart_static.a" ] && [ -e "$root.tmp/lib/libcudart.so.12" ]; then
    ln -sf libcudart.so.12 "$root.tmp/lib/libcudart.so"
  fi
  mv "$root.tmp" "$root"
}

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(13.0 12.9)
for v in "${versions[@]}"; do
  case "$v" in
    13.0) build_13 ;;
    12.9 | 12.3) build_12 "$v" ;;
    *) echo "fetch-cuda.sh: unknown version $v (13.0, 12.9 or 12.3)" >&2; exit 2 ;;
  esac
  echo "CUDA $v: $(pwd)/$dest/$v"
done

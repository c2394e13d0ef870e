#!/usr/bin/env bash
# Regenerates cuda-graph/kernels/condition_kernels.fatbin from condition_kernels.cu: compiled
# with -rdc for each architecture below, then linked against the device runtime (libcudadevrt,
# which provides cudaGraphSetConditional), so that the fatbin has no unresolved symbol and loads
# with cuModuleLoadData. Needs nvcc (CUDA 12.4 or newer); run it where nvcc is (the GPU machine).
#
# nvcc: $CUDA_PATH/bin/nvcc if CUDA_PATH is set, else `nvcc` on PATH. Usage: ci/gen-condition-fatbin.sh [out]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=cuda-graph/kernels/condition_kernels.cu
out=${1:-cuda-graph/kernels/condition_kernels.fatbin}
if [[ -n "${CUDA_PATH:-}" && -x "${CUDA_PATH}/bin/nvcc" ]]; then nvcc="${CUDA_PATH}/bin/nvcc"; else nvcc=nvcc; fi
echo "gen-condition-fatbin: using $nvcc ($("$nvcc" --version | tail -n 1))"
archs=(75 80 86 89 90 100 120)
gencode=()
for a in "${archs[@]}"; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$nvcc" -rdc=true -c "${gencode[@]}" -o "$tmp/condition_kernels.o" "$src"
"$nvcc" -dlink -fatbin "${gencode[@]}" -o "$out" "$tmp/condition_kernels.o" -lcudadevrt
echo "gen-condition-fatbin: wrote $out ($(wc -c <"$out") bytes; sm_${archs[*]})"

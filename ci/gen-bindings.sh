#!/usr/bin/env bash
# Regenerates the shipped bindings (cuda-graph-sys/src/pregenerated/cuda_<version>.rs) from the
# CUDA 13.0 and 12.9 headers with the build script's own code, so that they equal fresh output.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/fetch-cuda.sh 13.0 12.9 >/dev/null
for v in 13.0 12.9; do
  CUDA_GRAPH_SYS_UPDATE_PREGENERATED=1 CUDA_PATH="$PWD/.cuda/$v" \
    cargo build -q -p cuda-graph-sys --target-dir "target/cuda-$v"
done
git status --short cuda-graph-sys/src/pregenerated

#!/usr/bin/env bash
# Packs the workspace's tests (and examples) for a GPU machine that has no Rust toolchain:
#   gpu-suite/suite-<cuda>.tar.zst   nextest archives, one per CUDA header version
#   gpu-suite/examples-<cuda>.tar.gz the example binaries
#   gpu-suite/cargo-nextest          the runner
# Then copy the checkout with gpu-suite/ to the GPU machine and run ci/gpu-run.sh there.
# Usage: ci/pack-gpu-suite.sh [13.0|12.9]...   (default: 13.0 12.9)
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(13.0 12.9)
mkdir -p gpu-suite
ci/fetch-cuda.sh "${versions[@]}" >/dev/null
for v in "${versions[@]}"; do
  export CUDA_PATH="$PWD/.cuda/$v"
  # Its own target folder, without debug info: the archives must stay small enough to copy.
  target="target/gpu-$v"
  export CARGO_PROFILE_DEV_DEBUG=0
  cargo nextest archive --workspace --all-targets --target-dir "$target" \
    --archive-file "gpu-suite/suite-$v.tar.zst"
  # Every example needs cuda-graph's example-kernels feature (the workspace has it on through the
  # tests and bench crates; named here so that no example is left out if that changes).
  cargo build --workspace --examples --features cuda-graph/example-kernels,cuda-graph/cudarc --target-dir "$target"
  rm -rf "gpu-suite/examples-$v" && mkdir -p "gpu-suite/examples-$v"
  find "$target/debug/examples" -maxdepth 1 -type f -executable ! -name '*-*' \
    -exec cp {} "gpu-suite/examples-$v/" \;
  strip "gpu-suite/examples-$v"/*
  tar -C gpu-suite -czf "gpu-suite/examples-$v.tar.gz" "examples-$v"
  rm -rf "gpu-suite/examples-$v"
done
cp "$(command -v cargo-nextest)" gpu-suite/
ls -la gpu-suite

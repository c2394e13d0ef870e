#!/usr/bin/env bash
# Runs the cuda-graph-bench release binary on a GPU machine and keeps everything it says.
#
#   bench/run-gpu.sh PATH/TO/cuda-graph-bench [more options, e.g. --quick]
#
# Build the binary where Rust is (it needs only the NVIDIA driver to run; the CUDA runtime is
# linked statically):
#
#   CUDA_PATH=$PWD/.cuda/13.0 cargo build --release -p cuda-graph-bench
#
# Results go to $OUT (default target/bench): results.md (also on stdout), bench.csv,
# samples.csv (rewritten after every repetition), footprint.csv, bench.svg, and here
# nvidia-smi.txt, stdout.md, log.txt and exit-status. The script exits with the benchmark's
# status: 0 done, 1 CUDA or I/O error, 2 no usable GPU, 3 (--strict) a target missed.
set -uo pipefail

bin=${1:?usage: bench/run-gpu.sh PATH/TO/cuda-graph-bench [options]}
shift
if [ ! -x "$bin" ]; then
  echo "run-gpu.sh: $bin is not an executable file (build it with: cargo build --release -p cuda-graph-bench)" >&2
  exit 1
fi
out=${OUT:-target/bench}
mkdir -p "$out"

# The GPU, its driver and clocks, for the record.
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,persistence_mode \
    --format=csv >>"$out/nvidia-smi.txt" 2>&1 || true
fi

echo "run-gpu.sh: $bin --out $out $*" >&2
# stdout.md: what the benchmark prints on stdout (the tables); log.txt: stdout and stderr as
# they came (progress, errors).
(
  "$bin" --out "$out" "$@" | tee "$out/stdout.md"
  exit "${PIPESTATUS[0]}"
) 2>&1 | tee "$out/log.txt"
status=${PIPESTATUS[0]}
echo "$status" >"$out/exit-status"
echo "run-gpu.sh: exit status $status; files in $out:" >&2
ls -l "$out" >&2
exit "$status"

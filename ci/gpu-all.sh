#!/usr/bin/env bash
# One GPU session in one command, from the checkout's root on the GPU machine: the packed test
# suite (ci/gpu-run.sh, every archive in gpu-suite/), the examples (ci/gpu-examples.sh), where
# nvcc is there the capture-call probe (bench/probe/capture_calls.cu) and, when the release
# binary is there, the benchmark (bench/run-gpu.sh). Prints the summaries;
# the benchmark's results.md, bench.csv, footprint.csv, bench.svg and nvidia-smi.txt land in
# $OUT (default gpu-suite/out), the logs of the rest in a folder beside it.
#
#   ci/gpu-all.sh                        # suite, examples, benchmark (--budget 300)
#   SANITIZE=memcheck ci/gpu-all.sh      # the GPU test binaries, plain and under compute-sanitizer
#   BENCH_ARGS="--quick" ci/gpu-all.sh   # other benchmark options
#
# Carry gpu-suite/suite-*.tar.zst, gpu-suite/examples-13.0.tar.gz, gpu-suite/cargo-nextest.gz
# and target/release/cuda-graph-bench (see ci/pack-gpu-suite.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-suite/out}
logs="${out%/}-logs"
mkdir -p "$out" "$logs"
[ -f gpu-suite/cargo-nextest.gz ] && gunzip -f gpu-suite/cargo-nextest.gz
chmod +x gpu-suite/cargo-nextest
status=0

echo "##### test suite"
filter=()
# Under a sanitizer, only the binaries that run GPU work (the others would only be slower).
[ -n "${SANITIZE:-}" ] && filter=(-E 'binary(/^(seed_|safe_|misuse|stress|concurrency|lifetime_gpu|soundness)/)')
OUT=$logs ci/gpu-run.sh "${filter[@]}" >"$logs/suite.txt" 2>&1 || status=1
# gpu-run.sh ends with its summary: nextest's counts, failed, excluded and skipped tests by name,
# the sanitizers' counts.
sed -n '/^##### gpu-run summary/,$p' "$logs/suite.txt" | grep . || { tail -n 20 "$logs/suite.txt"; status=1; }

echo "##### examples"
OUT=$logs ci/gpu-examples.sh 13.0 >"$logs/examples.txt" 2>&1 || status=1
grep -E '^--- ' "$logs/examples.txt"

if command -v nvcc >/dev/null; then
  echo "##### capture-call probe (bench/probe/capture_calls.cu)"
  if nvcc -O2 -o "$logs/capture_calls" bench/probe/capture_calls.cu -lcuda >"$logs/probe.txt" 2>&1; then
    "$logs/capture_calls" || status=1
  else
    cat "$logs/probe.txt"; status=1
  fi
  # The driver's ordering of relaunches into shared streams (see the file's opening comment):
  # printed, not judged (it measures the driver, not the crate).
  echo "##### stream-change probe (bench/probe/stream_change_order.cu)"
  if nvcc -O2 -o "$logs/stream_change_order" bench/probe/stream_change_order.cu -lcuda >"$logs/probe2.txt" 2>&1; then
    "$logs/stream_change_order" shared 1500 | tail -n 1
    "$logs/stream_change_order" home 1500 | tail -n 1
  else
    cat "$logs/probe2.txt"; status=1
  fi
  # Which sequences leave graph memory reserved after every allocation is freed and trimmed:
  # printed, not judged (see the file's opening comment).
  echo "##### escaped-allocation reserve probe (bench/probe/escaped_reserve.cu)"
  if nvcc -O2 -o "$logs/escaped_reserve" bench/probe/escaped_reserve.cu -lcuda >"$logs/probe3.txt" 2>&1; then
    "$logs/escaped_reserve"
  else
    cat "$logs/probe3.txt"; status=1
  fi
fi

bench=target/release/cuda-graph-bench
if [ -x "$bench" ]; then
  echo "##### benchmark"
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
  OUT=$out bench/run-gpu.sh "$bench" ${BENCH_ARGS:---budget 300} >"$logs/bench.txt" 2>&1 || status=1
  rm -f "$out/samples.csv" "$out/log.txt" "$out/exit-status" "$out/stdout.md"
  grep -E '^- Timing|^  - missed' "$logs/bench.txt"
fi
exit $status

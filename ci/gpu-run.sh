#!/usr/bin/env bash
# Runs the packed suite (ci/pack-gpu-suite.sh) on a GPU machine, from the checkout's root:
#   ci/gpu-run.sh                     every archive in gpu-suite/, CUDA_GRAPH_REQUIRE_GPU=1
#   SANITIZE="memcheck racecheck synccheck initcheck" ci/gpu-run.sh
#                                     also every test under each compute-sanitizer tool listed
#                                     (memcheck, racecheck, synccheck, initcheck: any subset)
# Extra arguments go to nextest (e.g. -E 'binary(seed_runtime)').
# Exit status: non-zero when any run failed. Logs land in ${OUT:-gpu-suite}/.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-gpu-suite}
export CUDA_GRAPH_REQUIRE_GPU=1
status=0
runner_var=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
for archive in gpu-suite/suite-*.tar.zst; do
  v=$(basename "$archive" .tar.zst); v=${v#suite-}
  echo "=== CUDA $v headers: tests"
  gpu-suite/cargo-nextest nextest run --archive-file "$archive" --workspace-remap . \
    --no-fail-fast --success-output never "$@" 2>&1 | tee "$logs/tests-$v.log" || status=1
  for tool in ${SANITIZE:-}; do
    echo "=== CUDA $v headers: compute-sanitizer --tool $tool"
    env "$runner_var=$PWD/ci/sanitize-runner.sh" SANITIZER_TOOL="$tool" \
      gpu-suite/cargo-nextest nextest run --archive-file "$archive" --workspace-remap . \
      --no-fail-fast --test-threads 4 --success-output immediate "$@" >"$logs/$tool-$v.log" 2>&1 || status=1
    # racecheck ends each process with "RACECHECK SUMMARY: N hazards displayed", the other
    # tools with "ERROR SUMMARY: N errors".
    errors=$(grep -hoE '(ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard)' "$logs/$tool-$v.log" | awk '{s+=$3} END {print s+0}')
    runs=$(grep -cE '(ERROR|RACECHECK) SUMMARY' "$logs/$tool-$v.log")
    echo "$tool: $runs test processes checked, $errors errors or hazards"
    tail -n 3 "$logs/$tool-$v.log"
  done
done
exit $status

#!/usr/bin/env bash
# Runs the packed suite (ci/pack-gpu-suite.sh) on a GPU machine, from the checkout's root:
#   ci/gpu-run.sh                     every archive in gpu-suite/, CUDA_GRAPH_REQUIRE_GPU=1
#   SANITIZE="memcheck racecheck synccheck initcheck" ci/gpu-run.sh
#                                     also every test under each compute-sanitizer tool listed
#                                     (memcheck, racecheck, synccheck, initcheck: any subset)
# Extra arguments go to nextest (e.g. -E 'binary(seed_runtime)'); filtersets given with -E are
# combined with the exclusions below.
#
# The GPU tests are marked `#[ignore = "needs a GPU"]` (so that `cargo test` without a GPU counts
# them as ignored); this script runs them with the rest (--run-ignored all). Under
# CUDA_GRAPH_REQUIRE_GPU=1 a test that cannot run on this machine fails rather than pass by
# skipping. What the machine cannot run is excluded by name instead, and reported as not run:
#   - the tests listed in ci/needs-two-gpus.txt, where nvidia-smi lists fewer than two GPUs;
#   - cuda-graph-tests::compile_fail, where there is no cargo (trybuild compiles with it).
# Passing tests' output is kept (--success-output final) so that any `SKIPPED` line a test prints
# is found. The run ends with a block "##### gpu-run summary": per archive, nextest's summary, the
# failed tests, every excluded test with its reason, every test that printed SKIPPED, and the
# sanitizers' counts.
# Exit status: non-zero when a test failed, a test printed SKIPPED (it passed without running), a
# line of ci/needs-two-gpus.txt names no test, or a sanitizer reported errors or hazards or
# checked no test process. Logs land in ${OUT:-gpu-suite}/.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-gpu-suite}
mkdir -p "$logs"
export CUDA_GRAPH_REQUIRE_GPU=1
status=0
runner_var=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER
nextest=gpu-suite/cargo-nextest
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')

# The filtersets given with -E / --filterset; the other arguments pass through as they are.
user_filters=()
rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    -E | --filterset | --filter-expr) user_filters+=("$2"); shift 2 ;;
    --filterset=* | --filter-expr=*) user_filters+=("${1#*=}"); shift ;;
    -E*) user_filters+=("${1#-E}"); shift ;;
    *) rest+=("$1"); shift ;;
  esac
done

# What this machine cannot run: "<binary id> <test name>|<reason>" each.
excluded=()
if [ "$gpus" -lt 2 ]; then
  while read -r binary test _; do
    excluded+=("$binary $test|needs two GPUs (ci/needs-two-gpus.txt), nvidia-smi lists $gpus")
  done < <(grep -vE '^[[:space:]]*(#|$)' ci/needs-two-gpus.txt)
fi
if ! command -v cargo >/dev/null; then
  excluded+=("cuda-graph-tests::compile_fail misuses_the_safe_api_makes_impossible_do_not_compile|no cargo on this machine (trybuild compiles the programs with it)")
fi

# Tests that need the whole device's memory: run alone, after the rest.
alone='binary(capacity)'
# Under a sanitizer, the tests of conditional nodes run one at a time after the others: with
# several sanitized processes on the GPU at once, a conditional node's body kernel can fail
# with CUDA_ERROR_ILLEGAL_ADDRESS in plain CUDA too (bench/probe/conditional_nodes.cu, four
# processes under memcheck); alone they pass with no error.
sanitize_alone='binary(safe_conditional)'

# One filterset: the user's (any of them), less the exclusions.
filter="all()"
if [ ${#user_filters[@]} -gt 0 ]; then
  filter=""
  for f in "${user_filters[@]}"; do filter+="${filter:+ | }($f)"; done
  filter="($filter)"
fi
for entry in "${excluded[@]}"; do
  read -r binary test <<<"${entry%%|*}"
  filter+=" & not (binary_id(=$binary) & test(=$test))"
done

archives=()
for archive in gpu-suite/suite-*.tar.zst; do [ -f "$archive" ] && archives+=("$archive"); done
[ ${#archives[@]} -gt 0 ] || { echo "no gpu-suite/suite-*.tar.zst: run ci/pack-gpu-suite.sh and copy gpu-suite/ here"; exit 1; }

summary=()
say() { summary+=("$*"); }
for archive in "${archives[@]}"; do
  v=$(basename "$archive" .tar.zst); v=${v#suite-}
  say "=== CUDA $v headers"

  # Every exclusion must name a test of the archive, or the list has gone stale.
  "$nextest" nextest list --archive-file "$archive" --workspace-remap . --run-ignored all --message-format oneline \
    >"$logs/list-$v.txt" 2>"$logs/list-$v.err" || { cat "$logs/list-$v.err"; status=1; }
  while read -r binary test _; do
    if ! grep -qxF "$binary $test" "$logs/list-$v.txt"; then
      say "ERROR: ci/needs-two-gpus.txt names no test of $archive: $binary $test"
      status=1
    fi
  done < <(grep -vE '^[[:space:]]*(#|$)' ci/needs-two-gpus.txt)

  echo "=== CUDA $v headers: tests"
  "$nextest" nextest run --archive-file "$archive" --workspace-remap . --run-ignored all \
    --no-fail-fast --success-output final -E "($filter) & not ($alone)" "${rest[@]}" 2>&1 | tee "$logs/tests-$v.log" || status=1
  # Tests that take nearly the whole device run after the others, one at a time: beside other
  # test processes they would make those fail for want of memory, and measure their memory.
  echo "=== CUDA $v headers: tests that need the whole device, alone"
  "$nextest" nextest run --archive-file "$archive" --workspace-remap . --run-ignored all --test-threads 1 \
    --no-tests warn --no-fail-fast --success-output final -E "($filter) & ($alone)" "${rest[@]}" 2>&1 | tee -a "$logs/tests-$v.log" || status=1
  while read -r line; do say "$line"; done < <(grep -E '^ *Summary \[' "$logs/tests-$v.log" | sed -E 's/^ +//')
  # Failed tests: every status line other than a pass (nextest repeats them in its final list).
  while read -r line; do say "FAILED: $line"; done < <(grep -E '^ +[A-Z][A-Z0-9 -]*\[ *[0-9.]+s\]' "$logs/tests-$v.log" |
    grep -vE '^ +(PASS|SKIP|START|SLOW|RETRY) ' | sed -E 's/^ +//' | sort -u)
  for entry in "${excluded[@]}"; do say "EXCLUDED (not run): ${entry%%|*}: ${entry#*|}"; done
  [ ${#excluded[@]} -gt 0 ] || say "EXCLUDED (not run): none"
  skipped=$(grep -E '^ *SKIPPED [^ ]+:' "$logs/tests-$v.log" | sed -E 's/^ +//' | sort -u)
  if [ -n "$skipped" ]; then
    # Under CUDA_GRAPH_REQUIRE_GPU=1 no test may skip: one that did passed without running.
    while read -r line; do say "$line   <- passed without running"; done <<<"$skipped"
    status=1
  else
    say "SKIPPED (printed by a test): none"
  fi

  for tool in ${SANITIZE:-}; do
    echo "=== CUDA $v headers: compute-sanitizer --tool $tool"
    env "$runner_var=$PWD/ci/sanitize-runner.sh" SANITIZER_TOOL="$tool" \
      "$nextest" nextest run --archive-file "$archive" --workspace-remap . --run-ignored all \
      --no-fail-fast --test-threads 4 --success-output immediate -E "($filter) & not ($alone) & not ($sanitize_alone)" "${rest[@]}" >"$logs/$tool-$v.log" 2>&1 || status=1
    env "$runner_var=$PWD/ci/sanitize-runner.sh" SANITIZER_TOOL="$tool" \
      "$nextest" nextest run --archive-file "$archive" --workspace-remap . --run-ignored all \
      --no-fail-fast --test-threads 1 --no-tests warn --success-output immediate -E "($filter) & ($sanitize_alone)" "${rest[@]}" >>"$logs/$tool-$v.log" 2>&1 || status=1
    # racecheck ends each process with "RACECHECK SUMMARY: N hazards displayed", the other
    # tools with "ERROR SUMMARY: N errors".
    errors=$(grep -hoE '(ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard)' "$logs/$tool-$v.log" | awk '{s+=$3} END {print s+0}')
    runs=$(grep -cE '(ERROR|RACECHECK) SUMMARY' "$logs/$tool-$v.log")
    echo "$tool: $runs test processes checked, $errors errors or hazards"
    tail -n 3 "$logs/$tool-$v.log"
    if [ "$errors" -gt 0 ] || [ "$runs" -eq 0 ]; then
      say "SANITIZER FAILED: $tool: $runs test processes checked, $errors errors or hazards (see $logs/$tool-$v.log)"
      status=1
    else
      say "$tool: $runs test processes checked, 0 errors or hazards"
    fi
  done
done

echo
echo "##### gpu-run summary ($gpus GPUs listed by nvidia-smi; exit status $status)"
printf '%s\n' "${summary[@]}"
exit $status

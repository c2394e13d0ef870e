#!/usr/bin/env bash
cd "$(dirname "$0")"
gunzip -f gpu-suite/cargo-nextest.gz; chmod +x gpu-suite/cargo-nextest
export OUT=${OUT:-/tmp/out}
echo "##### suites"; git log --oneline -1 2>/dev/null
ci/gpu-run.sh 2>&1 | grep -E '^=== |Summary|FAIL|SKIP' | head -40
echo "##### examples"; OUT=/tmp ci/gpu-examples.sh 13.0 2>&1 | grep -E '^--- '
echo "##### bench"
t=$SECONDS
bench/run-gpu.sh target/release/cuda-graph-bench --budget ${BUDGET:-300} > /tmp/bench.log 2>&1; echo "bench rc=$? took $((SECONDS-t)) s"
rm -f $OUT/*.log $OUT/samples.csv $OUT/log.txt $OUT/exit-status $OUT/stdout.md $OUT/*.dot; tail -5 /tmp/bench.log
grep -E "build \+ instantiate|steady|launch \+ sync" $OUT/results.md | head -40

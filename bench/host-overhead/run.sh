#!/usr/bin/env bash
# The safe layer's own host cost per segment, without a GPU: builds the do-nothing driver
# (tests/stub-driver/null_cuda.c) and the host_overhead example, then runs the example's paths
# against it: explicit graphs (raw calls, the safe API without and with its checks) and
# captured ones (raw calls, the safe API), each built, instantiated and destroyed. Then
# launches, against the same stub with the launch calls added (launch_stub.c): the explicit
# chain (the safe API's fast launch path) and the escaping chain (k allocations escape each
# launch: its slow path), each through cuGraphLaunch alone and through the safe API. Then
# updates of the kernel chain (k kernel nodes, no memory nodes), rebuilt and launched every
# round, through cuGraphExecUpdate alone and through the safe API (ExecGraph::update).
#
#   bench/host-overhead/run.sh            # instructions per segment / launch / node (valgrind), and time
#   KS="1 100" PATHS="safe captured" LAUNCH_PATHS="escaping-raw escaping" bench/host-overhead/run.sh
#   LAUNCH_PATHS= UPDATE_PATHS= ...       # no launches, no updates; PATHS= : no build + instantiate
#
# With valgrind, each figure is the difference between two round counts, so start-up and the
# module load cancel out; instructions, unlike time, are the same from run to run and show a
# change of a few percent. Without valgrind it prints times only. Needs a C compiler and Rust.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-target/host-overhead}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cc -O2 -shared -fPIC -o "$out/libnullcuda.so" tests/stub-driver/null_cuda.c
cc -O2 -shared -fPIC -o "$out/liblaunchstub.so" bench/host-overhead/launch_stub.c
cargo build --release -q -p cuda-graph-bench --example host_overhead
bin=${CARGO_TARGET_DIR:-target}/release/examples/host_overhead
export CUDA_GRAPH_LIBCUDA="$out/libnullcuda.so"

instructions() { # path k rounds [valgrind option]
  valgrind --tool=callgrind --callgrind-out-file=/dev/null ${4:+"$4"} "$bin" "$1" "$2" "$3" 2>&1 >/dev/null |
    awk '/Collected/ {print $4}'
}

paths=${PATHS-raw unchecked safe captured-raw captured}
[ -z "$paths" ] || printf '%-13s %6s %14s %14s\n' path k instructions ns
for k in ${KS:-1 10 100 1000}; do
  for path in $paths; do
    rounds=$((2000 / k + 5))
    ns=$("$bin" "$path" "$k" $((rounds * 20)) | awk '{print $1}')
    if command -v valgrind >/dev/null; then
      a=$(instructions "$path" "$k" "$rounds")
      b=$(instructions "$path" "$k" $((rounds * 2)))
      per=$(((b - a) / rounds / k))
    else
      per="(no valgrind)"
    fi
    printf '%-13s %6s %14s %14s\n' "$path" "$k" "$per" "$ns"
  done
done

# Launches: per launch (the chain is built and instantiated once; the difference between two
# launch counts leaves the launches alone).
launch_paths=${LAUNCH_PATHS-launch-raw launch escaping-raw escaping}
export CUDA_GRAPH_LIBCUDA="$out/liblaunchstub.so"
if [ -n "$launch_paths" ]; then
  echo
  printf '%-13s %6s %22s %14s\n' path k 'instructions/launch' 'ns/launch'
  for k in ${KS:-1 10 100 1000}; do
    for path in $launch_paths; do
      rounds=$((20000 / k + 5))
      ns=$("$bin" "$path" "$k" $((rounds * 20)) | awk '{print $1}')
      if command -v valgrind >/dev/null; then
        a=$(instructions "$path" "$k" "$rounds")
        b=$(instructions "$path" "$k" $((rounds * 2)))
        per=$(((b - a) / rounds))
      else
        per="(no valgrind)"
      fi
      printf '%-13s %6s %22s %14s\n' "$path" "$k" "$per" "$ns"
    done
  done
fi

# Updates: per node of the chain. Each round rebuilds the chain, updates the executable graph
# from it, drops the graph and launches. Only the update is counted: callgrind collects inside
# the example's safe_update / raw_update alone (what ExecGraph::update lets go of, the previous
# graph's keep list, is let go of inside it: the stub reports the launch before complete), and
# the difference between two round counts, per round and node, is the figure. The time is the
# update call's alone.
update_paths=${UPDATE_PATHS-update-raw update}
[ -n "$update_paths" ] || exit 0
echo
printf '%-13s %6s %22s %14s\n' path k 'instructions/node' 'ns/node'
for k in ${KS:-1 10 100 1000}; do
  for path in $update_paths; do
    rounds=$((2000 / k + 5))
    ns=$("$bin" "$path" "$k" $((rounds * 20)) | awk '{print $1}')
    if command -v valgrind >/dev/null; then
      a=$(instructions "$path" "$k" "$rounds" --toggle-collect='host_overhead::*_update')
      b=$(instructions "$path" "$k" $((rounds * 2)) --toggle-collect='host_overhead::*_update')
      per=$(((b - a) / rounds / k))
    else
      per="(no valgrind)"
    fi
    printf '%-13s %6s %22s %14s\n' "$path" "$k" "$per" "$ns"
  done
done

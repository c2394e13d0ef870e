#!/usr/bin/env bash
# nextest target runner that runs each test process under compute-sanitizer.
# nextest also runs the binaries to list their tests; those runs make no CUDA call, which
# compute-sanitizer refuses, so they run bare. Tool: $SANITIZER_TOOL (default memcheck).
# API errors are not reported: the misuse tests make CUDA calls fail on purpose. Test processes
# that make no CUDA call (the checker's, the ABI's) pass through. Extra compute-sanitizer
# options: $SANITIZER_FLAGS (split on spaces).
for arg in "$@"; do
  [ "$arg" = "--list" ] && exec "$@"
done
exec compute-sanitizer --tool "${SANITIZER_TOOL:-memcheck}" --report-api-errors no --require-cuda-init no \
  --error-exitcode 86 --print-limit 20 ${SANITIZER_FLAGS:-} "$@"

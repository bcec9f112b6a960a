#!/bin/bash
# A/B of `ferry bench matrix` rows of the small files (10,000 files of 4-8 KiB), interleaved: for each of
# ROUNDS rounds, each binary in turn runs the rows once on each path, under the bench lock.
# Usage: sudo scripts/ab-small-files.sh ROUNDS "PATHS" "ROWS" BINARY...
#   e.g. sudo scripts/ab-small-files.sh 5 wan "ferry send,ferry send 1 lane" /dev/shm/ferry-a ./target/release/ferry
# Environment: CASES=file moves the single file (1 GiB) instead; QUICK=1 adds --quick (64 MiB, 1,000 files);
# RUNS=N adds --runs N (medians of N back-to-back samples per row).
# Prints each binary's rows with `uptime` before every run, and the receiver's event timeline (trace).
set -eu
rounds=$1 paths=$2 rows=$3
shift 3
export FERRY_BENCH_MATRIX_CASES=${CASES:-files} FERRY_BENCH_MATRIX_TRACE=1
quick=()
[ -n "${QUICK:-}" ] && quick=(--quick)
[ -n "${RUNS:-}" ] && quick+=(--runs "$RUNS")
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    echo "=== round $r $bin | $(date -u +%T) $(uptime | sed 's/.*load/load/')"
    flock /tmp/ferry-bench.lock "$bin" bench matrix "${quick[@]}" --paths "$paths" --rows "$rows" 2>&1
  done
done

#!/bin/bash
# Interleaved A/B of two ferry builds over `ferry bench` suites, one run's JSON per file.
#
# usage: scripts/ab-bench.sh OLD_FERRY NEW_FERRY OUT_DIR ROUNDS [SUITE...]
#
# SUITE is transfer, share or mount (the mount's uncached read only); the default is all three. The builds
# alternate (old, new, new, old, ...) inside each suite; every run is `--runs 3 --json`, with
# FERRY_NO_DISCOVERY=1 (loopback only). Summarize with scripts/ab-medians.py OUT_DIR.
set -euo pipefail
old=$1 new=$2 out=$3 rounds=$4
shift 4
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(transfer share mount)
mkdir -p "$out"
export FERRY_NO_DISCOVERY=1
for suite in "${suites[@]}"; do
    for i in $(seq 1 "$rounds"); do
        if [ $((i % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
        for build in $order; do
            ferry=$old
            [ "$build" = new ] && ferry=$new
            file="$out/$suite-$build-$i.json"
            echo "$(date -u +%H:%M:%S) $suite $build $i" >&2
            case $suite in
                mount) FERRY_BENCH_MOUNT_ONLY_UNCACHED=1 "$ferry" bench mount --runs 3 --json > "$file" ;;
                *) "$ferry" bench "$suite" --runs 3 --json > "$file" ;;
            esac
        done
    done
done

#!/bin/bash
# Samples the TCP state (`ss -tin`: congestion control, cwnd, retransmissions, rtt/minrtt, bytes sent) of the
# connections of the first running `ferry ... send --json` process (as `ferry bench matrix` starts it, inside
# the lab's namespace) every INTERVAL seconds (default 0.05) into OUT, one line per sample: PID, time, the
# connections joined by '|'. Runs until killed; start it beside scripts/ab-small-files.sh.
# Usage: sudo scripts/ss-trace.sh OUT [INTERVAL] &
set -u
out=$1 interval=${2:-0.05}
: > "$out"
while true; do
  pid=$(pgrep -f "ferry[^ ]* send --json" | head -1)
  if [ -n "$pid" ]; then
    t=$(date +%s.%N)
    nsenter --net=/proc/"$pid"/ns/net ss -tinH state established 2>/dev/null | tr -s ' \t' ' ' |
      paste -sd'|' | sed "s/^/$pid $t /" >> "$out"
  fi
  sleep "$interval"
done

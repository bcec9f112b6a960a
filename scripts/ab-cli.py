#!/usr/bin/env python3
"""Interleaved A/B of two ferry builds through the full CLI path (send + receive on 127.0.0.1).

usage: scripts/ab-cli.py BASE_FERRY NEW_FERRY SOURCE RUNS UNITS [UNIT_NAME]

Runs `ferry send SOURCE` and `ferry receive --yes` with each binary in turn (A, B, B, A, ...), RUNS times
each, with private XDG dirs and FERRY_NO_DISCOVERY=1 under /dev/shm, and prints the medians of UNITS per
second (for example 10000 files, or 1.073741824 GB for a 1 GiB file) and their ratio NEW/BASE.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    base, new, src, runs, units = sys.argv[1:6]
    unit = sys.argv[6] if len(sys.argv) > 6 else "units"
    runs, units = int(runs), float(units)
    scratch = tempfile.mkdtemp(prefix="ferry-ab-", dir="/dev/shm")
    env = dict(os.environ, XDG_RUNTIME_DIR=f"{scratch}/rt", XDG_CACHE_HOME=f"{scratch}/cache",
               XDG_CONFIG_HOME=f"{scratch}/config", FERRY_NO_DISCOVERY="1")
    env.pop("FERRY_RELAY", None)  # loopback only: no relay from the caller's environment
    os.makedirs(f"{scratch}/rt", mode=0o700)
    bins = [("base", base), ("new", new)]
    rates = {"base": [], "new": []}
    try:
        for i in range(runs):
            for name, ferry in (bins if i % 2 == 0 else bins[::-1]):
                out = f"{scratch}/out"
                shutil.rmtree(out, ignore_errors=True)
                code = f"{100 + i}-apple-orbit-violin"
                quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                t0 = time.time()
                send = subprocess.Popen([ferry, "send", "--code", code, src], **quiet)
                recv = subprocess.Popen([ferry, "receive", code, "--yes", "--out", out], **quiet)
                if recv.wait() != 0 or send.wait() != 0:
                    sys.exit(f"{name}: ferry failed")
                rates[name].append(units / (time.time() - t0))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, v in rates.items():
        print(f"{name}: median {statistics.median(v):.4g} {unit}/s  runs " + " ".join(f"{x:.4g}" for x in v))
    print(f"ratio new/base {statistics.median(rates['new']) / statistics.median(rates['base']):.3f}")


if __name__ == "__main__":
    main()

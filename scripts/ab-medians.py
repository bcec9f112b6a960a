#!/usr/bin/env python3
"""Medians of an A/B made by scripts/ab-bench.sh: one Markdown table per suite.

usage: scripts/ab-medians.py OUT_DIR

For each case: the median of each build's runs, new/old, and each build's range.
"""
import collections
import glob
import json
import os
import re
import statistics
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    order = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
        m = re.match(r"(\w+)-(old|new)-(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        suite, build = m.group(1), m.group(2)
        for line in open(path):
            line = line.strip()
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            value = row.get("value")
            if not isinstance(value, (int, float)):
                continue
            key = (row.get("case", "").strip(), row.get("unit", ""))
            if key not in order[suite]:
                order[suite].append(key)
            runs[(suite, key)][build].append(value)
    for suite, keys in order.items():
        print(f"\n{suite}\n")
        print("| case | unit | old | new | new/old | old range | new range |")
        print("|---|---|---|---|---|---|---|")
        for key in keys:
            r = runs[(suite, key)]
            if not r["old"] or not r["new"]:
                continue
            o, n = statistics.median(r["old"]), statistics.median(r["new"])
            ratio = f"{n / o:.3f}" if o else "-"
            print(f"| {key[0]} | {key[1]} | {o:.4g} | {n:.4g} | {ratio} | "
                  f"{min(r['old']):.4g}-{max(r['old']):.4g} | {min(r['new']):.4g}-{max(r['new']):.4g} |")


if __name__ == "__main__":
    main()

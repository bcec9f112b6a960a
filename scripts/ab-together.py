#!/usr/bin/env python3
"""Interleaved A/B of `ferry send` + `ferry receive --json` started together (no relay, no discovery, XDG dirs
in /dev/shm): prints, per binary, the medians of the seconds from the start to the first of each receiver event
and to the exit. Usage: ab-together.py BASE_FERRY NEW_FERRY RUNS SRC"""
import subprocess, time, os, sys, json, shutil, statistics
bins = sys.argv[1:3]; runs = int(sys.argv[3]); src = sys.argv[4]
res = {b: [] for b in bins}
n = 100
for r in range(runs):
    for b in bins:
        n += 1
        d = f"/dev/shm/tog-{n}"; os.makedirs(d)
        env = dict(os.environ, XDG_RUNTIME_DIR=d+"/rt", XDG_CACHE_HOME=d+"/c", XDG_CONFIG_HOME=d+"/cf", FERRY_NO_DISCOVERY="1")
        env.pop("FERRY_RELAY", None)
        code = f"{n}-apple-orbit-violin"
        t0 = time.monotonic()
        s = subprocess.Popen([b, "send", "--code", code, src], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rc = subprocess.Popen([b, "receive", code, "--yes", "--json", "--out", d+"/out"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ev = {}
        for line in rc.stdout:
            t = time.monotonic() - t0
            try: e = json.loads(line)["event"]
            except Exception: continue
            ev.setdefault(e, t)
        rc.wait(); t1 = time.monotonic() - t0; s.wait()
        ev["exit"] = t1
        res[b].append(ev)
        shutil.rmtree(d)
for b in bins:
    keys = res[b][0].keys()
    print(b, {k: round(statistics.median(e.get(k, float('nan')) for e in res[b]), 3) for k in keys})

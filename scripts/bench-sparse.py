#!/usr/bin/env python3
"""A sparse file through ferry and through rsync --sparse: wall time, CPU and blocks of the result.

usage: scripts/bench-sparse.py FERRY SPARSE_FILE RUNS [DENSE_FILE] [SSH_PORT SSH_KEY]

Copies SPARSE_FILE (on /dev/shm) with each tool in turn, interleaved, RUNS times each, into a fresh
directory next to it, and prints per tool the medians of wall time, CPU time (user + system of every
process involved) and the bytes the result takes on disk (st_blocks * 512), checking that the result
has the source's content (cmp). Tools:

- `ferry send` + `ferry receive --yes` on 127.0.0.1 (FERRY_NO_DISCOVERY=1, private XDG dirs);
- `ferry` again on DENSE_FILE (the same data without holes), when given, to show what the holes cost;
- `rsync --sparse SRC DST/` (local: rsync's three processes, whole-file);
- with SSH_PORT and SSH_KEY: `rsync --sparse -e ssh SRC root@127.0.0.1:DST/` against an sshd started
  for each run by this script (`sshd -D -f DIR/sshd_config`, next to SSH_KEY, listening on
  127.0.0.1:SSH_PORT only) so that the server side's CPU is counted too.
"""
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmds, env=None, before=None, after=None):
    """Runs `cmds` at once (the last one in the foreground); returns wall seconds and CPU seconds."""
    helper = before() if before else None
    cpu0, t0 = children_cpu(), time.time()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
             for c in cmds]
    errs = [(p.args, p.wait(), p.stderr.read()) for p in reversed(procs)]
    wall = time.time() - t0
    if helper is not None:
        after(helper)
    for args, rc, err in errs:
        if rc != 0:
            sys.exit(f"{args[0]} failed ({rc}): {err.decode(errors='replace')}")
    return wall, children_cpu() - cpu0


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    ferry, src, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dense = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
    ssh = sys.argv[5:7] if len(sys.argv) > 6 else None
    base = os.path.dirname(os.path.abspath(src))
    scratch = tempfile.mkdtemp(prefix="ferry-sparse-", dir="/dev/shm")
    env = dict(os.environ, XDG_RUNTIME_DIR=f"{scratch}/rt", XDG_CACHE_HOME=f"{scratch}/cache",
               XDG_CONFIG_HOME=f"{scratch}/config", FERRY_NO_DISCOVERY="1")
    env.pop("FERRY_RELAY", None)  # loopback only
    os.makedirs(f"{scratch}/rt", mode=0o700)
    out = f"{base}/bench-out"

    def ferry_of(path):
        def go(i):
            code = f"{200 + i}-apple-orbit-violin"
            return run([[ferry, "send", "--code", code, path],
                        [ferry, "receive", code, "--yes", "--out", out]], env=env), path
        return go

    def rsync_local(i):
        return run([["rsync", "--sparse", src, out + "/"]]), src

    tools = [("ferry", ferry_of(src))]
    if dense:
        tools.append(("ferry, dense copy", ferry_of(dense)))
    tools.append(("rsync --sparse (local)", rsync_local))
    if ssh:
        port, key = ssh
        conf = os.path.join(os.path.dirname(os.path.abspath(key)), "sshd_config")

        def start_sshd():
            p = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", conf, "-p", port])
            time.sleep(0.3)
            return p

        def stop_sshd(p):
            time.sleep(0.2)  # let it reap the session
            p.send_signal(signal.SIGTERM)
            p.wait()

        def rsync_ssh(i):
            e = (f"ssh -p {port} -i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                 "-o BatchMode=yes -o LogLevel=ERROR")
            return run([["rsync", "--sparse", "-e", e, src, f"root@127.0.0.1:{out}/"]],
                       before=start_sshd, after=stop_sshd), src
        tools.append(("rsync --sparse -e ssh", rsync_ssh))

    results = {name: [] for name, _ in tools}
    try:
        for i in range(runs):
            order = tools if i % 2 == 0 else tools[::-1]
            for name, go in order:
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out)
                (wall, cpu), path = go(i)
                dst = os.path.join(out, os.path.basename(path))
                if subprocess.run(["cmp", "-s", path, dst]).returncode != 0:
                    sys.exit(f"{name}: the copy differs from the source")
                blocks = os.stat(dst).st_blocks * 512
                results[name].append((wall, cpu, blocks))
                print(f"run {i} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU, {blocks} bytes on disk",
                      flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"source: {os.stat(src).st_size} bytes, {os.stat(src).st_blocks * 512} on disk")
    for name, rs in results.items():
        med = [statistics.median(x[k] for x in rs) for k in range(3)]
        print(f"{name}: median {med[0]:.2f} s wall, {med[1]:.2f} s CPU (user+sys), "
              f"{med[2] / 2**20:.0f} MiB on disk")


if __name__ == "__main__":
    main()

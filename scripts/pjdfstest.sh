#!/usr/bin/env bash
# Runs suites of pjdfstest (the POSIX file-system test suite) against a `ferry mount` of a `ferry share
# --writable`, both on this machine over loopback (discovery off), and sorts the failures: a test file whose
# first failure is one of the operations the share refuses on purpose (other owners and users, device
# nodes, FIFOs, sockets, hard links) is "by design", with everything after it in that file; any other is
# listed. Needs root (FUSE) and a pjdfstest source tree (it is not fetched here: no traffic beyond loopback).
#
# usage: sudo scripts/pjdfstest.sh PJDFSTEST_SRC [FERRY] [SUITE...]
#   PJDFSTEST_SRC  a checkout of https://github.com/pjd/pjdfstest (measured with 85a8aea)
#   FERRY          the ferry binary (default: target/release/ferry)
#   SUITE          default: open truncate ftruncate unlink rename mkdir rmdir symlink utimensat
#                  posix_fallocate
set -euo pipefail
SRC=$(realpath "${1:?usage: scripts/pjdfstest.sh PJDFSTEST_SRC [FERRY] [SUITE...]}")
FERRY=$(realpath "${2:-target/release/ferry}")
shift $(($# < 2 ? $# : 2))
SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(open truncate ftruncate unlink rename mkdir rmdir symlink utimensat posix_fallocate)

W=$(mktemp -d /dev/shm/ferry-pjdfstest.XXXXXX)
cleanup() {
  [ -n "${MOUNT:-}" ] && kill "$MOUNT" 2>/dev/null && sleep 1
  umount -l "$W/mnt" 2>/dev/null || true
  [ -n "${SHARE:-}" ] && kill "$SHARE" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT

# The suite's one C file, built with the Linux answers its configure script would find.
mkdir -p "$W/build" "$W/src" "$W/mnt"
cat >"$W/build/config.h" <<'EOF'
#define HAVE_SYS_SYSMACROS_H 1
#define HAVE_OPENAT 1
#define HAVE_UNLINKAT 1
#define HAVE_MKDIRAT 1
#define HAVE_LINKAT 1
#define HAVE_SYMLINKAT 1
#define HAVE_RENAMEAT 1
#define HAVE_MKFIFOAT 1
#define HAVE_MKNODAT 1
#define HAVE_FCHMODAT 1
#define HAVE_FCHOWNAT 1
#define HAVE_FSTATAT 1
#define HAVE_POSIX_FALLOCATE 1
#define HAVE_UTIMENSAT 1
#define HAVE_STRUCT_STAT_ST_ATIM 1
#define HAVE_STRUCT_STAT_ST_MTIM 1
#define HAVE_STRUCT_STAT_ST_CTIM 1
EOF
cc -O1 -D_GNU_SOURCE -I"$W/build" -o "$W/build/pjdfstest" "$SRC/pjdfstest.c"
# The tests find the binary beside their folder.
cp -r "$SRC/tests" "$W/build/tests"

export FERRY_NO_DISCOVERY=1 XDG_RUNTIME_DIR="$W/runtime"
as() {
  local who=$1
  shift
  XDG_CONFIG_HOME="$W/config-$who" XDG_CACHE_HOME="$W/cache-$who" "$FERRY" "$@"
}
# Run as `spawn WHO ARGS... &`: the background shell becomes ferry, so that $! is ferry's pid and a
# signal reaches it.
spawn() {
  export XDG_CONFIG_HOME="$W/config-$1" XDG_CACHE_HOME="$W/cache-$1"
  exec "$FERRY" "${@:2}"
}
as a pair --json --name b >"$W/pair.out" 2>&1 &
PAIR=$!
for _ in $(seq 50); do grep -q '"code"' "$W/pair.out" && break; sleep 0.1; done
code=$(grep -o '"code":"[^"]*"' "$W/pair.out" | head -n 1 | cut -d'"' -f4)
as b pair "$code" --json --name a >/dev/null
wait "$PAIR"
spawn a share --json "$W/src" --writable >"$W/share.out" 2>&1 &
SHARE=$!
for _ in $(seq 50); do grep -q '"ready"' "$W/share.out" && break; sleep 0.1; done
spawn b mount --json a "$W/mnt" >"$W/mount.out" 2>&1 &
MOUNT=$!
for _ in $(seq 100); do grep -q '"mounted"' "$W/mount.out" && break; sleep 0.1; done

tests=()
for s in "${SUITES[@]}"; do tests+=("$W/build/tests/$s"); done
(cd "$W/mnt" && prove -v -r "${tests[@]}" >"$W/prove.out" 2>&1) || true

# Sorted by each test file's first failure.
awk -v by_design='chown|lchown|mkfifo|mknod|bind |connect |-u [0-9]|-g [0-9]|[ \047]link ' '
  /\.t \.\./ { file = $1; sub(".*/tests/", "", file); files++ }
  # A TODO is a failure the suite expects on Linux.
  /^not ok.*# TODO/ { next }
  /^not ok/ && !(file in first) {
    first[file] = $0
    if ($0 ~ by_design) designed++; else { other++; print "not by design: " file ": " $0 }
  }
  /^not ok/ { failed++ }
  /^ok/ { passed++ }
  END {
    printf "files %d, checks passed %d, failed %d; files failing: %d by design, %d otherwise\n",
      files, passed, failed, designed, other
  }' "$W/prove.out"
grep -E '^Files=' "$W/prove.out" || true

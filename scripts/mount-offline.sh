#!/usr/bin/env bash
# Times writes through a writable `ferry mount` while its sharer is stopped, and shows what the sharer has
# once it is back: `echo y > doc.txt`, and an editor's save (a temporary file written, fsynced and renamed
# over the document). Everything on loopback with discovery off, under /dev/shm. Needs root (FUSE).
#
# usage: sudo scripts/mount-offline.sh [FERRY]   (default: target/release/ferry)
set -uo pipefail
FERRY=$(realpath "${1:-target/release/ferry}")
W=$(mktemp -d /dev/shm/ferry-offline.XXXXXX)
mkdir -p "$W/src/d" "$W/mnt"
echo a >"$W/src/a.txt"
echo doc >"$W/src/doc.txt"
export FERRY_NO_DISCOVERY=1 XDG_RUNTIME_DIR="$W/runtime"
as() {
  local who=$1
  shift
  XDG_CONFIG_HOME="$W/config-$who" XDG_CACHE_HOME="$W/cache-$who" "$FERRY" "$@"
}
# Run as `spawn WHO ARGS... &`: the background shell becomes ferry, so that $! is ferry's pid.
spawn() {
  export XDG_CONFIG_HOME="$W/config-$1" XDG_CACHE_HOME="$W/cache-$1"
  exec "$FERRY" "${@:2}"
}
cleanup() {
  kill "${MOUNT:-}" "${SHARE:-}" 2>/dev/null
  sleep 1
  umount -l "$W/mnt" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
seconds() { echo "$(date +%s.%N) - $1" | bc; }

as a pair --json --name b >"$W/pair.out" 2>&1 &
PAIR=$!
for _ in $(seq 50); do grep -q '"code"' "$W/pair.out" && break; sleep 0.1; done
as b pair "$(grep -o '"code":"[^"]*"' "$W/pair.out" | head -n 1 | cut -d'"' -f4)" --name a >/dev/null
wait "$PAIR"
spawn a share --json "$W/src" --writable >"$W/share.out" 2>&1 &
SHARE=$!
sleep 1
spawn b mount --json a "$W/mnt" --deadline 2s >"$W/mount.out" 2>&1 &
MOUNT=$!
for _ in $(seq 100); do grep -q '"mounted"' "$W/mount.out" && break; sleep 0.1; done
cat "$W/mnt/doc.txt" >/dev/null

kill -INT "$SHARE"
wait "$SHARE"
# Past the mount's deadline (2 s): it knows the sharer is gone.
sleep 3
t=$(date +%s.%N)
echo y >"$W/mnt/doc.txt"
rc=$?
echo "echo y > doc.txt: $(seconds "$t") s, status $rc"
t=$(date +%s.%N)
printf 'saved offline' >"$W/mnt/.doc.txt.tmp" && sync "$W/mnt/.doc.txt.tmp" &&
  mv "$W/mnt/.doc.txt.tmp" "$W/mnt/doc.txt"
rc=$?
echo "an editor's save: $(seconds "$t") s, status $rc"

spawn a share --json "$W/src" --writable >"$W/share2.out" 2>&1 &
SHARE=$!
sleep 5
echo "the sharer's folder after: $(ls -A "$W/src" | tr '\n' ' ')"
echo "the sharer's doc.txt: $(cat "$W/src/doc.txt")"

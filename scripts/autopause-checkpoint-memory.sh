#!/usr/bin/env bash
# What `autoPause: {checkpoint: true}` gives back (docs/auto-pause.md): runs its
# own `ember serve` (as root, runsc installed); each round creates a runsc
# sandbox with `autoPause: {afterSeconds: 3, checkpoint: true}`, has a process
# in it hold 64 MiB, reads the memory charged to the sandbox's cgroup while it
# runs, waits until it is auto-paused (checkpointed), reads it again, then
# times `ember exec ID -- true` (the restore and the command, client wall
# time). Prints each round and the medians; removes everything after.
#
#   scripts/autopause-checkpoint-memory.sh [path/to/ember] [rounds]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
E=${1:-$PWD/target/debug/ember}
rounds=${2:-5}
agent=${EMBER_AGENT_BIN:-$PWD/target/debug/ember-agent-static}
work=$(mktemp -d /tmp/ember-ckpt-mem-XXXXXX)
chmod 755 "$work"
D=$work/data G=ember-ckpt-mem-$$
mkdir -m 755 "$D"
"$E" serve --listen 127.0.0.1:0 --cgroup-parent "$G" --data-dir "$D" --agent "$agent" \
  --network-range none >"$work/out" 2>"$work/err" &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  "$E" uninstall --data-dir "$D" --cgroup-parent "$G" >/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do grep -q listening "$work/out" && break; sleep 0.2; done
url=$(head -1 "$work/out" | sed 's/ember listening on //')
export EMBER_URL=$url
# The sandbox's memory cgroup: v2 (memory.current) or v1 (memory.usage_in_bytes).
memory() {
  local f
  for f in "/sys/fs/cgroup/$G-runsc/$1/memory.current" "/sys/fs/cgroup/memory/$G-runsc/$1/memory.usage_in_bytes"; do
    [[ -r $f ]] && { cat "$f"; return; }
  done
  echo "no memory cgroup for $1" >&2
  return 1
}
json() { python3 -c "import sys, json; print(json.load(sys.stdin)$1)"; }
echo "uptime: $(uptime)"
: >"$work/rows"
for r in $(seq "$rounds"); do
  id=$(curl -sf -X POST "$url/v1/sandboxes" -H 'content-type: application/json' \
    -d '{"template":"host","runtimeClass":"runsc","autoPause":{"afterSeconds":3,"checkpoint":true}}' | json '["id"]')
  "$E" exec "$id" -- sh -c 'setsid python3 -c "x = bytearray(64 << 20)
for i in range(0, len(x), 4096): x[i] = 1
import time; time.sleep(1e6)" </dev/null >/dev/null 2>&1 & sleep 1'
  running=$(memory "$id")
  for _ in $(seq 300); do
    [[ $(curl -sf "$url/v1/sandboxes/$id" | json '["status"]["state"]') == Paused ]] && break
    sleep 0.1
  done
  paused=$(memory "$id")
  t0=$(date +%s%N)
  "$E" exec "$id" -- true
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "round $r: memory running $((running / 1024)) KiB, checkpointed $((paused / 1024)) KiB; exec after the pause $ms ms"
  echo "$running $paused $ms" >>"$work/rows"
  "$E" sandbox rm "$id" >/dev/null
done
python3 - "$work/rows" <<'PY'
import statistics, sys
rows = [list(map(int, l.split())) for l in open(sys.argv[1])]
med = lambda i: statistics.median(r[i] for r in rows)
print(f"median of {len(rows)}: memory running {med(0) / 2**20:.1f} MiB, checkpointed {med(1) / 2**20:.1f} MiB; "
      f"exec after the pause (restore + command) {med(2):.0f} ms")
PY
echo "uptime: $(uptime)"

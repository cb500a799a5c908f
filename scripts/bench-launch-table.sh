#!/usr/bin/env bash
# How a cold create scales with the sandboxes already on the host: for each
# binary, a daemon of its own, then `ember bench create` (cold create →
# ready, crun beside it in the same run) with 0, then FILL... idle sandboxes
# of a pool of another template on the host (so the bench's creates stay
# cold), and what a launch copies: the host's mount table and the daemon's
# `ember_launch_table_mounts` (docs/performance.md, "What a launch copies").
# crun clones from the host's table, so its figure shows what that costs.
#
#   scripts/bench-launch-table.sh [BIN...]   (default target/release/ember)
#
# Env: FILL (default "1000 3000"), RUNS (default 60). As root, with crun
# (scripts/bench-setup.sh). Leaves nothing behind: `ember uninstall`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export EMBER_AGENT_BIN="${EMBER_AGENT_BIN:-$PWD/target/release/ember-agent-static}"
fill="${FILL:-1000 3000}" runs="${RUNS:-60}"
data=/tmp/ember-bench-launch-table url=http://127.0.0.1:18474 parent=ember-bench-lt
[ $# -gt 0 ] || set -- "$PWD/target/release/ember"

idle() {
  curl -sf "$url/v1/pools/filler" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("idle", 0))'
}

for bin in "$@"; do
  rm -rf "$data" && mkdir -p "$data"
  "$bin" serve --data-dir "$data" --listen "${url#http://}" --cgroup-parent "$parent" 2> "$data.log" &
  daemon=$!
  trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; "$bin" uninstall --data-dir "$data" --cgroup-parent "$parent" >/dev/null 2>&1' EXIT
  for _ in $(seq 100); do curl -sf "$url/health" >/dev/null && break; sleep 0.2; done
  "$bin" template create --url "$url" filler >/dev/null
  for n in 0 $fill; do
    if [ "$n" -gt 0 ]; then
      t0=$SECONDS
      "$bin" pool create --url "$url" --template filler --name filler --max "$n" --target "$n" >/dev/null 2>&1 ||
        "$bin" pool resize --url "$url" filler --max "$n" --target "$n" >/dev/null
      until [ "$(idle)" -ge "$n" ]; do sleep 1; done
      echo "$bin: $n idle sandboxes on the host (filled in $((SECONDS - t0)) s)"
    fi
    table=$(curl -sf "$url/metrics" | awk '$1 == "ember_launch_table_mounts" {print $2}')
    echo "$bin: $n sandboxes: host mount table $(wc -l < /proc/self/mountinfo), a launch copies ${table:-?} (load $(cut -d' ' -f1-3 /proc/loadavg))"
    "$bin" bench create --url "$url" --runs "$runs" | grep -E '^cold create|^  phase spawn|^ember create'
  done
  kill $daemon; wait $daemon || true
  "$bin" uninstall --data-dir "$data" --cgroup-parent "$parent" >/dev/null
  trap - EXIT
done

#!/usr/bin/env bash
# Runs issue 19's claim-path and task benches against a daemon of their own
# (release build, its own data dir and cgroup parent, removed afterwards),
# with the load average before and after each bench, for docs/performance.md.
#
#   scripts/bench-claim.sh [claim|tasks|all] [extra `ember bench` args...]
#
# Env: EMBER_BIN (default target/release/ember), EMBER_AGENT_BIN (default
# target/release/ember-agent-static), EMBER_SERVE_ARGS (extra serve flags),
# EMBER_TASK_WORKERS (default 8), PERF_RECORD=1 (perf record -a -g during the
# run into $BENCH_OUT/perf.data; off-CPU waits: scripts/offcpu.py).
# As root. Leaves nothing behind: the daemon is stopped and
# `ember uninstall` removes its data dir and cgroups.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

what="${1:-all}"
shift || true
bin="${EMBER_BIN:-$PWD/target/release/ember}"
agent="${EMBER_AGENT_BIN:-$PWD/target/release/ember-agent-static}"
out="${BENCH_OUT:-$(mktemp -d /tmp/ember-bench.XXXXXX)}"
data="$out/data"
group="ember-bench-$$"
mkdir -p "$data"
chmod 755 "$out" "$data" # the sandboxes' id range traverses it
: >"$out/listen"
# shellcheck disable=SC2086
"$bin" serve --listen 127.0.0.1:0 --data-dir "$data" --cgroup-parent "$group" --agent "$agent" \
  --task-workers "${EMBER_TASK_WORKERS:-8}" ${EMBER_SERVE_ARGS:-} >"$out/listen" 2>"$out/serve.log" &
pid=$!
perf_pid=""

cleanup() {
  [[ -n "$perf_pid" ]] && kill -INT "$perf_pid" 2>/dev/null && wait "$perf_pid" 2>/dev/null || true
  kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  "$bin" uninstall --data-dir "$data" --cgroup-parent "$group" >/dev/null 2>&1 || true
}
trap cleanup EXIT

url=""
for _ in $(seq 300); do
  url=$(sed -n 's/^ember listening on //p' "$out/listen")
  [[ -n "$url" ]] && break
  sleep 0.1
done
[[ -n "$url" ]] || { cat "$out/serve.log" >&2; echo "ember serve did not start" >&2; exit 1; }

if [[ "${PERF_RECORD:-0}" == 1 ]]; then
  # On-CPU samples, and every context switch with its stack, host-wide:
  # where the daemon's threads block (an fsync on a runtime worker shows
  # here). Host-wide so that each switch-out has its switch-in (`-p` records
  # only the side of the traced process): scripts/offcpu.py sums the waits.
  # Monotonic timestamps (the tracepoint refuses CLOCK_REALTIME), with the
  # wall clock's offset beside them, so that `perf report --time` can cut out
  # one figure's window by the times in serve.log (wall − offset).
  python3 -c 'import time; print(time.time() - time.clock_gettime(time.CLOCK_MONOTONIC))' >"$out/perf.clock-offset"
  perf record -k mono -a -g -e cpu-clock -F 499 -e sched:sched_switch -o "$out/perf.data" >/dev/null 2>&1 &
  perf_pid=$!
fi

run() {
  echo "== uptime before: $(uptime)"
  "$bin" --url "$url" bench "$@"
  echo "== uptime after: $(uptime)"
}

case "$what" in
  claim) run claim "$@" ;;
  tasks) run tasks "$@" ;;
  all)
    run claim "$@"
    run tasks --mttd "" --floor-count 300 --floor-parallel "${EMBER_TASK_WORKERS:-8}"
    ;;
  *) echo "usage: $0 [claim|tasks|all] [args...]" >&2; exit 2 ;;
esac
echo "output in $out"

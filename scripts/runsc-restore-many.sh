#!/usr/bin/env bash
# One runsc checkpoint image restored into several sandboxes: what a golden
# pool `--from-checkpoint` would need from runsc (docs/warm-pools.md). Runs
# its own `ember serve` (as root, runsc installed): sandbox A is primed (a
# background `sleep`) and checkpointed; B, C, D are checkpointed, their image
# replaced by a copy of A's and resumed (`runsc restore` into their own id and
# bundle); each shows its hostname and processes. Then A itself is resumed.
# Everything is removed at the end (`ember uninstall`).
#
#   scripts/runsc-restore-many.sh [path/to/ember]
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
E=${1:-$PWD/target/debug/ember}
agent=${EMBER_AGENT_BIN:-$PWD/target/debug/ember-agent-static}
work=$(mktemp -d /tmp/ember-restore-many-XXXXXX)
D=$work/data G=ember-restore-many-$$
chmod 755 "$work"; mkdir -m 755 "$D"
"$E" serve --listen 127.0.0.1:0 --cgroup-parent "$G" --data-dir "$D" --agent "$agent" \
  --network-range none >"$work/out" 2>"$work/err" &
pid=$!
for _ in $(seq 100); do grep -q listening "$work/out" && break; sleep 0.2; done
export EMBER_URL=$(head -1 "$work/out" | sed 's/ember listening on //')
procs='hostname; for p in /proc/[0-9]*; do echo "$(basename $p) $(tr "\0" " " < $p/cmdline)"; done'
mk() { "$E" sandbox create --runtime runsc 2>/dev/null | tail -1; }
A=$(mk)
echo "A=$A"
"$E" exec "$A" -- sh -c 'setsid sh -c "exec sleep 100000" </dev/null >/dev/null 2>&1 &'
"$E" exec "$A" -- sh -c "$procs"
"$E" sandbox checkpoint "$A" && echo "checkpoint A: ok"
img=$D/oci/runsc/sandboxes/$A/checkpoint
for n in B C D; do
  X=$(mk)
  echo "$n=$X"
  "$E" sandbox checkpoint "$X" >/dev/null || echo "checkpoint $n failed"
  rm -rf "$D/oci/runsc/sandboxes/$X/checkpoint" && cp -a "$img" "$D/oci/runsc/sandboxes/$X/checkpoint"
  t0=$(date +%s%N)
  "$E" sandbox resume "$X" && echo "resume $n from A's image: ok in $((($(date +%s%N) - t0) / 1000000)) ms"
  "$E" exec "$X" -- sh -c "$procs" || echo "exec in $n failed"
done
"$E" sandbox resume "$A" && echo "resume A: ok"
"$E" exec "$A" -- sh -c "$procs" || echo "exec in A failed"
for s in $("$E" sandbox ls -q); do "$E" sandbox rm "$s" >/dev/null; done
kill "$pid"
wait "$pid" 2>/dev/null
"$E" uninstall --data-dir "$D" --cgroup-parent "$G" >/dev/null
rm -rf "$work"

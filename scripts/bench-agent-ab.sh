#!/usr/bin/env bash
# Two builds of the agent side by side: one daemon (release build) for each,
# one `host` sandbox on each, and N `echo x` commands through each daemon's
# proxy, alternated A, B, B, A... on one keep-alive connection per daemon,
# so that whatever else the host does lands on both alike. Prints, per
# agent, the time to the first stdout event (p50/p90/p99, as the client
# sees it) and the sandbox's CPU per command (its cgroup's cpuacct.usage:
# the agent and the command). For docs/performance.md.
#
#   scripts/bench-agent-ab.sh AGENT_A AGENT_B [N=1500]
#
# As root, cgroup v1 (cpuacct). Leaves nothing behind: both daemons are
# stopped and `ember uninstall` removes their data dirs and cgroups.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ $# -ge 2 ]] || { echo "usage: $0 AGENT_A AGENT_B [N]" >&2; exit 2; }
bin="${EMBER_BIN:-$PWD/target/release/ember}"
out=$(mktemp -d /tmp/ember-agent-ab.XXXXXX)
chmod 755 "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  for side in a b; do
    "$bin" uninstall --data-dir "$out/$side" --cgroup-parent "ember-ab-$$-$side" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT

urls=()
for side in a b; do
  agent=$1
  shift
  mkdir -p "$out/$side"
  chmod 755 "$out/$side"
  "$bin" serve --listen 127.0.0.1:0 --data-dir "$out/$side" --cgroup-parent "ember-ab-$$-$side" --agent "$agent" \
    >"$out/$side.listen" 2>"$out/$side.log" &
  pids+=($!)
  url=""
  for _ in $(seq 300); do
    url=$(sed -n 's/^ember listening on //p' "$out/$side.listen")
    [[ -n "$url" ]] && break
    sleep 0.1
  done
  [[ -n "$url" ]] || { cat "$out/$side.log" >&2; exit 1; }
  urls+=("$url")
done

echo "== uptime before: $(uptime)"
python3 - "${urls[0]}" "${urls[1]}" "${1:-1500}" <<'PY'
import glob, http.client, json, sys, time, urllib.parse

class Side:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port)
        body = {"image": {"uri": "host"}, "entrypoint": ["sleep", "infinity"], "timeout": 3600, "resourceLimits": {}}
        self.id = json.loads(self.call("POST", "/v1/sandboxes", body).read())["id"]
        found = glob.glob(f"/sys/fs/cgroup/cpuacct/**/{self.id}/cpuacct.usage", recursive=True)
        if not found:
            sys.exit(f"no cpuacct group of sandbox {self.id} (cgroup v1 only)")
        self.usage_file, self.times = found[0], []

    def call(self, method, path, body=None):
        self.conn.request(method, path, body=json.dumps(body) if body is not None else None,
                          headers={"content-type": "application/json"})
        return self.conn.getresponse()

    def once(self):
        t = time.perf_counter()
        r = self.call("POST", f"/v1/sandboxes/{self.id}/proxy/44772/command", {"command": "echo x"})
        first = None
        for line in iter(r.readline, b""):
            if first is None and b"stdout" in line:
                first = time.perf_counter()
        if r.status != 200 or first is None:
            sys.exit(f"exec on {self.id}: status {r.status}, no stdout event")
        self.times.append((first - t) * 1000)

    def usage(self):
        return int(open(self.usage_file).read())

sides = [Side(sys.argv[1]), Side(sys.argv[2])]
n = int(sys.argv[3])
for s in sides:  # one untimed command each: the first is a cold one
    s.once()
    s.times, s.u0 = [], s.usage()
for i in range(n):
    for s in sides if i % 2 else sides[::-1]:
        s.once()
        time.sleep(0.002)
print(f"{n} commands each, alternated; ms")
print(f"{'agent':6} {'p50':>7} {'p90':>7} {'p99':>7} {'sandbox CPU/command':>20}")
for name, s in zip("AB", sides):
    t = sorted(s.times)
    cpu = (s.usage() - s.u0) / 1e6 / n
    print(f"{name:6} {t[n // 2]:7.3f} {t[n * 9 // 10]:7.3f} {t[n * 99 // 100]:7.3f} {cpu:20.3f}")
    s.call("DELETE", f"/v1/sandboxes/{s.id}").read()
PY
echo "== uptime after: $(uptime)"

#!/usr/bin/env bash
# Fuzzes the daemon's API from docs/api/openapi.yaml with schemathesis against
# a real `ember serve --ui` (its own data dir, cgroup parent and port; real
# sandboxes): no 5xx, every answer as documented (status, schema, error bodies
# `{code, message}`). A bounded number of examples per operation, then the
# stateful phase (links between operations). Everything the run created is
# removed at the end. Run as root, after `cargo build -p ember` and
# scripts/build-agent.sh.
#
#   scripts/fuzz-api.sh [examples per operation, default 25] [schemathesis run flags...]
#   (e.g. `--include-operation-id createPool` to fuzz one operation)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

examples="${1:-25}"
shift || true
target="${CARGO_TARGET_DIR:-$PWD/target}"
venv="${EMBER_FUZZ_VENV:-$target/fuzz-venv}"
if ! "$venv/bin/schemathesis" --version >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'schemathesis==4.*'
fi

data=$(mktemp -d /tmp/ember-fuzz.XXXXXX)
chmod 755 "$data" # the sandboxes' id range traverses it
group="ember-fuzz-$$"
log="$data/serve.log"
# Made before the daemon starts: its redirect is opened in the background
# child, which a loaded machine may not have run yet when the poll below
# first reads the file (sed failing on a missing file ended the script).
: >"$data/listen"
# Workspaces of at most 1 GiB (larger sizes get the documented 400): an 8 TiB
# one costs 113 MiB of ext4 metadata and a fork makes up to 100, so the run's
# disk use stays bounded (~0.2 GiB) on a CI machine whose disk may be small;
# the reserve is a small one for the same reason (a CI run whose disk was
# nearly full got 500s here before full disks were 507s).
# Egress networking on a range, tag and nflog group of this run's own (from
# its pid, as the tests pick theirs), so that `PUT /v1/sandboxes/{id}/network`
# has a sandbox created with egress to change. The DNS upstream is a closed
# loopback port: nothing the run does sends a query off the machine.
net_n=$(($$ % 200))
net_range="10.214.$net_n.0/24"
net_tag="fz$(($$ % 100000))"
"$target/debug/ember" serve --listen 127.0.0.1:0 --data-dir "$data/data" --cgroup-parent "$group" \
  --agent "${EMBER_AGENT_BIN:-$target/debug/ember-agent-static}" --max-ttl 10m --retention 1m \
  --max-workspace-size 1Gi --disk-reserve 256Mi \
  --network-range "$net_range" --network-tag "$net_tag" --nflog-group $((12000 + $$ % 1000)) \
  --dns-upstream 127.0.0.1:9 --ui >"$data/listen" 2>"$log" &
pid=$!

cleanup() {
  local url="$1"
  if [[ -n "$url" ]]; then
    # Every sandbox, pool and workspace the run made, through the API first.
    for p in $(curl -sf "$url/v1/pools" | python3 -c 'import json,sys; [print(p["name"]) for p in json.load(sys.stdin)["items"]]' 2>/dev/null); do
      curl -sf -X DELETE "$url/v1/pools/$p" >/dev/null || true
    done
    for s in $(curl -sf "$url/v1/sandboxes?pageSize=200" | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)["items"]]' 2>/dev/null); do
      curl -sf -X DELETE "$url/v1/sandboxes/$s" >/dev/null || true
    done
  fi
  kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  # Left mounts (workspaces, writable layers) and cgroups, deepest first.
  grep -o " $data/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  find /sys/fs/cgroup -depth -type d -path "*$group*" -exec rmdir {} \; 2>/dev/null || true
  # The egress slots, table and resolver address (they outlive a daemon by design).
  for n in $(ls /run/netns /sys/class/net 2>/dev/null | grep -E "^$net_tag-[0-9]+\$" | sort -u); do
    ip link del "$n" 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true
  done
  nft delete table inet "$net_tag" 2>/dev/null || true
  ip addr del "10.214.$net_n.254/32" dev lo 2>/dev/null || true
  rm -rf "$data"
}

url=""
for _ in $(seq 100); do
  url=$(sed -n 's/^ember listening on //p' "$data/listen")
  [[ -n "$url" ]] && break
  sleep 0.1
done
if [[ -z "$url" ]]; then
  cat "$log" >&2
  cleanup ""
  echo "scripts/fuzz-api.sh: ember serve did not start" >&2
  exit 1
fi
trap 'cleanup "$url"' EXIT

# Sandboxes some operations can only succeed on, made before the run: a
# checkpoint needs a Running runsc sandbox, an egress policy change one created
# with egress. Random ids would only ever reach their 404s and 400s.
create_running() {
  local id state
  id=$(curl -sf -X POST "$url/v1/sandboxes" -H 'content-type: application/json' -d "$1" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  for _ in $(seq 300); do
    state=$(curl -sf "$url/v1/sandboxes/$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["state"])')
    [[ "$state" == Running ]] && break
    sleep 0.1
  done
  [[ "$state" == Running ]] || { echo "scripts/fuzz-api.sh: sandbox $1 is $state" >&2; return 1; }
  echo "$id"
}
runsc_id=$(create_running '{"template":"host","runtimeClass":"runsc","timeout":600}')
egress_id=$(create_running '{"template":"host","network":"egress","timeout":600}')
# Pools of the built-in template, so creates reach their success path; never
# more than one sandbox each and none idle (a fuzzed `min` of 10,000 would
# start that many on a shared machine). A pool's `resources` are a create's,
# fuzzed there: here random quantities (below the 16Mi an agent needs, say)
# would leave the fuzzing phase no valid pool at all.
cat >"$data/schemathesis.toml" <<TOML
[[operations]]
include-operation-id = "createPool"
parameters = { "body.template" = "host", "body.min" = 0, "body.max" = 1, "body.target" = 0, "body.resources" = {} }

# A create asking for an OpenSandbox feature ember lacks (secureAccess: true,
# ossfs volumes) is answered 501 by design (docs/opensandbox.md): no other
# 5xx is expected from it.
[[operations]]
include-operation-id = "createSandbox"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "501"]

[[operations]]
include-operation-id = "resizePool"
parameters = { "body.min" = 0, "body.max" = 1, "body.target" = 0 }

[[operations]]
include-operation-id = "checkpointSandbox"
parameters = { id = "$runsc_id" }

[[operations]]
include-operation-id = "setSandboxNetworkPolicy"
parameters = { id = "$egress_id" }
TOML

# Not fuzzed: the agent's own routes behind the proxy and the dashboard's
# PTY routes, which pass through to the same agent (the execd, pty and ui
# tests cover them), pulls and imports (they would reach real registries), and
# `/v1/cluster/call`, the node-to-node route: its body is an internal
# `NodeCall` (docs/cluster.md), each the engine call of a public route fuzzed
# here, and tests/cluster.rs drives it between real nodes.
start=$(date +%s)
set +e
"$venv/bin/schemathesis" --config-file "$data/schemathesis.toml" run docs/api/openapi.yaml --url "$url" \
  --max-examples "$examples" --phases examples,coverage,fuzzing,stateful \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --exclude-path-regex '/proxy/|/ui/sandboxes/[^/]+/pty|/images/pull|/images/import|/templates|/cluster/call' \
  --generation-database none --seed 1 --workers 1 --no-color --request-timeout 60 "$@"
code=$?
set -e
echo "scripts/fuzz-api.sh: schemathesis ran for $(($(date +%s) - start)) s ($examples examples per operation)"
if grep -q "panicked" "$log"; then
  grep -B2 -A5 "panicked" "$log" >&2
  echo "scripts/fuzz-api.sh: the daemon panicked" >&2
  code=1
fi
exit $code

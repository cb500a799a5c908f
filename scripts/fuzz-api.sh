#!/usr/bin/env bash
# Fuzzes the daemon's API from docs/api/openapi.yaml with schemathesis against
# a real `ember serve` (its own data dir, cgroup parent and port; real
# sandboxes): no 5xx, every answer as documented (status, schema, error bodies
# `{code, message}`). A bounded number of examples per operation, then the
# stateful phase (links between operations). Everything the run created is
# removed at the end. Run as root, after `cargo build -p ember` and
# scripts/build-agent.sh.
#
#   scripts/fuzz-api.sh [examples per operation, default 25]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

examples="${1:-25}"
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
"$target/debug/ember" serve --listen 127.0.0.1:0 --data-dir "$data/data" --cgroup-parent "$group" \
  --agent "${EMBER_AGENT_BIN:-$target/debug/ember-agent-static}" --network-range none --max-ttl 10m \
  --retention 1m >"$data/listen" 2>"$log" &
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

# Not fuzzed: the agent's own routes behind the proxy (the execd tests cover
# them), and pulls and imports (they would reach real registries).
start=$(date +%s)
set +e
"$venv/bin/schemathesis" run docs/api/openapi.yaml --url "$url" \
  --max-examples "$examples" --phases examples,coverage,fuzzing,stateful \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --exclude-path-regex '/proxy/|/images/pull|/images/import|/templates' \
  --generation-database none --seed 1 --workers 1 --no-color --request-timeout 60
code=$?
set -e
echo "scripts/fuzz-api.sh: schemathesis ran for $(($(date +%s) - start)) s ($examples examples per operation)"
if grep -q "panicked" "$log"; then
  grep -B2 -A5 "panicked" "$log" >&2
  echo "scripts/fuzz-api.sh: the daemon panicked" >&2
  code=1
fi
exit $code

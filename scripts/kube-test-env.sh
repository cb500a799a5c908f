#!/usr/bin/env bash
# Builds, once per machine, the binaries the Kubernetes operator's tests run
# (crates/ember-operator/tests, docs/kubernetes.md): kube-apiserver from the
# k8s.io/kubernetes module, etcd, and helm, all from the Go module proxy. They
# are cached under ${EMBER_KUBE_CACHE:-/var/cache/ember-kube}/<versions>/bin;
# a second call finds them and returns at once. Prints `export` lines:
#
#   eval "$(scripts/kube-test-env.sh)"
#
# which set EMBER_KUBE_APISERVER, EMBER_ETCD and EMBER_HELM.
#
# Why a wrapper module: k8s.io/kubernetes replaces its staging modules
# (k8s.io/api, k8s.io/apiserver, ...) by local paths, so `go install` refuses
# it; the wrapper pins each of them by `replace` to the published v0.x.y of the
# same release. The list of staging modules is read from kubernetes' own go.mod
# so a version bump needs no edit here. etcd's modules do the same with theirs.
set -euo pipefail

k8s_version="${EMBER_KUBE_VERSION:-1.37.2}"
etcd_version="${EMBER_ETCD_VERSION:-3.6.16}"
helm_version="${EMBER_HELM_VERSION:-3.22.0}"
cache="${EMBER_KUBE_CACHE:-/var/cache/ember-kube}"
root="$cache/k8s-$k8s_version-etcd-$etcd_version-helm-$helm_version"
bin="$root/bin"

die() {
  echo "scripts/kube-test-env.sh: $*" >&2
  exit 1
}

print_env() {
  echo "export EMBER_KUBE_APISERVER=$bin/kube-apiserver"
  echo "export EMBER_ETCD=$bin/etcd"
  echo "export EMBER_HELM=$bin/helm"
}

if [[ -x $bin/kube-apiserver && -x $bin/etcd && -x $bin/helm ]]; then
  print_env
  exit 0
fi

command -v go >/dev/null || die "the go command is not on PATH (it builds kube-apiserver, etcd and helm)"
mkdir -p "$bin" "$root/src" || die "cannot create $root"
start=$SECONDS

# module_replaces GOMOD STAGING_VERSION: MODULE's own `replace` lines, which
# `go` ignores outside MODULE: those to a local path (staging modules) pin the
# module to STAGING_VERSION, the others are copied as they are.
module_replaces() {
  local gomod="$1" staging_version="$2"
  awk -v v="$staging_version" '
    /^replace[ \t]*\(/ { block = 1; next }
    block && /^[ \t]*\)/ { block = 0; next }
    block || $1 == "replace" {
      line = $0
      sub(/^[ \t]*(replace[ \t]+)?/, "", line)
      split(line, f, /[ \t]+/)
      target = (f[2] == "=>") ? f[3] : f[4] # "mod => ..." or "mod version => ..."
      # etcd bars some imports with `=> ./FORBIDDEN_DEPENDENCY`: leave those out.
      if (target ~ /FORBIDDEN/) next
      if (target ~ /^\.\.?\//) { if (v != "") print "replace " f[1] " => " f[1] " " v }
      else print "replace " line
    }' "$gomod"
}

gomod_of() {
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p'
}

# build NAME MODULE VERSION STAGING_VERSION PACKAGE: builds PACKAGE into
# $bin/NAME from a throwaway module requiring MODULE@VERSION.
build() {
  local name="$1" module="$2" version="$3" staging="$4" pkg="$5"
  local dir="$root/src/$name"
  rm -rf "$dir" && mkdir -p "$dir"
  local gomod
  gomod="$(gomod_of "$module@$version")" || die "cannot fetch $module@$version from the Go module proxy"
  [[ -n $gomod ]] || die "no go.mod for $module@$version"
  {
    echo "module ember.local/kube-test-env/$name"
    echo
    echo "go $(awk '$1 == "go" { print $2; exit }' "$gomod")"
    echo
    echo "require $module $version"
    module_replaces "$gomod" "$staging"
  } >"$dir/go.mod"
  # The usual tools.go: a build tag keeps the program import out of builds.
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" >"$dir/tools.go"
  echo "== $name: $module@$version" >&2
  (cd "$dir" && go mod tidy >&2) || die "go mod tidy failed for $module@$version (see above)"
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$bin/$name.tmp" "$pkg" >&2) ||
    die "go build $pkg failed (see above)"
  mv "$bin/$name.tmp" "$bin/$name"
}

[[ -x $bin/etcd ]] || build etcd go.etcd.io/etcd/server/v3 "v$etcd_version" "v$etcd_version" go.etcd.io/etcd/server/v3
[[ -x $bin/helm ]] || build helm helm.sh/helm/v3 "v$helm_version" "" helm.sh/helm/v3/cmd/helm
[[ -x $bin/kube-apiserver ]] ||
  build kube-apiserver k8s.io/kubernetes "v$k8s_version" "v0.${k8s_version#1.}" k8s.io/kubernetes/cmd/kube-apiserver

"$bin/kube-apiserver" --version >&2 || die "$bin/kube-apiserver does not run"
"$bin/etcd" --version >&2 || die "$bin/etcd does not run"
"$bin/helm" version --short >&2 || die "$bin/helm does not run"
echo "scripts/kube-test-env.sh: built in $((SECONDS - start)) s under $bin" >&2
print_env

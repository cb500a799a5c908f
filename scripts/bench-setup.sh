#!/usr/bin/env bash
# Prepares this host for `ember bench`: installs what the benchmarks run and
# mounts what crun needs. The benchmarks themselves never change the host;
# they say what is missing and name this script. Idempotent: run it again and
# it changes nothing. Needs root (apt-get, mount).
#
#   scripts/bench-setup.sh
#
#   crun             the reference of `ember bench create`, and a runtime class
#   zstd, tar        the reference of `ember bench snapshot`
#   busybox-static   the image `ember bench image` builds
#   docker-registry, skopeo   the local registry `ember bench image` pushes to
#
# On a hybrid cgroup v1 layout crun refuses to start containers unless a
# hugetlb hierarchy is mounted; this mounts one when the kernel has the
# controller and no hierarchy has it.
set -euo pipefail

missing=()
for pkg_cmd in crun:crun zstd:zstd tar:tar busybox-static:/bin/busybox docker-registry:docker-registry skopeo:skopeo; do
  pkg=${pkg_cmd%%:*} cmd=${pkg_cmd#*:}
  if ! command -v "$cmd" >/dev/null 2>&1; then
    missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y "${missing[@]}" >&2 || { apt-get update >&2 && apt-get install -y "${missing[@]}" >&2; }
else
  echo "packages: all present" >&2
fi

hugetlb=/sys/fs/cgroup/hugetlb
unified_root=$(awk '$2 == "/sys/fs/cgroup" && $3 == "cgroup2"' /proc/mounts)
v1=$(awk '$3 == "cgroup" && $2 ~ "^/sys/fs/cgroup/"' /proc/mounts)
has_hugetlb=$(awk '$3 == "cgroup" && $4 ~ /(^|,)hugetlb(,|$)/' /proc/mounts)
kernel_has=$(awk '$1 == "hugetlb" && $4 == 1' /proc/cgroups)
if [[ -z $unified_root && -n $v1 && -z $has_hugetlb && -n $kernel_has ]]; then
  echo "mounting a hugetlb cgroup v1 hierarchy at $hugetlb (crun needs one on this layout)" >&2
  mkdir -p "$hugetlb"
  mount -t cgroup -o hugetlb cgroup "$hugetlb"
else
  echo "cgroups: nothing to mount" >&2
fi

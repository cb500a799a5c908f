#!/usr/bin/env bash
# The whole `ember run --runtime runsc -- /bin/true` CLI process beside plain
# `runsc run` of a busybox bundle, both timed the same way (wall time of the
# process, from this shell), alternating one run of each so that load drifting
# on a shared machine weighs on both alike. Prints p50/p90 of each and the
# ratio of the medians (issue 19: ≤ 1.5×), with the load average before and
# after. Also times `runsc delete --force` of a running container, the part of
# a removal that is runsc's own.
#
#   EMBER_URL=http://127.0.0.1:8080 benches/runsc_cli.sh [RUNS] [EMBER_BIN]
#
# Needs runsc and busybox-static (scripts/bench-setup.sh) and a running daemon;
# as root. Leaves nothing behind (its bundle dir and containers are removed).
set -euo pipefail

runs="${1:-20}"
ember="${2:-$(dirname "${BASH_SOURCE[0]}")/../target/release/ember}"
command -v runsc >/dev/null || { echo "runsc not found (scripts/bench-setup.sh)" >&2; exit 2; }
[ -x /bin/busybox ] || { echo "/bin/busybox not found (scripts/bench-setup.sh)" >&2; exit 2; }

dir="$(mktemp -d /tmp/ember-runsc-cli.XXXXXX)"
prefix="ember-bench-$$"
# A runsc root of the bench's own: a current runsc pins its gofers' empty
# network namespace at <root>/null-netns for the root's life.
rs() { runsc --root "$dir/root" "$@"; }
cleanup() {
  for c in $(rs list -q 2>/dev/null | grep "^$prefix" || true); do rs delete --force "$c" >/dev/null 2>&1 || true; done
  while umount -l "$dir/root/null-netns" 2>/dev/null; do :; done
  rm -rf "$dir"
}
trap cleanup EXIT

mkdir -p "$dir/rootfs/bin"
cp /bin/busybox "$dir/rootfs/bin/busybox"
for l in true sh sleep; do ln -s busybox "$dir/rootfs/bin/$l"; done
(cd "$dir" && runsc spec -- /bin/true)
# A second bundle whose process stays up, for the delete figure.
mkdir -p "$dir/sleep" && ln -s ../rootfs "$dir/sleep/rootfs"
sed 's#"/bin/true"#"/bin/sleep", "1000"#' "$dir/config.json" >"$dir/sleep/config.json"

ms() { echo "$(( ($2 - $1) / 1000000 ))"; }
now() { date +%s%N; }
ember_t=() runsc_t=() delete_t=()

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 0 "$runs"); do
  t0=$(now); "$ember" run --runtime runsc -- /bin/true >/dev/null; t1=$(now)
  (cd "$dir" && rs --network=none run "$prefix-r$i" >/dev/null); t2=$(now)
  (cd "$dir/sleep" && rs --network=none create "$prefix-s$i" && rs --network=none start "$prefix-s$i")
  t3=$(now); rs --network=none delete --force "$prefix-s$i"; t4=$(now)
  if [ "$i" -gt 0 ]; then # the first pair warms caches and is not counted
    ember_t+=("$(ms "$t0" "$t1")"); runsc_t+=("$(ms "$t1" "$t2")"); delete_t+=("$(ms "$t3" "$t4")")
  fi
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"

pct() { # pct P values... : the P-th percentile (nearest rank)
  local p="$1"; shift
  printf '%s\n' "$@" | sort -n | awk -v p="$p" '{v[NR]=$1} END {i=int((p*NR+99)/100); if (i<1) i=1; print v[i]}'
}
e50=$(pct 50 "${ember_t[@]}"); r50=$(pct 50 "${runsc_t[@]}")
printf '%-52s %8s %8s\n' "$runs runs each, wall ms" p50 p90
printf '%-52s %8s %8s\n' "ember run --runtime runsc -- /bin/true (whole CLI)" "$e50" "$(pct 90 "${ember_t[@]}")"
printf '%-52s %8s %8s\n' "runsc run, busybox bundle, /bin/true (reference)" "$r50" "$(pct 90 "${runsc_t[@]}")"
printf '%-52s %8s %8s\n' "runsc delete --force of a running container" "$(pct 50 "${delete_t[@]}")" "$(pct 90 "${delete_t[@]}")"
awk -v e="$e50" -v r="$r50" 'BEGIN {printf "ember / runsc run at p50: %.2fx (target: <= 1.5x)\n", e / (r > 0 ? r : 1)}'

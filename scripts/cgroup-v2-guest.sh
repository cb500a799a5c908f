#!/usr/bin/env bash
# Runs the cgroup-sensitive tests on a real cgroup v2 kernel: Debian's
# linux-image-amd64, booted under qemu with software emulation (TCG), from an
# initramfs holding busybox-static, the kernel modules ember needs, glibc, the
# `ember` + `ember-agent-static` binaries and the test binaries, all built on
# this host. The guest mounts cgroup2 (every controller, nsdelegate) at
# /sys/fs/cgroup, runs each test with `--exact` and reports on the serial
# console; this script fails if the guest does not boot, if any test fails, or
# if any test did not report.
#
#   scripts/cgroup-v2-guest.sh            build (cached) and run
#   scripts/cgroup-v2-guest.sh --build    build only; prints the initramfs path
#   scripts/cgroup-v2-guest.sh --boot     boot the last build again
#
# $EMBER_GUEST_TESTS (an extended regex) keeps only the matching tests, to
# iterate on one; the stage in scripts/test.sh runs them all.
# Cache (outside the repo): $EMBER_GUEST_CACHE, default /var/cache/ember/cgroup-v2-guest.
# Needs (Debian packages): qemu-system-x86, busybox-static, kmod, cpio, zstd.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
cache=${EMBER_GUEST_CACHE:-/var/cache/ember/cgroup-v2-guest}
target_dir=${CARGO_TARGET_DIR:-$repo/target}

# The tests, as `<package>/<test target> <exact test name>`. Chosen for what
# differs between cgroup v1 and v2: limits, the OOM reason, pids, the freezer,
# cpu weight, the sandbox's cgroup namespace, restart adoption and leftovers.
tests=(
  "ember-cgroups/ember_cgroups v2::tests::limits_are_written_in_v2_syntax_and_read_back"
  "ember-cgroups/host create_attach_freeze_destroy_on_the_real_hierarchy"
  "ember-cgroups/host freeze_returns_once_every_process_is_frozen"
  "ember-cgroups/host cpu_weight_follows_the_cpu_limit"
  "ember-cgroups/host the_group_weight_is_set_on_a_group_not_made_yet"
  "ember-cgroups/host a_freeze_that_cannot_complete_is_undone"
  "ember-runtime/background_launch a_refill_launches_at_the_least_cpu_weight_a_cold_launch_at_the_most_each_set_back_once_up"
  "ember/isolation oom_kill_is_reported_and_the_neighbour_keeps_running"
  "ember/isolation a_sandbox_costs_the_daemon_one_descriptor_and_an_oom_still_ends_only_its_own"
  "ember/isolation the_init_is_born_in_its_cgroups_never_moved_into_them"
  "ember/isolation fork_bomb_is_capped_by_the_pids_limit"
  "ember/isolation a_sandbox_sees_only_its_processes_its_loopback_and_its_hostname"
  "ember/isolation a_sandbox_is_the_root_of_its_cgroup_namespace"
  "ember/isolation pause_freezes_every_process_before_it_answers_and_resume_thaws"
  "ember/isolation removing_a_sandbox_leaves_no_cgroup_mount_namespace_or_process"
  "ember/isolation ttl_expiry_and_entrypoint_exit_end_with_their_reasons"
  "ember/restart kill9_of_the_daemon_then_restart_converges"
  "ember/interactive stats_show_memory_growing_after_the_sandbox_allocates"
  "ember/restart a_graceful_stop_leaves_sandboxes_running_for_the_next_daemon"
  "ember/pools a_restart_re_adopts_the_idle_pool"
  "ember/classes conformance_crun"
  "ember/classes conformance_runc"
  "ember/classes conformance_runsc"
  "ember/classes entrypoint_exit_codes_crun"
  "ember/classes oci_sandboxes_are_readopted_after_a_daemon_restart"
  "ember/workspaces the_size_is_a_quota_and_bad_requests_are_structured"
  "ember/workspaces one_writer_at_a_time_steal_fences_readers_are_free"
  "ember/class_workspaces workspaces_native"
  "ember/class_workspaces workspaces_crun"
)
# runsc runs gVisor on its ptrace platform, which under TCG needs far more than
# the default 10 s for the agent to answer: the guest's init sets
# EMBER_READY_TIMEOUT (`ember serve --ready-timeout`). Left out:
# entrypoint_exit_codes_runc (143-180 s under TCG and no more v2-specific than
# the crun one) and the other runsc tests (the same class path, minutes each).
# The OCI runtimes (Debian's crun, runc and runsc), at the host's paths.
runtimes=(crun runc runsc)
# Host tools the workspace code runs, over busybox's applets of the same name
# (busybox has no mkfs.ext4, and its df has no --output; fsfreeze and truncate
# for ember-cgroups' freeze that cannot complete).
host_tools=(mkfs.ext4 df mount umount fsfreeze truncate)
if [[ -n ${EMBER_GUEST_TESTS:-} ]]; then
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" | grep -E -- "$EMBER_GUEST_TESTS")
  ((${#tests[@]})) || { echo "cgroup-v2-guest: no test matches $EMBER_GUEST_TESTS" >&2; exit 1; }
fi
# Modules the guest loads (with their dependencies, from modules.dep).
# crc32c_generic: ext4's soft dependency (metadata checksums; without it a mount
# fails with ENOENT), which modules.dep does not list.
modules=(virtio_pci overlay loop crc32c_generic ext4)

log() { echo "cgroup-v2-guest: $*" >&2; }

# The kernel and its modules, extracted from the package linux-image-amd64
# depends on (never installed on the host).
kernel() {
  local pkg
  local find='/Depends: linux-image-[0-9]/ {print $2; exit}'
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk "$find")
  # Images often ship without package lists.
  [[ -n $pkg ]] || { apt-get update -qq && pkg=$(apt-cache depends linux-image-amd64 | awk "$find"); }
  [[ -n $pkg ]] || { log "no linux-image package behind linux-image-amd64"; exit 1; }
  kdir=$cache/$pkg
  if [[ ! -e $kdir/done ]]; then
    log "fetching $pkg"
    rm -rf "$kdir" && mkdir -p "$kdir/deb"
    (cd "$kdir/deb" && apt-get download -q "$pkg" >/dev/null) || { log "apt-get download $pkg failed"; exit 1; }
    dpkg-deb -x "$kdir"/deb/*.deb "$kdir/x"
    kver=$(ls "$kdir/x/lib/modules")
    depmod -b "$kdir/x" "$kver"
    cp "$kdir/x/boot/vmlinuz-$kver" "$kdir/vmlinuz"
    touch "$kdir/done"
  fi
  kver=$(ls "$kdir/x/lib/modules")
}

# Module paths in load order: each one's dependencies first (modules.dep lists
# a module's dependencies so that loading them from last to first works).
module_order() {
  local dep=$kdir/x/lib/modules/$kver/modules.dep m line seen=" " f
  for m in "${modules[@]}"; do
    line=$(grep -E "(^|/)${m}\.ko(\.[a-z]+)?:" "$dep") || { log "module $m not in $kver"; exit 1; }
    local all=(${line#*:}) chain=()
    for ((i = ${#all[@]} - 1; i >= 0; i--)); do chain+=("${all[i]}"); done
    chain+=("${line%%:*}")
    for f in "${chain[@]}"; do
      [[ $seen == *" $f "* ]] && continue
      seen+="$f "
      echo "$f"
    done
  done
}

# Builds the binaries and prints `<package>/<target> <executable>` per test target.
binaries() {
  cargo build -q -p ember --bin ember >&2
  cargo test -q -p ember-cgroups -p ember-runtime -p ember --lib --test host --test background_launch --test isolation --test restart --test pools --test classes --test interactive \
    --test workspaces --test class_workspaces \
    --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        pkg = m["manifest_path"].split("/")[-2]  # crates/<name>/Cargo.toml, bins/<name>/Cargo.toml
        print(pkg + "/" + m["target"]["name"], m["executable"])
'
}

# Copies a dynamically linked binary's libraries (and the loader) into the root.
copy_libs() {
  local f
  for f in $(ldd "$1" | grep -o '/[^ ]*'); do
    [[ -e $root$f ]] && continue
    mkdir -p "$root$(dirname "$f")"
    cp -L "$f" "$root$f"
  done
}

build() {
  kernel
  root=$cache/root
  rm -rf "$root" && mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/lib64,etc,proc,sys,dev,run,tmp,root,newroot,tests}
  chmod 1777 "$root/tmp"
  for l in bin sbin lib lib64; do ln -s "usr/$l" "$root/$l"; done
  cp /bin/busybox "$root/usr/bin/busybox"
  for a in $(busybox --list); do [[ -e $root/usr/bin/$a ]] || ln -s busybox "$root/usr/bin/$a"; done
  while read -r m; do
    mkdir -p "$root/modules/$(dirname "$m")"
    cp "$kdir/x/lib/modules/$kver/$m" "$root/modules/$m"
    echo "$m" >>"$root/modules/order"
  done < <(module_order)
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
  printf 'root:x:0:\n' >"$root/etc/group"
  cp /etc/os-release "$root/etc/os-release"
  # `ember serve` builds its registry client at start and needs a CA bundle.
  mkdir -p "$root/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  # Test binaries find `ember` where cargo built it (CARGO_BIN_EXE_ember).
  local map line key exe
  map=$(binaries)
  agent=$(scripts/build-agent.sh | tail -1)
  mkdir -p "$root$target_dir/debug"
  strip --strip-debug -o "$root$target_dir/debug/ember" "$target_dir/debug/ember"
  strip --strip-debug -o "$root/ember-agent-static" "$agent"
  copy_libs "$target_dir/debug/ember"
  for r in "${runtimes[@]}" "${host_tools[@]}"; do
    r=$(command -v "$r") || { log "$r is not installed (.ci/run installs it)"; exit 1; }
    mkdir -p "$root$(dirname "$r")"
    rm -f "$root$r" # a busybox symlink: cp would write through it
    cp "$r" "$root$r"
    ldd "$r" >/dev/null 2>&1 && copy_libs "$r"
  done
  cp /etc/mke2fs.conf "$root/etc/"
  : >"$root/tests/list"
  for line in "${tests[@]}"; do
    key=${line%% *}
    exe=$(awk -v k="$key" '$1 == k {print $2; exit}' <<<"$map")
    [[ -n $exe ]] || { log "no test binary for $key"; exit 1; }
    [[ -e $root/tests/${key//\//.} ]] || { strip --strip-debug -o "$root/tests/${key//\//.}" "$exe"; copy_libs "$exe"; }
    echo "${key//\//.} ${line#* }" >>"$root/tests/list"
  done
  cp scripts/cgroup-v2-guest-init.sh "$root/init"
  chmod 755 "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet) | zstd -q -3 -T0 -f -o "$cache/initrd.zst"
  log "initramfs $(du -h "$cache/initrd.zst" | cut -f1), kernel $kver"
}

boot() {
  local out=$cache/console.log start=$SECONDS
  log "booting $kver under TCG (-m 2G -smp 2)"
  # The guest powers itself off; the timeout only catches a hang.
  # no_timer_check: on a loaded host the emulated IO-APIC timer check fails
  # and the kernel panics at boot ("IO-APIC + timer doesn't work").
  timeout 3000 qemu-system-x86_64 -nographic -accel tcg -m 2G -smp 2 -no-reboot -nic none \
    -kernel "$kdir/vmlinuz" -initrd "$cache/initrd.zst" \
    -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3 no_timer_check" </dev/null | sed -u 's/\r$//' | tee "$out" ||
    log "qemu ended with status ${PIPESTATUS[0]}"
  local want pass fail
  want=${#tests[@]}
  pass=$(grep -c '^CGV2 PASS ' "$out" || true)
  fail=$(grep -c '^CGV2 FAIL ' "$out" || true)
  log "$pass passed, $fail failed, $want expected, $((SECONDS - start)) s"
  grep -E '^CGV2 (PASS|FAIL|TIME) ' "$out" >&2 || true
  grep -q '^CGV2 controllers .*memory' "$out" || { log "the guest did not come up with cgroup v2 controllers"; return 1; }
  ((fail == 0 && pass == want)) || return 1
}

# Each step on its own line: `set -e` does not apply inside a function called
# on the left of `&&` (a failed agent build went on to boot a guest without it).
case ${1:-} in
  --build) build; echo "$cache/initrd.zst" ;;
  --boot) kernel; boot ;;  # the last build, unchanged
  "") build; boot ;;
  *) echo "usage: $0 [--build|--boot]" >&2; exit 2 ;;
esac

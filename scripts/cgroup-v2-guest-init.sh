#!/bin/sh
# PID 1 of the cgroup v2 guest (scripts/cgroup-v2-guest.sh puts it at /init).
# Stage 1 copies the initramfs into a tmpfs and switch_roots into it: a
# sandbox's pivot_root cannot leave the initramfs itself. Stage 2 mounts the
# system, cgroup2 with every controller, loads the modules, runs each test in
# /tests/list and reports `CGV2 PASS|FAIL <binary> <test>` on the console.
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
if [ ! -e /.stage2 ]; then
  mount -t tmpfs -o mode=755,size=1200m tmpfs /newroot
  for e in /*; do
    case $e in /newroot | /proc | /sys | /dev) ;; *) cp -a "$e" /newroot/ ;; esac
  done
  mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/newroot
  touch /newroot/.stage2
  exec switch_root /newroot /init
fi

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o ptmxmode=666 devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
# As systemd mounts it on a unified host: namespaces are delegation boundaries.
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
while read -r m; do insmod "/modules/$m" || echo "CGV2 insmod $m failed"; done </modules/order
ip link set lo up
hostname cgv2-guest
echo "CGV2 kernel $(uname -r)"
echo "CGV2 controllers $(cat /sys/fs/cgroup/cgroup.controllers)"

export HOME=/root RUST_BACKTRACE=1 EMBER_AGENT_BIN=/ember-agent-static
# gVisor (ptrace platform) under TCG takes tens of seconds to get its agent up.
export EMBER_READY_TIMEOUT=300s
cd /tmp
while read -r bin name; do
  echo "CGV2 RUN $bin $name"
  start=$(cut -d. -f1 /proc/uptime)
  # A name no test has any more (one renamed) runs nothing and exits 0:
  # that is a failure, not a pass (`1 passed` must be in the output).
  timeout 900 "/tests/$bin" --exact "$name" --test-threads 1 </dev/null >/tmp/test.out 2>&1
  code=$?
  cat /tmp/test.out
  if [ "$code" -eq 0 ] && grep -q '^test result: ok\. 1 passed' /tmp/test.out; then
    echo "CGV2 PASS $bin $name"
  else
    echo "CGV2 FAIL $bin $name"
  fi
  echo "CGV2 TIME $(($(cut -d. -f1 /proc/uptime) - start)) s $bin $name"
done </tests/list
echo "CGV2 END"
sync
poweroff -f

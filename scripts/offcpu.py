#!/usr/bin/env python3
"""Off-CPU time by stack, from a system-wide sched_switch recording.

    perf record -a -e sched:sched_switch -g -o sw.perf -- COMMAND
    perf script -i sw.perf -F comm,tid,time,trace,ip,sym > sw.txt
    scripts/offcpu.py sw.txt [--skip swapper,kworker,...] [--top 25] [--grep SYMBOL]

Each switch-out of a thread is paired with its next switch-in (recorded
system-wide, so both are seen; `perf record -p` records only one side), and
the time between is summed by (command, state, kernel stack). Sleeps in
epoll, futex, nanosleep, poll, wait, sigsuspend and netlink reads are left out: they are idle threads,
not waits. `--grep SYMBOL` sums the waits whose stack holds SYMBOL by the
frames around the syscall instead, to find the caller.

A pair that spans events perf lost (its "lost" warnings; a larger
`--mmap-pages` helps) counts the whole gap: read a few long waits (small
n, large total) with that in mind.
"""
import argparse
import collections
import re

IDLE = ("epoll_wait", "futex", "nanosleep", "do_poll", "sys_poll", "do_wait", "anon_pipe_read", "sigsuspend", "netlink_recvmsg")
HEAD = re.compile(r"prev_comm=(.+?) prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=(.+?) next_pid=(\d+)")
TIME = re.compile(r"\s*(.+?)\s+(\d+)\s+(\d+\.\d+):")


def frames(lines):
    out = []
    for x in lines:
        parts = x.strip().split(None, 1)
        out.append(parts[1].split("+")[0] if len(parts) > 1 else "?")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("script")
    ap.add_argument("--skip", default="swapper,kworker,rcu,ksoft,perf,migration,kcompactd,kdamond,khugepaged")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--grep")
    a = ap.parse_args()
    skip = tuple(a.skip.split(",")) if a.skip else ()
    pending, total, count = {}, collections.Counter(), collections.Counter()
    for block in open(a.script).read().split("\n\n"):
        lines = block.strip().split("\n")
        t, h = TIME.match(lines[0]), HEAD.search(lines[0])
        if not t or not h:
            continue
        now = float(t.group(3))
        prev, state, nxt = int(h.group(2)), h.group(3), int(h.group(5))
        pending[prev] = (now, h.group(1), state, frames(lines[1:]))
        if nxt not in pending:
            continue
        t0, comm, st, stack = pending.pop(nxt)
        if comm.startswith(skip):
            continue
        if a.grep:
            if a.grep not in stack:
                continue
            i = next((k for k, f in enumerate(stack) if f.startswith("entry_SYSCALL")), 0)
            key = (comm, st, " <- ".join(stack[max(0, i - 3) : i + 7]))
        else:
            text = " <- ".join(stack[1:9])
            if st.startswith("S") and any(w in text for w in IDLE):
                continue
            key = (comm, st, text)
        total[key] += now - t0
        count[key] += 1
    for key, secs in total.most_common(a.top):
        print(f"{secs:8.3f} s  n={count[key]:<6} {key[0]} {key[1]}  {key[2][:300]}")


if __name__ == "__main__":
    main()

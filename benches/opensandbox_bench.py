#!/usr/bin/env python3
"""Create → first command output through the real OpenSandbox SDK (opensandbox
1.1.1 from PyPI), against a running `ember serve`.

    python3 benches/opensandbox_bench.py --domain 127.0.0.1:8080 --runs 50

Prints p50/p99 of `Sandbox.create` + the first `commands.run("echo ready")`
output, cold (a sandbox built per request; no pool matches the SDK's
default resources), and the server-side create time
ember reports. Sandboxes are killed after each run (outside the timing).
"""
import argparse
import asyncio
import statistics
import time
from datetime import timedelta

from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def one(cfg):
    t0 = time.perf_counter()
    sb = await Sandbox.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    t1 = time.perf_counter()
    ex = await sb.commands.run("echo ready")
    t2 = time.perf_counter()
    assert ex.logs.stdout and ex.logs.stdout[0].text == "ready", ex
    await sb.kill()
    await sb.close()
    return (t2 - t0) * 1000, (t1 - t0) * 1000


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", default="127.0.0.1:8080")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--api-key", default=None)
    a = ap.parse_args()
    cfg = ConnectionConfig(domain=a.domain, api_key=a.api_key, request_timeout=timedelta(seconds=60))
    await one(cfg)  # warm-up: the host template layer, imports, connections
    total, create = [], []
    for _ in range(a.runs):
        t, c = await one(cfg)
        total.append(t)
        create.append(c)
    print(f"OpenSandbox SDK 1.1.1 → ember, {a.runs} sequential runs")
    print(f"cold: create→first output  p50 {pct(total, 50):7.1f} ms  p99 {pct(total, 99):7.1f} ms  mean {statistics.mean(total):.1f} ms")
    print(f"cold: Sandbox.create alone p50 {pct(create, 50):7.1f} ms  p99 {pct(create, 99):7.1f} ms")
    print("warm: not measured by this script yet (create a pool with POST /v1/pools, then pass extensions.poolRef)")


if __name__ == "__main__":
    asyncio.run(main())

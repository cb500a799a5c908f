#!/usr/bin/env python3
"""Create → first command output through the real OpenSandbox SDK (opensandbox
1.1.1 from PyPI), against a running `ember serve`.

    python3 benches/opensandbox_bench.py --domain 127.0.0.1:8080 --runs 30

Prints p50/p99 of `Sandbox.create` + the first `commands.run("echo ready")`
output, and of `Sandbox.create` alone, for:

* cold: a sandbox started per request;
* warm: claimed from a pool this script creates (`extensions.poolRef`), the
  pool refilled between runs (outside the timing);

each with the SDK as users call it (`default`) and with the two per-create
costs the SDK adds on the client (`lean`: a shared transport and
`disable_metrics`, see docs/opensandbox.md §Latency), plus what ember itself
spent launching or claiming (`launch.micros` of the sandbox record). Sandboxes
are killed after each run (outside the timing).
"""
import argparse
import asyncio
import statistics
import time
from datetime import timedelta

import httpx
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig

POOL = "sdk-bench"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def config(a, lean):
    extra = {}
    if lean:
        # One transport for every sandbox, and no telemetry client per create.
        extra = {"transport": httpx.AsyncHTTPTransport(), "disable_metrics": True}
    return ConnectionConfig(domain=a.domain, api_key=a.api_key, request_timeout=timedelta(seconds=60), **extra)


async def one(cfg, http, warm):
    ext = {"poolRef": POOL} if warm else None
    t0 = time.perf_counter()
    sb = await Sandbox.create("host", connection_config=cfg, timeout=timedelta(minutes=5), extensions=ext)
    t1 = time.perf_counter()
    ex = await sb.commands.run("echo ready")
    t2 = time.perf_counter()
    assert ex.logs.stdout and ex.logs.stdout[0].text == "ready", ex
    info = (await http.get(f"/v1/sandboxes/{sb.id}")).json()
    launch = info.get("launch") or {}
    assert launch.get("kind") == ("warm" if warm else "cold"), launch
    await sb.kill()
    await sb.close()
    return (t2 - t0) * 1000, (t1 - t0) * 1000, launch.get("micros", 0) / 1000


async def wait_idle(http):
    for _ in range(600):
        if (await http.get(f"/v1/pools/{POOL}")).json().get("idle", 0) >= 1:
            return
        await asyncio.sleep(0.05)
    raise SystemExit("the bench pool did not refill")


async def series(a, http, warm, lean):
    cfg = config(a, lean)
    total, create, server = [], [], []
    for i in range(a.runs + 1):
        if warm:
            await wait_idle(http)
        t, c, s = await one(cfg, http, warm)
        if i > 0:  # the first run warms imports and connections
            total.append(t)
            create.append(c)
            server.append(s)
    kind = "warm" if warm else "cold"
    sdk = "lean" if lean else "default"
    print(
        f"{kind} {sdk:7}  create→first output p50 {pct(total, 50):6.1f} p99 {pct(total, 99):6.1f} ms"
        f" | Sandbox.create p50 {pct(create, 50):6.1f} p99 {pct(create, 99):6.1f} ms"
        f" | ember launch p50 {statistics.median(server):5.1f} ms"
    )


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", default="127.0.0.1:8080")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--skip-warm", action="store_true")
    a = ap.parse_args()
    headers = {"OPEN-SANDBOX-API-KEY": a.api_key} if a.api_key else {}
    async with httpx.AsyncClient(base_url=f"http://{a.domain}", headers=headers, timeout=60) as http:
        print(f"OpenSandbox SDK 1.1.1 → ember at {a.domain}, {a.runs} sequential runs per line")
        await series(a, http, warm=False, lean=False)
        await series(a, http, warm=False, lean=True)
        if a.skip_warm:
            return
        r = await http.post("/v1/pools", json={"name": POOL, "template": "host", "min": 1, "max": 2, "target": 1})
        assert r.status_code in (200, 201), r.text
        try:
            await series(a, http, warm=True, lean=False)
            await series(a, http, warm=True, lean=True)
        finally:
            await http.delete(f"/v1/pools/{POOL}")


if __name__ == "__main__":
    asyncio.run(main())

"""Lifecycle through the real `opensandbox` SDK: create options, renew, list
filters, pause/resume, connect, kill, metadata, diagnostics, egress policy,
host and pvc (workspace) volumes, the proxy for any port, and the not-yet-supported answers."""
import asyncio
import socket
import time
from datetime import datetime, timedelta, timezone

import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.exceptions import SandboxException
from opensandbox.models.sandboxes import PVC, Host, NetworkRule, SandboxFilter, SnapshotFilter, Volume

from helpers import arun, sandbox, stdout


def test_create_with_env_metadata_resources_timeout(ember):
    async def go():
        async with sandbox(
            ember,
            env={"GREETING": "hi there"},
            metadata={"team": "e2e", "case": "create"},
            resource={"cpu": "500m", "memory": "256Mi"},
            timeout=timedelta(minutes=3),
        ) as sb:
            info = await sb.get_info()
            assert info.status.state == "Running"
            assert info.metadata == {"team": "e2e", "case": "create"}
            left = (info.expires_at - datetime.now(timezone.utc)).total_seconds()
            assert 150 < left <= 180, left
            assert stdout(await sb.commands.run("echo $GREETING")) == "hi there\n"
            m = await sb.get_metrics()
            assert m.memory_total_in_mib == 256 and m.cpu_count == 0.5
            # The limits the kernel enforces, read back by ember (not copied from the request).
            with ember.http() as c:
                b = c.get(f"/v1/sandboxes/{sb.id}/boundary").json()
            assert b["memoryLimitBytes"] == 256 << 20 and b["cpuMillis"] == 500

    arun(go())


def test_manual_cleanup_has_no_expiry_and_cannot_be_renewed(ember):
    async def go():
        sb = await Sandbox.create("host", connection_config=ember.config(), timeout=None)
        try:
            info = await sb.get_info()
            assert info.expires_at is None
            with pytest.raises(SandboxException) as e:
                await sb.renew(timedelta(minutes=5))
            assert "409" in str(e.value) or "NO_EXPIRATION" in str(e.value)
        finally:
            await sb.kill()
            await sb.close()

    arun(go())


def test_renew(ember):
    async def go():
        async with sandbox(ember, timeout=timedelta(minutes=2)) as sb:
            before = (await sb.get_info()).expires_at
            resp = await sb.renew(timedelta(minutes=30))
            after = (await sb.get_info()).expires_at
            assert after > before + timedelta(minutes=20)
            assert abs((resp.expires_at - after).total_seconds()) < 1

    arun(go())


def test_list_with_filters_and_metadata_patch(ember):
    async def go():
        async with sandbox(ember, metadata={"suite": "list", "n": "1"}) as a, sandbox(
            ember, metadata={"suite": "list", "n": "2"}
        ) as b:
            mgr = await SandboxManager.create(connection_config=ember.config())
            try:
                both = await mgr.list_sandbox_infos(SandboxFilter(metadata={"suite": "list"}))
                assert {s.id for s in both.sandbox_infos} == {a.id, b.id}
                one = await mgr.list_sandbox_infos(SandboxFilter(metadata={"suite": "list", "n": "2"}))
                assert [s.id for s in one.sandbox_infos] == [b.id]
                await a.pause()
                paused = await mgr.list_sandbox_infos(SandboxFilter(states=["Paused"], metadata={"suite": "list"}))
                assert [s.id for s in paused.sandbox_infos] == [a.id]
                either = await mgr.list_sandbox_infos(
                    SandboxFilter(states=["Paused", "Running"], metadata={"suite": "list"})
                )
                assert len(either.sandbox_infos) == 2
                page = await mgr.list_sandbox_infos(SandboxFilter(metadata={"suite": "list"}, page_size=1, page=2))
                assert len(page.sandbox_infos) == 1 and page.pagination.total_items == 2
                patched = await b.patch_metadata({"n": None, "owner": "me"})
                assert patched.metadata == {"suite": "list", "owner": "me"}
            finally:
                await mgr.close()

    arun(go())


def test_pause_resume_keeps_processes(ember):
    async def go():
        async with sandbox(ember) as sb:
            await sb.commands.run("echo kept > /tmp/state; sleep 1000 &")
            await sb.pause()
            mgr = await SandboxManager.create(connection_config=ember.config())
            try:
                assert (await mgr.get_sandbox_info(sb.id)).status.state == "Paused"
            finally:
                await mgr.close()
            resumed = await Sandbox.resume(sb.id, connection_config=ember.config())
            try:
                assert (await resumed.get_info()).status.state == "Running"
                ex = await resumed.commands.run("cat /tmp/state; pgrep -c sleep")
                assert stdout(ex) == "kept\n1\n"
            finally:
                await resumed.close()

    arun(go())


def test_connect_to_existing_and_kill(ember):
    async def go():
        sb = await Sandbox.create("host", connection_config=ember.config())
        await sb.files.write_file("/tmp/mark", "from the first client")
        other = await Sandbox.connect(sb.id, connection_config=ember.config())
        assert await other.files.read_file("/tmp/mark") == "from the first client"
        await other.kill()
        await other.close()
        await sb.close()
        mgr = await SandboxManager.create(connection_config=ember.config())
        try:
            with pytest.raises(SandboxException):
                await mgr.get_sandbox_info(sb.id)
            with pytest.raises(SandboxException):
                await Sandbox.connect(sb.id, connection_config=ember.config())
        finally:
            await mgr.close()

    arun(go())


def test_diagnostics_logs_and_events(ember):
    async def go():
        async with sandbox(ember) as sb:
            await sb.pause()
            resumed = await Sandbox.resume(sb.id, connection_config=ember.config())
            await resumed.close()
            ev = await sb.get_diagnostic_events("lifecycle")
            text = ev.content
            assert "Pending" in text and "Running" in text and "Paused" in text, text
            logs = await sb.get_diagnostic_logs("container")
            assert logs.kind == "logs" and logs.delivery == "inline"

    arun(go())


def test_egress_policy_is_enforced_and_reported_honestly(ember):
    async def go():
        from opensandbox.models.sandboxes import NetworkPolicy

        policy = NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="pypi.org")])
        async with sandbox(ember, network_policy=policy) as sb:
            got = await sb.get_egress_policy()
            assert got.default_action == "deny" and [(r.action, r.target) for r in got.egress] == [("allow", "pypi.org")]
            await sb.patch_egress_rules([NetworkRule(action="deny", target="pypi.org"), NetworkRule(action="allow", target="*.example.com")])
            got = await sb.get_egress_policy()
            assert [(r.action, r.target) for r in got.egress] == [("deny", "pypi.org"), ("allow", "*.example.com")]
            await sb.delete_egress_rules(["pypi.org"])
            assert [r.target for r in (await sb.get_egress_policy()).egress] == ["*.example.com"]
            # The policy implied egress networking, and it is enforced.
            with ember.http() as c:
                raw = c.get(f"/v1/sandboxes/{sb.id}/proxy/18080/policy").json()
                native = c.get(f"/v1/sandboxes/{sb.id}/network").json()
            assert raw["enforcementMode"] == "dns+nft" and raw["mode"] == "deny_with_rules"
            assert native["network"] == "egress" and [r["target"] for r in native["egress"]] == ["*.example.com"]
            ex = await sb.commands.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort")
            assert stdout(ex) == "eth0\nlo\n"
        # Without a policy a sandbox still has loopback only, and says so.
        async with sandbox(ember) as sb:
            with ember.http() as c:
                raw = c.get(f"/v1/sandboxes/{sb.id}/proxy/18080/policy").json()
            assert raw["enforcementMode"] == "none"
            ex = await sb.commands.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
            assert stdout(ex) == "lo\n"

    arun(go())


def test_host_volume_under_the_allow_list(ember):
    async def go():
        if ember.api_key:
            # Under a tenant key: the host paths are every tenant's, so a host
            # volume is the admin's (docs/tenancy.md, "Host volumes are the admin's").
            vol = Volume(name="data", host=Host(path=str(ember.host_dir)), mount_path="/mnt/data")
            with pytest.raises(SandboxException) as e:
                await Sandbox.create("host", connection_config=ember.config(), volumes=[vol])
            assert "host volume needs the admin key" in str(e.value)
            return
        (ember.host_dir / "in.txt").write_text("from the host\n")
        vol = Volume(name="data", host=Host(path=str(ember.host_dir)), mount_path="/mnt/data", read_only=False)
        async with sandbox(ember, volumes=[vol]) as sb:
            ex = await sb.commands.run("cat /mnt/data/in.txt && echo from the sandbox > /mnt/data/out.txt")
            assert ex.exit_code == 0 and stdout(ex) == "from the host\n"
        assert (ember.host_dir / "out.txt").read_text() == "from the sandbox\n"
        ro = Volume(name="ro", host=Host(path=str(ember.host_dir)), mount_path="/ro", read_only=True)
        async with sandbox(ember, volumes=[ro]) as sb:
            ex = await sb.commands.run("echo x > /ro/nope")
            assert ex.exit_code != 0
        outside = Volume(name="etc", host=Host(path="/etc"), mount_path="/hostetc")
        with pytest.raises(SandboxException) as e:
            await Sandbox.create("host", connection_config=ember.config(), volumes=[outside])
        assert "allowed host path" in str(e.value)

    arun(go())


def test_pvc_volume_is_an_ember_workspace(ember):
    async def go():
        vol = Volume(name="state", pvc=PVC(claim_name="e2e-pvc", storage="64Mi"), mount_path="/mnt/state")
        async with sandbox(ember, volumes=[vol]) as sb:
            ex = await sb.commands.run("echo first > /mnt/state/log && df -m /mnt/state | tail -1")
            assert ex.exit_code == 0, ex
        with ember.http() as c:
            ws = c.get("/v1/workspaces/e2e-pvc").json()
            assert ws["sizeBytes"] == 64 << 20, ws
        # An existing claim, read-only this time: the data outlived the sandbox.
        ro = Volume(
            name="state", pvc=PVC(claim_name="e2e-pvc", create_if_not_exists=False), mount_path="/in", read_only=True
        )
        async with sandbox(ember, volumes=[ro]) as sb:
            ex = await sb.commands.run("cat /in/log; echo x > /in/nope")
            assert stdout(ex).startswith("first\n") and ex.exit_code != 0
        missing = Volume(name="m", pvc=PVC(claim_name="e2e-none", create_if_not_exists=False), mount_path="/m")
        with pytest.raises(SandboxException) as e:
            await Sandbox.create("host", connection_config=ember.config(), volumes=[missing])
        assert "e2e-none" in str(e.value)
        sub = Volume(name="s", pvc=PVC(claim_name="e2e-pvc"), mount_path="/s", sub_path="a")
        with pytest.raises(SandboxException) as e:
            await Sandbox.create("host", connection_config=ember.config(), volumes=[sub])
        assert "subPath" in str(e.value)

    arun(go())


async def _serve_in_sandbox(sb, port, script):
    await sb.files.write_file(f"/tmp/server{port}.py", script)
    return await sb.commands.run(f"python3 /tmp/server{port}.py {port}", opts=_bg())


def _bg():
    from opensandbox.models.execd import RunCommandOpts

    return RunCommandOpts(background=True)


HTTP_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from port %s path %s" % (sys.argv[1], self.path)).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

# A minimal upgrade endpoint: answers 101, then echoes bytes upper-cased.
UPGRADE_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
while True:
    c, _ = s.accept(); buf = b""
    while b"\\r\\n\\r\\n" not in buf:
        d = c.recv(4096)
        if not d: break  # a readiness probe: connect and close
        buf += d
    if b"\\r\\n\\r\\n" not in buf:
        c.close(); continue
    c.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: echo\\r\\nConnection: Upgrade\\r\\n\\r\\n")
    while True:
        d = c.recv(4096)
        if not d: break
        c.sendall(d.upper())
    c.close()
"""


async def _wait_port(sb, port):
    for _ in range(100):
        ex = await sb.commands.run(f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'")
        if ex.exit_code == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} in the sandbox")


def test_proxy_reaches_any_port_http_and_upgrade(ember):
    async def go():
        async with sandbox(ember) as sb:
            await _serve_in_sandbox(sb, 8000, HTTP_SERVER)
            await _serve_in_sandbox(sb, 9000, UPGRADE_SERVER)
            await _wait_port(sb, 8000)
            await _wait_port(sb, 9000)
            ep = await sb.get_endpoint(8000)
            with ember.http() as c:
                r = c.get(f"http://{ep.endpoint}/some/path?q=1")
            assert r.status_code == 200 and r.text == "hello from port 8000 path /some/path?q=1"
            # An upgraded connection is spliced through daemon → agent → port.
            host, port = ember.domain.split(":")
            with socket.create_connection((host, int(port)), timeout=10) as s:
                auth = f"OPEN-SANDBOX-API-KEY: {ember.api_key}\r\n" if ember.api_key else ""
                s.sendall(
                    f"GET /v1/sandboxes/{sb.id}/proxy/9000/ws HTTP/1.1\r\nHost: {ember.domain}\r\n{auth}"
                    "Connection: Upgrade\r\nUpgrade: echo\r\n\r\n".encode()
                )
                head = b""
                while b"\r\n\r\n" not in head:
                    head += s.recv(4096)
                assert head.startswith(b"HTTP/1.1 101"), head
                s.sendall(b"ping through the proxy")
                got = b""
                deadline = time.time() + 10
                while len(got) < 22 and time.time() < deadline:
                    got += s.recv(4096)
                assert got == b"PING THROUGH THE PROXY"
            with ember.http() as c:
                r = c.get(f"/v1/sandboxes/{sb.id}/proxy/8001/x")
            assert r.status_code == 502 and set(r.json()) == {"code", "message"}

    arun(go())


def test_wire_details_and_unsupported_answers(ember):
    async def go():
        async with sandbox(ember) as sb:
            with ember.http() as c:
                r = c.get(f"/v1/sandboxes/{sb.id}", headers={"X-Request-ID": "e2e-rid-1"})
                assert r.headers["x-request-id"] == "e2e-rid-1" and "entrypoint" in r.json()
                assert c.get(f"/sandboxes/{sb.id}").status_code == 200  # bare path
                assert c.get("/health").json() == {"status": "healthy"}
                assert "version" in c.get("/version").json()
                r = c.post("/v1/sandboxes/nope/snapshots", json={})
                assert r.status_code == 404 and set(r.json()) == {"code", "message"}, r.text
                r = c.post("/v1/sandboxes", json={"image": {"uri": "host"}, "entrypoint": ["sleep", "1"], "extensions": {"poolRef": "no-such-pool"}})
                assert r.status_code in (400, 404) and set(r.json()) == {"code", "message"}, r.text
                r = c.get("/v1/sandboxes/nope", headers={"X-Request-ID": "e2e-rid-2"})
                assert r.status_code == 404 and r.headers["x-request-id"] == "e2e-rid-2"
                assert set(r.json()) == {"code", "message"}
            await sb.pause()
            # A snapshot takes a freeze of its own: a paused sandbox is
            # snapshotted, and stays paused after it.
            await sb.create_snapshot("of-paused")
            with ember.http() as c:
                assert c.get(f"/v1/sandboxes/{sb.id}").json()["status"]["state"] == "Paused"

    arun(go())


def test_snapshot_and_restore(ember):
    async def go():
        async with sandbox(ember) as sb:
            await sb.files.write_file("/tmp/snap", "state")
            snap = await sb.create_snapshot("s1")
            source = sb.id
        assert snap.status.state == "Ready" and snap.sandbox_id == source and snap.name == "s1"
        restored = await Sandbox.create(snapshot_id=snap.id, connection_config=ember.config())
        mgr = await SandboxManager.create(connection_config=ember.config())
        try:
            assert await restored.files.read_file("/tmp/snap") == "state"
            assert (await mgr.get_snapshot(snap.id)).id == snap.id
            page = await mgr.list_snapshots(SnapshotFilter(sandbox_id=source, states=["Ready"]))
            assert [s.id for s in page.snapshot_infos] == [snap.id]
            await mgr.delete_snapshot(snap.id)
            with pytest.raises(SandboxException):
                await mgr.get_snapshot(snap.id)
        finally:
            await restored.kill()
            await restored.close()
            await mgr.close()

    arun(go())

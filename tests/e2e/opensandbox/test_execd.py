"""execd through the real `opensandbox` SDK: commands (foreground, failing,
argv with cwd and envs, background with status and logs, interrupt), every
file operation, identity-scoped files, sessions, metrics, set_env, and the PTY WebSocket (raw)."""
import asyncio
from datetime import timedelta

import pytest
from opensandbox.exceptions import SandboxException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)

from helpers import arun, sandbox, stdout


def test_commands_foreground_failing_argv(ember):
    async def go():
        async with sandbox(ember) as sb:
            ex = await sb.commands.run("echo hello; echo world; echo oops >&2")
            assert ex.exit_code == 0 and stdout(ex) == "hello\nworld\n"
            assert [m.text for m in ex.logs.stderr] == ["oops"]
            assert ex.id
            ex = await sb.commands.run("echo partial; exit 3")
            assert ex.exit_code == 3 and ex.error.value == "3" and stdout(ex) == "partial\n"
            opts = RunCommandOpts(working_directory="/tmp", envs={"X": "from envs"}, timeout=timedelta(seconds=30))
            ex = await sb.commands.run(["python3", "-c", "import os; print(os.getcwd(), os.environ['X'])"], opts=opts)
            assert ex.exit_code == 0 and stdout(ex) == "/tmp from envs\n"
            ex = await sb.commands.run(["id", "-u"], opts=RunCommandOpts(uid=0))
            assert stdout(ex) == "0\n"
            ex = await sb.commands.run(["id", "-u"])
            assert stdout(ex) == "1000\n"

    arun(go())


def test_background_status_logs_and_interrupt(ember):
    async def go():
        async with sandbox(ember) as sb:
            ex = await sb.commands.run("for i in 1 2 3; do echo line$i; done; sleep 0.3; exit 4", opts=RunCommandOpts(background=True))
            for _ in range(100):
                st = await sb.commands.get_command_status(ex.id)
                if not st.running:
                    break
                await asyncio.sleep(0.05)
            assert st.running is False and st.exit_code == 4
            logs = await sb.commands.get_background_command_logs(ex.id)
            assert logs.content == "line1\nline2\nline3\n"
            again = await sb.commands.get_background_command_logs(ex.id, cursor=logs.cursor)
            assert again.content == ""

            long = await sb.commands.run("sleep 300", opts=RunCommandOpts(background=True))
            assert (await sb.commands.get_command_status(long.id)).running is True
            await sb.commands.interrupt(long.id)
            for _ in range(100):
                st = await sb.commands.get_command_status(long.id)
                if not st.running:
                    break
                await asyncio.sleep(0.05)
            assert st.running is False and st.exit_code != 0

    arun(go())


def test_every_file_operation(ember):
    async def go():
        async with sandbox(ember) as sb:
            f = sb.files
            await f.write_file("/tmp/e2e/a.txt", "alpha\nbeta\ngamma\n", mode=644)
            await f.write_files([WriteEntry(path="/tmp/e2e/sub/b.bin", data=b"\x00\x01\x02", mode=600)])
            assert await f.read_file("/tmp/e2e/a.txt") == "alpha\nbeta\ngamma\n"
            assert await f.read_bytes("/tmp/e2e/sub/b.bin") == b"\x00\x01\x02"
            info = await f.get_file_info(["/tmp/e2e/a.txt", "/tmp/e2e/sub"])
            assert info["/tmp/e2e/a.txt"].size == 17 and info["/tmp/e2e/a.txt"].mode == 644
            assert info["/tmp/e2e/a.txt"].owner == "sandbox"
            await f.create_directories([WriteEntry(path="/tmp/e2e/made/deep", mode=700)])
            listed = await f.list_directory(__import__("opensandbox.models.filesystem", fromlist=["x"]).DirectoryListEntry(path="/tmp/e2e", depth=1))
            assert {e.path for e in listed} == {"/tmp/e2e/a.txt", "/tmp/e2e/sub", "/tmp/e2e/made"}
            found = await f.search(SearchEntry(path="/tmp/e2e", pattern="*.bin"))
            assert [e.path for e in found] == ["/tmp/e2e/sub/b.bin"]
            await f.set_permissions([SetPermissionEntry(path="/tmp/e2e/a.txt", mode=600)])
            assert (await f.get_file_info(["/tmp/e2e/a.txt"]))["/tmp/e2e/a.txt"].mode == 600
            await f.replace_contents([ContentReplaceEntry(path="/tmp/e2e/a.txt", old_content="beta", new_content="BETA")])
            assert "BETA" in await f.read_file("/tmp/e2e/a.txt")
            await f.move_files([MoveEntry(src="/tmp/e2e/a.txt", dest="/tmp/e2e/made/a.txt")])
            assert await f.read_file("/tmp/e2e/made/a.txt") == "alpha\nBETA\ngamma\n"
            await f.delete_files(["/tmp/e2e/made/a.txt"])
            with pytest.raises(SandboxException):
                await f.read_file("/tmp/e2e/made/a.txt")
            await f.delete_directories(["/tmp/e2e"])
            ex = await sb.commands.run("test -e /tmp/e2e || echo gone")
            assert stdout(ex) == "gone\n"

    arun(go())


def test_identity_scoped_files(ember):
    async def go():
        async with sandbox(ember) as sb:
            as_user = sb.files_with_identity(1000, 1000)
            await as_user.write_file("/home/sandbox/mine.txt", "user file")
            info = await sb.files.get_file_info(["/home/sandbox/mine.txt"])
            assert info["/home/sandbox/mine.txt"].owner == "sandbox"
            with pytest.raises(SandboxException):
                await as_user.write_file("/root/not-mine.txt", "denied")
            with pytest.raises(SandboxException):
                await as_user.read_file("/root/.profile-nope")
            as_root = sb.files_with_identity(0, 0)
            await as_root.write_file("/root/admin.txt", "root file")
            assert (await sb.files.get_file_info(["/root/admin.txt"]))["/root/admin.txt"].owner == "root"

    arun(go())


def test_sessions_keep_cwd_and_exported_vars(ember):
    async def go():
        async with sandbox(ember) as sb:
            sid = await sb.commands.create_session(working_directory="/tmp")
            ex = await sb.commands.run_in_session(sid, "pwd; mkdir -p work && cd work && export STAGE=two")
            assert stdout(ex) == "/tmp\n"
            ex = await sb.commands.run_in_session(sid, 'echo "$PWD $STAGE"')
            assert stdout(ex) == "/tmp/work two\n"
            ex = await sb.commands.run_in_session(sid, "false")
            assert ex.exit_code == 1
            other = await sb.commands.create_session()
            ex = await sb.commands.run_in_session(other, 'echo "${STAGE:-unset}"')
            assert stdout(ex) == "unset\n"
            await sb.commands.delete_session(sid)
            with pytest.raises(SandboxException):
                await sb.commands.run_in_session(sid, "true")

    arun(go())


def test_set_env_and_metrics(ember):
    async def go():
        async with sandbox(ember, resource={"cpu": "1", "memory": "512Mi"}) as sb:
            m = await sb.get_metrics()
            assert m.cpu_count == 1 and m.memory_total_in_mib == 512 and 0 < m.memory_used_in_mib < 512
            await sb.commands.set_env("SET_BY_SDK", "it's here")
            assert stdout(await sb.commands.run("echo $SET_BY_SDK")) == "it's here\n"

    arun(go())


def _ws_connect(url: str, path: str, api_key: str | None = None):
    """A minimal RFC 6455 client (the venv has no WebSocket package): the
    handshake, masked client frames, unfragmented server frames."""
    import base64
    import os
    import socket

    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    auth = f"OPEN-SANDBOX-API-KEY: {api_key}\r\n" if api_key else ""
    s.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n{auth}"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    return s, int(head.split(b" ")[1])


def _ws_send(s, opcode: int, payload: bytes):
    import os
    import struct

    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n))
    s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def _ws_recv(s):
    import struct

    def exact(n):
        b = b""
        while len(b) < n:
            chunk = s.recv(n - len(b))
            if not chunk:
                raise EOFError
            b += chunk
        return b

    b0, b1 = exact(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", exact(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", exact(8))[0]
    return b0 & 0x0F, exact(n)


def test_pty_websocket_through_the_proxy(ember):
    """execd's PTY API (no SDK wrapper): a real terminal over the daemon's proxy."""
    import json

    async def go():
        async with sandbox(ember) as sb:
            base = f"/v1/sandboxes/{sb.id}/proxy/44772"
            with ember.http() as c:
                r = c.post(f"{base}/pty", json={"cwd": "/tmp/e2e-pty"})
                assert r.status_code == 201, r.text
                sid = r.json()["session_id"]
            s, status = _ws_connect(ember.url, f"{base}/pty/{sid}/ws", ember.api_key)
            assert status == 101
            _ws_send(s, 2, b"\x00echo pty-$((6*7)); tty; exit 4\n")
            out, exit_code = "", None
            while exit_code is None:
                op, data = _ws_recv(s)
                if op == 2 and data[:1] == b"\x01":
                    out += data[1:].decode(errors="replace")
                elif op == 1 and json.loads(data).get("type") == "exit":
                    exit_code = json.loads(data)["exit_code"]
                elif op == 8:
                    break
            s.close()
            assert exit_code == 4, out
            assert "pty-42" in out and "/dev/pts/" in out, out
            with ember.http() as c:
                st = c.get(f"{base}/pty/{sid}").json()
                assert st["running"] is False and st["output_offset"] > 0
                assert c.delete(f"{base}/pty/{sid}").status_code == 200

    arun(go())

"""`opensandbox-cli` (the `osb` command, PyPI) against ember: a config file
naming the daemon, then create, list, get, health, metrics, endpoint, command
run (foreground, background + status + logs, sessions), file write/cat/
upload/download/search/info/mv/rm, pause/resume, renew, diagnostics, kill;
every answer read back as JSON (or raw) and checked."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _osb():
    exe = shutil.which("osb", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("osb is not installed in this venv (pip install opensandbox-cli)", pytrace=False)
    return exe


class Osb:
    def __init__(self, ember, tmp: Path):
        self.config = tmp / "osb.toml"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
        self.env["HOME"] = str(tmp)  # nothing read from, or written to, the caller's ~/.opensandbox
        self.run("config", "init")
        self.run("config", "set", "connection.domain", ember.domain)
        self.run("config", "set", "connection.protocol", "http")

    def run(self, *args, check=True, input=None):
        p = subprocess.run(
            [_osb(), "--config", str(self.config), *args],
            env=self.env, capture_output=True, text=True, timeout=120, input=input,
        )
        if check and p.returncode != 0:
            raise AssertionError(f"osb {' '.join(args)} exited {p.returncode}: {p.stdout}\n{p.stderr}")
        return p

    @staticmethod
    def _with_format(args, fmt):
        """`-o FMT` among the options, before a `--` that starts a command."""
        cut = args.index("--") if "--" in args else len(args)
        return (*args[:cut], "-o", fmt, *args[cut:])

    def json(self, *args):
        return json.loads(self.run(*self._with_format(args, "json")).stdout)

    def raw(self, *args):
        return self.run(*self._with_format(args, "raw")).stdout


def test_cli_lifecycle_commands_files(ember, tmp_path):
    osb = Osb(ember, tmp_path)
    assert osb.json("config", "show")["domain"] == ember.domain
    created = osb.json("sandbox", "create", "--image", "host", "--timeout", "10m", "-e", "WHO=cli", "-m", "suite=cli")
    sid = created["id"]
    try:
        got = osb.json("sandbox", "get", sid)
        assert got["id"] == sid and got["status"]["state"] == "Running"
        assert got["metadata"]["suite"] == "cli"
        listed = osb.json("sandbox", "list", "--state", "running", "-m", "suite=cli")
        items = listed["items"] if isinstance(listed, dict) else listed
        assert [s["id"] for s in items] == [sid]
        assert osb.json("sandbox", "health", sid)["healthy"] is True
        metrics = osb.json("sandbox", "metrics", sid)
        assert metrics["cpu_count"] > 0 and metrics["memory_total_in_mib"] > 0
        ep = osb.json("sandbox", "endpoint", sid, "--port", "8080")
        assert f"/sandboxes/{sid}/proxy/8080" in ep["endpoint"]

        # One line: osb writes each output message as is, and execd's messages
        # are lines without their newline (upstream's execd does the same).
        assert osb.raw("command", "run", sid, "--", "sh", "-c", "echo $WHO-$(id -u)") == "cli-1000\n"
        failed = osb.run("command", "run", sid, "-o", "raw", "--", "sh", "-c", "exit 3", check=False)
        assert failed.returncode != 0
        bg = osb.json("command", "run", sid, "--background", "--", "sh", "-c", "echo done-bg")
        eid = bg["id"] if "id" in bg else bg["execution_id"]
        for _ in range(100):
            st = osb.json("command", "status", sid, eid)
            if not st["running"]:
                break
        assert st["running"] is False and st["exit_code"] == 0
        assert osb.json("command", "logs", sid, eid)["content"] == "done-bg\n"
        session = osb.json("command", "session", "create", sid, "--workdir", "/tmp")
        ses = session["session_id"] if "session_id" in session else session["id"]
        osb.raw("command", "session", "run", sid, ses, "--", "export", "FOO=bar")
        assert osb.raw("command", "session", "run", sid, ses, "--", "sh", "-c", "echo $FOO $(pwd)") == "bar /tmp\n"
        osb.json("command", "session", "delete", sid, ses)

        osb.json("file", "write", sid, "/tmp/cli/hello.txt", "-c", "hello from osb\n")
        assert osb.raw("file", "cat", sid, "/tmp/cli/hello.txt") == "hello from osb\n"
        local = tmp_path / "up.bin"
        local.write_bytes(bytes(range(256)) * 64)
        osb.json("file", "upload", sid, str(local), "/tmp/cli/up.bin")
        osb.json("file", "download", sid, "/tmp/cli/up.bin", str(tmp_path / "down.bin"))
        assert (tmp_path / "down.bin").read_bytes() == local.read_bytes()
        found = osb.json("file", "search", sid, "/tmp/cli", "--pattern", "*.txt")
        assert [f["path"] for f in found] == ["/tmp/cli/hello.txt"]
        info = osb.json("file", "info", sid, "/tmp/cli/up.bin")
        assert [(i["path"], i["size"], i["owner"]) for i in info] == [("/tmp/cli/up.bin", 256 * 64, "sandbox")]
        osb.json("file", "mv", sid, "/tmp/cli/hello.txt", "/tmp/cli/moved.txt")
        osb.json("file", "rm", sid, "/tmp/cli/moved.txt")
        assert osb.raw("command", "run", sid, "--", "ls", "/tmp/cli") == "up.bin\n"

        osb.json("sandbox", "pause", sid)
        assert osb.json("sandbox", "get", sid)["status"]["state"] == "Paused"
        osb.json("sandbox", "resume", sid)
        assert osb.raw("command", "run", sid, "--", "echo", "back") == "back\n"
        osb.json("sandbox", "renew", sid, "--timeout", "30m")
        osb.run("diagnostics", "events", sid, "--scope", "lifecycle", "-o", "raw")
    finally:
        osb.json("sandbox", "kill", sid)
    with ember.http() as c:
        assert c.get(f"/v1/sandboxes/{sid}").status_code == 404
    missing = osb.run("sandbox", "get", "no-such-sandbox", "-o", "json", check=False)
    assert missing.returncode != 0 and "NOT_FOUND" in missing.stdout + missing.stderr

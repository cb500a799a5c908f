"""End-to-end fixtures: a real `ember serve` on 127.0.0.1:<free port>, with its
own data dir, cgroup parent and host-volume allow-list, driven through the real
OpenSandbox SDKs from PyPI (opensandbox 1.1.1, opensandbox-code-interpreter,
opensandbox-mcp). Run as root: the daemon creates real sandboxes.

Binaries: $EMBER_BIN (default $CARGO_TARGET_DIR/debug/ember) and
$EMBER_AGENT_BIN (default .../ember-agent-static, from scripts/build-agent.sh).

With $EMBER_E2E_NATS_SERVER (a nats-server binary, scripts/nats-server.sh) the
suite runs against a cluster instead (docs/cluster.md): one NATS server, the
daemon above as node `worker`, and an `--api-only` node `front` that the SDKs
talk to, so every call reaches its sandbox through a node that does not own it.

With $EMBER_E2E_TENANT=1 the daemon has an admin key and the SDKs use the key
of a tenant made for the run (docs/tenancy.md): the suite under a tenant key.
"""
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from opensandbox.config import ConnectionConfig

REPO = Path(__file__).resolve().parents[3]


def _binary(env: str, name: str) -> str:
    if os.environ.get(env):
        return os.environ[env]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: build it (scripts/test.sh does) or set ${env}", pytrace=False)
    return str(path)


@dataclass
class Ember:
    url: str
    domain: str
    host_dir: Path
    data_dir: Path
    api_key: str | None = None

    def config(self) -> ConnectionConfig:
        # A fresh config per event loop: the SDK binds its transport to one.
        return ConnectionConfig(domain=self.domain, api_key=self.api_key, request_timeout=timedelta(seconds=60))

    def http(self) -> httpx.Client:
        headers = {"OPEN-SANDBOX-API-KEY": self.api_key} if self.api_key else {}
        return httpx.Client(base_url=self.url, timeout=30, headers=headers)


def _remove_network(net_tag, resolver):
    """Slots, table and resolver address of the daemon's egress networking
    outlive it by design, like its sandboxes."""
    for d in ("/run/netns", "/sys/class/net"):
        for p in Path(d).glob(f"{net_tag}-*"):
            subprocess.run(["ip", "link", "del", p.name], capture_output=True)
            subprocess.run(["ip", "netns", "del", p.name], capture_output=True)
    subprocess.run(["nft", "delete", "table", "inet", net_tag], capture_output=True)
    subprocess.run(["ip", "addr", "del", resolver, "dev", "lo"], capture_output=True)


def _listening(proc) -> str:
    line = proc.stdout.readline().strip()
    assert line.startswith("ember listening on http://"), f"unexpected first line {line!r}"
    return line.removeprefix("ember listening on ")


def _nats(tag):
    """One JetStream server on a free loopback port: (process, url, store dir)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = Path(tempfile.mkdtemp(prefix=f"{tag}-nats-"))
    proc = subprocess.Popen(
        [os.environ["EMBER_E2E_NATS_SERVER"], "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, f"nats://127.0.0.1:{port}", store


def _cluster_key(tag) -> Path:
    """The cluster's manifest key: every node signs and checks the snapshots
    of the cluster's shared store with it (serve refuses --cluster without)."""
    key = Path(tempfile.mkdtemp(prefix=f"{tag}-key-")) / "snapshot.key"
    key.write_text(secrets.token_hex(32) + "\n")
    os.chmod(key, 0o600)
    return key


def _front(tag, nats, key):
    """The API-only node the SDKs talk to: (process, url, data dir)."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"{tag}-front-"))
    os.chmod(data_dir, 0o755)
    proc = subprocess.Popen(
        [
            _binary("EMBER_BIN", "ember"), "serve", "--cluster", nats[1], "--node", "front", "--api-only",
            "--snapshot-key-file", str(key),
            "--listen", "127.0.0.1:0",
            "--data-dir", str(data_dir),
            "--cgroup-parent", f"{tag}-front",
            "--agent", _binary("EMBER_AGENT_BIN", "ember-agent-static"),
            "--network-range", "none",
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "EMBER_LOG": "warn"},
        text=True,
    )
    return proc, _listening(proc), data_dir


def _unmount_under(root: Path) -> None:
    """Unmounts every mount below `root`, deepest first (lazily: a loop
    device is released once its last user is gone)."""
    prefix = str(root).rstrip("/") + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    # /proc/mounts escapes spaces and the like as octal; these paths have none.
    for p in sorted((p for p in points if p.startswith(prefix)), key=lambda p: -p.count("/")):
        subprocess.run(["umount", "-l", p], capture_output=True)


def stop_daemon(proc, tag) -> None:
    """SIGTERM (then SIGKILL) to a daemon, and its cgroup parent `tag`
    removed, deepest first (its sandboxes were removed through the API)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    for root in Path("/sys/fs/cgroup").glob(f"*/{tag}"):
        for d in sorted(root.glob("**/"), key=lambda p: -len(p.parts)):
            try:
                d.rmdir()
            except OSError:
                pass


@pytest.fixture(scope="session")
def ember():
    if os.geteuid() != 0:
        pytest.fail("the OpenSandbox e2e suite creates real sandboxes and must run as root", pytrace=False)
    tag = f"ember-e2e-{os.getpid()}"
    net_tag = f"e2e{os.getpid() % 100000}"
    data_dir = Path(tempfile.mkdtemp(prefix=f"{tag}-data-"))
    # mkdtemp makes 0700 dirs; the sandboxes' mapped ids must traverse the data dir.
    os.chmod(data_dir, 0o755)
    host_dir = Path(tempfile.mkdtemp(prefix=f"{tag}-vol-"))
    os.chmod(host_dir, 0o777)
    nats = _nats(tag) if os.environ.get("EMBER_E2E_NATS_SERVER") else None
    key = _cluster_key(tag) if nats else None
    cluster = ["--cluster", nats[1], "--node", "worker", "--snapshot-key-file", str(key)] if nats else []
    admin = secrets.token_hex(16) if os.environ.get("EMBER_E2E_TENANT") else None
    if admin and nats:
        pytest.fail("$EMBER_E2E_TENANT runs on one node: tenants are per node (docs/tenancy.md)", pytrace=False)
    if admin:
        cluster += ["--api-key", admin]
    proc = subprocess.Popen(
        [
            _binary("EMBER_BIN", "ember"), "serve", *cluster,
            "--listen", "127.0.0.1:0",
            "--data-dir", str(data_dir),
            "--cgroup-parent", tag,
            "--agent", _binary("EMBER_AGENT_BIN", "ember-agent-static"),
            "--allow-host-path", str(host_dir),
            # Egress networking on a range and tag of its own, removed below;
            # no test here sends traffic off the machine (no upstream resolver).
            "--network-range", "10.214.0.0/24",
            "--network-tag", net_tag,
            "--nflog-group", str(4000 + os.getpid() % 1000),
            "--dns-upstream", "127.0.0.1:9",
            "--network-slots", "1",
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "EMBER_LOG": "warn"},
        text=True,
    )
    url = _listening(proc)
    front = _front(tag, nats, key) if nats else None
    if front:
        url = front[1]
    tenant_key = None
    if admin:
        with httpx.Client(base_url=url, timeout=30, headers={"OPEN-SANDBOX-API-KEY": admin}) as c:
            c.post("/v1/tenants", json={"name": "e2e"}).raise_for_status()
            tenant_key = c.post("/v1/tenants/e2e/keys").json()["key"]
    e = Ember(url=url, domain=url.removeprefix("http://"), host_dir=host_dir, data_dir=data_dir, api_key=tenant_key)
    try:
        yield e
    finally:
        # Sandboxes outlive a daemon by design: remove them through the API first.
        try:
            with e.http() as c:
                for s in c.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]:
                    c.delete(f"/v1/sandboxes/{s['id']}")
        finally:
            stop_daemon(proc, tag)
            # A native sandbox's writable layer is a host tmpfs (idle pool
            # members were not listed above); a workspace is a loop-mounted
            # image (fs/) with its tree bound at mnt/: every mount under the
            # data dir goes, deepest first, before the dir is deleted.
            _unmount_under(data_dir)
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.rmtree(host_dir, ignore_errors=True)
            _remove_network(net_tag, "10.214.0.254/32")
            if front:
                # Its cpu group, made at start though it runs no sandboxes.
                stop_daemon(front[0], f"{tag}-front")
            for t in (front, nats):
                if t:
                    t[0].kill()
                    t[0].wait()
                    _unmount_under(t[2])
                    shutil.rmtree(t[2], ignore_errors=True)
            if key:
                shutil.rmtree(key.parent, ignore_errors=True)

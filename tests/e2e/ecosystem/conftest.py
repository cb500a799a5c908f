"""The OpenSandbox ecosystem beyond the Python SDK, unchanged from its
registries, against a real `ember serve`: the TypeScript SDK (npm), the
`opensandbox-cli` (PyPI) and the `langchain-opensandbox` backend (PyPI).
scripts/test.sh installs the pinned versions into target/eco-venv and
target/eco-node ($EMBER_NODE_DIR) and runs this suite with that venv.

The daemon is the `ember` fixture of tests/e2e/opensandbox (same binaries,
data dir, cgroup parent and cleanup), loaded here under another module name.
"""
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

_spec = importlib.util.spec_from_file_location(
    "opensandbox_e2e_conftest", Path(__file__).resolve().parents[1] / "opensandbox" / "conftest.py"
)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

REPO = _base.REPO
ember = _base.ember


@pytest.fixture(scope="session")
def node_dir() -> Path:
    """Where scripts/test.sh installed the npm packages (a node_modules below)."""
    d = Path(os.environ.get("EMBER_NODE_DIR", REPO / "target" / "eco-node"))
    if not (d / "node_modules" / "@alibaba-group" / "opensandbox").is_dir():
        pytest.fail(f"{d}/node_modules lacks @alibaba-group/opensandbox: run scripts/test.sh's install step", pytrace=False)
    return d


@pytest.fixture(scope="session")
def domain_ember():
    """A second, plain daemon with `--sandbox-domain localhost`: each sandbox
    port gets a browser origin of its own (`http://{port}-{id}.localhost:{port}`;
    Chromium resolves every `*.localhost` to loopback). No egress networking.
    Yields its base URL."""
    tag = f"ember-e2e-dom-{os.getpid()}"
    data_dir = Path(tempfile.mkdtemp(prefix=f"{tag}-data-"))
    os.chmod(data_dir, 0o755)
    proc = subprocess.Popen(
        [
            _base._binary("EMBER_BIN", "ember"), "serve",
            "--listen", "127.0.0.1:0",
            "--sandbox-domain", "localhost",
            "--data-dir", str(data_dir),
            "--cgroup-parent", tag,
            "--agent", _base._binary("EMBER_AGENT_BIN", "ember-agent-static"),
            "--network-range", "none",
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "EMBER_LOG": "warn"},
        text=True,
    )
    url = _base._listening(proc)
    try:
        yield url
    finally:
        try:
            with httpx.Client(base_url=url, timeout=30) as c:
                for s in c.get("/v1/sandboxes").json()["items"]:
                    c.delete(f"/v1/sandboxes/{s['id']}")
        finally:
            _base.stop_daemon(proc, tag)
            _base._unmount_under(data_dir)
            shutil.rmtree(data_dir, ignore_errors=True)

"""A web console for OpenSandbox, `sandbox-console` (PyPI), unchanged, pointed at
a real `ember serve`. scripts/test.sh installs the pinned version into
target/console-venv (its own venv: it pulls an older `opensandbox` SDK than
the 1.1.1 the other suites pin) and runs this suite with that venv's python.

The daemon is the `ember` fixture of tests/e2e/opensandbox, loaded here under
another module name; `console` starts `sandbox-console-server` from the same
venv on a free port with a database of its own.
"""
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

_spec = importlib.util.spec_from_file_location(
    "opensandbox_e2e_conftest", Path(__file__).resolve().parents[1] / "opensandbox" / "conftest.py"
)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

ember = _base.ember


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def console():
    """The console's base URL (`http://127.0.0.1:PORT`); auth disabled (no
    admin token), as its quick start runs it."""
    server = Path(sys.executable).parent / "sandbox-console-server"
    if not server.exists():
        pytest.fail(f"{server} is missing: run scripts/test.sh's install step", pytrace=False)
    work = Path(tempfile.mkdtemp(prefix="ember-e2e-console-"))
    port = _free_port()
    env = {
        **os.environ,
        "EXPLORER_DATABASE_URL": f"sqlite+aiosqlite:///{work}/explorer.db",
        "EXPLORER_HOST": "127.0.0.1",
        "EXPLORER_PORT": str(port),
    }
    log = open(work / "console.log", "w")
    proc = subprocess.Popen(
        [str(server), "--host", "127.0.0.1", "--port", str(port)], cwd=work, env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sandbox-console-server did not start: {(work / 'console.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)

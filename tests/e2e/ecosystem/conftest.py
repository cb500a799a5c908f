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
from pathlib import Path

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

"""The TypeScript SDK (@alibaba-group/opensandbox from npm) against ember:
typescript_sdk.mjs under node's own test runner, whose every test must pass."""
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_typescript_sdk(ember, node_dir):
    run = subprocess.run(
        ["node", "--test", "--test-reporter=spec", "--test-concurrency=1", str(HERE / "typescript_sdk.mjs")],
        env={**os.environ, "EMBER_NODE_DIR": str(node_dir), "OPEN_SANDBOX_DOMAIN": ember.domain},
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(run.stdout[-20000:], run.stderr[-5000:])
    assert run.returncode == 0, "node --test failed (output above)"
    # Every test of the script ran: none skipped, none missing.
    assert "ℹ pass 5" in run.stdout and "ℹ fail 0" in run.stdout

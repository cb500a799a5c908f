"""`langchain-opensandbox` (PyPI), the deepagents sandbox backend, driven with
no model: its backend's tool-facing calls (execute, write, read, edit, ls,
grep, glob, upload, download) on a sandbox it was handed, the per-thread
factory that finds or creates a sandbox by `thread_id` metadata, and the
`execute_python` LangChain tool, each call's result checked."""
import asyncio
from types import SimpleNamespace

from langchain_opensandbox import OpenSandboxSandbox
from langchain_opensandbox.factory import get_backend
from langchain_opensandbox.tools import execute_python
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.sync.sandbox import SandboxSync


def test_backend_tool_calls(ember):
    sb = SandboxSync.create("host", connection_config=ConnectionConfigSync(domain=ember.domain))
    backend = OpenSandboxSandbox(sandbox=sb)
    try:
        assert backend.id == sb.id
        res = backend.execute("echo out; echo err >&2; exit 2")
        assert res.exit_code == 2 and "out" in res.output and "err" in res.output

        assert backend.write("/tmp/lc/notes.md", "alpha\nbeta\ngamma\n").error is None
        assert "beta" in backend.read("/tmp/lc/notes.md").file_data["content"]
        edited = backend.edit("/tmp/lc/notes.md", "beta", "BETA")
        assert edited.error is None and edited.occurrences == 1
        assert sb.files.read_file("/tmp/lc/notes.md") == "alpha\nBETA\ngamma\n"

        backend.write("/tmp/lc/sub/code.py", "print('hi')\n")
        listed = backend.ls("/tmp/lc").entries
        assert sorted((e["path"], e.get("is_dir", False)) for e in listed) == [("/tmp/lc/notes.md", False), ("/tmp/lc/sub", True)]
        matches = backend.grep("BETA", path="/tmp/lc").matches
        assert [(m["path"], m["line"]) for m in matches] == [("/tmp/lc/notes.md", 2)]
        globbed = backend.glob("**/*.py", path="/tmp/lc").matches
        assert [g["path"] for g in globbed] == ["sub/code.py"]

        up = backend.upload_files([("/tmp/lc/blob.bin", bytes(range(256)))])
        assert [u.error for u in up] == [None]
        down = backend.download_files(["/tmp/lc/blob.bin", "/tmp/lc/missing"])
        assert down[0].content == bytes(range(256)) and down[0].error is None
        assert down[1].error == "file_not_found"
    finally:
        sb.kill()
        backend.close()


def test_thread_factory_and_python_tool(ember):
    config = {
        "configurable": {
            "thread_id": "lc-thread-1",
            "opensandbox_url": ember.domain,
            "opensandbox_image": "host",
            "opensandbox_use_server_proxy": True,
        }
    }
    runtime = SimpleNamespace(config=config)
    first = get_backend(runtime)
    assert first.execute("echo $PYTHONUNBUFFERED > /tmp/marker; cat /tmp/marker").output.strip() == "1"
    # The second backend of the same thread finds that sandbox by its metadata.
    second = get_backend(runtime)
    assert second.id == first.id
    assert second.execute("cat /tmp/marker").output.strip() == "1"

    async def tool():
        out = await execute_python.coroutine(code="import sys\nprint(sum(range(10)))\nprint(sys.version_info[0])", runtime=runtime)
        assert out == "45\n3\n" or out.strip() == "45\n3", out
        failed = await execute_python.coroutine(code="raise SystemExit(5)", runtime=runtime)
        assert failed.startswith("Execution failed (exit 5)"), failed

    asyncio.run(tool())
    with ember.http() as c:
        items = c.get("/v1/sandboxes", params={"metadata": "thread_id=lc-thread-1"}).json()["items"]
        assert [s["id"] for s in items] == [first.id]
        c.delete(f"/v1/sandboxes/{first.id}")
    first.close()
    second.close()

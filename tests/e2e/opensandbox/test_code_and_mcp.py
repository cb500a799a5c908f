"""The code interpreter (`opensandbox-code-interpreter`) and the MCP server
(`opensandbox-mcp`, called through the MCP SDK's own in-process client)."""
import json

from code_interpreter import CodeInterpreter
from code_interpreter.models.code import SupportedLanguage
from mcp import Client
from opensandbox_mcp.server import create_server

from helpers import arun, sandbox


def test_code_interpreter_keeps_state_and_reports_exceptions(ember):
    async def go():
        async with sandbox(ember) as sb:
            ci = await CodeInterpreter.create(sandbox=sb)
            try:
                ctx = await ci.codes.create_context(SupportedLanguage.PYTHON)
                r = await ci.codes.run("import math\nx = 20\nprint('set', x)", context=ctx)
                assert r.error is None and "".join(m.text for m in r.logs.stdout) == "set 20\n"
                r = await ci.codes.run("def double(v):\n    return 2 * v\nmath.floor(double(x) + 2.5)", context=ctx)
                assert r.error is None and [x.text for x in r.result] == ["42"]
                r = await ci.codes.run("print('before'); {}['missing']", context=ctx)
                assert r.error.name == "KeyError" and r.error.value == "'missing'"
                assert any("KeyError" in line for line in r.error.traceback)
                assert "".join(m.text for m in r.logs.stdout) == "before\n"
                # A second context has its own state; the first still has its own.
                other = await ci.codes.create_context(SupportedLanguage.PYTHON)
                r = await ci.codes.run("x", context=other)
                assert r.error.name == "NameError"
                r = await ci.codes.run("x", context=ctx)
                assert [x.text for x in r.result] == ["20"]
                # The default context (no id) persists too.
                await ci.codes.run("y = 'default'")
                r = await ci.codes.run("y")
                assert [x.text for x in r.result] == ["'default'"]
                ids = {c.id for c in await ci.codes.list_contexts(SupportedLanguage.PYTHON)}
                assert {ctx.id, other.id} <= ids
                await ci.codes.delete_context(other.id)
                assert other.id not in {c.id for c in await ci.codes.list_contexts(SupportedLanguage.PYTHON)}
            finally:
                await ci.aclose()

    arun(go())


def _text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def test_mcp_tools_through_the_mcp_client(ember):
    async def go():
        server = create_server(ember.config())
        async with Client(server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"sandbox_create", "command_run", "file_write", "file_read", "sandbox_kill"} <= names
            created = await client.call_tool("sandbox_create", {"image": "host", "metadata": {"via": "mcp"}})
            assert not created.is_error, _text(created)
            sid = json.loads(_text(created))["sandbox_id"]
            try:
                r = await client.call_tool("command_run", {"sandbox_id": sid, "command": "echo from mcp; exit 0"})
                assert not r.is_error and "from mcp" in _text(r), _text(r)
                r = await client.call_tool("file_write", {"sandbox_id": sid, "path": "/tmp/m.txt", "content": "mcp file"})
                assert not r.is_error, _text(r)
                r = await client.call_tool("file_read", {"sandbox_id": sid, "path": "/tmp/m.txt"})
                assert not r.is_error and "mcp file" in _text(r), _text(r)
                r = await client.call_tool("sandbox_get_info", {"sandbox_id": sid})
                assert not r.is_error and "Running" in _text(r), _text(r)
            finally:
                r = await client.call_tool("sandbox_kill", {"sandbox_id": sid})
                assert not r.is_error, _text(r)

    arun(go())

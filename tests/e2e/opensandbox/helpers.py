"""Small helpers shared by the e2e tests."""
import asyncio
import contextlib
from datetime import timedelta

from opensandbox import Sandbox


def arun(coro):
    """Runs one test coroutine on a fresh event loop."""
    return asyncio.run(coro)


@contextlib.asynccontextmanager
async def sandbox(ember, **kw):
    """A `host` sandbox created through the SDK, killed at the end."""
    kw.setdefault("timeout", timedelta(minutes=10))
    sb = await Sandbox.create("host", connection_config=ember.config(), **kw)
    try:
        yield sb
    finally:
        try:
            await sb.kill()
        finally:
            await sb.close()


def stdout(execution) -> str:
    return "".join(m.text if m.text.endswith("\n") else m.text + "\n" for m in execution.logs.stdout)

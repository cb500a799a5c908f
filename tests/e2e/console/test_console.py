"""`sandbox-console` 0.2.0 (PyPI) against ember: its own REST API, as its
web page calls it, does everything its README lists on an ember daemon,
unchanged: a connection registered and tested, a sandbox created, listed,
inspected, a command run, files written, read and listed, pause and resume,
the terminal WebSocket, the delete. Each step is checked against ember's
own API too, so a console that only believed it succeeded fails."""
import asyncio
import json

import httpx
import websockets


def _state(ember, sid):
    with ember.http() as c:
        r = c.get(f"/v1/sandboxes/{sid}")
        return r.json()["status"]["state"] if r.status_code == 200 else r.status_code


def _terminal(console, path, line):
    """Sends one line to the console's terminal WebSocket; returns what came
    back until the next prompt after the output."""
    async def go():
        ws_url = console.replace("http://", "ws://") + path
        out = []
        async with websockets.connect(ws_url, open_timeout=30) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert first["type"] == "output" and "Connected to sandbox" in first["data"], first
            await ws.send(json.dumps({"type": "input", "data": line + "\r"}))
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
                assert msg["type"] == "output", msg
                if "$ " in msg["data"] and out:
                    return "".join(out)
                out.append(msg["data"])
    return asyncio.run(go())


def test_the_console_manages_an_ember_sandbox(ember, console):
    page = httpx.get(console + "/", timeout=30)
    assert page.status_code == 200 and "<title>Sandbox Console</title>" in page.text

    with httpx.Client(base_url=console + "/api/v1", timeout=120) as c:
        creds = {"api_key": ember.api_key or ""}
        r = c.post("/connections", json={"name": "ember", "endpoint": ember.url, "credentials": creds})
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        r = c.post(f"/connections/{cid}/test")
        assert r.status_code == 200 and r.json()["ok"], r.text

        r = c.post(f"/connections/{cid}/sandboxes", json={"image": "host", "name": "from-console"})
        assert r.status_code == 201, r.text
        sid = r.json()["sandbox_id"]
        assert r.json()["state"] == "running", r.text
        assert _state(ember, sid) == "Running"
        listed = c.get("/sandboxes").json()["items"]
        assert sid in [s["sandbox_id"] for s in listed], listed
        assert c.get(f"/connections/{cid}/sandboxes/{sid}").json()["image"] == "host"

        base = f"/connections/{cid}/sandboxes/{sid}"
        r = c.post(f"{base}/commands", json={"command": "echo hello-$((6*7)); id -u"})
        assert r.status_code == 201, r.text
        cmd = c.get(f"{base}/commands/{r.json()['command_id']}").json()
        assert (cmd["status"], cmd["exit_code"]) == ("succeeded", 0), cmd
        # execd sends output by lines; the console joins them as they come.
        assert cmd["stdout"].startswith("hello-42"), cmd
        r = c.post(f"{base}/commands", json={"command": "exit 3"})
        assert c.get(f"{base}/commands/{r.json()['command_id']}").json()["exit_code"] == 3

        r = c.put(f"{base}/file", params={"path": "/tmp/console.txt"}, json={"content": "written by the console\n"})
        assert r.status_code == 200, r.text
        r = c.get(f"{base}/file", params={"path": "/tmp/console.txt"})
        assert r.json()["content"] == "written by the console\n", r.text
        entries = c.get(f"{base}/files", params={"path": "/tmp"}).json()["entries"]
        assert "/tmp/console.txt" in [e["path"] for e in entries], entries
        with ember.http() as e:
            got = e.get(f"/v1/sandboxes/{sid}/proxy/44772/files/download", params={"path": "/tmp/console.txt"})
            assert got.text == "written by the console\n", (got.status_code, got.text)

        assert c.post(f"{base}/pause").json()["state"] == "paused"
        assert _state(ember, sid) == "Paused"
        assert c.post(f"{base}/resume").json()["state"] == "running"
        assert _state(ember, sid) == "Running"

        r = c.post(f"{base}/terminals")
        assert r.status_code == 201, r.text
        out = _terminal(console, r.json()["ws_url"], "echo term-$((6*7))")
        assert "term-42" in out, out

        assert c.delete(base).status_code == 200
        assert _state(ember, sid) in (404, "Terminated"), _state(ember, sid)

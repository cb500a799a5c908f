"""The built-in `browser` and `desktop` templates (Debian's chromium, or Xvfb
+ openbox + x11vnc + noVNC, from the host's /usr), reached from outside only
through ember's port proxy: playwright-core drives the sandbox's Chromium over
CDP to a screenshot (kept under target/eco-screens/), and a VNC client written
here does the RFB handshake through noVNC's WebSocket bridge and reads the
desktop's framebuffer size."""
import json
import os
import struct
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import httpx

from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.sync.sandbox import SandboxSync
from websockets.sync.client import connect

HERE = Path(__file__).resolve().parent
SCREENS = Path(os.environ.get("CARGO_TARGET_DIR", HERE.parents[2] / "target")) / "eco-screens"


def _create(ember, template):
    with ember.http() as c:
        r = c.post("/v1/sandboxes", json={"image": {"uri": template}, "timeout": 600})
        assert r.status_code == 202, r.text
        return r.json()["id"]


def _until_served(c, sid, url, headers=None):
    """The entrypoint starts its servers after the create answers: polls
    (a bounded number of times) until `url` answers 200."""
    for _ in range(300):
        r = c.get(url, headers=headers or {})
        if r.status_code == 200:
            return r
        state = c.get(f"/v1/sandboxes/{sid}").json()["status"]["state"]
        assert state == "Running", f"the sandbox behind {url} is {state}"
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered: last {r.status_code} {r.text[:300]}")


def test_browser_template_driven_over_cdp(ember, node_dir):
    # Through the SDK, as users create it: the SDK sends its keep-alive
    # entrypoint (`tail -f /dev/null`), which must not replace Chromium.
    sb = SandboxSync.create("browser", connection_config=ConnectionConfigSync(domain=ember.domain), timeout=timedelta(minutes=10))
    sid = sb.id
    sb.close()
    try:
        with ember.http() as c:
            version = _until_served(c, sid, f"/v1/sandboxes/{sid}/proxy/9222/json/version").json()
        assert version["Browser"].startswith(("Chrome/", "HeadlessChrome/")), version
        SCREENS.mkdir(parents=True, exist_ok=True)
        shot = SCREENS / "browser.png"
        shot.unlink(missing_ok=True)
        run = subprocess.run(
            ["node", str(HERE / "browser_cdp.mjs"), ember.url, sid, str(shot)],
            env={**os.environ, "EMBER_NODE_DIR": str(node_dir)},
            capture_output=True, text=True, timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        got = json.loads(run.stdout.strip().splitlines()[-1])
        assert got["title"] == "ember browser"
        assert got["size"] == [640, 480]
        assert got["pixel"] == [0, 128, 255]
        assert shot.read_bytes()[1:4] == b"PNG"
    finally:
        with ember.http() as c:
            c.delete(f"/v1/sandboxes/{sid}")


class _Rfb:
    """The RFB byte stream over websockify's binary messages, however it
    split the stream into them."""

    def __init__(self, ws):
        self.ws, self.buf = ws, b""

    def read(self, n):
        while len(self.buf) < n:
            self.buf += self.ws.recv(timeout=30)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def test_browser_from_a_warm_pool(ember):
    """A pool's idle members run no entrypoint; the claim binds it: a warm
    `browser` claimed through the SDK (`poolRef`) starts its Chromium."""
    with ember.http() as c:
        r = c.post("/v1/pools", json={"name": "browsers", "template": "browser", "min": 1, "max": 1, "target": 1})
        assert r.status_code in (200, 201), r.text
        try:
            for _ in range(300):
                if c.get("/v1/pools/browsers").json()["idle"] >= 1:
                    break
                time.sleep(0.1)
            sb = SandboxSync.create(
                "browser",
                connection_config=ConnectionConfigSync(domain=ember.domain),
                timeout=timedelta(minutes=10),
                extensions={"poolRef": "browsers"},
            )
            sid = sb.id
            sb.close()
            try:
                assert c.get(f"/v1/sandboxes/{sid}").json()["launch"]["kind"] == "warm"
                version = _until_served(c, sid, f"/v1/sandboxes/{sid}/proxy/9222/json/version").json()
                assert "webSocketDebuggerUrl" in version
            finally:
                c.delete(f"/v1/sandboxes/{sid}")
        finally:
            c.delete("/v1/pools/browsers")


def test_desktop_template_vnc_handshake(ember):
    sid = _create(ember, "desktop")
    try:
        with ember.http() as c:
            page = _until_served(c, sid, f"/v1/sandboxes/{sid}/proxy/6080/vnc.html")
        assert "noVNC" in page.text
        ws_url = ember.url.replace("http://", "ws://") + f"/v1/sandboxes/{sid}/proxy/6080/websockify"
        with connect(ws_url, subprotocols=["binary"], max_size=None) as ws:
            rfb = _Rfb(ws)
            # RFB 3.8 (RFC 6143 §7.1): version, security types, result, init.
            assert rfb.read(12) == b"RFB 003.008\n"
            ws.send(b"RFB 003.008\n")
            count = rfb.read(1)[0]
            types = rfb.read(count)
            assert 1 in types, f"security types {list(types)}: no 'None'"
            ws.send(bytes([1]))
            assert struct.unpack(">I", rfb.read(4))[0] == 0, "security handshake failed"
            ws.send(bytes([1]))  # ClientInit: shared
            width, height = struct.unpack(">HH", rfb.read(4))
            assert (width, height) == (1280, 800)
            pixel_format_and_name_length = rfb.read(16 + 4)
            name_length = struct.unpack(">I", pixel_format_and_name_length[16:])[0]
            assert b":1" in rfb.read(name_length)
    finally:
        with ember.http() as c:
            c.delete(f"/v1/sandboxes/{sid}")


def test_desktop_in_novnc_on_its_own_origin(domain_ember, node_dir):
    """noVNC's page in a real browser: on the port's own origin
    (`--sandbox-domain`), not the path route, whose opaque origin refuses
    noVNC's ES modules (docs/templates.md)."""
    with httpx.Client(base_url=domain_ember, timeout=30) as c:
        r = c.post("/v1/sandboxes", json={"image": {"uri": "desktop"}, "timeout": 600})
        assert r.status_code == 202, r.text
        sid = r.json()["id"]
        endpoint = c.get(f"/v1/sandboxes/{sid}/endpoints/6080").json()["endpoint"]
        assert endpoint.startswith(f"6080-{sid}.localhost:"), endpoint
        _until_served(c, sid, "/vnc.html", headers={"Host": endpoint})
    SCREENS.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        ["node", str(HERE / "novnc_page.mjs"), f"http://{endpoint}", str(SCREENS / "desktop-novnc.png")],
        env={**os.environ, "EMBER_NODE_DIR": str(node_dir)},
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["status"].startswith("Connected"), got
    assert got["canvas"] == [1280, 800] and got["errors"] == [], got


def test_bundled_templates_are_listed(ember):
    with ember.http() as c:
        listed = {t["name"]: t for t in c.get("/v1/templates").json()}
    for name in ("host", "browser", "desktop"):
        assert listed[name]["builtin"] is True, listed[name]
    assert listed["desktop"]["env"]["DISPLAY"] == ":1"

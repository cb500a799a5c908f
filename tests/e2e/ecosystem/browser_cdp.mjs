// Drives the Chromium of a `browser` sandbox from outside, over CDP through
// ember's port proxy, with playwright-core (npm): args <daemon url> <sandbox id>
// <screenshot file>. Prints one JSON line: the page's title, the colour of a
// pixel and the screenshot's size.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(`${process.env.EMBER_NODE_DIR}/`);
const { chromium } = require("playwright-core");

const [url, id, out] = process.argv.slice(2);
const base = `${url}/v1/sandboxes/${id}/proxy/9222`;

// DevTools names its WebSocket by the address Chromium listens on inside the
// sandbox; the same path is reached through the proxy's WebSocket upgrade.
const version = await (await fetch(`${base}/json/version`)).json();
const ws = base.replace(/^http/, "ws") + new URL(version.webSocketDebuggerUrl).pathname;
const browser = await chromium.connectOverCDP(ws);
try {
  const context = browser.contexts()[0] ?? (await browser.newContext());
  const page = await context.newPage();
  await page.setViewportSize({ width: 640, height: 480 });
  const html = "<title>ember browser</title><body style='margin:0;background:rgb(0,128,255)'><h1 id=h>drawn in a sandbox</h1>";
  await page.goto(`data:text/html,${encodeURIComponent(html)}`);
  assert.equal(await page.textContent("#h"), "drawn in a sandbox");
  const png = await page.screenshot({ path: out });
  // PNG signature, then IHDR's width and height.
  assert.equal(png.subarray(1, 4).toString(), "PNG");
  const size = [png.readUInt32BE(16), png.readUInt32BE(20)];
  // The colour Chromium painted at a corner, read back from the page's own canvas of the screenshot.
  const pixel = await page.evaluate(async (b64) => {
    const img = new Image();
    img.src = `data:image/png;base64,${b64}`;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = img.width;
    c.height = img.height;
    const ctx = c.getContext("2d");
    ctx.drawImage(img, 0, 0);
    return Array.from(ctx.getImageData(630, 470, 1, 1).data.slice(0, 3));
  }, png.toString("base64"));
  writeFileSync(out, png);
  console.log(JSON.stringify({ title: await page.title(), size, pixel, userAgent: version["User-Agent"] }));
} finally {
  await browser.close();
}

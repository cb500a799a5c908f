// noVNC, the desktop template's own web client, in Debian's Chromium launched
// here by playwright-core: args <origin of the sandbox's port 6080> <screenshot
// file>. Prints one JSON line: noVNC's status text and its canvas size.
import { createRequire } from "node:module";

const require = createRequire(`${process.env.EMBER_NODE_DIR}/`);
const { chromium } = require("playwright-core");

const [origin, out] = process.argv.slice(2);
// Root runs the tests; Chromium's own sandbox refuses root.
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1300, height: 860 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${origin}/vnc.html?autoconnect=1&resize=off`);
  await page
    .waitForFunction(() => document.querySelector("#noVNC_status")?.textContent?.startsWith("Connected"), null, { timeout: 60000 })
    .catch(() => {});
  const status = await page.evaluate(() => document.querySelector("#noVNC_status")?.textContent ?? null);
  const canvas = await page.evaluate(() => {
    const c = document.querySelector("#noVNC_container canvas");
    return c ? [c.width, c.height] : null;
  });
  await page.screenshot({ path: out });
  console.log(JSON.stringify({ status, canvas, errors }));
} finally {
  await browser.close();
}

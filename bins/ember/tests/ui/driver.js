// Drives the /ui dashboard in Debian's chromium through playwright-core
// (bins/ember/tests/ui.rs runs it). Every wait is for a selector or a page
// condition; the timeouts only bound a hang.
"use strict";
const { chromium } = require("playwright-core");
const [url, key, shots, wantIdle, report] = process.argv.slice(2);
const HANG = { timeout: 60000 };

async function claim() {
  const r = await fetch(`${url}/v1/sandboxes`, {
    method: "POST",
    headers: { "content-type": "application/json", "open-sandbox-api-key": key },
    body: JSON.stringify({ template: "host" }),
  });
  if (!r.ok) throw new Error(`claim: ${r.status} ${await r.text()}`);
  return (await r.json()).id;
}

(async () => {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on("console", (m) => console.error("page:", m.text()));
  await page.goto(`${url}/ui`);
  await page.waitForSelector("#key", HANG); // redirected: no session yet
  await page.screenshot({ path: `${shots}/0-login.png` });
  await page.fill("#key", key);
  await Promise.all([page.waitForURL(/\/ui$/, HANG), page.click("#login")]);

  const idle = 'tr[data-pool="host"] td.idle';
  await page.waitForFunction(([s, n]) => document.querySelector(s)?.textContent === n, [idle, wantIdle], HANG);
  await page.screenshot({ path: `${shots}/1-pools.png`, fullPage: true });

  const claimed = 'tr[data-pool="host"] td.claimed';
  const before = Number(await page.textContent(claimed));
  const updates = Number(await page.evaluate(() => document.body.dataset.updates));
  const id = await claim();
  await page.waitForFunction(([s, n]) => Number(document.querySelector(s)?.textContent) === n, [claimed, before + 1], HANG);
  const after = Number(await page.evaluate(() => document.body.dataset.updates));
  if (!(after > updates)) throw new Error(`the claim showed without an SSE update (${updates} → ${after})`);
  await page.waitForSelector(`tr[data-id="${id}"] td.state >> text=Running`, HANG);
  await page.screenshot({ path: `${shots}/2-claimed.png`, fullPage: true });

  await page.click(`tr[data-id="${id}"] button.term`);
  await page.waitForSelector('#term[data-connected="1"]', HANG);
  await page.focus("#term");
  await page.keyboard.type("echo ui-$((6*7))");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => /(^|\n)ui-42/.test(document.querySelector("#term").textContent), null, HANG);
  await page.screenshot({ path: `${shots}/3-terminal.png`, fullPage: true });

  await page.click(`tr[data-id="${id}"] button.bnd`);
  await page.waitForSelector(`tr[data-id="${id}"] pre.bnd-out`, HANG);
  await page.waitForSelector(`#reports a >> text=${report}`, HANG);
  await page.waitForSelector("#hist-claim .count", HANG);
  await page.screenshot({ path: `${shots}/4-boundary.png`, fullPage: true });
  await browser.close();
  console.log(JSON.stringify({ ok: true, claimed: id }));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});

// The dashboard's node list on a cluster node, in Debian's chromium through
// playwright-core (bins/ember/tests/cluster/ui.rs runs it, once with both
// nodes live and once after one was killed). Every wait is for a selector or
// a page condition; the timeout only bounds a hang.
"use strict";
const { chromium } = require("playwright-core");
const [url, shot, want] = process.argv.slice(2);
const HANG = { timeout: 60000 };
// want: "a=live:1,b=live:0" — each node's liveness and sandbox count.
const rows = want.split(",").map((w) => { const [n, r] = w.split("="); const [l, c] = r.split(":"); return { n, l, c }; });

(async () => {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on("console", (m) => console.error("page:", m.text()));
  await page.goto(`${url}/ui`);
  await page.waitForSelector("#nodebox:not([hidden])", HANG);
  for (const { n, l, c } of rows) {
    const row = `#nodelist tr[data-node="${n}"]`;
    await page.waitForFunction(([r, l, c]) => {
      const alive = document.querySelector(`${r} td.alive`)?.textContent ?? "";
      return alive.startsWith(l) && document.querySelector(`${r} td.sandboxes`)?.textContent === c;
    }, [row, l, c], HANG);
    const free = await page.textContent(`${row} td.free`);
    if (!/^[1-9][0-9]* MiB$/.test(free)) throw new Error(`node ${n}: free memory shown as ${free}`);
  }
  await page.screenshot({ path: shot, fullPage: true });
  const shown = await page.$$eval("#nodelist tbody tr", (trs) => trs.map((t) => t.innerText.replace(/\s+/g, " ")));
  await browser.close();
  console.log(JSON.stringify({ ok: true, shown }));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});

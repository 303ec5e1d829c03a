// Loads one page of the built dashboard in headless Chromium at one viewport width and
// prints JSON: the document's scroll width, the elements that stick out past the right
// edge (outside any scrolling box), axe-core's violations, and optionally a screenshot.
// Every <details> is opened first, so folded content is measured and audited too.
//
//   node check.cjs NODE_MODULES CHROMIUM URL WIDTH [SCREENSHOT.png]
//
// Run by tests/test_dashboard_browser.py (puppeteer-core and axe-core from npm; the
// browser is the system's Chromium, never a downloaded one).
"use strict";
const path = require("path");
const fs = require("fs");
const os = require("os");
const [modules, chromium, url, width, shot] = process.argv.slice(2);
const puppeteer = require(path.join(modules, "puppeteer-core"));
const axePath = require.resolve(path.join(modules, "axe-core", "axe.min.js"));

(async () => {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "distci-chromium-"));
  const browser = await puppeteer.launch({
    executablePath: chromium, headless: true, userDataDir: profile,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage();
    const w = Number(width);
    await page.setViewport({width: w, height: shot ? (w < 600 ? 1800 : 2000) : 900});
    await page.goto(url, {waitUntil: "load"});
    if (shot) await page.screenshot({path: shot});
    const layout = await page.evaluate(() => {
      document.querySelectorAll("details").forEach(d => { d.open = true; });
      const width = document.documentElement.clientWidth;
      const wide = [];
      for (const el of document.body.querySelectorAll("*")) {
        const r = el.getBoundingClientRect();
        if (r.width === 0 || r.right <= width + 1) continue;
        let scroller = false;
        for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
          const o = getComputedStyle(p).overflowX;
          if (o === "auto" || o === "scroll" || o === "hidden") { scroller = true; break; }
        }
        if (!scroller) wide.push(`${el.tagName.toLowerCase()}.${String(el.className).trim().split(/\s+/).join(".")} right=${Math.round(r.right)} "${el.textContent.trim().slice(0, 60)}"`);
      }
      return {width, scrollWidth: document.documentElement.scrollWidth, wide: wide.slice(0, 12)};
    });
    await page.addScriptTag({path: axePath});
    const violations = await page.evaluate(async () => {
      const res = await window.axe.run(document, {resultTypes: ["violations"]});
      return res.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                       nodes: v.nodes.slice(0, 4).map(n => n.target.join(" "))}));
    });
    process.stdout.write(JSON.stringify({...layout, violations}) + "\n");
  } finally {
    await browser.close();
    fs.rmSync(profile, {recursive: true, force: true});
  }
})().catch(err => { console.error(err); process.exit(1); });

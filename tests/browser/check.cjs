// Loads pages of the built dashboard in headless Chromium, each at one viewport width, and
// prints one JSON line per page, in the order given: the document's scroll width, the
// elements that stick out past the right edge (outside any scrolling box), axe-core's
// violations, and optionally a screenshot.
// Every <details> is opened first, so folded content is measured and audited too.
// And what only looking saw before: `narrow`, text wrapped to a few characters a line (an
// id squeezed into a column one to four characters wide); `overlap`, sibling boxes that
// cover each other; `beside`, a heading with its own content on the same line (a class
// that turned a card's header row into a flex row).
//
//   node check.cjs NODE_MODULES CHROMIUM JOBS.json
//
// JOBS.json is a list of {"url", "width", "shot" (a PNG path, or null)}. One browser serves
// every job (its start is most of a one-page check's CPU), each page in a fresh browser
// context of its own (no cookie, storage or cache passes from one page to the next); a job
// that throws prints {"url", "error"} and the others still run.
//
// Run by tests/test_dashboard_browser.py (puppeteer-core and axe-core from npm; the
// browser is the system's Chromium, never a downloaded one).
"use strict";
const path = require("path");
const fs = require("fs");
const os = require("os");
const [modules, chromium, jobsPath] = process.argv.slice(2);
const jobs = JSON.parse(fs.readFileSync(jobsPath, "utf8"));
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
    for (const {url, width, shot} of jobs) {
      const context = await browser.createBrowserContext();
      try {
        const found = await check(await context.newPage(), url, Number(width), shot);
        process.stdout.write(JSON.stringify({url, ...found}) + "\n");
      } catch (err) {
        process.stdout.write(JSON.stringify({url, error: String(err && err.stack || err)}) + "\n");
      } finally {
        await context.close();
      }
    }
  } finally {
    await browser.close();
    fs.rmSync(profile, {recursive: true, force: true});
  }
})().catch(err => { console.error(err); process.exit(1); });

async function check(page, url, w, shot) {
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
    const describe = el => `${el.closest("[id]") ? "#" + el.closest("[id]").id + " " : ""}${el.tagName.toLowerCase()}.${String(el.className).trim().split(/\s+/).join(".")} "${el.textContent.trim().slice(0, 40)}"`;
    const visible = el => { const r = el.getBoundingClientRect(); const st = getComputedStyle(el);
                            return r.width > 0 && r.height > 0 && st.visibility !== "hidden" && st.display !== "none"; };
    // Text wrapped to a few characters a line: the element's own text nodes, their line boxes.
    const narrow = [];
    for (const el of document.body.querySelectorAll("*")) {
      if (!visible(el) || el.closest("svg, script, style")) continue;
      const texts = [...el.childNodes].filter(n => n.nodeType === 3 && n.textContent.trim());
      const chars = texts.reduce((k, n) => k + n.textContent.trim().length, 0);
      if (chars < 8) continue;
      const tops = new Set();
      for (const n of texts) {
        const range = document.createRange();
        range.selectNodeContents(n);
        for (const r of range.getClientRects()) if (r.width > 0) tops.add(Math.round(r.top));
      }
      if (tops.size >= 3 && chars / tops.size < 5)
        narrow.push(`${describe(el)} ${chars} chars on ${tops.size} lines`);
    }
    // Sibling boxes in the flow that cover each other by more than 2 px both ways.
    const overlap = [];
    // (inline boxes are left out: a wrapped inline's bounding box spans lines it does not fill)
    const inFlow = el => { const st = getComputedStyle(el);
                           return st.position !== "absolute" && st.position !== "fixed" && st.display !== "inline" && visible(el); };
    for (const parent of document.body.querySelectorAll("*")) {
      const kids = [...parent.children].filter(inFlow);
      if (kids.length < 2 || kids.length > 400) continue;
      const rects = kids.map(k => k.getBoundingClientRect());
      for (let i = 0; i < kids.length; i++) for (let j = i + 1; j < kids.length; j++) {
        const a = rects[i], b = rects[j];
        const x = Math.min(a.right, b.right) - Math.max(a.left, b.left);
        const y = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        if (x > 2 && y > 2) overlap.push(`${describe(kids[i])} / ${describe(kids[j])} (${Math.round(x)}x${Math.round(y)} px)`);
      }
    }
    // A heading sharing its line with the content after it.
    const beside = [];
    for (const h of document.body.querySelectorAll("h1, h2, h3, h4")) {
      const next = h.nextElementSibling;
      if (!next || !visible(h) || !visible(next)) continue;
      const a = h.getBoundingClientRect(), b = next.getBoundingClientRect();
      if (b.left >= a.right - 1 && b.top < a.bottom - 2) beside.push(`${describe(h)} beside ${describe(next)}`);
    }
    return {width, scrollWidth: document.documentElement.scrollWidth, wide: wide.slice(0, 12),
            narrow: narrow.slice(0, 12), overlap: overlap.slice(0, 12), beside: beside.slice(0, 12)};
  });
  await page.addScriptTag({path: axePath});
  const violations = await page.evaluate(async () => {
    const res = await window.axe.run(document, {resultTypes: ["violations"]});
    return res.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                     nodes: v.nodes.slice(0, 4).map(n => n.target.join(" "))}));
  });
  return {...layout, violations};
}

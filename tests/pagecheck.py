"""Checks of a built dashboard site: layout width and axe-core in headless Chromium, links.

`browser_checks(modules, jobs)` runs tests/browser/check.cjs: puppeteer-core drives the
system's Chromium, and for each (page, viewport width, screenshot) opens every `<details>`,
measures the document's scroll width against the viewport, lists the elements that stick
out past the right edge, and runs axe-core; it can take a screenshot first. One browser
serves all the jobs of a call, each page in a fresh browser context: a browser's start is
most of what one page's check costs (~1.4 CPU-s of ~1.5). `--window-size` alone cannot
make a 390 px viewport: headless Chromium's windows are at least 500 px wide.

`site_links(site)` checks every href and src of every HTML file of the site: http(s), or
a relative path to a file inside the site, or `#id` of an element of its page.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHROMIUM = os.environ.get("DISTCI_CHROMIUM") or next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"))), None
)
# npm packages the check needs, pinned: a new axe-core release may add rules.
NPM_PACKAGES = ("puppeteer-core@24.43.1", "axe-core@4.14.1")
CHECK = Path(__file__).with_name("browser") / "check.cjs"


def browser_checks(modules: Path, jobs: list[tuple[Path, int, Path | None]]) -> list[dict]:
    """For each (page, width, screenshot or None), in order: {width, scrollWidth, wide: [elements
    past the right edge], narrow, overlap, beside, violations: [axe's]}, or {error} where that
    page's check threw (the others still ran)."""
    assert CHROMIUM is not None
    listed = [{"url": page.resolve().as_uri(), "width": width, "shot": str(shot) if shot else None}
              for page, width, shot in jobs]
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="distci-pages-") as spec:
        json.dump(listed, spec)
        spec.flush()
        proc = subprocess.run(["node", str(CHECK), str(modules), CHROMIUM, spec.name], capture_output=True,
                              text=True, timeout=120 + 60 * len(jobs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [f["url"] for f in found] == [j["url"] for j in listed], proc.stdout[-3000:] + proc.stderr[-3000:]
    return found


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if key in a:
                self.refs.append(a[key])


def site_links(site: Path) -> tuple[int, list[str]]:
    """(links checked, the ones that do not resolve inside the site and are not http(s))."""
    pages = {p: _Refs() for p in sorted(site.rglob("*.html")) if not p.name.startswith(".check-")}
    for path, refs in pages.items():
        refs.feed(path.read_text(encoding="utf-8"))
    bad, n = [], 0
    root = site.resolve()
    for path, refs in pages.items():
        for ref in refs.refs:
            n += 1
            parts = urlsplit(ref)
            if parts.scheme in ("http", "https") and parts.netloc:
                continue
            if parts.scheme or parts.netloc:
                bad.append(f"{path.name}: {ref} (not http(s))")
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path.resolve()
            if not target.is_relative_to(root) or not target.is_file():
                bad.append(f"{path.name}: {ref} (no such file in the site)")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    bad.append(f"{path.name}: {ref} (no element with that id)")
    return n, bad

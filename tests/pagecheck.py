"""Checks of a built dashboard site: layout width and axe-core in headless Chromium, links.

`browser_check(modules, page, width)` runs tests/browser/check.cjs: puppeteer-core drives
the system's Chromium at that viewport width, opens every `<details>`, measures the
document's scroll width against the viewport, lists the elements that stick out past the
right edge, and runs axe-core; it can take a screenshot first. (`--window-size` alone
cannot make a 390 px viewport: headless Chromium's windows are at least 500 px wide.)

`site_links(site)` checks every href and src of every HTML file of the site: http(s), or
a relative path to a file inside the site, or `#id` of an element of its page.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHROMIUM = os.environ.get("DISTCI_CHROMIUM") or next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"))), None
)
# npm packages the check needs, pinned: a new axe-core release may add rules.
NPM_PACKAGES = ("puppeteer-core@24.43.1", "axe-core@4.14.1")
CHECK = Path(__file__).with_name("browser") / "check.cjs"


def browser_check(modules: Path, page: Path, width: int, screenshot: Path | None = None) -> dict:
    """{width, scrollWidth, wide: [elements past the right edge], violations: [axe's]}."""
    assert CHROMIUM is not None
    args = ["node", str(CHECK), str(modules), CHROMIUM, page.resolve().as_uri(), str(width)]
    proc = subprocess.run(args + ([str(screenshot)] if screenshot else []), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


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

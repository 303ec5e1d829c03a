"""The built site as GitHub Pages serves it: every link resolves, no page scrolls sideways at
1280 or 390 px, axe-core finds no violation, with generated and with recorded data.

Two sites: the generated store of tests/fixtures_dashboard.py (120 tests x 10 cells x 14
nights; hostile `ci.server` and upstream links included) and the five recorded-style
nights of tests/fixtures_runs.py. The browser checks run headless Debian Chromium through
puppeteer-core with axe-core (tests/browser/check.cjs; both npm packages are installed
into a cache by the fixture below when absent: `DISTCI_NODE_MODULES` points at an
existing node_modules instead). Skipped with the reason when chromium or npm is missing.

Beyond width and axe, a layout review sees what only looking saw before (check.cjs):
text wrapped to a few characters a line, sibling boxes that cover each other, a heading
beside its own content. DISTCI_DASHBOARD_SCREENSHOTS=reports keeps a screenshot of every
page checked, both sites, both widths (reports/dashboard/<site>-<page>-<width>.png), for a
person's review next to the check.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures_dashboard import NOW, generate
from fixtures_runs import seed_nights
from pagecheck import CHROMIUM, NPM_PACKAGES, browser_checks, site_links

from distci.dashboard import render_dashboard
from distci.judge.ingest import ingest_runs
from distci.judge.store import Store
from distci.provision.sources import IndexConfig

WIDTHS = (1280, 390)
PAGES = ("index.html", "audit.html")
INDEX = IndexConfig(extra_index_urls=("https://download.example/whl/{variant}",),
                    nightly_index_url="https://download.example/nightly/{variant}")


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two built sites, by name."""
    root = tmp_path_factory.mktemp("pages")
    gen = generate(root / "generated")
    with Store(root / "generated.sqlite") as store:
        ingest_runs(store, [gen.root])
        render_dashboard(store, root / "generated-site", matrix_path=gen.matrix, now=NOW, issues=gen.issues,
                         known_issues=gen.known_issues, index=INDEX, audit_dir=None)
    seeded = seed_nights(root / "recorded")
    with Store(root / "recorded.sqlite") as store:
        ingest_runs(store, [seeded.root])
        render_dashboard(store, root / "recorded-site", matrix_path=None, audit_dir=None, index=INDEX)
    return {"generated": root / "generated-site", "recorded": root / "recorded-site"}


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """puppeteer-core and axe-core, at the versions pagecheck pins."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    given = os.environ.get("DISTCI_NODE_MODULES")
    if given:
        return Path(given)
    key = hashlib.sha1(" ".join(NPM_PACKAGES).encode()).hexdigest()[:12]
    prefix = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "distci" / f"node-{key}"
    modules = prefix / "node_modules"
    if not all((modules / p.rsplit("@", 1)[0]).is_dir() for p in NPM_PACKAGES):
        if not (shutil.which("npm") and shutil.which("node")):
            pytest.skip("node and npm are not installed (apt-get install -y nodejs npm)")
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save",
                        *NPM_PACKAGES], check=True, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PUPPETEER_SKIP_DOWNLOAD": "1"})
    return modules


@pytest.mark.parametrize("name", ["generated", "recorded"])
def test_every_link_of_the_site_resolves_inside_it_or_is_https(sites: dict[str, Path], name: str) -> None:
    checked, bad = site_links(sites[name])
    assert checked > 20 and bad == [], bad


def test_the_link_checker_finds_what_pages_would_404(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(
        '<a href="runs/r1/pytest.log">log</a><a href="../distci-data/runs/r1/stack.json">outside</a>'
        '<a href="javascript:alert(1)">js</a><a href="#nowhere">anchor</a><a id="here" href="#here">ok</a>'
        '<a href="https://github.com/x/y">web</a>')
    checked, bad = site_links(tmp_path)
    assert checked == 6 and [b.split(" (")[0] for b in bad] == [
        "index.html: runs/r1/pytest.log", "index.html: ../distci-data/runs/r1/stack.json",
        "index.html: javascript:alert(1)", "index.html: #nowhere"]


# The split pages (a cell's history, a week's heat, a tier's blockers), by kind: the first of each.
SPLIT = ("cell", "week", "tier")
CHECKED = [(n, p, w) for n in ("generated", "recorded") for p in PAGES + SPLIT for w in WIDTHS
           if (n, p) != ("recorded", "tier")]  # no matrix there: no tiers


# A page with what the layout review must see: a squeezed column, boxes covering each other, a
# heading beside its content.
BROKEN = ('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>t</title></head><body><main>'
          '<table><tr><td style="width:1px;word-break:break-all">cpu-cpu-torch_2.13.0-ao_0.18.0-ws2</td>'
          '<td style="width:99%">wide</td></tr></table>'
          '<div><p style="margin:0;height:20px">first</p><p style="margin:-15px 0 0 0;height:20px">second</p></div>'
          '<section style="display:flex"><h2>Stacks</h2><ul><li>torch 2.13.0</li></ul></section>'
          '</main></body></html>')


@pytest.fixture(scope="module")
def checked(sites: dict[str, Path], node_modules: Path,
            tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, int], tuple[dict, Path | None]]:
    """Every (site, page, width) of CHECKED, and ("broken", "broken.html", 390): (what check.cjs
    found, its screenshot), all pages through one browser (its start was ~1.4 of a page's ~1.5
    CPU-s), each in a fresh browser context."""
    shots = tmp_path_factory.mktemp("shots")
    broken = shots / "broken.html"
    broken.write_text(BROKEN)
    keys, jobs = list(CHECKED), []
    for name, page, width in CHECKED:
        if page in SPLIT:
            page = sorted(p.name for p in sites[name].glob(f"{page}-*.html"))[0]
        jobs.append((sites[name] / page, width, shots / f"{name}-{Path(page).stem.split('-')[0]}-{width}.png"))
    keys.append(("broken", "broken.html", 390))
    jobs.append((broken, 390, None))
    found = browser_checks(node_modules, jobs)
    return {key: (f, job[2]) for key, f, job in zip(keys, found, jobs)}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "page", "width"), CHECKED)
def test_no_sideways_scroll_no_axe_violation_and_no_broken_layout(checked, name: str, page: str,
                                                                  width: int) -> None:
    found, shot = checked[name, page, width]
    assert "error" not in found, found["error"]
    keep = os.environ.get("DISTCI_DASHBOARD_SCREENSHOTS")
    if keep:
        (Path(keep) / "dashboard").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, Path(keep) / "dashboard" / shot.name)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert found["width"] == width
    assert found["scrollWidth"] <= width, f"{page} is {found['scrollWidth']} px wide at {width}: {found['wide']}"
    assert found["violations"] == [], found["violations"]
    assert found["narrow"] == [], f"{page} at {width} px wraps text to a few characters a line"
    assert found["overlap"] == [], f"{page} at {width} px has boxes covering each other"
    assert found["beside"] == [], f"{page} at {width} px has a heading beside its content"


@pytest.mark.slow
def test_the_layout_review_sees_a_squeezed_column_covering_boxes_and_a_heading_beside(checked) -> None:
    found, _ = checked["broken", "broken.html", 390]
    assert "error" not in found, found["error"]
    assert any("cpu-cpu-torch" in n for n in found["narrow"]), found
    assert any('"first"' in o and '"second"' in o for o in found["overlap"]), found
    assert any("Stacks" in b for b in found["beside"]), found

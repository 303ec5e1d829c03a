"""The static dashboard, loaded in headless Chromium from a store seeded with five nights.

The release view, grouping, links, fix story and accessibility are tested on the
generated store of tests/fixtures_dashboard.py (120 tests x 10 cells x 14 nights) in
tests/test_dashboard_release.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fixtures_runs import F8_ROWWISE, NIGHTLY_OFF, NIGHTLY_ON, REG_F8_AC, REG_TANGENT, RELEASE_NPU, seed_nights

from distci.dashboard import render_dashboard
from distci.dashboard.model import build_page
from distci.judge.store import Store
from distci.judge.rows import BisectRow
from distci.judge.ingest import ingest_runs

CHROMIUM = os.environ.get("DISTCI_CHROMIUM") or next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"))), None
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",
)
SCREEN = "1440,1960"


@pytest.fixture(scope="module")
def seeded_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dash")
    seeded = seed_nights(root / "runs")
    audit = root / "audit"
    audit.mkdir()
    (audit / "audit.json").write_text(
        json.dumps(
            [
                {
                    "fix": "act-tangent-coercion",
                    "version": "2.11.0.dev20260305",
                    "present": True,
                    "applied": True,
                    "off": "failed",
                    "on": "passed",
                    "verdict": "needed",
                    "cell_id": NIGHTLY_ON,
                },
                {
                    "fix": "rowwise-parallel-wait",
                    "version": "2.10.0",
                    "present": False,
                    "applied": False,
                    "off": "passed",
                    "on": "passed",
                    "verdict": "obsolete",
                },
            ]
        )
    )
    db = root / "store.sqlite"
    with Store(db) as s:
        ingest_runs(s, [seeded.root])
        s.add_bisects(
            [
                BisectRow(
                    REG_TANGENT,
                    "torch-nightly",
                    "2026-03-04",
                    "2026-03-05",
                    "pytorch/pytorch@0e797b5a6acf",
                    ".distci/bisect/act-tangent/report.md",
                    NIGHTLY_OFF,
                    "found",
                    "2026-03-05T09:12:00+00:00",
                )
            ]
        )
    return db


def test_page_shows_regression_flaky_and_infra(seeded_store: Path) -> None:
    with Store(seeded_store) as s:
        page = build_page(s, audit_dir=seeded_store.parent / "audit")
    status = {c.cell_id: c.status for c in page.cells}
    assert status[NIGHTLY_OFF] == "red" and status[NIGHTLY_ON] == "amber" and status[RELEASE_NPU] == "infra"
    assert [(c.result.cell_id, c.result.test_id) for c in page.regressions] == [(NIGHTLY_OFF, REG_TANGENT)]
    assert [(c.result.test_id) for c in page.fixes] == [REG_F8_AC]
    assert page.regressions[0].compared is not None and page.regressions[0].result.error_signature
    assert [f.test_id for f in page.flaky] == [F8_ROWWISE]
    assert {a.fix for a in page.audit} == {"act-tangent-coercion", "rowwise-parallel-wait"}
    assert len(page.nights) == 5 and all(len(v) == 5 for v in page.night_rates.values())


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_dashboard_in_headless_chromium(seeded_store: Path, tmp_path: Path) -> None:
    with Store(seeded_store) as s:
        index = render_dashboard(s, tmp_path / "site", audit_dir=seeded_store.parent / "audit", matrix_path=None)
    served = _Elements()
    served.feed(index.read_text())
    links = [a[k] for t, a in served.elements for k in ("src", "href") if k in a and (k == "src" or t == "link")]
    assert links and not [u for u in links if u.startswith(("http:", "https:", "//"))], "no remote resources"
    assert (tmp_path / "site" / "assets" / "style.css").exists()

    dom = _chromium("--dump-dom", index.as_uri(), profile=tmp_path / "profile").stdout
    parser = _Elements()
    parser.feed(dom)
    rows = {a["data-cell"] for t, a in parser.elements if t == "tr" and "data-state" in a}  # the grid's rows
    chips = [a for t, a in parser.elements if "data-suite" in a]
    assert rows == {c for c in rows if "ws2" in c} and len(rows) == 5
    assert len(chips) == 5 * len({a["data-suite"] for a in chips}) >= 25
    # (an infra result of a test that has an answer since the complete run never replaces it, as
    # in the gate: the infra verdict shows as the npu cell's row, whose run never came up)
    assert {a["data-verdict"] for a in chips} >= {"regression", "pass", "flaky", "xfail", "skip"}

    start = dom.index('data-verdict="regression"', dom.index('id="breaks"'))
    article = dom[start : dom.index("</article>", start)]
    assert REG_TANGENT in article and NIGHTLY_OFF in article and "AsyncCollectiveTensor" in article
    assert F8_ROWWISE in dom[dom.index('id="flaky"') : dom.index('id="history"')]
    npu_row = dom[dom.index(f'data-cell="{RELEASE_NPU}"') : dom.index("</tr>", dom.index(f'data-cell="{RELEASE_NPU}"'))]
    assert "row-infra" in dom[dom.rindex("<tr", 0, dom.index(f'data-cell="{RELEASE_NPU}"')) :][:80]
    assert "v-regression" not in npu_row and "v-fail" not in npu_row

    shot = tmp_path / "dashboard.png"
    _chromium(f"--window-size={SCREEN}", f"--screenshot={shot}", index.as_uri(), profile=tmp_path / "profile")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000

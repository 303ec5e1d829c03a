"""The dashboard a release manager acts on, rendered from a generated store of
120 tests x 10 cells x 14 nights (tests/fixtures_dashboard.py).

Set DISTCI_DASHBOARD_SCREENSHOTS=reports to keep the Chromium screenshots
(reports/dashboard.png: the release view and breaks; reports/dashboard-audit.png).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markupsafe import escape
from fixtures_dashboard import (BREAK_SIG, CI, F8, HIDDEN, HIDDEN_FIXES, HIDDEN_KNOWN, ISSUE_URL, NOW, RELEASE_SIG, TP,
                                generate)
from test_dashboard import CHROMIUM, FLAGS

from distci.audit.model import Audit, AuditRow
from distci.audit.model import TestRun as AuditRun
from distci.dashboard import contrast, render_dashboard
from distci.judge.store import Store
from distci.judge.rows import BisectRow
from distci.judge.ingest import ingest_runs
from distci.provision.sources import IndexConfig

INDEX = IndexConfig(extra_index_urls=("https://download.example/whl/{variant}",),
                    nightly_index_url="https://download.example/nightly/{variant}")


class _Tree(HTMLParser):
    """Elements with their attributes and the text inside each (enough to find articles)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("gen")
    gen = generate(root)
    audit_dir = root / "audit" / "20261130-0900"
    audit_dir.mkdir(parents=True)
    audit = Audit(versions=["2.13.0", "2.14.1"], rows=[
        AuditRow("fix_bug_0", "2.14.1", "suites/regressions/test_pytorch100000_bug.py", True, True, "applied",
                 AuditRun("failed", 0, 1, message="RuntimeError: upstream bug 0"), AuditRun("passed", 1), "needed"),
        AuditRow("fix_bug_1", "2.13.0", "suites/regressions/test_pytorch100001_bug.py", False, False, "out_of_range",
                 AuditRun("passed", 1), AuditRun("passed", 1), "obsolete since 2.13.0"),
    ], started="20261130-0900")
    (audit_dir / "audit.json").write_text(json.dumps(asdict(audit)))
    with Store(root / "store.sqlite") as store:
        ingest_runs(store, [gen.root])
        index = render_dashboard(store, root / "site", matrix_path=gen.matrix, now=NOW, issues=gen.issues,
                                 audit_dir=root / "audit", known_issues=gen.known_issues, index=INDEX)
    html = index.read_text()
    tree = _Tree()
    tree.feed(html)
    return {"gen": gen, "index": index, "html": html, "tree": tree, "data": json.loads((root / "site" / "data.json").read_text())}


def _article(html: str, attr: str) -> str:
    start = html.index(attr)
    start = html.rindex("<article", 0, start)
    return html[start: html.index("</article>", start)]


def _row(html: str, attr: str) -> str:
    start = html.rindex("<tr", 0, html.index(attr))
    return html[start: html.index("</tr>", start)]


def test_release_view_gives_each_tier_the_gates_answer(site: dict) -> None:
    cells, html, gate = site["gen"].cells, site["html"], site["data"]["gate"]
    assert html.index('id="release"') < html.index('id="breaks"') < html.index('id="grid"'), "release view first"
    assert {t: g["status"] for t, g in gate.items()} == {"release": "BLOCKED", "pr": "PASSED", "nightly": "INCOMPLETE"}
    assert [m.group(1) for m in re.finditer(r'data-tier="(\w+)"', html)] == ["release", "pr", "nightly"]
    release = _article(html, 'data-tier="release"')
    assert 'data-status="BLOCKED"' in release and f'data-blocking="{cells["release_red"]}::{TP[7]}"' in release
    assert escape(RELEASE_SIG) in release and "1 stale" in release
    nightly = gate["nightly"]["cells"]
    for role, state in (("missing", "missing"), ("stale", "stale"), ("infra", "infra_only"),
                        ("in_flight", "in_flight"), ("break_on", "ok"), ("twin_off", "ok")):
        assert nightly[cells[role]] == state, role
    night = _article(html, 'data-tier="nightly"')
    assert re.search(r'data-cell-state="missing" data-cell="%s">.*?never' % re.escape(cells["missing"]), night, re.S)
    stale = _row(night, f'data-cell="{cells["stale"]}"')
    assert "stale" in stale and "5d11h ago" in stale
    assert "11h04m ago" in _row(night, f'data-cell="{cells["break_on"]}"'), "each cell's last run age"
    assert "environment never came up: MissingRun" not in html


def test_in_flight_and_stale_runs_are_marked_in_the_grid(site: dict) -> None:
    cells, html = site["gen"].cells, site["html"]
    grid = html[html.index('id="grid"'):html.index('id="nights"')]
    assert 'data-state="in_flight"' in _row(grid, f'data-cell="{cells["in_flight"]}"')
    assert "in flight" in _row(grid, f'data-cell="{cells["in_flight"]}"')
    assert "stale" in _row(grid, f'data-cell="{cells["stale"]}"')
    assert "stale" not in _row(grid, f'data-cell="{cells["twin_on"]}"')


def test_one_card_for_one_upstream_break(site: dict) -> None:
    cells, html = site["gen"].cells, site["html"]
    breaks = html[html.index('id="breaks"'):html.index('id="fixstory"')]
    assert breaks.count(f'data-signature="{BREAK_SIG}"') == 1
    assert breaks.count("<article") == 3, "the break, the release regression, the known issues; nothing per test"
    card = _article(breaks, f'data-signature="{BREAK_SIG}"')
    assert "40 tests in 3 cells" in card and "120 failing results" in card
    assert all(cells[r] in card for r in ("break_cpu", "break_on", "break_off"))
    assert "first bad</span>2026-11-28" in card and "last good</span>2026-11-27" in card
    git = {d: hashlib.sha1(f"torch 2.16.0.dev{d}".encode()).hexdigest() for d in ("20261127", "20261128")}
    assert f"https://github.com/pytorch/pytorch/compare/{git['20261127']}...{git['20261128']}" in card
    assert f"<code>{git['20261127']}</code> → <code>{git['20261128']}</code>" in card, "the stack diff good -> bad"
    assert f'href="{ISSUE_URL}"' in card
    assert all(f'data-test="{t}"' in card.split("<details>")[1] for t in F8), "the tests are folded inside"
    assert [b for b in site["data"]["breaks"] if b["signature"] == BREAK_SIG] == [{"signature": BREAK_SIG, "cells": sorted(
        cells[r] for r in ("break_cpu", "break_on", "break_off")), "tests": 40}]


def test_repro_is_pinned_to_the_stack_and_backend(site: dict) -> None:
    card = _article(site["html"], f'data-signature="{escape(RELEASE_SIG)}"')
    cell = site["gen"].cells["release_red"]
    assert escape(f"--cell {cell} --test 'suites/test_tp.py::test_tp_loss[7]' --backend docker") in card
    assert ("pip install --extra-index-url https://download.example/whl/cu130 torch==2.14.1+cu130 torchao==0.18.0 "
            "triton==3.5.1 &amp;&amp; DISTCI_FIXES=all") in card, "the index a +cu130 build is on"
    nightly = _article(site["html"], f'data-signature="{BREAK_SIG}"')
    assert re.search(r"pip install --extra-index-url https://download.example/whl/cpu "
                     r"--extra-index-url https://download.example/nightly/cpu --pre torch==2.16.0.dev202611\d\d\+cpu ",
                     nightly), "a nightly needs the nightly index and --pre"
    assert "triton</th><td><code>3.5.0</code> → <code>3.5.1</code>" in card


def test_runs_link_ci_artifacts_and_their_logs(site: dict) -> None:
    html, index = site["html"], site["index"]
    base = f"{CI['server']}/{CI['repository']}/actions/runs/{CI['run_id']}"
    assert f'href="{base}/attempts/2"' in html and f'href="{base}#artifacts"' in html
    local = [a["href"] for t, a in site["tree"].elements if t == "a" and a.get("class") == "lnk"
             and not a["href"].startswith(("http", "#"))]
    assert {Path(h).name for h in local} >= {"pytest.log", "stack.json", "rank0.log", "results.jsonl"}
    assert all(h.startswith("runs/") and ".." not in h for h in local), "published inside the site"
    assert all((index.parent / h).is_file() for h in local), "the run files are in the site (GitHub Pages serves them)"
    assert "javascript:" not in html, "a run.json's ci.server never becomes a link"
    stale = _row(html[html.index('id="grid"'):], f'data-cell="{site["gen"].cells["stale"]}"')
    assert "CI run" not in stale and "pytest.log" in stale


def test_the_page_is_the_same_rendered_from_another_directory(site: dict, tmp_path: Path, monkeypatch) -> None:
    """The store keeps absolute run paths: from any cwd the CI, artifact and log links are there."""
    monkeypatch.chdir(tmp_path)
    with Store(site["index"].parent.parent / "store.sqlite") as store:
        again = render_dashboard(store, tmp_path / "elsewhere", matrix_path=site["gen"].matrix, now=NOW,
                                 issues=site["gen"].issues, audit_dir=None, known_issues=site["gen"].known_issues,
                                 index=INDEX)
    links = lambda html: sorted(re.findall(r'class="lnk" href="([^"]+)"', html))  # noqa: E731
    assert links(again.read_text()) == links(site["html"]) and len(links(site["html"])) > 20


def test_known_issue_chips_link_upstream_and_tests_sort_naturally(site: dict) -> None:
    from fixtures_dashboard import UPSTREAM

    story = _article(site["html"], f'data-off="{site["gen"].cells["twin_off"]}"')
    for k in HIDDEN_KNOWN[:4]:
        assert f'<a class="tag known" href="{UPSTREAM[k]}">{k}</a>' in story
    assert f'<span class="tag known">{HIDDEN_KNOWN[4]}</span>' in story, "a javascript: upstream is no link"
    card = _article(site["html"], f'data-signature="{BREAK_SIG}"')
    order = [m.group(1) for m in re.finditer(r'data-test="suites/test_float8.py::test_float8_grads\[(\d+)\]"', card)]
    assert order[:12] == [str(i) for i in range(12)], order[:12]


def test_fix_story_says_what_the_fixes_hide(site: dict) -> None:
    cells, html = site["gen"].cells, site["html"]
    story = _article(html, f'data-off="{cells["twin_off"]}"')
    assert 'data-bugs="5"' in story and "hides <strong>5 upstream bugs</strong>" in story
    assert all(k in story for k in HIDDEN_KNOWN) and all(f in story for f in HIDDEN_FIXES)
    assert all(f'data-test="{t}"' in story for t in HIDDEN)
    twin = _row(html[html.index('id="grid"'):], f'data-cell="{cells["twin_off"]}"')
    assert "hides 5 upstream bugs" in twin and "35/40 · 5 known" in twin
    audit = (site["index"].parent / "audit.html").read_text()
    assert "fix_bug_0" in audit and "failed (0/1)" in audit and "obsolete since 2.13.0" in audit
    assert "RuntimeError: upstream bug 0" in audit and "20261130-0900" in audit
    assert "No fix audit recorded" not in audit


def test_accessible_squares_details_and_contrast(site: dict) -> None:
    """Over the whole site: the per-test history squares live on the cells' pages."""
    html = "".join(p.read_text() for p in sorted(site["index"].parent.glob("*.html")))
    tree = _Tree()
    tree.feed(html)
    squares = re.findall(r'<span class="sq v-(\w+)" role="img" aria-label="([^"]+)" title="[^"]*">([^<]+)</span>', html)
    assert len(squares) > 1000 and all(glyph.strip() for _, _, glyph in squares), "a glyph in every square"
    assert {v for v, _, _ in squares} >= {"pass", "fail", "regression", "xfail", "infra", "none"}
    assert len({g for v, _, g in squares if v in ("pass", "fail", "regression")}) == 3
    titled = [a for t, a in tree.elements if "title" in a and t != "svg"]
    assert all("aria-label" in a for a in titled), "no detail lives only in a title attribute"
    assert sum(t == "details" for t, _ in tree.elements) > 50
    index = site["html"]
    assert "<path d=" not in index[index.index('id="nights"'):index.index('id="flaky"')].split("<figure")[0], \
        "a heat-map, not a many-line chart"
    css = (site["index"].parent / "assets" / "style.css").read_text()
    pairs = contrast.check(css)
    assert pairs and all(p.ok for p in pairs), [p.line() for p in pairs if not p.ok]
    assert {p.where for p in pairs} >= {".v-pass", ".v-regression", ".v-none", ".muted", ".st-stale"}


def test_contrast_check_fails_on_the_old_colours(tmp_path: Path) -> None:
    old = ":root { --card: #ffffff; --bg: #f6f8fa; --pass: #2da44e; }\n.card { background: var(--card); }\n" \
          ".v-pass { background: var(--pass); color: #fff; }\n.v-fail { background: #f47067; color: #fff; }\n" \
          ".v-none { background: #f0f2f4; color: #8c959f; }\n"
    bad = {p.where: p.ratio for p in contrast.check(old) if not p.ok}
    assert round(bad[".v-pass"], 2) == 3.22 and round(bad[".v-fail"], 2) == 2.85 and round(bad[".v-none"], 2) == 2.71
    (tmp_path / "old.css").write_text(old)
    assert contrast.main([str(tmp_path / "old.css")]) == 1
    assert contrast.main([]) == 0


def test_page_stays_small(site: dict) -> None:
    assert site["index"].stat().st_size < 400_000
    assert not re.search(r'(src|href)="(https?:)?//(?!github\.com/)', site["html"]), "no remote resources"


def test_site_is_split_by_cell_week_and_tier_and_every_local_link_resolves(site: dict) -> None:
    """index.html stays the size of one night; each cell, week and tier has its own page,
    and every relative link of every page names a file that exists (and an id in it)."""
    out, gen = site["index"].parent, site["gen"]
    ran = [c for role, c in gen.cells.items() if role != "missing"]
    assert sorted(p.name for p in out.glob("cell-*.html")) == sorted(f"cell-{c}.html" for c in ran)
    assert [p.name for p in sorted(out.glob("week-*.html"))] == ["week-2026-W47.html", "week-2026-W48.html",
                                                             "week-2026-W49.html"]
    assert {p.name for p in out.glob("tier-*.html")} == {"tier-nightly.html", "tier-pr.html", "tier-release.html"}
    release_red = (out / f"cell-{gen.cells['release_red']}.html").read_text()
    assert f'data-test="{TP[7]}"' in release_red and 'id="stack"' in release_red and "3.5.1" in release_red
    assert f'href="cell-{gen.cells["release_red"]}.html"' in site["html"], "the index links the cell's page"
    week = (out / "week-2026-W48.html").read_text()
    assert week.count('<tr><th scope="row" class="cellid">') == len(ran) and ">11-23<" in week and ">11-29<" in week
    ids: dict[str, set[str]] = {}
    hrefs: list[tuple[str, str]] = []
    for page in out.glob("*.html"):
        tree = _Tree()
        tree.feed(page.read_text())
        ids[page.name] = {a["id"] for _, a in tree.elements if "id" in a}
        hrefs += [(page.name, a["href"]) for t, a in tree.elements if t == "a" and "href" in a]
    local = [(p, h) for p, h in hrefs if not h.startswith(("http://", "https://"))]
    assert local and len(ids) > 10
    for page, href in local:
        target, _, anchor = href.partition("#")
        target = target or page
        assert (out / target).exists(), f"{page}: {href}"
        if anchor and target.endswith(".html"):
            assert anchor in ids[target], f"{page}: {href}"


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=180, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_release_view_in_headless_chromium(site: dict, tmp_path: Path) -> None:
    index = site["index"]
    dom = _chromium("--dump-dom", index.as_uri(), profile=tmp_path / "profile").stdout
    assert 'data-status="BLOCKED"' in dom and dom.count(f'data-signature="{BREAK_SIG}"') == 1
    keep = os.environ.get("DISTCI_DASHBOARD_SCREENSHOTS")
    for page, name, size in (("index.html", "dashboard.png", "1440,2400"), ("audit.html", "dashboard-audit.png",
                                                                            "1440,700")):
        shot = tmp_path / name
        _chromium(f"--window-size={size}", f"--screenshot={shot}", (index.parent / page).as_uri(),
                  profile=tmp_path / "profile")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, Path(keep) / name)


def test_a_blocker_says_since_when_what_changed_and_what_to_do(site: dict) -> None:
    """The release view's blocking item: first-bad date, stack diff from the last good run,
    pasteable repro lines, and a link to the card of its break."""
    import html as htmllib
    import shlex

    cell = site["gen"].cells["release_red"]
    start = site["html"].index(f'data-blocking="{cell}::{TP[7]}"')
    item = site["html"][start: site["html"].index("</li>", start)]
    assert 'data-since="2026-11-30"' in item and "last good 2026-11-29" in item
    assert "triton <code>3.5.0</code> → <code>3.5.1</code>" in item
    card = re.search(r'href="#(break-[0-9a-f]+)">its break card', item).group(1)
    assert f'id="{card}" data-signature="{escape(RELEASE_SIG)}"' in site["html"]
    lines = [htmllib.unescape(x) for x in re.findall(r'<code class="copy">(.*?)</code>', item)]
    assert shlex.split(lines[0]) == ["nox", "-s", "dist_tests", "--", "--cell", cell, "--test", TP[7], "--backend",
                                     "docker"]
    pip = shlex.split(lines[1].split(" && ")[0])
    assert pip[:4] == ["pip", "install", "--extra-index-url", "https://download.example/whl/cu130"]
    assert "torch==2.14.1+cu130" in pip and "triton==3.5.1" in pip


def test_the_gate_step_summary_says_the_same(site: dict) -> None:
    from distci.dashboard.release import explain
    from distci.judge.gate import evaluate, evaluate_cells, explain_blocking

    cells = site["gen"].cells
    copy = site["index"].parent.parent / "store-with-bisect.sqlite"
    with Store(site["index"].parent.parent / "store.sqlite") as store:
        store.conn.execute("VACUUM INTO ?", (str(copy),))
    with Store(copy) as store:
        store.add_bisects([BisectRow(TP[7], "triton", "3.5.0", "3.5.1", "triton==3.5.1", "", cells["release_red"],
                                     "found", "2026-11-30T09:00:00+00:00")])
        release = explain_blocking(store, evaluate(store, "release", matrix_path=site["gen"].matrix, now=NOW))
        broken = explain_blocking(store, evaluate_cells(store, "nightly", [cells["break_cpu"]], blocking_suites=None,
                                                        now=NOW))
        blockers = explain(store, broken.blocking, index=INDEX)
    md = release.to_markdown()
    row = next(line for line in md.splitlines() if f"`{TP[7]}`" in line and line.startswith("| regression"))
    assert "2026-11-30" in row and "triton `3.5.0` → `3.5.1`" in row
    assert f"--cell {cells['release_red']} --test 'suites/test_tp.py::test_tp_loss[7]'" in md
    assert "bisect triton 3.5.0..3.5.1: `triton==3.5.1`" in md
    git = {d: hashlib.sha1(f"torch 2.16.0.dev{d}".encode()).hexdigest() for d in ("20261127", "20261128")}
    compare = f"https://github.com/pytorch/pytorch/compare/{git['20261127']}...{git['20261128']}"
    assert f"]({compare})" in broken.to_markdown() and "2026-11-28" in broken.to_markdown()
    assert blockers[0].since == "2026-11-28" and blockers[0].onset.compare[0][1] == compare, "the page agrees"


def test_ci_links_need_no_run_directory(site: dict, tmp_path: Path) -> None:
    """The store keeps run.json's ci block: a store copied elsewhere (the `store` artifact)
    still links every run's CI job and artifacts, and only the run files drop out."""
    copy = tmp_path / "store.sqlite"
    with Store(site["index"].parent.parent / "store.sqlite") as store:
        store.conn.execute("VACUUM INTO ?", (str(copy),))
    with Store(copy) as store:
        store.conn.execute("UPDATE runs SET source_path = '/nonexistent/' || run_id")
        index = render_dashboard(store, tmp_path / "site", matrix_path=None, audit_dir=None, known_issues=None)
    html = index.read_text()
    base = f"{CI['server']}/{CI['repository']}/actions/runs/{CI['run_id']}"
    assert f'href="{base}/attempts/2"' in html and f'href="{base}#artifacts"' in html
    assert "pytest.log" not in html and "javascript:" not in html


@pytest.fixture(scope="module")
def rerun_site(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The generated store after two narrowed reruns on the last night's stacks: one passing
    test of the blocked release cell, and two of the fixes-off twin's hidden failures."""
    from datetime import timedelta

    from fixtures_dashboard import HIDDEN_KNOWN as KNOWN, NIGHTS, START, _rows, _stack
    from fixtures_runs import write_run

    root = tmp_path_factory.mktemp("rerun")
    gen = generate(root)
    night = (START + timedelta(days=NIGHTS - 1)).date().isoformat()
    red, twin = gen.cells["release_red"], gen.cells["twin_off"]
    write_run(gen.root, f"20261130T133000Z-rr-{red}", red, [{"test_id": TP[0], "duration_s": 2.0}],
              started_at=NOW - timedelta(minutes=30), stack=_stack(red, night, triton="3.5.1"), tier="nightly",
              runner="gpu-runner-1", selection=["-k", "test_tp_loss and 0"])
    twin_rows = [r for r in _rows("twin_off", NIGHTS - 1) if r["test_id"] in HIDDEN[:2]]
    assert [r.get("known_issue") for r in twin_rows] == KNOWN[:2]
    write_run(gen.root, f"20261130T134000Z-rr-{twin}", twin, twin_rows, started_at=NOW - timedelta(minutes=20),
              stack=_stack(twin, night), tier="nightly", runner="ubuntu-2c", backend="venv", selection=["-k", "bug"])
    never = gen.cells["missing"]  # never ran whole: its one run is narrowed, so the gate calls it partial
    write_run(gen.root, f"20261130T135000Z-rr-{never}", never, [{"test_id": TP[1], "duration_s": 2.0}],
              started_at=NOW - timedelta(minutes=10), stack=_stack(never, night), tier="nightly", runner="ubuntu-2c",
              backend="venv", selection=["-k", "test_tp_loss and 1"])
    with Store(root / "store.sqlite") as store:
        ingest_runs(store, [gen.root])
        index = render_dashboard(store, root / "site", matrix_path=gen.matrix, now=NOW, issues=gen.issues,
                                 known_issues=gen.known_issues, index=INDEX)
        from distci.judge.gate import evaluate

        gate = {c.cell_id: c for c in evaluate(store, "nightly", matrix_path=gen.matrix, now=NOW).cells}
    return {"gen": gen, "html": index.read_text(), "data": json.loads((root / "site" / "data.json").read_text()),
            "gate": gate}


def test_after_a_narrowed_rerun_every_card_agrees_with_the_gate(rerun_site: dict) -> None:
    """A narrowed rerun adds evidence and never replaces the complete run (DESIGN rule 12):
    the gate stays BLOCKED by the same test, and so does every card of the page: the
    blocker's card link resolves, Breaks keeps the regression, the grid counts the whole
    tier, the Fix story still counts the twin's five hidden bugs."""
    cells, html, data = rerun_site["gen"].cells, rerun_site["html"], rerun_site["data"]
    assert data["gate"]["release"]["status"] == "BLOCKED"
    red = cells["release_red"]
    start = html.index(f'data-blocking="{red}::{TP[7]}"')
    item = html[start: html.index("</li>", start)]
    card = re.search(r'href="#(break-[0-9a-f]+)">its break card', item).group(1)
    assert f'id="{card}" data-signature="{escape(RELEASE_SIG)}"' in html
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    assert sorted(set(re.findall(r'href="#([^"]+)"', html)) - ids) == [], "anchors the page does not have"
    breaks = html[html.index('id="breaks"'):html.index('id="fixstory"')]
    assert f'data-signature="{escape(RELEASE_SIG)}"' in breaks
    grid = html[html.index('id="grid"'):html.index('id="nights"')]
    row = _row(grid, f'data-cell="{red}"')
    assert "39/40" in row and ">1/1<" not in row, row
    story = _article(html, f'data-off="{cells["twin_off"]}"')
    assert 'data-bugs="5"' in story and "hides <strong>5 upstream bugs</strong>" in story
    twin = _row(grid, f'data-cell="{cells["twin_off"]}"')
    assert "hides 5 upstream bugs" in twin and "35/40 · 5 known" in twin


def test_a_partial_cell_has_a_badge_and_the_gates_one_cause(rerun_site: dict) -> None:
    """`partial` is shown as a badge where the gate's states are, with the cause the gate
    gave (the page never words its own), in the release view and in the grid."""
    cell = rerun_site["gen"].cells["missing"]
    state = rerun_site["gate"][cell]
    assert state.state == "partial" and state.reason
    html = rerun_site["html"]
    night = _article(html, 'data-tier="nightly"')
    row = _row(night, f'data-cell="{cell}"')
    assert 'data-cell-state="partial"' in row and 'class="badge st-partial">◑ partial<' in row
    assert str(escape(state.reason)) in row
    assert "1 partial" in night
    grid = html[html.index('id="grid"'):html.index('id="nights"')]
    assert "◑ partial" in _row(grid, f'data-cell="{cell}"')

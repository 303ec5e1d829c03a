"""Writes the static site: index.html (Jinja2, server-side rendered), assets/, data.json.

No server, no script, no CDN: the page works from file:// and from GitHub Pages, and
a headless browser's --dump-dom sees everything.
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import jinja2

from distci.dashboard import charts
from distci.dashboard.model import Page, build_page, page_json
from distci.judge.store import DEFAULT_AUDIT_DIR, Store
from distci.provision.sources import IndexConfig

HERE = Path(__file__).parent
DEFAULT_MATRIX = Path("matrix.toml")
DEFAULT_KNOWN_ISSUES = Path("suites") / "known_issues.toml"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["short"] = lambda s, n=12: (s or "")[:n]
    env.filters["mmdd"] = lambda s: (s or "")[5:10]
    env.filters["pct"] = lambda v: "–" if v is None else f"{v:.0f}%"
    env.filters["when"] = lambda s: (s or "").replace("T", " ")[:16]
    env.globals.update(charts=charts, colors=charts.VERDICT_COLORS)
    return env


def render_page(page: Page, template: str = "index.html.j2") -> str:
    return _environment().get_template(template).render(page=page)


def render_dashboard(
    store: Store,
    out_dir: Path | str,
    *,
    title: str = "distci",
    audit_dir: Path | None = DEFAULT_AUDIT_DIR,
    history_runs: int = 14,
    matrix_path: Path | None = DEFAULT_MATRIX,
    now: datetime | None = None,
    issues: dict[str, str] | None = None,
    known_issues: Path | None = DEFAULT_KNOWN_ISSUES,
    index: IndexConfig | None = None,
) -> Path:
    """Writes the site (index.html, audit.html, assets/, data.json) into out_dir; returns index.html.

    `matrix_path` gives the release view its tiers (default: ./matrix.toml, as the CLI's
    --matrix; no file, no release view); `issues` maps error signatures to filed issues;
    `known_issues` is the registry the known-issue chips link upstream from (default
    ./suites/known_issues.toml, when there); `index` the indexes of pinned repro lines.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    page = build_page(store, title=title, audit_dir=audit_dir, history_runs=history_runs, matrix_path=matrix_path,
                      now=now, site=out, issues=issues, known_issues=known_issues, index=index)
    assets = out / "assets"
    assets.mkdir(exist_ok=True)
    for f in (HERE / "assets").iterdir():
        if f.is_file():
            shutil.copyfile(f, assets / f.name)
    (out / ".nojekyll").write_text("")
    (out / "data.json").write_text(page_json(page) + "\n", encoding="utf-8")
    (out / "audit.html").write_text(render_page(page, "audit.html.j2"), encoding="utf-8")
    index = out / "index.html"
    index.write_text(render_page(page), encoding="utf-8")
    return index

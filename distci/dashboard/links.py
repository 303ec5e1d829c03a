"""Where a person goes from a run: its CI job, its logs, the upstream diff, a pinned repro.

Every link is computed from what a run recorded (run.json's `ci` block, stack.json, the
run directory the store indexed), never guessed: a link that is not known is left out.
Log links are relative paths from the site to the run directory, so they work when the
site is built beside the runs (CI artifacts, a local `.distci/`) and from file://.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from distci.rundir import repro_line
from distci.judge.store import RunRow

# Upstream repositories of the packages whose commits a stack can name.
UPSTREAM = {"torch": "pytorch/pytorch", "torchao": "pytorch/ao", "torchtitan": "pytorch/torchtitan"}
GITHUB = "https://github.com"
MAX_RANK_LOGS = 8
_GIT_IN_VERSION = re.compile(r"\+git([0-9a-f]{7,40})\b")


@dataclass(frozen=True)
class Link:
    label: str
    href: str


def ci_links(ci: Mapping[str, str]) -> list[Link]:
    """The workflow run (its attempt when rerun) and its artifacts list."""
    if not ci or not {"server", "repository", "run_id"} <= ci.keys():
        return []
    base = f"{ci['server']}/{ci['repository']}/actions/runs/{ci['run_id']}"
    run = base + (f"/attempts/{ci['attempt']}" if ci.get("attempt") not in (None, "", "1") else "")
    label = f"CI run {ci['run_id']}" + (f" ({ci['job']})" if ci.get("job") else "")
    return [Link(label, run), Link("artifacts", f"{base}#artifacts")]


def read_run_json(run: RunRow) -> dict[str, Any]:
    """run.json of the indexed run directory, when it is still there (keys the store drops)."""
    try:
        data = json.loads((Path(run.source_path) / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _relative(target: Path, site: Path) -> str:
    return Path(os.path.relpath(target.resolve(), site.resolve())).as_posix()


def run_links(run: RunRow, site: Path | None) -> list[Link]:
    """CI run and artifacts, then the run's files (pytest.log, rank logs, stack.json)."""
    links = ci_links(read_run_json(run).get("ci") or {})
    if site is None or not run.source_path:
        return links
    run_dir = Path(run.source_path)
    for name, label in (("pytest.log", "pytest.log"), ("stack.json", "stack.json"), ("results.jsonl", "results")):
        if (run_dir / name).is_file():
            links.append(Link(label, _relative(run_dir / name, site)))
    logs = sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").is_dir() else []
    for log in logs[:MAX_RANK_LOGS]:
        links.append(Link(log.stem, _relative(log, site)))
    return links


def package_commit(stack: Mapping[str, Any], package: str) -> str | None:
    """The upstream commit a stack names for a package: torch's git_version, a `<pkg>_git`
    key, or a `+git<sha>` local version (source installs)."""
    value = stack.get(f"{package}_git")
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{7,40}", value):
        return value
    m = _GIT_IN_VERSION.search(str(stack.get(package) or ""))
    return m.group(1) if m else None


def compare_links(good: Mapping[str, Any], bad: Mapping[str, Any]) -> list[Link]:
    """`compare/<good>...<bad>` for each upstream package whose commit changed."""
    out = []
    for package, repo in UPSTREAM.items():
        a, b = package_commit(good, package), package_commit(bad, package)
        if a and b and a != b:
            out.append(Link(f"{package} {a[:10]}…{b[:10]}", f"{GITHUB}/{repo}/compare/{a}...{b}"))
    return out


def pinned_requirements(stack: Mapping[str, Any]) -> list[str]:
    """`name==version` for the tracked packages of a stack (what a pinned repro installs)."""
    out = []
    for package in ("torch", "torchao", "torchtitan", "torch_npu", "triton"):
        version = stack.get(package)
        if isinstance(version, str) and version and version != "none":
            out.append(f"{package}=={version}")
    return out


def repro_lines(run: RunRow, test_id: str, *, world_size: int | None = None) -> list[str]:
    """Commands that rerun `test_id` on the stack this run had, not on what resolves today.

    The first is rundir's repro line with the run's backend (a nightly or specifier cell
    re-resolves through it); the second pins every version (or the image digest) and
    runs the harness directly.
    """
    cell = run.cell_id
    first = repro_line(cell, test_id, backend=run.backend or "venv")
    fixes = "none" if cell.endswith("fix_off") else "all"
    m = re.search(r"-ws(\d+)-", cell)
    ws = world_size or (int(m.group(1)) if m else 2)
    harness = (f"DISTCI_FIXES={fixes} python -m pytest -p distci.harness --distci-world-size={ws} "
               f"--distci-device={cell.split('-', 1)[0]} {shlex.quote(test_id)}")
    digest = run.image_digest or run.stack.get("image_digest")
    if digest:
        image = read_run_json(run).get("image") or "IMAGE"
        return [first, f"docker run --rm {image}@{digest} {harness}" if "@" not in str(image)
                else f"docker run --rm {image} {harness}"]
    pins = pinned_requirements(run.stack)
    if not pins:
        return [first]
    return [first, f"pip install {' '.join(shlex.quote(p) for p in pins)} && {harness}"]


def page_file(kind: str, name: str) -> str:
    """The file name of a split page: `cell-<id>.html`, `week-<label>.html`, `tier-<name>.html`,
    beside index.html (one directory: every relative link works on file:// and on Pages)."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)
    return f"{kind}-{safe}.html"

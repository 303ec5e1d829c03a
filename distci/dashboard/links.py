"""Where a person goes from a run: its CI job, its logs, the upstream diff, a pinned repro.

Every link is computed from what a run recorded (run.json's `ci` block and image, which
the store keeps; stack.json; the run directory the store indexed, by its absolute path),
never guessed: a link that is not known is left out, and so is one that would
not be http(s) (a `ci.server` of `javascript:...` in a run.json never becomes a link).
The run files a page links are published into the site (`runs/<run-id>/`), so every
link is relative inside the site or http(s): they resolve on GitHub Pages, from file://
and wherever the site is copied, whatever directory it was rendered from.
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version

from distci.errors import ConfigError
from distci.judge.history import compare_urls
from distci.judge.rows import RunRow
from distci.provision.sources import IndexConfig, format_url
from distci.rundir import PYTEST_LOG, RESULTS_FILE, STACK_FILE, repro_line
from distci.stack import Stack

MAX_RANK_LOGS = 8
MAX_PUBLISHED_BYTES = 4 << 20  # a bigger log stays in the run's Actions artifact (linked)
PUBLISHED = "runs"  # the site's folder of run files
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_RUN_ID = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class Link:
    label: str
    href: str


def web_url(url: Any) -> str | None:
    """`url` without a trailing slash when it is an http(s) URL with a host, else None."""
    if not isinstance(url, str):
        return None
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return url.strip().rstrip("/")


def ci_links(ci: Mapping[str, Any]) -> list[Link]:
    """The workflow run (its attempt when rerun) and its artifacts list; none unless the
    server is http(s), the repository `owner/name` and the run id a number."""
    if not ci or not {"server", "repository", "run_id"} <= ci.keys():
        return []
    server, repository, run_id = web_url(ci["server"]), str(ci["repository"]), str(ci["run_id"])
    if server is None or not _REPOSITORY.match(repository) or not run_id.isdigit():
        return []
    base = f"{server}/{repository}/actions/runs/{run_id}"
    attempt = str(ci.get("attempt") or "")
    run = base + (f"/attempts/{attempt}" if attempt.isdigit() and attempt != "1" else "")
    label = f"CI run {run_id}" + (f" ({ci['job']})" if ci.get("job") else "")
    return [Link(label, run), Link("artifacts", f"{base}#artifacts")]


def publish(source: Path, site: Path, run_id: str, name: str) -> str | None:
    """Copies one run file into the site; its href relative to the site, or None when it
    cannot be published (too big, an odd run id)."""
    if not _RUN_ID.match(run_id) or source.stat().st_size > MAX_PUBLISHED_BYTES:
        return None
    target = site / PUBLISHED / run_id / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return f"{PUBLISHED}/{run_id}/{name}"


def run_links(run: RunRow, site: Path | None) -> list[Link]:
    """CI run and artifacts, then the run's files (pytest.log, stack.json, rank logs),
    published into the site when `site` is given."""
    links = ci_links(run.ci)
    if site is None or not run.source_path:
        return links
    run_dir = Path(run.source_path)
    files = [(run_dir / n, n, label) for n, label in ((PYTEST_LOG, PYTEST_LOG), (STACK_FILE, STACK_FILE),
                                                      (RESULTS_FILE, "results"))]
    logs = sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").is_dir() else []
    files += [(log, f"logs/{log.name}", log.stem) for log in logs[:MAX_RANK_LOGS]]
    for path, name, label in files:
        if path.is_file() and (href := publish(path, Path(site), run.run_id, name)):
            links.append(Link(label, href))
    return links


def compare_links(good: Stack, bad: Stack) -> list[Link]:
    """`compare/<good>...<bad>` for each upstream package whose commit changed."""
    return [Link(label, url) for label, url in compare_urls(good, bad)]


def pinned_requirements(stack: Stack) -> list[str]:
    """`name==version` for the tracked packages of a stack (what a pinned repro installs)."""
    out = []
    for package in ("torch", "torchao", "torchtitan", "torch_npu", "triton"):
        version = stack.get(package)
        if isinstance(version, str) and version and version != "none":
            out.append(f"{package}=={version}")
    return out


def _version(pin: str) -> Version | None:
    try:
        return Version(pin.partition("==")[2])
    except InvalidVersion:
        return None


def pip_index_args(pins: list[str], config: IndexConfig, variant: str | None) -> list[str] | None:
    """What `pip install` needs to find these exact versions: the configured indexes, the
    nightly or test channel for a dev or release-candidate torch, `--pre` for any
    pre-release. None when a pin needs an index the configuration does not name (a
    `+cu130` build with no index configured is on no default index)."""
    args: list[str] = []
    try:
        if config.index_url:
            args += ["--index-url", format_url(config.index_url, variant, "DISTCI_INDEX_URL")]
        for url in config.extra_index_urls:
            args += ["--extra-index-url", format_url(url, variant, "DISTCI_EXTRA_INDEX_URLS")]
        for loc in config.find_links:
            args += ["--find-links", format_url(loc, variant, "DISTCI_FIND_LINKS")]
        torch = next((_version(p) for p in pins if p.startswith("torch==")), None)
        if torch is not None and torch.is_devrelease:
            if not config.nightly_index_url:
                return None
            args += ["--extra-index-url", format_url(config.nightly_index_url, variant, "DISTCI_NIGHTLY_INDEX_URL")]
        elif torch is not None and torch.is_prerelease:
            if not config.test_index_url:
                return None
            args += ["--extra-index-url", format_url(config.test_index_url, variant, "DISTCI_TEST_INDEX_URL")]
    except ConfigError:
        return None
    if not args and any((v := _version(p)) is not None and v.local for p in pins):
        return None
    if any((v := _version(p)) is not None and v.is_prerelease for p in pins):
        args.append("--pre")
    return args


def repro_lines(run: RunRow, test_id: str, *, world_size: int | None = None,
                index: IndexConfig | None = None) -> list[str]:
    """Commands that rerun `test_id`, each pasteable as it stands.

    The first is rundir's repro line with the run's backend (in a checkout; a nightly or
    specifier cell re-resolves through it). The second reruns it on the stack this run
    had: its image by digest, or `pip install` of every version with the indexes and
    `--pre` they need (from `index`, default: the DISTCI_* index variables), then the
    harness directly; left out when no configured index serves those versions.
    """
    cell = run.cell_id
    first = repro_line(cell, test_id, backend=run.backend or "venv")
    fixes = "none" if cell.endswith("fix_off") else "all"
    m = re.search(r"-ws(\d+)-", cell)
    ws = world_size or (int(m.group(1)) if m else 2)
    accelerator, _, rest = cell.partition("-")
    harness = (f"DISTCI_FIXES={fixes} python -m pytest -p distci.harness.plugin --distci-world-size={ws} "
               f"--distci-device={accelerator} {shlex.quote(test_id)}")
    digest = run.image_digest or run.stack.image_digest
    if digest:
        image = run.image or "IMAGE"
        return [first, f"docker run --rm {image}@{digest} {harness}" if "@" not in str(image)
                else f"docker run --rm {image} {harness}"]
    pins = pinned_requirements(run.stack)
    index_args = pip_index_args(pins, index or IndexConfig.from_env(), rest.partition("-")[0] or None)
    if not pins or index_args is None:
        return [first]
    return [first, f"pip install {' '.join(shlex.quote(a) for a in [*index_args, *pins])} && {harness}"]


def page_file(kind: str, name: str) -> str:
    """The file name of a split page: `cell-<id>.html`, `week-<label>.html`, `tier-<name>.html`,
    beside index.html (one directory: every relative link works on file:// and on Pages)."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)
    return f"{kind}-{safe}.html"

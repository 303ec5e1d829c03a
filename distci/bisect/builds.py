"""Two torch builds and what they need, planned before anything is downloaded.

A torch wheel alone does not import: it needs its dependencies (typing_extensions, sympy,
and for a CUDA build the nvidia-* libraries it finds by RPATH). python-diff installs them
once, from the bad build's own metadata: pip resolves the bad build's requirement with
the machine's pip configuration (`pip install --dry-run --report`, metadata only), and
every package of that resolution but torch becomes a pin of one shared base env. Both
builds are installed alone (``--no-deps``) over that base, and every overlay of the
search is a hard-linked copy of the good build's site-packages, so there is one copy of
each dependency and no second full torch.

The same resolution gives the sizes of what will be downloaded (local files by stat,
remote ones by a HEAD request), so the disk and time a cold run needs are printed, and
checked against the free disk, before the first byte is fetched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from packaging.utils import canonicalize_name

from distci.bisect.state import BisectError

Log = Callable[[str], None]
# What an installed wheel takes on disk against its compressed size, and how fast wheels
# unpack, measured on a cold torch 2.14.0 -> 2.14.1 run (CUDA 13 builds, 3.6 GB of wheels,
# 10 GB on disk, 2-core shared machine): see reports/bisect-torch-python-diff.md.
INSTALLED_RATIO = 1.8
REMOTE_MB_S = 20.0  # an assumption for the estimate, said as one
INSTALL_MB_S = 35.0


@dataclass(frozen=True)
class Planned:
    """One distribution pip would install: name, version, where from, size (None: unknown)."""

    name: str
    version: str
    url: str
    size: int | None

    @property
    def remote(self) -> bool:
        return not self.url.startswith("file:")


@dataclass
class BuildPlan:
    """The base env's pins (the bad build's dependencies, resolved) and the downloads."""

    base_requirements: list[str]
    downloads: list[Planned] = field(default_factory=list)
    resolve_seconds: float = 0.0

    @property
    def known_bytes(self) -> int:
        return sum(p.size or 0 for p in self.downloads)

    @property
    def remote_bytes(self) -> int:
        return sum(p.size or 0 for p in self.downloads if p.remote)

    def disk_bytes(self) -> int:
        """The wheelhouse archive keeps the wheels; the envs hold them unpacked, once."""
        return int(self.known_bytes * (1 + INSTALLED_RATIO))

    def seconds(self) -> float:
        return (self.remote_bytes / (REMOTE_MB_S * 1e6) + self.known_bytes * INSTALLED_RATIO
                / (INSTALL_MB_S * 1e6))

    def describe(self) -> str:
        unknown = [p.name for p in self.downloads if p.size is None]
        text = (f"estimate: {len(self.downloads)} wheels, {_gb(self.known_bytes)} to fetch "
                f"({_gb(self.remote_bytes)} remote), about {_gb(self.disk_bytes())} of disk, "
                f"about {self.seconds() / 60:.0f} min to download and install "
                f"(remote at an assumed {REMOTE_MB_S:g} MB/s); then each probe runs the check once")
        if unknown:
            text += f"; size unknown: {', '.join(unknown[:5])}"
        return text


def plan_builds(good: str, bad: str, extra: Sequence[str], pip_args: Sequence[str], *,
                python: str = sys.executable, log: Log = print) -> BuildPlan:
    """Resolve `bad` (a requirement such as ``torch==2.14.1``) with `extra` (what the check
    imports besides) as pip would, and `good` alone; no download."""
    import time

    started = time.monotonic()
    resolved = _dry_run([bad, *extra], pip_args, python)
    good_only = _dry_run([good], [*pip_args, "--no-deps"], python)
    package = canonicalize_name(bad.split("==")[0].split(">")[0].split("<")[0].strip())
    pins, downloads = [], []
    for item in [*resolved, *good_only]:
        meta = item["metadata"]
        name, version = meta["name"], meta["version"]
        url = item.get("download_info", {}).get("url", "")
        if canonicalize_name(name) != package and item in resolved:
            pins.append(f"{name}=={version}")
        if url and not any(p.url == url for p in downloads):
            downloads.append(Planned(name, version, url, _size(url)))
    return BuildPlan(sorted(set(pins), key=str.lower), downloads, round(time.monotonic() - started, 1))


def cached_plan(path: Path, make: Callable[[], BuildPlan], log: Log = print) -> BuildPlan:
    """The plan saved at `path` (keyed by the caller on every input of the resolution),
    else `make()` saved there: a rerun does not resolve again."""
    try:
        data = json.loads(path.read_text())
        plan = BuildPlan(data["base_requirements"], [Planned(**p) for p in data["downloads"]],
                         data["resolve_seconds"])
        log(f"plan: from {path}")
        return plan
    except (OSError, ValueError, KeyError, TypeError):
        pass
    plan = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"base_requirements": plan.base_requirements,
                               "downloads": [vars(p) for p in plan.downloads],
                               "resolve_seconds": plan.resolve_seconds}))
    tmp.replace(path)
    return plan


def check_disk(plan: BuildPlan, where: Path, log: Log = print) -> None:
    """Refuse to start downloads the disk cannot hold (with what was found and a way out)."""
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    if plan.disk_bytes() > free:
        raise BisectError(f"not enough disk under {where}: the builds need about "
                          f"{_gb(plan.disk_bytes())}, {_gb(free)} is free; free some, or point "
                          "--cache, DISTCI_WHEELHOUSE_ROOT and DISTCI_ENV_ROOT at a larger disk")
    log(f"disk: {_gb(free)} free under {where}")


def _dry_run(requirements: Sequence[str], pip_args: Sequence[str], python: str) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="distci-plan-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--no-input", "--report", str(report), *pip_args, *requirements]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not report.exists():
            said = [line for line in (proc.stderr or proc.stdout).strip().splitlines()
                    if not line.startswith("WARNING: Location")][-6:]
            raise BisectError(f"pip cannot resolve {' '.join(requirements)} with this machine's pip "
                              "configuration (or --index-url / --find-links):\n  " + "\n  ".join(said))
        return json.loads(report.read_text()).get("install", [])


def _size(url: str) -> int | None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = Path(urllib.parse.unquote(parsed.path))
        return path.stat().st_size if path.is_file() else None
    try:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=20) as response:
            length = response.headers.get("Content-Length")
            return int(length) if length else None
    except (OSError, ValueError):
        return None


def _gb(n: int | float) -> str:
    return f"{n / 1e9:.1f} GB"

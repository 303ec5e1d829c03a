"""Wheels of distci itself and of the fix package, for installing into cell environments.

Cell environments install offline from wheels. distci's own code changes far more often
than torch, so these wheels are built apart from the wheelhouse and keyed by a hash of
their sources: an unchanged checkout reuses them, and a change in fixes/ rebuilds only
the fixes wheel (and, in images, only the top layer).

A wheel is built reproducibly (`SOURCE_DATE_EPOCH`): the same sources give the same bytes
wherever they are built (this checkout, a copy of it, a bisect's working directory). An env
records the sha256 of each wheel installed into it, so a wheel that differed only by its
build time would reinstall distci into a shared env under a run that is using it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from distci.errors import InfraError

REPO = Path(__file__).resolve().parents[2]
BUILD_EPOCH = "315532800"
"""The zip timestamp of every file in our wheels (1980-01-01, the earliest a zip can hold)."""
SOURCES = {
    "distci": (REPO, ("pyproject.toml", "distci")),
    "distci_fixes": (REPO / "fixes", ("pyproject.toml", "distci_fixes")),
}


def source_hash(root: Path, parts: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        path = root / part
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            digest.update(str(f.relative_to(root)).encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def build_wheel(name: str, cache: Path, *, log=print) -> Path:
    root, parts = SOURCES[name]
    if not (root / "pyproject.toml").exists():
        raise InfraError(f"cannot build {name}: {root / 'pyproject.toml'} is missing")
    Path(cache).mkdir(parents=True, exist_ok=True)
    out = Path(cache) / f"{name}-{source_hash(root, parts)}"
    found = sorted(out.glob("*.whl"))
    if found:
        return found[0]
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    build_dir = Path(tempfile.mkdtemp(prefix=f"{name}-src-"))
    try:
        # Build from a copy so setuptools' build/ and egg-info never land in the checkout.
        shutil.copytree(root, build_dir / "src", ignore=shutil.ignore_patterns(".git", ".distci", ".nox", "__pycache__", "build", "*.egg-info", "fixes", "suites", "tests", "reports", "docker") if name == "distci" else shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp), str(build_dir / "src")]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "SOURCE_DATE_EPOCH": BUILD_EPOCH})
        if proc.returncode != 0:
            output = proc.stdout + proc.stderr
            hint = ""
            if "invalid command 'bdist_wheel'" in output:  # setuptools < 70.1 without the `wheel` package
                hint = (f": {sys.executable}'s setuptools cannot build wheels; install `wheel` (or setuptools>=70.1) "
                        "there, or run distci through nox, whose venv has them")
            elif "No module named" in output and "setuptools" in output:
                hint = f": {sys.executable} has no setuptools; pip install setuptools"
            raise InfraError(f"building the {name} wheel failed{hint}", log=output[-4000:])
        # Another process (a second cell run, a test beside this one) may have built the same
        # sources meanwhile: its wheel stays, as something may be installing it right now.
        if not any(out.glob("*.whl")):
            shutil.rmtree(out, ignore_errors=True)
            try:
                tmp.rename(out)
            except OSError:
                if not any(out.glob("*.whl")):
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(build_dir, ignore_errors=True)
    wheel = sorted(out.glob("*.whl"))[0]
    log(f"built {wheel.name}")
    return wheel


def build_all(cache: Path, *, log=print) -> list[Path]:
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    return [build_wheel(name, cache, log=log) for name in SOURCES if (SOURCES[name][0] / "pyproject.toml").exists()]

"""Fix packages for external launches: a team's own patches, applied to upstream's tests.

A fix package registers its fixes under the `distci.fixes` entry-point group; distci-fixes
loads every registered fix at the end of `import torch` (its `torch.backends` entry
point) and applies those DISTCI_FIXES allows. Entry points are found through installed
metadata, so each package is installed (no deps) into one site directory that is put
first on PYTHONPATH of every launch. The directory is content-addressed like the
wheelhouse (``<root>/fixsite-<key>/``): the same packages reuse it, and the cell's own
environment is never modified.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from distci.errors import ConfigError, InfraError
from distci.provision.files import file_lock, sha256_file

Log = Callable[[str], None]
_SKIP_PARTS = {"__pycache__", "build", ".git", ".distci", ".nox"}


def _tree_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path)
        if _SKIP_PARTS & set(rel.parts) or f.suffix == ".pyc" or any(p.endswith(".egg-info") for p in rel.parts):
            continue
        digest.update(str(rel).encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


def package_hash(package: Path) -> str:
    package = Path(package)
    if package.is_file():
        return sha256_file(package)
    if (package / "pyproject.toml").is_file() or (package / "setup.py").is_file():
        return _tree_hash(package)
    raise ConfigError(f"fix package {package} is neither a wheel nor a project directory (pyproject.toml)")


def fixes_env(mode: str) -> str:
    """DISTCI_FIXES for a cell's fixes axis (`on` | `off`), or an explicit `all|none|id,id`."""
    return {"on": "all", "off": "none"}.get(mode, mode)


def ensure_fix_site(packages: Sequence[Path], root: Path, *, log: Log = print) -> Path | None:
    """A directory holding the fix packages (wheels or project dirs), installed without deps."""
    if not packages:
        return None
    packages = [Path(p).resolve() for p in packages]
    for p in packages:
        if not p.exists():
            raise ConfigError(f"fix package {p} does not exist")
    key = hashlib.sha256("\n".join(sorted(package_hash(p) for p in packages)).encode()).hexdigest()[:16]
    root = Path(root)
    final = root / f"fixsite-{key}"
    if (final / ".complete").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".fixsite-{key}.lock"):
        if (final / ".complete").exists():
            return final
        shutil.rmtree(final, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-fixsite-", dir=root))
        builds = Path(tempfile.mkdtemp(prefix="distci-fixsite-src-"))
        try:
            sources = []
            for p in packages:
                if p.is_dir():  # build from a copy, so build/ and *.egg-info never land in the package
                    copy = builds / f"{len(sources)}-{p.name}"
                    shutil.copytree(p, copy, ignore=shutil.ignore_patterns(*_SKIP_PARTS, "*.egg-info"))
                    sources.append(str(copy))
                else:
                    sources.append(str(p))
            cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                   "--no-compile", "--no-index", "--target", str(tmp), *sources]
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
            if proc.returncode != 0:
                raise InfraError("installing the fix packages failed: " + " ".join(p.name for p in packages),
                                 log=(proc.stdout + proc.stderr)[-4000:])
            (tmp / ".complete").write_text("\n".join(str(p) for p in packages) + "\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(builds, ignore_errors=True)
    log(f"fix packages {', '.join(p.name for p in packages)} -> {final}")
    return final

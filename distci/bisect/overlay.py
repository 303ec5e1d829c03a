"""Bisect PyTorch main between two nightlies without building: Python trees over binaries.

Between two adjacent nightlies lie a few dozen main commits. Building each is out of
question; most of them change only Python under torch/, and a nightly binary with the
Python files of another commit laid over it is that commit, as long as no native code
(C++, CUDA, codegen inputs) changed between the binary's commit and it. PyTorch's own
tools/nightly.py pairs a checkout's Python with a nightly binary the same way.

With the good nightly's binary G and the bad one's B, the commits of the range (G first,
B last) split by the first native commit f and the last native commit l:
- before f: G's binary plus the commit's Python is exactly that commit;
- from l on: B's binary (whose native code is l's) plus the commit's Python, likewise;
- from f up to l (exclusive): no binary matches, the commit is skipped.
With a single native commit (f = l) every commit can be probed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Literal, Sequence

from distci.errors import SourceError

Kind = Literal["python", "native", "inert"]

# Shipped Python packages of the pytorch repository whose .py files are used as they are.
PYTHON_ROOTS = ("torch/", "functorch/")
# Not shipped, or not code: changes here cannot change a test's outcome.
INERT_ROOTS = ("test/", "docs/", "benchmarks/", ".github/", ".ci/", "android/", "ios/",
               "scripts/", ".circleci/", ".devcontainer/", ".vscode/")
INERT_SUFFIXES = (".md", ".rst")
# Python under the shipped roots that the build generates or compiles, or that feeds
# code generation: a change there needs a build.
NATIVE_PYTHON_ROOTS = ("torch/csrc/", "torch/lib/", "torch/_C/")
NATIVE_NAMES = ("torch/version.py",)


@dataclass(frozen=True)
class CommitClass:
    """What one commit touches: `python` (only shipped Python), `native` (anything that
    needs a build, or that we cannot tell), `inert` (tests, docs, CI)."""

    commit: str
    kind: Kind
    files: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class OverlayPlan:
    """How to probe one commit: over the good or bad nightly's binary, or skip."""

    commit: str
    binary: Literal["good", "bad"] | None
    reason: str


def classify_file(path: str) -> Kind:
    if path.startswith(INERT_ROOTS) or path.endswith(INERT_SUFFIXES):
        return "inert"
    if (path.startswith(PYTHON_ROOTS) and path.endswith(".py")
            and not path.startswith(NATIVE_PYTHON_ROOTS) and path not in NATIVE_NAMES):
        return "python"
    return "native"


def classify_files(commit: str, files: Iterable[str]) -> CommitClass:
    files = tuple(sorted(files))
    native = [f for f in files if classify_file(f) == "native"]
    if native:
        more = f" and {len(native) - 3} more" if len(native) > 3 else ""
        return CommitClass(commit, "native", files, f"needs a build: {', '.join(native[:3])}{more}")
    if any(classify_file(f) == "python" for f in files):
        return CommitClass(commit, "python", files)
    return CommitClass(commit, "inert", files)


def classify_commit(repo: Path | str, commit: str) -> CommitClass:
    """Classify what `commit` changed against its first parent (a merge: the whole merge)."""
    out = _git(Path(repo), "diff-tree", "--no-commit-id", "--name-only", "-r", "-m",
               "--first-parent", "--root", commit)
    return classify_files(commit, out.splitlines())


def plan_overlays(classes: Sequence[CommitClass]) -> list[OverlayPlan]:
    """For the commits from the good nightly's (first) to the bad nightly's (last)."""
    native = [i for i, c in enumerate(classes) if i > 0 and c.kind == "native"]
    first = native[0] if native else len(classes)
    last = native[-1] if native else len(classes)
    plans = []
    for i, c in enumerate(classes):
        if i < first:
            plans.append(OverlayPlan(c.commit, "good", "no native change since the good nightly"))
        elif i >= last:
            plans.append(OverlayPlan(c.commit, "bad", "no native change up to the bad nightly"))
        else:
            plans.append(OverlayPlan(
                c.commit, None, f"native changes both before and after it "
                f"({classes[first].commit[:12]} .. {classes[last].commit[:12]}): no binary matches"))
    return plans


def python_changes(repo: Path | str, base: str, commit: str) -> tuple[list[str], list[str]]:
    """(paths to write from `commit`, paths to delete) that turn `base`'s shipped Python
    into `commit`'s."""
    out = _git(Path(repo), "diff", "--name-status", "--no-renames", base, commit)
    write, delete = [], []
    for line in out.splitlines():
        status, path = line.split("\t", 1)
        if classify_file(path) != "python":
            continue
        (delete if status == "D" else write).append(path)
    return write, delete


def lay_python_over(repo: Path | str, base: str, commit: str, installed: Path,
                    target: Path) -> list[str]:
    """Make `target` a copy of the site-packages dir `installed` (built from `base`) with
    `commit`'s shipped Python laid over it; returns the paths changed.

    The copy is hard links (cheap for a multi-GB torch) and every changed file is unlinked
    before it is written, so the installed environment is never modified through a link
    (stale bytecode is no risk: its recorded source mtime no longer matches).
    """
    repo = Path(repo)
    write, delete = python_changes(repo, base, commit)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(installed, target, copy_function=link_or_copy, symlinks=True)
    for path in delete:
        (target / PurePosixPath(path)).unlink(missing_ok=True)
    for path in write:
        data = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"],
                              capture_output=True, check=True).stdout
        dest = target / PurePosixPath(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        dest.write_bytes(data)
    return sorted(write + delete)


def link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"git {args[0]} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout

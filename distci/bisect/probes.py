"""Probes: install a candidate into a cached environment, run a check, answer good/bad/skip.

An environment is built once per candidate and kept under a cache directory, keyed by the
candidate and everything else that went into it (interpreter, base requirements, pip
arguments), so a second bisect over the same candidates, or a resumed one, only runs the
check. A probe says whether it found its environment warm; the report shows cold and warm
times apart.

Each candidate environment is a small venv without pip holding only the candidate. The
rest of the stack (every other package pinned to the bad cell's versions) lives in one
shared base venv, put on the candidate venv's path by a .pth file after its own
site-packages: the candidate wins over any copy in the base, and torch is installed once,
not once per commit. pip runs from the controller against the venv (``pip --python``).

The check is a command read as `git bisect run` reads it: exit 0 good, 125 skip, any
other code from 1 to 127 bad; a code above 127 (a signal, a crashed shell) aborts the
bisect, as in git, since it says nothing about the candidate. An environment that cannot
be built answers skip (DESIGN rule 4: infra is not a regression).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from distci.bisect.candidates import CommitCandidate, WheelCandidate
from distci.bisect.engine import ProbeOutcome
from distci.bisect.overlay import OverlayPlan, lay_python_over
from distci.bisect.state import BisectError
from distci.wheelhouse import file_lock

SKIP_CODE = 125
READY = "distci-env.json"


def outcome_from_exit(code: int) -> str:
    """A check's exit code read as `git bisect run` reads it."""
    if code == 0:
        return "good"
    if code == SKIP_CODE:
        return "skip"
    if 1 <= code <= 127:
        return "bad"
    raise BisectError(f"the check exited with {code}: codes above 127 (or a signal) abort the "
                      "bisect, as with git bisect run; wrap the command to exit 1 for a crash")


class InstallFailed(Exception):
    def __init__(self, message: str, log: str = "") -> None:
        self.log = log
        super().__init__(message)


@dataclass
class CommandCheck:
    """The check of a probe: a shell command run with the candidate's venv first on PATH.

    `exit_map` reads some exit codes first, e.g. pytest's 2-5 (interrupted, internal or
    usage error, nothing collected) as skip: they say nothing about the candidate.
    """

    command: str
    cwd: Path | None = None
    timeout: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    exit_map: Mapping[int, str] = field(default_factory=dict)

    def run(self, venv: Path) -> tuple[str, str]:
        """(outcome, last lines of output). A timeout is `bad`: a hang is a failure."""
        env = dict(os.environ, **self.env)
        env.pop("PYTHONHOME", None)
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.Popen(self.command, shell=True, cwd=self.cwd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate()
            return "bad", f"timeout after {self.timeout}s\n" + _tail(out)
        finally:
            _kill_group(proc)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return self.exit_map.get(code) or outcome_from_exit(code), f"exit {code}\n" + _tail(out)


class EnvCache:
    """Candidate venvs (and the shared base venv) under `root`, reused across bisects."""

    def __init__(self, root: Path | str, *, python: str = sys.executable,
                 base_requirements: Sequence[str] = (), base_env: Path | str | None = None,
                 pip_args: Sequence[str] = ()) -> None:
        """`base_env` (an existing venv, e.g. the bad cell's) or `base_requirements` (a base
        venv built here) hold the rest of the stack; the candidate shadows its copy there."""
        if base_env is not None and base_requirements:
            raise BisectError("give base_env or base_requirements, not both")
        self.root = Path(root)
        self.python = python
        self.base_requirements = list(base_requirements)
        self.base_env = Path(base_env).resolve() if base_env is not None else None
        self.pip_args = list(pip_args)
        self.salt = _digest([python, *self.base_requirements, str(self.base_env or ""), "|",
                             *self.pip_args])

    def ensure(self, key: str, install: Callable[[], Sequence[str]] | None = None, *,
               populate: Callable[[Path], None] | None = None) -> tuple[Path, bool]:
        """The venv of candidate `key`, unless it is already there built by
        `populate(venv)` and pip with the arguments `install()` returns; (path, warm)."""
        path = self.root / "envs" / f"{_safe(key)}-{_digest([key, self.salt])}"
        if (path / READY).exists():
            return path, True
        base = self.base_env or (self._base() if self.base_requirements else None)
        with file_lock(path.with_name(f".{path.name}.lock")):  # two bisects sharing a cache
            if (path / READY).exists():
                return path, True
            self._build(path, list(install()) if install else [], base, populate)
        return path, False

    def _base(self) -> Path:
        path = self.root / "base" / self.salt
        with file_lock(path.with_name(f".{path.name}.lock")):
            if not (path / READY).exists():
                self._build(path, self.base_requirements, None)
        return path

    def _build(self, path: Path, install: list[str], base: Path | None,
               populate: Callable[[Path], None] | None = None) -> None:
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            _run([self.python, "-m", "venv", "--without-pip", str(path)], "venv")
            if populate is not None:
                populate(path)
            if base is not None:
                pth = _site_packages(path) / "_distci_base.pth"
                pth.unlink(missing_ok=True)  # may be a hard link into another env
                pth.write_text(f"import site; site.addsitedir({str(_site_packages(base))!r})\n")
            if install:
                _run([sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"),
                      "install", "--no-input", *self.pip_args, *install], "pip install")
        except InstallFailed:
            shutil.rmtree(path, ignore_errors=True)
            raise
        (path / READY).write_text(json.dumps({"install": install, "base": str(base or "")}))


class WheelProbe:
    """Installs a release / nightly / wheelhouse candidate, then runs the check."""

    def __init__(self, check: CommandCheck, cache: EnvCache) -> None:
        self.check = check
        self.cache = cache

    def __call__(self, candidate: WheelCandidate) -> ProbeOutcome:
        return _probe(self.check, lambda: self.cache.ensure(
            candidate.key, lambda: [*candidate.pip_args(), candidate.requirement]))


class CommitProbe:
    """Installs a pure-Python package at one commit of a local clone, then runs the check.

    The commit's tree is exported with `git archive` (the clone's checkout and index are
    never touched), built into a wheel by `builder` without build isolation (no network;
    the builder needs the build backend, e.g. setuptools) and with `build_env` (torchao:
    ``USE_CPP=0``, no C++ build), and installed without dependencies: those come from the
    base environment. A commit that does not build or install answers skip.
    """

    def __init__(self, check: CommandCheck, cache: EnvCache, *, builder: str = sys.executable,
                 build_env: Mapping[str, str] | None = None) -> None:
        self.check = check
        self.cache = cache
        self.builder = builder
        self.build_env = dict(build_env or {})

    def __call__(self, candidate: CommitCandidate) -> ProbeOutcome:
        return _probe(self.check, lambda: self.cache.ensure(
            candidate.commit, lambda: ["--no-deps", "--no-index", str(self._wheel(candidate))]))

    def _wheel(self, candidate: CommitCandidate) -> Path:
        out = self.cache.root / "wheels" / candidate.commit
        built = sorted(out.glob("*.whl")) if out.is_dir() else []
        if built:
            return built[0]
        src = self.cache.root / "src" / candidate.commit
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        src.mkdir(parents=True)
        tree = subprocess.run(["git", "-C", candidate.repo, "archive", "--format=tar",
                               candidate.commit], capture_output=True)
        if tree.returncode != 0:
            raise InstallFailed("git archive failed", tree.stderr.decode(errors="replace"))
        with tarfile.open(fileobj=io.BytesIO(tree.stdout)) as archive:
            _extract(archive, src)
        try:
            _run([self.builder, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--no-index", "--no-input", "-w", str(out), str(src)], "build",
                 env=dict(os.environ, **self.build_env))
        finally:
            shutil.rmtree(src, ignore_errors=True)
        built = sorted(out.glob("*.whl"))
        if not built:
            raise InstallFailed("the build made no wheel")
        return built[0]


class OverlayProbe:
    """Probes a PyTorch main commit as the good or bad nightly's binary with the commit's
    shipped Python laid over it (see overlay.py); commits no binary matches are skipped.

    `good` and `bad` are (main commit the nightly was built from, venv holding that
    nightly), e.g. from EnvCache.ensure of the two nightly candidates. The commit's venv
    is a hard-linked copy of the nightly's site-packages, so it costs little disk. Checks
    should run ``python -m torch.distributed.run``, not the nightly venv's scripts.
    """

    def __init__(self, check: CommandCheck, cache: EnvCache, repo: Path | str, *,
                 good: tuple[str, Path], bad: tuple[str, Path],
                 plans: Sequence[OverlayPlan]) -> None:
        self.check = check
        self.cache = cache
        self.repo = Path(repo)
        self.binaries = {"good": good, "bad": bad}
        self.plans = {plan.commit: plan for plan in plans}

    def __call__(self, candidate: CommitCandidate) -> ProbeOutcome:
        plan = self.plans[candidate.commit]
        if plan.binary is None:
            return ProbeOutcome("skip", detail=plan.reason)
        base_commit, base_env = self.binaries[plan.binary]

        def populate(venv: Path) -> None:
            try:
                lay_python_over(self.repo, base_commit, candidate.commit,
                                _site_packages(base_env), _site_packages(venv))
            except (OSError, subprocess.CalledProcessError) as exc:
                raise InstallFailed(f"overlay failed: {exc}") from exc

        return _probe(self.check, lambda: self.cache.ensure(
            f"overlay-{plan.binary}-{candidate.commit}", populate=populate),
            note=f"{plan.binary} nightly's binary: {plan.reason}\n")


def _probe(check: CommandCheck, setup, note: str = "") -> ProbeOutcome:
    started = time.monotonic()
    try:
        venv, warm = setup()
    except InstallFailed as failed:
        return ProbeOutcome("skip", cached=False, detail=f"{failed}\n{_tail(failed.log)}",
                            setup_seconds=round(time.monotonic() - started, 3))
    setup_seconds = round(time.monotonic() - started, 3)
    outcome, detail = check.run(venv)
    return ProbeOutcome(outcome, cached=warm, detail=note + detail,  # type: ignore[arg-type]
                        setup_seconds=setup_seconds)


def _run(cmd: list[str], what: str, env: Mapping[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise InstallFailed(f"{what} failed (exit {proc.returncode})", proc.stdout + proc.stderr)


def _site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python*/site-packages"))
    if not found:
        raise InstallFailed(f"no site-packages in {venv}")
    return found[0]


def _extract(archive: tarfile.TarFile, dest: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
    else:  # Python < 3.11.4: git archive output of a local clone
        archive.extractall(dest)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill what the check left behind (rank workers of a distributed test, servers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(text: bytes | str | None, lines: int = 20) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


def _digest(parts: Sequence[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", key)[:60]



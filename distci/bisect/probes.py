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
from distci.rundir import RunDir
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
        text = out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
        return self.outcome(code, text), f"exit {code}\n" + _tail(text)

    def outcome(self, code: int, output: str) -> str:
        """What an exit code (and, for subclasses, the output) says about the candidate."""
        return self.exit_map.get(code) or outcome_from_exit(code)


# pytest: 2 interrupted, 3 internal error, 4 usage error, 5 nothing collected (the test
# does not exist at this candidate): none of them is an answer about the candidate.
PYTEST_EXIT_MAP = {2: "skip", 3: "skip", 4: "skip", 5: "skip"}
_PYTEST_SUMMARY = re.compile(r"^=*\s*(?:\d+ \w+(?:, )?)+ in [\d.]+s", re.MULTILINE)


@dataclass
class PytestCheck(CommandCheck):
    """A pytest run read as pytest's exit codes say: 0 good, 1 bad, 2-5 skip.

    Exit 0 with nothing passed (the test skipped itself: no such device, a marker the
    candidate cannot meet) is `skip` too: a skipped test says nothing about the
    candidate, and reading it as good would steer the search.
    """

    exit_map: Mapping[int, str] = field(default_factory=lambda: dict(PYTEST_EXIT_MAP))
    run_dir: Path | None = None

    def run(self, venv: Path) -> tuple[str, str]:
        """As CommandCheck; with `run_dir` (the harness's --distci-run-dir) the detail
        starts with what the harness recorded: each test's outcome and error."""
        results = RunDir(self.run_dir).results_path if self.run_dir else None
        offset = results.stat().st_size if results and results.exists() else 0
        outcome, detail = super().run(venv)
        if results and results.exists():
            with results.open("rb") as fh:
                fh.seek(offset)
                recorded = [_recorded(line) for line in fh.read().decode(errors="replace").splitlines()]
            detail = "".join(line + "\n" for line in recorded if line) + detail
        return outcome, detail

    def outcome(self, code: int, output: str) -> str:
        seen = super().outcome(code, output)
        if seen != "good":
            return seen
        summaries = _PYTEST_SUMMARY.findall(output)
        return "good" if summaries and " passed" in summaries[-1] else "skip"


def _recorded(line: str) -> str:
    """One harness result as a line or three: test id, outcome, the error's first lines."""
    try:
        record = json.loads(line)
    except ValueError:
        return ""
    message = [text for text in str(record.get("message", "")).splitlines() if text.strip()][:3]
    return f"{record.get('test_id')}: {record.get('outcome')}" + "".join(f"\n  {m}" for m in message)


class EnvCache:
    """Candidate venvs (and the shared base venv) under `root`, reused across bisects."""

    def __init__(self, root: Path | str, *, python: str = sys.executable,
                 base_requirements: Sequence[str] = (), base_env: Path | str | None = None,
                 pip_args: Sequence[str] = (), base_args: Sequence[str] = ()) -> None:
        """`base_env` (an existing venv, e.g. the bad cell's) or `base_requirements` (a base
        venv built here, with `base_args` added to its pip install, e.g. ``--no-deps`` for
        a complete set of pins) hold the rest of the stack; the candidate shadows its copy
        there. `pip_args` (where pip finds things) go to every install."""
        if base_env is not None and base_requirements:
            raise BisectError("give base_env or base_requirements, not both")
        self.root = Path(root).resolve()  # .pth files and links must not depend on the cwd
        self.python = python
        self.base_requirements = list(base_requirements)
        self.base_env = Path(base_env).resolve() if base_env is not None else None
        self.pip_args = list(pip_args)
        self.base_args = list(base_args)
        self.salt = _digest([python, *self.base_requirements, str(self.base_env or ""), "|",
                             *self.pip_args, "|", *self.base_args])

    def tools(self, wheels: Sequence[Path]) -> Path:
        """A directory holding `wheels` installed without dependencies, keyed by their
        content: distci's own wheels, put on PYTHONPATH by the check rather than into the
        candidate venvs, so an edit of distci does not rebuild a single torch env."""
        digest = _digest([hashlib.sha256(Path(w).read_bytes()).hexdigest() for w in wheels])
        path = self.root / "tools" / digest
        with file_lock(path.with_name(f".{path.name}.lock")):
            if not (path / READY).exists():
                shutil.rmtree(path, ignore_errors=True)
                try:
                    _run([sys.executable, "-m", "pip", "install", "--no-input", "--no-deps",
                          "--no-index", "--target", str(path), *map(str, wheels)], "pip install")
                except InstallFailed as failed:
                    raise BisectError(f"{failed}: {_tail(failed.log, 5)}") from None
                (path / READY).write_text(json.dumps({"wheels": [Path(w).name for w in wheels]}))
        return path

    def existing(self, key: str) -> Path | None:
        """The venv of candidate `key` if a probe has built it, else None."""
        path = self._path(key)
        return path if (path / READY).exists() else None

    def _path(self, key: str) -> Path:
        return self.root / "envs" / f"{_safe(key)}-{_digest([key, self.salt])}"

    def ensure(self, key: str, install: Callable[[], Sequence[str]] | None = None, *,
               populate: Callable[[Path], None] | None = None) -> tuple[Path, bool]:
        """The venv of candidate `key`, unless it is already there built by
        `populate(venv)` and pip with the arguments `install()` returns; (path, warm)."""
        path = self._path(key)
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
                self._build(path, self.base_requirements, None, extra=self.base_args)
        return path

    def _build(self, path: Path, install: list[str], base: Path | None,
               populate: Callable[[Path], None] | None = None, extra: Sequence[str] = ()) -> None:
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
                      "install", "--no-input", *self.pip_args, *extra, *install], "pip install")
            if base is not None and populate is None:
                link_base_tree(_site_packages(base), _site_packages(path))
        except InstallFailed:
            shutil.rmtree(path, ignore_errors=True)
            raise
        (path / READY).write_text(json.dumps({"install": install, "base": str(base or "")}))


def link_base_tree(base: Path, site: Path) -> None:
    """Symlink into `site` the directories of `base` it lacks, and one level into the
    namespace-like directories both have (``nvidia/cublas`` next to the candidate's own
    ``nvidia/cusparselt``; a real package such as torchao is never merged).

    Python finds the base through the .pth file, but shared libraries do not: a CUDA
    torch wheel finds its CUDA libraries by RPATH (``$ORIGIN/../../nvidia/cublas/lib``),
    relative to where torch is installed, the candidate venv. Done after pip has run, so
    pip never writes through a link into the shared base; what the candidate installed
    itself is a real directory and wins.
    """
    for entry in sorted(base.resolve().iterdir()):
        if not entry.is_dir() or entry.name == "__pycache__" or entry.name.endswith(
                (".dist-info", ".egg-info", ".data")):
            continue
        mine = site / entry.name
        if not mine.exists():
            mine.symlink_to(entry, target_is_directory=True)
        elif mine.is_dir() and not mine.is_symlink() and _namespace_like(entry):
            for child in sorted(entry.iterdir()):
                if child.is_dir() and child.name != "__pycache__" and not (mine / child.name).exists():
                    (mine / child.name).symlink_to(child, target_is_directory=True)


def _namespace_like(directory: Path) -> bool:
    """No __init__.py, or an empty one: a directory many distributions share (nvidia)."""
    init = directory / "__init__.py"
    return not init.exists() or init.stat().st_size == 0


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
            # the export sits inside whatever repository holds the cache: a build that
            # asks git for its commit (torchao's version suffix) must not read that one
            env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(src.parent), **self.build_env)
            _run([self.builder, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--no-index", "--no-input", "-w", str(out), str(src)], "build", env=env)
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



"""Install: put one candidate into a cached environment over the rest of the stack.

An environment is built once per candidate and kept under a cache directory, keyed by the
candidate and everything else that went into it (interpreter, base, pip arguments), so a
second bisect over the same candidates, or a resumed one, only runs the check. `ensure`
says whether it found the environment warm; the report shows cold and warm times apart.

Each candidate environment is a small venv holding only the candidate. The rest of the
stack (every other package pinned to the bad cell's versions) lives in one base env, made
by distci.provision.envs (THE venv primitive: the same env a cell of that stack gets) from a
wheelhouse of the pins, or given as --base-env; each candidate env is an overlay venv
(distci.provision.envs.overlay_venv + add_import_path): a .pth file puts the base after the
candidate's own site-packages: the candidate wins over any copy in the base, and torch is
installed once, not once per commit. pip runs from the controller (``pip --python``).

Wheels come from the wheelhouse archive (distci.provision.wheelhouse): a release or nightly is
downloaded into it once and installed from it, so a nightly that has left its index stays
installable. Commits are built into wheels here, keyed by commit, build environment and
builder (a wheel built with other flags is another wheel).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from distci.bisect.candidates import CommitCandidate, WheelCandidate
from distci.provision.envs import MARKER as ENV_MARKER
from distci.provision.envs import default_root as env_default_root
from distci.provision.envs import add_import_path, ensure_env, env_key, env_python, isolated_environ, overlay_venv, stack_env
from distci.errors import InfraError
from distci.provision.wheelhouse import Wheelhouse, ensure_wheelhouse, install_args
from distci.provision.files import file_lock

READY = "distci-env.json"


class InstallFailed(Exception):
    """A candidate could not be installed: an infra skip, retried by a later bisect."""

    def __init__(self, message: str, log: str = "") -> None:
        self.log = log
        super().__init__(message)


@dataclass(frozen=True)
class Base:
    """The rest of the stack: an existing venv (`env`), or `requirements` to make one from
    (through the wheelhouse and distci.provision.envs), or nothing. `install_args` go to the base
    install (``--no-deps`` for a complete set of pins)."""

    env: Path | None = None
    requirements: tuple[str, ...] = ()
    install_args: tuple[str, ...] = ()

    def key(self) -> str:
        return _digest([str(self.env or ""), *self.requirements, "|", *self.install_args])


@dataclass
class EnvCache:
    """Candidate venvs (and the base) under `root`, reused across bisects.

    `pip_args` say where pip finds things (indexes, find-links), for downloads into the
    wheelhouse archive `wheelhouse_root` (None: the default archive). A base made from
    requirements is distci.provision.envs' env of that stack (under `env_root`, None: the default
    env root), the very env a cell of the same stack runs in."""

    root: Path
    python: str = sys.executable
    base: Base = field(default_factory=Base)
    pip_args: Sequence[str] = ()
    wheelhouse_root: Path | None = None
    env_root: Path | None = None
    log: Callable[[str], None] = print

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()  # .pth files and links must not depend on the cwd
        self.salt = _digest([self.python, self.base.key(), "|", *self.pip_args])
        self._base_env: Path | None = None

    @property
    def base_python(self) -> str:
        """The interpreter of the base env (what builds commits by default: it has the
        build's imports, e.g. torch for torchao's setup.py), else the venvs' python."""
        if self.base.env is not None:
            return str(env_python(self.base.env.resolve()))
        return self.python

    def base_env(self) -> Path | None:
        if self.base.env is not None:
            return self.base.env.resolve()
        if not self.base.requirements:
            return None
        if self._base_env is None:
            try:
                env = stack_env(list(self.base.requirements), [*self.pip_args, *self.base.install_args],
                                python=self.python, wheelhouse_root=self.wheelhouse_root,
                                env_root=self.env_root, log=self.log)
            except InfraError as exc:
                raise InstallFailed(f"the base env cannot be built: {exc}", exc.log) from None
            self._base_env = env.path
        return self._base_env

    def tools(self, wheels: Sequence[Path]) -> Path:
        """A directory holding `wheels` installed without dependencies, keyed by their
        content: distci's own wheels, put on PYTHONPATH by the check rather than into the
        candidate venvs, so an edit of distci does not rebuild a single torch env."""
        digest = _digest([hashlib.sha256(Path(w).read_bytes()).hexdigest() for w in wheels])
        path = self.root / "tools" / digest
        with file_lock(path.with_name(f".{path.name}.lock")):
            if not (path / READY).exists():
                shutil.rmtree(path, ignore_errors=True)
                _run([sys.executable, "-m", "pip", "install", "--no-input", "--no-deps",
                      "--no-index", "--target", str(path), *map(str, wheels)], "pip install")
                (path / READY).write_text(json.dumps({"wheels": [Path(w).name for w in wheels]}))
        return path

    def existing(self, key: str) -> Path | None:
        """The venv of candidate `key` if a probe has built it, else None."""
        path = self._path(key)
        if (path / READY).exists():
            return path
        stack = _read(self._stack_note(key)).get("env")
        return Path(stack) if stack and env_python(Path(stack)).exists() else None

    def stack(self, candidate: WheelCandidate) -> tuple[Path, bool]:
        """The env of the stack "candidate + the base's requirements", made by distci.provision.envs
        (the env a cell of that stack gets, shared with it); (path, warm). For a base given
        as requirements or none: with --base-env, `ensure` lays the candidate over it."""
        requirements = [candidate.requirement, *self.base.requirements]
        try:
            house = self._stack_wheelhouse(candidate, requirements)
            root = (self.env_root or env_default_root()).resolve()
            warm = (root / f"stack-{env_key(house, self.python)}" / ENV_MARKER).exists()
            env = ensure_env(house, root=root, python=self.python, log=self.log)
        except InfraError as exc:
            raise InstallFailed(f"{candidate.requirement}: {exc}", exc.log) from None
        note = self._stack_note(candidate.key)
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(json.dumps({"env": str(env.path), "requirements": requirements}))
        return env.path, warm

    def _stack_wheelhouse(self, candidate: WheelCandidate, requirements: list[str]) -> Wheelhouse:
        """The wheels of "candidate + the base's requirements".

        A candidate from its own index (a nightly's, DISTCI_INDEX_URL's) or wheel directory
        is resolved there alone, with its dependencies (a CUDA nightly's pytorch-triton is
        only on the nightly index); the base's requirements (pytest, packaging, pins) are
        resolved with pip's configuration and that wheelhouse as find-links. One pip call
        with the candidate's `--index-url` would look for pytest on the nightly index,
        which does not serve it: every candidate an infra skip."""
        own_args = candidate.pip_args()
        if not own_args or not self.base.requirements:
            return ensure_wheelhouse(requirements, [*own_args, *self.pip_args, *self.base.install_args],
                                     self.wheelhouse_root, python=self.python, log=self.log)
        own = ensure_wheelhouse([candidate.requirement], [*own_args, *self.pip_args, *self.base.install_args],
                                self.wheelhouse_root, python=self.python, log=self.log)
        return ensure_wheelhouse(requirements, ["--find-links", str(own.path.resolve()), *self.pip_args,
                                                *self.base.install_args],
                                 self.wheelhouse_root, python=self.python, log=self.log)

    def _stack_note(self, key: str) -> Path:
        return self.root / "stacks" / f"{_safe(key)}-{_digest([key, self.salt])}.json"

    def _path(self, key: str) -> Path:
        return self.root / "envs" / f"{_safe(key)}-{_digest([key, self.salt])}"

    def ensure(self, key: str, install: Callable[[], Sequence[str]] | None = None, *,
               populate: Callable[[Path], None] | None = None) -> tuple[Path, bool]:
        """The venv of candidate `key`, unless it is already there built by
        `populate(venv)` and pip with the arguments `install()` returns; (path, warm)."""
        path = self._path(key)
        if (path / READY).exists():
            return path, True
        base = self.base_env() if populate is None else None
        with file_lock(path.with_name(f".{path.name}.lock")):  # two bisects sharing a cache
            if (path / READY).exists():
                return path, True
            self._build(path, list(install()) if install else [], base, populate)
        return path, False

    def _build(self, path: Path, install: list[str], base: Path | None,
               populate: Callable[[Path], None] | None) -> None:
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            try:
                overlay_venv(path, self.python, path.with_name(f".{path.name}.log"))
            except InfraError as exc:
                raise InstallFailed(str(exc), exc.log) from None
            if populate is not None:
                populate(path)
            if base is not None:
                add_import_path(site_packages(path), [str(site_packages(base))], "_distci_base.pth")
            if install:  # what to install is decided (a wheel, a lock): no pip config may veto it
                _run([sys.executable, "-m", "pip", "--python", str(env_python(path)),
                      "install", "--no-input", *install], "pip install", env=isolated_environ())
            if base is not None:
                link_base_tree(site_packages(base), site_packages(path))
        except InstallFailed:
            shutil.rmtree(path, ignore_errors=True)
            raise
        (path / READY).write_text(json.dumps({"install": install, "base": str(base or "")}))

    # -- what goes into a candidate env ------------------------------------------------

    def wheel_install(self, candidate: WheelCandidate) -> list[str]:
        """pip arguments installing a release / nightly / wheelhouse candidate from the
        wheelhouse archive, downloading it there first if this machine never did."""
        try:
            house = self.archive(candidate)
        except InfraError as exc:
            raise InstallFailed(f"{candidate.requirement}: download failed: {exc}", exc.log) from None
        return [*install_args(house), "--no-deps"]

    def archive(self, candidate: WheelCandidate) -> Wheelhouse:
        """The wheelhouse holding `candidate` alone (its dependencies come from the base)."""
        return ensure_wheelhouse([candidate.requirement], [*candidate.pip_args(), *self.pip_args,
                                                           "--no-deps"],
                                 self.wheelhouse_root, python=self.python, log=self.log)


@dataclass(frozen=True)
class CommitBuilder:
    """Builds one commit of a local clone into a wheel.

    The commit's tree is exported with `git archive` (the clone's checkout and index are
    never touched), built by `builder` without build isolation (no network; the builder
    needs the build backend, e.g. setuptools, and whatever setup.py imports) and with
    `build_env` (torchao: ``USE_CPP=0``, no C++ build). Wheels are cached under `root`
    by commit, build environment and builder."""

    root: Path
    builder: str
    build_env: Mapping[str, str] = field(default_factory=dict)

    def key(self) -> str:
        return _digest([self.builder, *(f"{k}={v}" for k, v in sorted(self.build_env.items()))])

    def wheel(self, candidate: CommitCandidate) -> Path:
        out = self.root / "wheels" / f"{candidate.commit}-{self.key()}"
        built = sorted(out.glob("*.whl")) if out.is_dir() else []
        if built:
            return built[0]
        src = self.root / "src" / candidate.commit
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


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python*/site-packages"))
    if not found:
        raise InstallFailed(f"no site-packages in {venv}")
    return found[0]


def _run(cmd: list[str], what: str, env: Mapping[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise InstallFailed(f"{what} failed (exit {proc.returncode})", proc.stdout + proc.stderr)


def _extract(archive: tarfile.TarFile, dest: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
    else:  # Python < 3.11.4: git archive output of a local clone
        archive.extractall(dest)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _digest(parts: Sequence[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", key)[:60]

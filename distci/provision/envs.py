"""THE venv primitive: one environment per stack, installed from its wheelhouse with no network.

Cells, the fix audit, bisect and external suites all get their environments here.
An env is ``<root>/stack-<key>/``, where the key covers the wheelhouse (its content
address) and the interpreter, nothing else. So cells that differ only in fixes mode (the
fix_on / fix_off twins), the audit's per-version envs and bisect's candidates share one
env per stack: fixes mode is a runtime switch (``DISTCI_FIXES``), never an install.

Installs use uv (``uv pip install --no-index --find-links <wheelhouse>``, hash checked
against ``requirements.lock``): it links wheels from its cache instead of unpacking them
again, which takes a 17-wheel CPU stack from minutes to seconds. Where uv is absent, pip
does the same install. Neither reads the machine's package configuration here: the
lock pins every wheel exactly, and a configured constraint (``torch<=2.14.1``) or an extra
index must not veto or redirect an install that the wheelhouse already decided.

distci's own wheels (`extra_wheels`) go in last with ``--no-deps`` and are not part of the
key: they change on every edit of distci, and reinstalling two small wheels is cheaper
than reinstalling torch. Two marker files record progress and are written last: without
the base marker the env is rebuilt from scratch; with it but stale extras only the extras
are reinstalled. So an env whose build was interrupted is never mistaken for a ready one.

Bytecode is written once per env, at install or at first import (`bytecode_mode`). A runner
that sets PYTHONDONTWRITEBYTECODE (common in CI images) would otherwise compile torch's Python
source on every import, in every rank worker and after every pool rebuild: 40 % of a compiled
scenario's CPU time on 2 cores (docs/provisioning.md); there the install compiles all of it
(uv's ``--compile-bytecode``; pip compiles by default). Elsewhere Python writes each module's
bytecode on its first import, and compiling every module at install is ~18 CPU-s per torch env
against ~5 for what a cell imports (measured: docs/provisioning.md). The base marker (and so the
key) records the mode: a runner that starts setting the variable gets an env compiled at install.
Builders of one env serialize on a file lock; a reader of a ready env takes no lock.
Checkouts with different distci sources should not share one DISTCI_ENV_ROOT: each
would reinstall its own distci wheels into envs the other may be running.

API (typed; no argparse namespaces)::

    env = stack_env(["torch==2.13.0", "pytest"], pip_args, extra_wheels=own_wheels)
    env = ensure_env(wheelhouse, extra_wheels=own_wheels)      # when you hold a Wheelhouse
    subprocess.run([str(env.python), "-m", "pytest", ...])
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from distci.errors import InfraError
from distci.provision.wheelhouse import Log, Wheelhouse, ensure_wheelhouse, failure_line, run_pip
from distci.provision.files import file_lock, sha256_file
from distci.provision.wheeltarget import interpreter_tags
from distci.results import format_duration

BASE_MARKER = "distci-base.json"
MARKER = "distci-env.json"
INSTALL_LOG = "distci-install.log"
KEY_LENGTH = 16
LOG_TAIL_LINES = 40
INSTALLERS = ("uv", "pip")
INSTALLER_VAR = "DISTCI_INSTALLER"


@dataclass(frozen=True)
class Env:
    """A ready environment: run `python`; `log_path` holds every install it went through."""

    path: Path
    python: Path
    key: str
    log_path: Path
    installer: str = "uv"


def default_root() -> Path:
    return Path(os.environ.get("DISTCI_ENV_ROOT") or Path(".distci") / "envs")


def env_python(path: Path) -> Path:
    return path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def find_uv() -> str | None:
    """The uv binary: the ``uv`` package's (a controller dependency), else one on PATH."""
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def choose_installer(requested: str | None = None) -> tuple[str, str | None]:
    """(installer, uv binary): `requested`, else DISTCI_INSTALLER, else uv when found, else pip."""
    wanted = requested or os.environ.get(INSTALLER_VAR, "").strip() or None
    if wanted is not None and wanted not in INSTALLERS:
        raise InfraError(f"{INSTALLER_VAR}={wanted!r}: choose one of {', '.join(INSTALLERS)}")
    uv = find_uv() if wanted != "pip" else None
    if wanted == "uv" and uv is None:
        raise InfraError(f"{INSTALLER_VAR}=uv but no uv was found (pip install uv, or unset it)")
    return ("uv", uv) if uv else ("pip", None)


def isolated_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment installers run in: no PIP_*/UV_* settings, no pip config files.

    UV_CACHE_DIR is kept (where uv's cache lives is no resolution input).
    """
    env = dict(os.environ if environ is None else environ)
    for name in list(env):
        if (name.startswith("PIP_") or name.startswith("UV_")) and name != "UV_CACHE_DIR":
            del env[name]
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
                "UV_NO_CONFIG": "1", "PYTHONUNBUFFERED": "1"})
    return env


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def env_key(wheelhouse: Wheelhouse, python: str = sys.executable, *, with_pip: bool = False) -> str:
    """The stack's env key: the same wheelhouse and interpreter always name the same env."""
    return _key(_base(wheelhouse, python, with_pip))


BYTECODE_AT_INSTALL = True  # the marker's value since envs recorded it: kept, so those envs keep their key
BYTECODE_AT_IMPORT = "first import"


def bytecode_mode(environ: Mapping[str, str] | None = None) -> bool | str:
    """When an env's bytecode is written: at install where the processes this controller starts
    (which inherit its environment) write none: PYTHONDONTWRITEBYTECODE set to anything but empty,
    as Python reads it. Else Python writes each module's bytecode on its first import."""
    env = os.environ if environ is None else environ
    return BYTECODE_AT_INSTALL if env.get("PYTHONDONTWRITEBYTECODE") else BYTECODE_AT_IMPORT


def _base(wheelhouse: Wheelhouse, python: str, with_pip: bool) -> dict:
    tags = interpreter_tags(python)
    return {"wheelhouse": wheelhouse.manifest["key"], "python": tags["python"], "platform": tags["platform"],
            "interpreter": str(Path(python).resolve()), "with_pip": with_pip, "bytecode": bytecode_mode()}


def _key(base: dict) -> str:
    return hashlib.sha256(json.dumps(base, sort_keys=True).encode()).hexdigest()[:KEY_LENGTH]


def ensure_env(
    wheelhouse: Wheelhouse,
    *,
    root: Path | None = None,
    python: str = sys.executable,
    extra_wheels: Sequence[Path] = (),
    with_pip: bool = False,
    installer: str | None = None,
    log: Log = print,
) -> Env:
    """Return the ready env of `wheelhouse`'s stack, building it once; reuse it when current.

    `with_pip` gives the env its own pip (bootstrapped offline by ensurepip), for envs that
    must run pip themselves; otherwise the controller's uv or pip installs into it.
    `installer` forces ``"uv"`` or ``"pip"`` (default: DISTCI_INSTALLER, else uv if found).
    Raises InfraError (with the install log's tail; the whole log stays in the env dir)
    when the venv cannot be created or a wheel cannot be installed.
    """
    root = (Path(root) if root is not None else default_root()).resolve()
    base = _base(wheelhouse, python, with_pip)
    key = _key(base)
    path = root / f"stack-{key}"
    extras = [Path(w).resolve() for w in extra_wheels]
    for wheel in extras:
        if not wheel.is_file():
            raise InfraError(f"env {path.name}: extra wheel {wheel} does not exist")
    wanted = {**base, "extras": {w.name: sha256_file(w) for w in extras}}
    tool, uv = choose_installer(installer)
    env = Env(path=path, python=env_python(path), key=key, log_path=path / INSTALL_LOG, installer=tool)

    if _read_json(path / BASE_MARKER) == base and _read_json(path / MARKER) == wanted and env.python.exists():
        log(f"env {path.name}: reusing {path}")
        return env
    with file_lock(root / f".{path.name}.lock"):
        base_ready = _read_json(path / BASE_MARKER) == base and env.python.exists()
        if base_ready and _read_json(path / MARKER) == wanted:
            log(f"env {path.name}: reusing {path}")
            return env
        started = time.monotonic()
        if not base_ready:
            _build_base(env, wheelhouse, python, base, uv, log)
        (path / MARKER).unlink(missing_ok=True)
        if extras:
            log(f"env {path.name}: installing {', '.join(w.name for w in extras)}")
            _install(env, python, uv, ["--no-deps", "--no-index", *_reinstall(uv), *map(str, extras)], log)
        _write_json(path / MARKER, wanted)
        log(f"env {path.name}: ready in {format_duration(time.monotonic() - started)} ({tool})")
    return env


def stack_env(
    requirements: Sequence[str],
    pip_args: Sequence[str] = (),
    *,
    python: str = sys.executable,
    extra_wheels: Sequence[Path] = (),
    wheelhouse_root: Path | None = None,
    env_root: Path | None = None,
    with_pip: bool = False,
    installer: str | None = None,
    log: Log = print,
) -> Env:
    """The env of a stack given as requirement lines: wheelhouse (download once) + `ensure_env`.

    `requirements` and `pip_args` are what distci.provision.sources gives (``torch==2.13.0``,
    ``--extra-index-url ...``); the same inputs map to the same wheelhouse and so to the
    same env, whoever asks (a cell, the fix audit, a bisect probe).
    """
    wheelhouse = ensure_wheelhouse(requirements, pip_args, wheelhouse_root, python=python, log=log)
    return ensure_env(wheelhouse, root=env_root, python=python, extra_wheels=extra_wheels, with_pip=with_pip,
                      installer=installer, log=log)


def _reinstall(uv: str | None) -> list[str]:
    return ["--reinstall", "--no-cache"] if uv else ["--force-reinstall"]


def _build_base(env: Env, wheelhouse: Wheelhouse, python: str, base: dict, uv: str | None, log: Log) -> None:
    if env.path.exists():
        shutil.rmtree(env.path)
    env.path.mkdir(parents=True)
    log(f"env {env.path.name}: creating venv, installing {len(wheelhouse.wheels)} wheels "
        f"from wheelhouse {wheelhouse.key} with {'uv' if uv else 'pip'}")
    if uv and not base["with_pip"]:
        cmd = [uv, "venv", "--quiet", "--allow-existing", "--python", python, str(env.path)]
    else:
        cmd = [python, "-m", "venv", *([] if base["with_pip"] else ["--without-pip"]), str(env.path)]
    with env.log_path.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=isolated_environ())
    if proc.returncode != 0 or not env.python.exists():
        output = env.log_path.read_text()
        raise InfraError(f"env {env.path.name}: venv creation failed: {failure_line(output)} "
                         f"(log: {env.log_path})", log=_tail(output))
    # The lock is the whole closure pip resolved when it filled the wheelhouse: install exactly
    # it (--no-deps), so nothing is resolved again, only hash checked.
    _install(env, python, uv, ["--no-index", "--no-deps", "--find-links", str(wheelhouse.path), "--require-hashes",
                               "-r", str(wheelhouse.lock_file)], log)
    _write_json(env.path / BASE_MARKER, base)


def _install(env: Env, python: str, uv: str | None, args: list[str], log: Log) -> None:
    at_install = bytecode_mode() == BYTECODE_AT_INSTALL
    if uv:
        cmd = [uv, "pip", "install", "--python", str(env.python), *(["--compile-bytecode"] if at_install else []),
               *args]
    else:
        cmd = [python, "-m", "pip", "--python", str(env.python), "install", *([] if at_install else ["--no-compile"]),
               *args]
    code, output = run_pip(cmd, env.log_path, log, environ=isolated_environ())
    if code != 0:
        tool = "uv pip" if uv else "pip"
        raise InfraError(f"env {env.path.name}: {tool} install failed (exit {code}): {failure_line(output)} "
                         f"(log: {env.log_path})", log=_tail(output))


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-LOG_TAIL_LINES:])


# --------------------------------------------------------------------------- installed stacks

_PROBE = r"""
import importlib.metadata as m, json, os, sys
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
names = json.loads(sys.argv[1])
print(json.dumps({"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3],
                  "path": [p for p in sys.path if p and os.path.isdir(p)],
                  "versions": {n: version(n) for n in names}}))
"""
INSTALLED_PTH = "_distci_installed.pth"


def overlay_venv(path: Path, python: str, log_path: Path) -> Path:
    """An empty venv of `python` (no pip: the controller's pip installs into it with
    ``--python``); returns its site-packages. With `add_import_path` it becomes an overlay:
    its own packages first, then another environment's, imported where they are installed.
    Used by installed stacks here and by bisect's candidate envs (distci/bisect/install.py)."""
    cmd = [python, "-m", "venv", "--without-pip", str(path)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=isolated_environ())
    if proc.returncode != 0 or not env_python(path).exists():
        raise InfraError(f"env {path.name}: cannot make a venv of {python} (log: {log_path})",
                         log=_tail(log_path.read_text()))
    return next(path.glob("lib/python*/site-packages"), None) or path / "Lib" / "site-packages"


def add_import_path(site_dir: Path, sites: Sequence[str], name: str) -> None:
    """A .pth file `name` in `site_dir` appending `sites` (after the venv's own packages)."""
    pth = site_dir / name
    pth.unlink(missing_ok=True)  # may be a hard link into another env
    pth.write_text(f"import site; list(map(site.addsitedir, {[str(s) for s in sites]!r}))\n")


@dataclass(frozen=True)
class InstalledStack:
    """What an interpreter already has: its import path and the versions of the packages asked about."""

    python: str
    executable: str
    version: str
    path: tuple[str, ...]
    versions: Mapping[str, str | None]


def probe_installed(python: str, names: Sequence[str]) -> InstalledStack:
    """Ask `python` (without importing torch) which versions of `names` it has installed."""
    proc = subprocess.run([python, "-c", _PROBE, json.dumps(list(names))], capture_output=True, text=True)
    if proc.returncode != 0:
        raise InfraError(f"cannot run the interpreter {python}: {failure_line(proc.stderr)}", log=proc.stderr[-4000:])
    data = json.loads(proc.stdout)
    return InstalledStack(python=python, executable=data["executable"], version=data["version"],
                          path=tuple(data["path"]), versions=data["versions"])


def installed_env(
    python: str,
    requirements: Sequence[str],
    *,
    find_links: Sequence[str] = (),
    present: Sequence[str] = (),
    root: Path | None = None,
    extra_wheels: Sequence[Path] = (),
    installer: str | None = None,
    log: Log = print,
) -> tuple[Env, InstalledStack]:
    """Run an interpreter's preinstalled stack as it is: nothing downloaded, nothing replaced.

    `requirements` are what the run needs (``torch``, ``torchao==0.17.0``, ``pytest``). One
    installed at a version outside its specifier is an InfraError: an installed stack is
    used, never changed. One missing (unless named in `present`: those the interpreter must
    have, e.g. torch declared 'installed') is installed from the local `find_links` wheels only
    (pip, which sees the interpreter's packages and so adds only what is missing). The env
    is a thin overlay ``<root>/installed-<key>/``: a venv of the same interpreter holding
    distci's own wheels and those additions, whose ``.pth`` puts the interpreter's whole
    import path after them, so every preinstalled package is imported from where it is.
    """
    from packaging.requirements import Requirement

    wanted = [Requirement(r) for r in requirements]
    found = probe_installed(python, list(dict.fromkeys([*(r.name for r in wanted), *present])))
    wrong = [f"{r.name} {found.versions[r.name]} (the run needs {r})" for r in wanted
             if found.versions.get(r.name) and not r.specifier.contains(found.versions[r.name], prereleases=True)]
    if wrong:
        raise InfraError(f"{python} has {', '.join(wrong)}; an installed stack is used as it is, so declare "
                         "that package 'installed' or use an interpreter that matches")
    absent = [name for name in present if not found.versions.get(name)]
    if absent:
        raise InfraError(f"{python} has no {', '.join(absent)}, which the run takes as installed")
    missing = [str(r) for r in wanted if not found.versions.get(r.name)]
    if missing and not find_links:
        raise InfraError(f"{python} lacks {', '.join(missing)}; put their wheels in a directory named by "
                         "DISTCI_FIND_LINKS (nothing is downloaded for an installed stack)")
    root = (Path(root) if root is not None else default_root()).resolve()
    base = {"installed": found.executable, "path": list(found.path), "versions": dict(found.versions),
            "missing": missing, "find_links": list(find_links)}
    key = _key(base)
    path = root / f"installed-{key}"
    extras = [Path(w).resolve() for w in extra_wheels]
    wanted_marker = {**base, "extras": {w.name: sha256_file(w) for w in extras}}
    tool, uv = choose_installer(installer)
    env = Env(path=path, python=env_python(path), key=key, log_path=path / INSTALL_LOG, installer=tool)
    with file_lock(root / f".{path.name}.lock"):
        if _read_json(path / MARKER) == wanted_marker and env.python.exists():
            log(f"env {path.name}: reusing the overlay of {found.executable}")
            return env, found
        started = time.monotonic()
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        log(f"env {path.name}: {found.executable} as installed"
            + (f", adding {', '.join(missing)} from local wheels" if missing else ""))
        add_import_path(overlay_venv(path, python, env.log_path), found.path, INSTALLED_PTH)
        if missing:
            links = [arg for loc in find_links for arg in ("--find-links", loc)]
            _install(env, sys.executable, None, ["--no-index", *links, *missing], log)
        if extras:
            _install(env, sys.executable, uv, ["--no-deps", "--no-index", *_reinstall(uv), *map(str, extras)], log)
        _write_json(path / MARKER, wanted_marker)
        log(f"env {path.name}: ready in {format_duration(time.monotonic() - started)}")
    return env, found

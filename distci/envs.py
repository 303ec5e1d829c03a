"""Provision a cell's virtualenv from its wheelhouse, with no network.

An env is ``<root>/<cell-id>-<key>/``: a stdlib venv into which the wheelhouse's
``requirements.lock`` is installed with ``pip install --no-index`` (hash checked), then
distci's own wheels (`extra_wheels`) with ``--no-deps``. pip, not uv: uv ignores the
machine's pip configuration, which some hosts need. The creating interpreter's pip
installs into the env (``pip --python``), because bootstrapping a pip into every venv
(ensurepip) costs more than the whole offline install of small stacks; pass
``with_pip=True`` for an env that must run pip itself (or put ``pip`` in the wheelhouse).

The key covers the wheelhouse and the interpreter, not the extra wheels: those change
on every edit of distci, and reinstalling two small wheels is cheaper than reinstalling
torch. Two marker files record progress and are written last: without the base marker
the env is rebuilt from scratch; with it but stale extras only the extras are
reinstalled. So an env whose build was interrupted is never mistaken for a ready one.
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
from typing import Sequence

from distci.errors import InfraError
from distci.wheelhouse import Log, Wheelhouse, failure_line, file_lock, interpreter_tags, run_pip, sha256_file

BASE_MARKER = "distci-base.json"
MARKER = "distci-env.json"
INSTALL_LOG = "distci-install.log"
KEY_LENGTH = 8
LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class Env:
    path: Path
    python: Path
    key: str
    log_path: Path


def default_root() -> Path:
    return Path(os.environ.get("DISTCI_ENV_ROOT") or Path(".distci") / "envs")


def env_python(path: Path) -> Path:
    return path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def ensure_env(
    cell_or_key: object,
    wheelhouse: Wheelhouse,
    *,
    root: Path | None = None,
    python: str = sys.executable,
    extra_wheels: Sequence[Path] = (),
    with_pip: bool = False,
    log: Log = print,
) -> Env:
    """Return a ready venv for a cell (or any name) built from `wheelhouse`; reuse it when current.

    Raises InfraError (with the install log's tail; the whole log stays in the env dir)
    when the venv cannot be created or a wheel cannot be installed.
    """
    name = getattr(cell_or_key, "id", None) or str(cell_or_key)
    root = (Path(root) if root is not None else default_root()).resolve()
    tags = interpreter_tags(python)
    interpreter = str(Path(python).resolve())
    base = {"wheelhouse": wheelhouse.manifest["key"], "python": tags["python"], "platform": tags["platform"],
            "interpreter": interpreter, "with_pip": with_pip}
    key = hashlib.sha256(json.dumps(base, sort_keys=True).encode()).hexdigest()[:KEY_LENGTH]
    path = root / f"{name}-{key}"
    extras = [Path(w).resolve() for w in extra_wheels]
    for wheel in extras:
        if not wheel.is_file():
            raise InfraError(f"env {name}: extra wheel {wheel} does not exist")
    wanted = {**base, "extras": {w.name: sha256_file(w) for w in extras}}
    env = Env(path=path, python=env_python(path), key=key, log_path=path / INSTALL_LOG)

    with file_lock(root / f".{path.name}.lock"):
        base_ready = _read_json(path / BASE_MARKER) == base and env.python.exists()
        if base_ready and _read_json(path / MARKER) == wanted:
            log(f"env {path.name}: reusing {path}")
            return env
        started = time.monotonic()
        if not base_ready:
            _build_base(env, wheelhouse, python, base, log)
        (path / MARKER).unlink(missing_ok=True)
        if extras:
            log(f"env {path.name}: installing {', '.join(w.name for w in extras)}")
            _pip(env, python, ["install", "--no-deps", "--no-index", "--force-reinstall", *map(str, extras)], log)
        _write_json(path / MARKER, wanted)
        log(f"env {path.name}: ready in {time.monotonic() - started:.1f}s")
    return env


def _build_base(env: Env, wheelhouse: Wheelhouse, python: str, base: dict, log: Log) -> None:
    if env.path.exists():
        shutil.rmtree(env.path)
    env.path.mkdir(parents=True)
    log(f"env {env.path.name}: creating venv, installing {len(wheelhouse.wheels)} wheels "
        f"from wheelhouse {wheelhouse.key}")
    with env.log_path.open("a") as out:
        cmd = [python, "-m", "venv", *([] if base["with_pip"] else ["--without-pip"]), str(env.path)]
        out.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not env.python.exists():
        output = env.log_path.read_text()
        raise InfraError(f"env {env.path.name}: venv creation failed: {failure_line(output)} "
                         f"(log: {env.log_path})", log=_tail(output))
    _pip(env, python, ["install", "--no-index", "--find-links", str(wheelhouse.path), "-r", str(wheelhouse.lock_file)],
         log)
    _write_json(env.path / BASE_MARKER, base)


def _pip(env: Env, python: str, args: list[str], log: Log) -> None:
    code, output = run_pip([python, "-m", "pip", "--python", str(env.python), *args], env.log_path, log)
    if code != 0:
        raise InfraError(f"env {env.path.name}: pip {args[0]} failed (exit {code}): {failure_line(output)} "
                         f"(log: {env.log_path})", log=_tail(output))


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-LOG_TAIL_LINES:])

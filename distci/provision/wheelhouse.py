"""Download a Stack once into a content-addressed wheel cache (offline-first, DESIGN rule 3).

A wheelhouse is a directory ``<root>/<key>/`` of wheels, keyed by what was asked for:
the sorted requirement lines, the pip arguments (indexes, find-links, --pre), the
target interpreter and platform, and the hashes of any local wheels added. The same
inputs always map to the same directory, so a second run, a venv rebuild or an image
build installs with no network, and a nightly that has since vanished from its index
stays installable for bisect.

Each wheelhouse holds ``requirements.lock`` (``name==version --hash=sha256:...`` for
every wheel: pip installs it in hash-checking mode, so a corrupted cache fails loudly)
and ``manifest.json`` (what was asked, what was resolved, when, how long). It is built
in a temporary sibling directory and renamed into place only when complete, so a
crash never leaves a half wheelhouse that looks finished.

pip does the downloads, so the machine's pip configuration (pip.conf, PIP_* variables,
a proxy's CA bundle) applies to them; installs from a finished wheelhouse use uv (see
distci.provision.envs), which needs no configuration at all. What of that configuration can change
what resolves (indexes, find-links, constraints, --pre; their UV_* twins) is part of the
key (`resolution_environment`): the same requirements under a torch<=2.14.1 constraint
and without it are two wheelhouses, never one reused for the other. A constraints file
is keyed by its content, not its path, so two empty files are the same input.

Durable storage for runners: point ``DISTCI_WHEELHOUSE_ROOT`` at a disk that outlives
jobs, and cap it with ``DISTCI_WHEELHOUSE_MAX_GB``. Every use stamps the wheelhouse
(``.last-used``); after each use, the least recently used wheelhouses are deleted until
the root fits the cap. One used within the last `MIN_IDLE_S` seconds is never deleted,
since another job may be installing from it: the cap is then exceeded and said so.
Hashes are recorded when wheels are downloaded (manifest and lock) and enforced when
they are installed: `install_args` puts pip in ``--require-hashes`` mode.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from filelock import FileLock
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from distci.errors import InfraError
from distci.provision.index import redact_url
from distci.provision.wheeltarget import WheelTarget, interpreter_tags, wheel_requires
from distci.provision.lru import evict, max_bytes, touch
from distci.provision.pipconfig import resolution_environment
from distci.provision.files import MANIFEST, file_lock, sha256_file
from distci.results import format_duration

LOCK_FILE = "requirements.lock"
PIP_LOG = "pip.log"
KEY_LENGTH = 16
LOG_TAIL_LINES = 40

Log = Callable[[str], None]


@dataclass(frozen=True)
class Wheelhouse:
    key: str
    path: Path
    wheels: list[str]
    lock_file: Path
    manifest: dict


def default_root() -> Path:
    return Path(os.environ.get("DISTCI_WHEELHOUSE_ROOT") or Path(".distci") / "wheelhouse")


def _complete_for(target: WheelTarget, directory: Path, cmd: list[str], log_path: Path, log: Log) -> None:
    """Download what the target's markers ask for and pip skipped.

    `pip download --python-version` matches wheel tags for the target but evaluates
    dependency markers for the interpreter running pip, so a dependency behind
    `python_version >= "3.12"` is missed from a 3.11 controller. Each round reads the
    downloaded wheels' Requires-Dist with the target's markers and fetches what is missing.
    """
    env = target.marker_env()
    for _ in range(20):
        have = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in directory.glob("*.whl")}
        missing = sorted({str(Requirement(f"{r.name}{r.specifier}"))
                          for w in directory.glob("*.whl") for r in wheel_requires(w)
                          if canonicalize_name(r.name) not in have
                          and (r.marker is None or r.marker.evaluate({**env, "extra": ""}))})
        if not missing:
            return
        log(f"  for CPython {target.python}: also {', '.join(missing)}")
        code, output = run_pip([*cmd, *missing], log_path, log)
        if code != 0:
            raise InfraError(f"pip download for CPython {target.python} failed: {failure_line(output)}",
                             log=_tail(output))
    raise InfraError("dependencies of the target did not converge after 20 rounds")


def tags_of_here() -> str:
    here = interpreter_tags(sys.executable)
    return f"{here['python']} {here['platform']}"


def wheelhouse_key(requirements: Sequence[str], pip_args: Sequence[str], tags: dict[str, str],
                   extra_wheel_hashes: Sequence[str] = (), environment: Mapping[str, str] | None = None) -> str:
    """The content address of a wheelhouse; `environment` is `resolution_environment()`'s answer."""
    payload = {
        "requirements": sorted(r.strip() for r in requirements),
        "pip_args": list(pip_args),
        "python": tags["python"],
        "platform": tags["platform"],
        "extra_wheels": sorted(extra_wheel_hashes),
    }
    if environment:
        payload["environment"] = dict(sorted(environment.items()))
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _load(path: Path, key: str) -> Wheelhouse | None:
    """The complete wheelhouse at `path`, or None when it is missing or damaged."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    wheels = [w["filename"] for w in manifest.get("wheels", [])]
    if manifest.get("key") != key or not (path / LOCK_FILE).is_file():
        return None
    if not all((path / w).is_file() for w in wheels):
        return None
    return Wheelhouse(key=path.name, path=path, wheels=wheels, lock_file=path / LOCK_FILE, manifest=manifest)


BUILDER_LOCK = ".builder.lock"
UNMARKED_STALE_S = 3600


def _builder_gone(entry: Path) -> bool:
    """Whether the process that made temp directory `entry` is gone: its builder lock is free.

    The pid in the name is not evidence: a bisect in a container (its own PID namespace) on
    the same checkout sees every host pid as dead, and once deleted a live host build's
    directory under it (CI: ``No such file or directory: .tmp-7000-.../pip.log``). A flock
    is seen alike from every namespace on the host. A directory without the lock file (an
    older distci's, or one whose maker died before taking it) is stale only when it has
    not changed for UNMARKED_STALE_S.
    """
    try:
        fd = os.open(entry / BUILDER_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        try:
            return time.time() - entry.stat().st_mtime > UNMARKED_STALE_S
        except FileNotFoundError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the probe's own lock, if it got one
    return True


def remove_stale_temps(root: Path) -> None:
    """Delete temp build and eviction directories whose maker is gone (a crashed process)."""
    if not root.is_dir():
        return
    for entry in [*root.glob(".tmp-*"), *root.glob(".evicting-*")]:
        if entry.is_dir() and _builder_gone(entry):
            shutil.rmtree(entry, ignore_errors=True)


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


FAILURE_LINE_MAX = 600


def failure_line(output: str) -> str:
    """One line that says why pip (or uv) failed: the cause, not the last words.

    pip ends a failed resolution with ``ResolutionImpossible: for help visit ...``; the
    cause is earlier: its first ERROR block, and the "The conflict is caused by:" lines
    (``The user requested (constraint) torch<=2.14.1``). uv writes ``error:`` and
    ``╰─▶`` hint lines. All joined with "; ", capped at FAILURE_LINE_MAX characters.
    """
    lines = output.splitlines()
    stripped = [line.strip() for line in lines]
    parts: list[str] = []
    first = next((i for i, line in enumerate(stripped) if line.startswith(("ERROR:", "error:"))), None)
    if first is not None:
        parts.append(stripped[first])
        for line in stripped[first + 1:]:
            if not line or line.startswith(("ERROR:", "error:")) or "The conflict is caused by" in line:
                break
            parts.append(line.lstrip("╰─▶ ").strip())
    cause = next((i for i, line in enumerate(stripped) if line.startswith("The conflict is caused by")), None)
    if cause is not None:
        caused = []
        for line in stripped[cause + 1:]:
            if not line:
                break
            caused.append(line)
        if caused:
            parts.append("caused by: " + "; ".join(caused))
    if not parts:
        parts = [line for line in stripped if line][-1:] or ["no output"]
    text = "; ".join(dict.fromkeys(parts))
    return text if len(text) <= FAILURE_LINE_MAX else text[:FAILURE_LINE_MAX - 3] + "..."


def _redacted_args(args: Sequence[str]) -> list[str]:
    return [redact_url(a) if "://" in a else a for a in args]


def run_pip(cmd: list[str], log_path: Path, log: Log, *, environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run pip (or uv) with its output going to `log_path`; report each real download as it starts.

    `environ` replaces the process environment (distci.provision.envs passes one without pip config).
    """
    lines = []
    with log_path.open("a") as out:
        out.write("$ " + " ".join(_redacted_args(cmd)) + "\n")
        out.flush()
        env = {**(os.environ if environ is None else environ), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               "PIP_NO_INPUT": "1", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            lines.append(line)
            if line.lstrip().startswith("Downloading ") and "(" in line:
                log("  " + line.strip())
        code = proc.wait()
    return code, "".join(lines)


def ensure_wheelhouse(
    requirements: Sequence[str],
    pip_args: Sequence[str],
    root: Path | None = None,
    *,
    python: str = sys.executable,
    extra_wheels: Sequence[Path] = (),
    max_gb: float | None = None,
    target: WheelTarget | None = None,
    log: Log = print,
) -> Wheelhouse:
    """Return the wheelhouse for these inputs, building it (with pip, once) if needed.

    `requirements` are pip requirement lines (``torch==2.13.0``, ``pytest``, direct
    references ``name @ git+URL@SHA``); `pip_args` come from distci.provision.sources.pip_args.
    `extra_wheels` are local wheels the requirements may need (made available to pip
    and copied in); distci's own wheels belong to ensure_env instead, so rebuilding
    them does not re-download torch. Sdists and direct references are built into wheels
    here, so environments never build anything. Failures raise InfraError with pip's log.
    `max_gb` caps the root's size (default: DISTCI_WHEELHOUSE_MAX_GB; unset: no cap).
    `target`: download the wheels for another interpreter (WheelTarget); the key is the
    one that interpreter would get, so either way of making a wheelhouse serves both.
    """
    root = Path(root) if root is not None else default_root()
    extra = [Path(p) for p in extra_wheels]
    for wheel in extra:
        if not wheel.is_file():
            raise InfraError(f"extra wheel {wheel} does not exist")
    tags = target.tags() if target is not None else interpreter_tags(python)
    environment = resolution_environment(python)
    full_key = wheelhouse_key(requirements, pip_args, tags, [sha256_file(w) for w in extra], environment)
    key = full_key[:KEY_LENGTH]
    final = root / key
    root.mkdir(parents=True, exist_ok=True)

    cap = max_bytes(max_gb)
    found = _load(final, full_key)
    if found:
        log(f"wheelhouse {key}: reusing {final} ({len(found.wheels)} wheels)")
        return _used(found, root, cap, log)

    with file_lock(root / f".{key}.lock"):
        found = _load(final, full_key)
        if found:
            log(f"wheelhouse {key}: reusing {final} ({len(found.wheels)} wheels)")
        else:
            remove_stale_temps(root)
            if final.exists():
                log(f"wheelhouse {key}: {final} is incomplete or damaged; rebuilding it")
                shutil.rmtree(final)
            found = _build(list(requirements), list(pip_args), final, full_key, tags, python, extra, log,
                           environment, target)
    return _used(found, root, cap, log)


def _used(wheelhouse: Wheelhouse, root: Path, cap: int | None, log: Log) -> Wheelhouse:
    touch(wheelhouse.path)
    if cap is not None:
        evict(root, cap, keep=(wheelhouse.path,), log=log)
    return wheelhouse


def install_args(wheelhouse: Wheelhouse, *, find_links: str | None = None, lock_file: str | None = None) -> list[str]:
    """pip install arguments for a wheelhouse: offline, every wheel checked against its recorded hash.

    `find_links` / `lock_file` override the paths where the wheelhouse is seen from
    elsewhere (inside an image build).
    """
    return ["--no-index", "--find-links", find_links or str(wheelhouse.path), "--require-hashes",
            "-r", lock_file or str(wheelhouse.lock_file)]


def archived(root: Path | None, package: str) -> list[Path]:
    """The complete wheelhouses under `root` holding a wheel of `package`: where bisect
    finds builds (old nightlies) that have since left their index."""
    root = Path(root) if root is not None else default_root()
    name = canonicalize_name(package)
    found = []
    for manifest in sorted(root.glob(f"*/{MANIFEST}")):
        try:
            wheels = json.loads(manifest.read_text()).get("wheels", [])
        except (OSError, ValueError):
            continue
        if any(canonicalize_name(w.get("name", "")) == name for w in wheels):
            found.append(manifest.parent)
    return found


def verify(wheelhouse: Wheelhouse) -> list[str]:
    """Wheels whose bytes no longer match the hash recorded at download (empty when intact)."""
    return [w["filename"] for w in wheelhouse.manifest.get("wheels", [])
            if not (wheelhouse.path / w["filename"]).is_file()
            or sha256_file(wheelhouse.path / w["filename"]) != w["sha256"]]


# --------------------------------------------------------------------------- size cap (LRU)


def _build(requirements: list[str], pip_args: list[str], final: Path, full_key: str,
           tags: dict[str, str], python: str, extra: list[Path], log: Log,
           environment: Mapping[str, str], target: WheelTarget | None = None) -> Wheelhouse:
    key = final.name
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-{key}-", dir=final.parent))
    builder = FileLock(str(tmp / BUILDER_LOCK))  # held while building: see _builder_gone
    builder.acquire()
    try:
        started = time.monotonic()
        log(f"wheelhouse {key}: downloading {', '.join(requirements)}")
        req_file = tmp / "requirements.in"
        req_file.write_text("".join(r.strip() + "\n" for r in requirements))
        find_links: list[str] = []
        if extra:
            local = tmp / ".extra"
            local.mkdir()
            for wheel in extra:
                shutil.copy2(wheel, local / wheel.name)
            find_links = ["--find-links", str(local)]
        # `pip wheel` (not `pip download`): a wheel on the index is saved as is, an sdist
        # or a git reference is built once here, so installs from the wheelhouse never build.
        if target is None:
            cmd = [python, "-m", "pip", "wheel", "--prefer-binary", "--wheel-dir", str(tmp),
                   *pip_args, *find_links, "-r", str(req_file)]
        else:
            log(f"wheelhouse {key}: for CPython {target.python} on {target.machine} (this is {tags_of_here()})")
            cmd = [sys.executable, "-m", "pip", "download", "--dest", str(tmp), *target.pip_args(),
                   *pip_args, *find_links, "-r", str(req_file)]
        code, output = run_pip(cmd, tmp / PIP_LOG, log)
        if code == 0 and target is not None:
            _complete_for(target, tmp, cmd[: cmd.index("-r")], tmp / f"more-{PIP_LOG}", log)
        if code != 0:
            kept = final.parent / f"{key}.failed.log"
            shutil.copyfile(tmp / PIP_LOG, kept)
            raise InfraError(
                f"wheelhouse {key}: pip wheel failed (exit {code}): {failure_line(output)} (full log: {kept})",
                log=_tail(output),
            )
        shutil.rmtree(tmp / ".extra", ignore_errors=True)
        wheels = []
        for wheel in sorted(tmp.glob("*.whl")):
            name, version, _, _ = parse_wheel_filename(wheel.name)
            wheels.append({"filename": wheel.name, "name": str(name), "version": str(version),
                           "sha256": sha256_file(wheel), "size": wheel.stat().st_size})
        if not wheels:
            raise InfraError(f"wheelhouse {key}: pip produced no wheels", log=_tail(output))
        (tmp / LOCK_FILE).write_text("".join(
            f"{canonicalize_name(w['name'])}=={w['version']} --hash=sha256:{w['sha256']}\n" for w in wheels))
        duration = time.monotonic() - started
        manifest = {
            "schema": 1,
            "key": full_key,
            "requirements": requirements,
            "pip_args": _redacted_args(pip_args),
            "python": tags["python"],
            "platform": tags["platform"],
            "extra_wheels": [w.name for w in extra],
            "environment": {k: redact_url(v) if "://" in v else v for k, v in environment.items()},
            "wheels": wheels,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "duration_s": round(duration, 1),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.rename(tmp, final)
        (final / BUILDER_LOCK).unlink(missing_ok=True)
        (final.parent / f"{key}.failed.log").unlink(missing_ok=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        builder.release()
    size_mb = sum(w["size"] for w in wheels) / 1e6
    log(f"wheelhouse {key}: {len(wheels)} wheels, {size_mb:.0f} MB in {format_duration(duration)} -> {final}")
    return Wheelhouse(key=key, path=final, wheels=[w["filename"] for w in wheels],
                      lock_file=final / LOCK_FILE, manifest=manifest)

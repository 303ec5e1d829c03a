"""Upstream test sources at the version or commit the cell resolved to, cached once.

Upstream wheels do not ship their tests, so the tests come from the upstream repository
(or, where a project ships them there, its sdist) at exactly the ref that matches what
is installed in the cell: the tag of a release (`v{version}`), the commit of a git
install. A suite's checkout is cached like the wheelhouse: ``<root>/<key>/`` keyed by
(origin, ref, kept paths), built in a temporary sibling and renamed into place when
complete, so a second run or a bisect step reuses it with no network. Only the paths
the suite `keep`s are stored, which keeps the cache (and a device carry) small.

Where the sources come from, first match wins:
  1. an explicit directory (``--source NAME=DIR`` or ``DISTCI_EXTERNAL_<NAME>``), used as is;
  2. ``DISTCI_GIT_<GIT>``: a repository URL or local path, checked out at the ref;
  3. the package's sdist from the configured index, when the suite says `sdist = true`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from packaging.version import InvalidVersion, Version

from distci.errors import ConfigError, InfraError, SourceError
from distci.provision.index import redact_url
from distci.sources import env_var_name
from distci.provision.files import file_lock

from distci.external.spec import SuiteSpec

MANIFEST = "manifest.json"
PREPARED = "UPSTREAM.json"
KEY_LENGTH = 16

Log = Callable[[str], None]


@dataclass(frozen=True)
class UpstreamRef:
    """Which upstream revision matches the cell: `ref` is what git checks out."""

    package: str
    version: str | None
    ref: str
    commit: str | None = None


@dataclass(frozen=True)
class Checkout:
    path: Path
    origin: str
    ref: str
    commit: str | None
    key: str | None = None
    missing: tuple[str, ...] = ()
    substituted: Mapping[str, str] = field(default_factory=dict)


def default_root() -> Path:
    return Path(os.environ.get("DISTCI_EXTERNAL_ROOT") or Path(".distci") / "external")


def upstream_ref(suite: SuiteSpec, installed: Mapping[str, object] | None, *, override: str | None = None) -> UpstreamRef:
    """The ref of the suite's upstream that matches the package installed in the cell.

    `installed` is the probe's entry for the package: ``{"version": ..., "commit": ...}``.
    A git install's commit wins; a release version maps through the suite's ref template;
    a nightly or local build has no tag, so it needs an explicit ref or directory.
    """
    version = (installed or {}).get("version") if installed else None
    commit = (installed or {}).get("commit") if installed else None
    if override:
        return UpstreamRef(suite.package, version, override, commit)  # type: ignore[arg-type]
    if commit:
        return UpstreamRef(suite.package, version, str(commit), str(commit))  # type: ignore[arg-type]
    if not version:
        raise SourceError(f"{suite.package} is not installed in this cell, so there is no upstream "
                          f"version to take the {suite.name} tests from", where=suite.where)
    try:
        parsed = Version(str(version))
    except InvalidVersion:
        raise SourceError(f"{suite.package} {version} is not a PEP 440 version", where=suite.where) from None
    local = parsed.local or ""
    if local.startswith("git") and len(local) > 6:  # a source build: 0.18.0+git1a2b3c4
        return UpstreamRef(suite.package, str(version), local[3:], local[3:])
    if parsed.is_devrelease:
        raise SourceError(
            f"{suite.package} {version} is a nightly or source build without a recorded commit; pass "
            f"--ref {suite.name}=<commit> or point {env_var_name('DISTCI_EXTERNAL_', suite.name)} at a checkout",
            where=suite.where)
    public = parsed.public
    return UpstreamRef(suite.package, str(version), suite.ref.format(version=public), None)


def _git(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})


def _origin(suite: SuiteSpec, environ: Mapping[str, str]) -> str | None:
    if not suite.git:
        return None
    var = env_var_name("DISTCI_GIT_", suite.git)
    value = environ.get(var, "")
    if not value:
        return None
    value = value.removeprefix("git+")
    if "://" not in value and not Path(value).expanduser().exists():
        raise ConfigError(f"{var}={value} is neither a URL nor an existing path")
    return value if "://" in value else str(Path(value).expanduser().resolve())


def prepared_record(directory: Path) -> dict:
    """What `prepare` recorded about a directory of upstream sources (its origin, ref, commit)."""
    try:
        return json.loads((directory / PREPARED).read_text())
    except (OSError, ValueError):
        return {}


def prepare(checkout: Checkout, keep: tuple[str, ...], dest: Path, *, notes: dict | None = None) -> int:
    """Copy the kept paths of a checkout to `dest`, recording where they came from; returns bytes."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    missing = _copy_kept(checkout.path, dest, keep)
    record = {"origin": checkout.origin, "ref": checkout.ref, "commit": checkout.commit,
              "missing": sorted(set(missing) | set(checkout.missing)), **(notes or {})}
    (dest / PREPARED).write_text(json.dumps(record, indent=1) + "\n")
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def explicit_directory(suite: SuiteSpec, environ: Mapping[str, str] | None = None) -> Path | None:
    """The directory of upstream sources given by DISTCI_EXTERNAL_<NAME>, if any."""
    value = (os.environ if environ is None else environ).get(env_var_name("DISTCI_EXTERNAL_", suite.name))
    return Path(value) if value else None


def describe_origin(suite: SuiteSpec, origin: str | None) -> str:
    """How a result names where its tests came from: a URL without credentials, never a
    local path (results are shared; the commit says exactly what ran)."""
    if origin is None:
        return f"sdist:{suite.package}"
    if "://" in origin:
        return redact_url(origin)
    return f"{env_var_name('DISTCI_GIT_', suite.git or suite.name)} (a local repository)"


def checkout_key(origin: str, ref: str, keep: tuple[str, ...]) -> str:
    payload = {"origin": redact_url(origin), "ref": ref, "keep": sorted(keep)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _load(path: Path, key: str) -> Checkout | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("key") != key:
        return None
    return Checkout(path=path, origin=manifest["origin"], ref=manifest["ref"], commit=manifest.get("commit"),
                    key=path.name, missing=tuple(manifest.get("missing", [])))


def _copy_kept(src: Path, dst: Path, keep: tuple[str, ...]) -> list[str]:
    """Copy the kept paths (everything but .git when none are named); return those not found."""
    missing = []
    if not keep:
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True)
        return missing
    for rel in keep:
        source = src / rel
        target = dst / rel
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        else:
            missing.append(rel)
    return missing


def ensure_checkout(
    suite: SuiteSpec,
    ref: UpstreamRef,
    *,
    root: Path | None = None,
    directory: Path | None = None,
    environ: Mapping[str, str] | None = None,
    log: Log = print,
) -> Checkout:
    """The suite's upstream sources at `ref`: an explicit directory, or a cached checkout."""
    environ = os.environ if environ is None else environ
    directory = directory or explicit_directory(suite, environ)
    if directory is not None:
        directory = Path(directory).expanduser().resolve()
        if not directory.is_dir():
            raise ConfigError(f"the {suite.name} sources {directory} are not a directory")
        missing = tuple(rel for rel in suite.keep if not (directory / rel).exists())
        recorded = prepared_record(directory)
        if not recorded and (directory / ".git").exists():
            head = _git(["rev-parse", "HEAD"], cwd=directory)
            recorded = {"origin": "a local checkout", "commit": head.stdout.strip() or None} if head.returncode == 0 else {}
        return Checkout(path=directory, origin=recorded.get("origin", "a prepared directory"), ref=recorded.get("ref", ref.ref),
                        commit=recorded.get("commit", ref.commit), missing=missing,
                        substituted=recorded.get("substituted", {}))
    origin = _origin(suite, environ)
    if origin is None and not suite.sdist:
        var = env_var_name("DISTCI_GIT_", suite.git or suite.name)
        raise ConfigError(f"no source for the {suite.name} tests: set {var} to the upstream repository "
                          f"(URL or path) or {env_var_name('DISTCI_EXTERNAL_', suite.name)} to a checkout",
                          where=suite.where)
    origin_id = origin or f"sdist:{suite.package}"
    root = Path(root) if root is not None else default_root()
    full_key = checkout_key(origin_id, ref.ref if origin else str(ref.version), suite.keep)
    final = root / full_key[:KEY_LENGTH]
    found = _load(final, full_key)
    if found:
        return found
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".{final.name}.lock"):
        found = _load(final, full_key)
        if found:
            return found
        if final.exists():
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=root))
        try:
            if origin:
                commit, missing = _from_git(origin, ref.ref, tmp, suite.keep, log)
            else:
                commit, missing = None, _from_sdist(suite.package, str(ref.version), tmp, suite.keep, log)
            manifest = {"key": full_key, "origin": describe_origin(suite, origin), "ref": ref.ref, "commit": commit,
                        "keep": list(suite.keep), "missing": missing,
                        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log(f"external {suite.name}: {describe_origin(suite, origin)} at {ref.ref} -> {final}")
    return Checkout(path=final, origin=describe_origin(suite, origin), ref=ref.ref, commit=commit, key=final.name,
                    missing=tuple(missing))


def _from_git(origin: str, ref: str, dest: Path, keep: tuple[str, ...], log: Log) -> tuple[str, list[str]]:
    work = Path(tempfile.mkdtemp(prefix="distci-ext-git-"))
    try:
        log(f"git clone {redact_url(origin)} ({ref})")
        proc = _git(["clone", "--quiet", "--no-checkout", origin, str(work / "repo")])
        if proc.returncode != 0:
            raise InfraError(f"git clone of {redact_url(origin)} failed", log=proc.stderr[-4000:])
        repo = work / "repo"
        proc = _git(["checkout", "--quiet", "--detach", ref], cwd=repo)
        if proc.returncode != 0:
            _git(["fetch", "--quiet", "origin", ref], cwd=repo)
            proc = _git(["checkout", "--quiet", "--detach", "FETCH_HEAD"], cwd=repo)
        if proc.returncode != 0:
            raise SourceError(f"{redact_url(origin)} has no ref {ref!r}: {proc.stderr.strip().splitlines()[-1:]}")
        commit = _git(["rev-parse", "HEAD"], cwd=repo).stdout.strip()
        return commit, _copy_kept(repo, dest, keep)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _from_sdist(package: str, version: str, dest: Path, keep: tuple[str, ...], log: Log) -> list[str]:
    work = Path(tempfile.mkdtemp(prefix="distci-ext-sdist-"))
    try:
        log(f"pip download --no-binary {package}=={version}")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               "--no-build-isolation", "-d", str(work), f"{package}=={version}"],
                              capture_output=True, text=True)
        archives = sorted(work.glob("*.tar.gz"))
        if proc.returncode != 0 or not archives:
            raise InfraError(f"no sdist of {package}=={version}", log=(proc.stdout + proc.stderr)[-4000:])
        with tarfile.open(archives[0]) as tar:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(work / "src", **safe)
        (top,) = [p for p in (work / "src").iterdir() if p.is_dir()]
        return _copy_kept(top, dest, keep)
    finally:
        shutil.rmtree(work, ignore_errors=True)

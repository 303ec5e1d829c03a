"""Resolution: a declared Source -> the exact version (or commit) it names tonight.

list_candidates asks the index (or pip's own configuration) what a Source admits;
resolve picks one; resolve_sources does a whole cell. The wheelhouse downloads what
this answered.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Iterable, Sequence
from urllib.parse import urlparse
from urllib.request import url2pathname

from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, sys_tags
from packaging.version import InvalidVersion, Version

from distci.errors import SourceError
from distci.provision.index import IndexEntry, list_find_links, list_index_versions, redact_url
from distci.provision.sources import IndexConfig, format_url
from distci.sources import Source, exact_version


def _pip_index_versions(package: str, config: IndexConfig, python: str) -> list[IndexEntry]:
    """Versions as pip's own configuration sees them (used when DISTCI_INDEX_URL is empty)."""
    args = [python, "-m", "pip", "index", "versions", "--pre", "--disable-pip-version-check", package]
    for url in config.extra_index_urls:
        args += ["--extra-index-url", url]
    for loc in config.find_links:
        args += ["--find-links", loc]
    proc = subprocess.run(args, capture_output=True, text=True)
    match = re.search(r"Available versions:\s*(.*)", proc.stdout)
    if proc.returncode != 0 or not match:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise SourceError(f"pip index versions {package} found nothing: {' | '.join(tail)}")
    versions = []
    for text in match.group(1).split(","):
        try:
            versions.append(Version(text.strip()))
        except InvalidVersion:
            continue
    return [IndexEntry(v, "", "") for v in sorted(versions)]


def list_candidates(
    source: Source,
    config: IndexConfig,
    *,
    variant: str | None = None,
    tags: Iterable[Tag] | None = None,
    python: str = sys.executable,
) -> list[IndexEntry]:
    """The files a source could install here, oldest first.

    nightly -> dev builds on the nightly index compatible with `tags` (default: this
    interpreter), restricted to the declared date if any; release/test -> versions
    matching the specifier; latest -> final releases only (no pre-releases, no dev builds);
    wheelhouse -> compatible wheels in its directory.
    """
    wanted = set(sys_tags()) if tags is None else set(tags)
    package = source.package
    if source.kind == "nightly":
        entries = list_index_versions(config.index_for(source, variant), package, ca_bundle=config.ca_bundle)
        entries = [e for e in entries if e.date is not None and e.is_compatible(wanted) and not e.yanked]
        if source.nightly_date:
            entries = [e for e in entries if e.date == source.nightly_date]
        return entries
    if source.kind == "wheelhouse":
        entries = list_find_links(str(config.wheelhouse_dir(source)), package)
        return [e for e in entries if e.is_compatible(wanted)]
    if source.kind in ("release", "test", "latest"):
        specs = SpecifierSet(source.spec)
        if source.kind == "test":
            found = list_index_versions(config.index_for(source, variant), package, ca_bundle=config.ca_bundle)
        elif config.index_url:
            found = []
            for url in (config.index_url, *config.extra_index_urls):
                found += list_index_versions(format_url(url, variant, "DISTCI_INDEX_URL"), package,
                                             ca_bundle=config.ca_bundle)
            for loc in config.find_links:
                found += list_find_links(loc, package, ca_bundle=config.ca_bundle)
        else:
            found = _pip_index_versions(package, config, python)
        pre = source.kind == "test" or bool(specs.prereleases)
        keep = [
            e for e in found
            if not e.yanked
            and specs.contains(e.version, prereleases=pre)
            and (not e.filename or not e.is_wheel or e.is_compatible(wanted))
        ]
        return sorted(keep, key=lambda e: (e.version, e.filename))
    raise SourceError(f"{package} = '{source.declared}': {source.kind} sources have no candidate list")


def _git_commit(url: str, rev: str, where: str) -> str:
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        return rev
    if url.startswith("git+file://"):
        path = url2pathname(urlparse(url[len("git+"):]).path)
        cmd = ["git", "-C", path, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"]
    else:
        cmd = ["git", "ls-remote", url[len("git+"):], rev]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sha = proc.stdout.split()[0] if proc.returncode == 0 and proc.stdout.split() else ""
    if not re.fullmatch(r"[0-9a-f]{40}", sha):
        raise SourceError(f"{where}: revision '{rev}' not found in {redact_url(url)}")
    return sha


def resolve(
    source: Source,
    config: IndexConfig,
    *,
    variant: str | None = None,
    tags: Iterable[Tag] | None = None,
    python: str = sys.executable,
) -> Source:
    """Pin a source to what it means today; the declared value (and so the cell id) stays."""
    if source.resolved or source.kind in ("none", "installed"):
        return source
    where = f"{source.package} = '{source.declared}'"
    if source.kind == "git":
        url = config.git_url(source)
        return source.pin(f"{url}@{_git_commit(url, source.git_rev, where)}")
    if source.kind in ("release", "test") and exact_version(source.spec):
        return source
    candidates = list_candidates(source, config, variant=variant, tags=tags, python=python)
    if not candidates:
        if source.kind == "nightly" and source.nightly_date:
            raise SourceError(f"{where}: no nightly of that date for this platform on the nightly index")
        raise SourceError(f"{where}: no matching version found")
    return source.pin(str(candidates[-1].version))


def resolve_sources(
    sources: Sequence[Source],
    config: IndexConfig,
    *,
    variant: str | None = None,
    tags: Iterable[Tag] | None = None,
    python: str = sys.executable,
) -> list[Source]:
    return [resolve(s, config, variant=variant, tags=tags, python=python) for s in sources]

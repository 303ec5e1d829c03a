"""Where a package of a cell comes from: the Source kinds, their pip arguments, and index listings.

A matrix value such as ``"2.13.0"`` or ``"nightly:2026-11-20"`` is parsed once into a
`Source`. The cell id is built from what was *declared*; what a source resolves to
(an exact nightly version, a commit sha) lives in `Source.resolved` and later in the
Stack, never in the id, so tonight's run of a cell compares with last night's.

Typical flow of a runner::

    config = IndexConfig.from_env()
    sources = resolve_sources(cell.sources, config, variant=cell.variant)
    requirements = requirement_lines(sources) + ["pytest", "packaging"]
    args = pip_args(sources, config, variant=cell.variant)
    # -> distci.wheelhouse.ensure_wheelhouse(requirements, args, ...)

Sources that pip cannot pin by itself (a nightly, a nightly date, a git branch) must go
through `resolve_sources` first: the wheelhouse is content-addressed by its requirement
lines, so ``torch`` unpinned would reuse the first nightly ever downloaded forever.

Index URLs are configuration, never written in the repository: every URL comes from a
``DISTCI_*`` environment variable (see `IndexConfig`). A URL may contain ``{variant}``,
replaced by the cell's variant (``cpu``, ``cu130``), so one variable serves every cell.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence
from urllib.parse import urlparse
from urllib.request import url2pathname

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.tags import Tag, sys_tags
from packaging.version import InvalidVersion, Version

from distci.errors import ConfigError, MatrixError, SourceError
from distci.index import IndexEntry, list_find_links, list_index_versions, redact_url

KINDS = ("release", "latest", "nightly", "test", "wheelhouse", "git", "installed", "none")

# Short names used in cell ids; any other package uses its own (sanitized) name.
ID_PREFIX = {"torch": "torch", "torchao": "ao", "torchtitan": "titan", "torch_npu": "npu"}

ALLOWED_FORMS = (
    "a version ('2.13.0'), a PEP 440 specifier ('>=2.13,<2.15'), 'latest', 'nightly', "
    "'nightly:YYYY-MM-DD', 'test:VERSION', 'wheelhouse:NAME', 'git:NAME@REV', 'installed' or 'none'"
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_OPERATOR_WORDS = {
    "===": "arb",
    "==": "eq",
    "!=": "ne",
    "~=": "compat",
    ">=": "ge",
    "<=": "le",
    ">": "gt",
    "<": "lt",
}


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]", "_", text)


def env_var_name(prefix: str, name: str) -> str:
    """``("DISTCI_GIT_", "torch-titan")`` -> ``DISTCI_GIT_TORCH_TITAN``."""
    return prefix + re.sub(r"[^A-Z0-9]", "_", name.upper())


@dataclass(frozen=True)
class Source:
    """One package's declared origin, and (after `resolve`) what it resolved to.

    `spec` by kind: release/test -> a PEP 440 specifier (``==2.13.0``); nightly -> ``""``
    (newest) or a date ``YYYY-MM-DD``; wheelhouse -> the wheelhouse NAME; git ->
    ``NAME@REV``; latest, installed, none -> ``""``. `resolved` is an exact version (or,
    for git, a ``git+URL@SHA`` reference) and never part of the cell id.

    ``latest`` is the newest final release on the index at run time, so a cell follows
    releases without an edit of matrix.toml. ``installed`` is whatever the interpreter
    a run is given already has: nothing is downloaded or installed for it
    (distci.envs.installed_env), and the Stack records the version found with source=installed.
    """

    package: str
    kind: str
    spec: str
    declared: str
    resolved: str = ""

    @classmethod
    def parse(cls, package: str, value: object, where: str = "") -> "Source":
        """Parse a matrix.toml value; a bad one raises a one-line MatrixError naming the key."""
        key = f"{package} = {value!r}"

        def bad(problem: str) -> MatrixError:
            return MatrixError(f"{key}: {problem}", where=where or None)

        if not isinstance(value, str):
            hint = f" (quote it: {package} = \"{value}\")" if isinstance(value, (int, float)) else ""
            raise bad(f"must be a string{hint}; allowed: {ALLOWED_FORMS}")
        text = value.strip()
        if text in ("none", "latest", "installed"):
            return cls(package, text, "", value)
        if text == "nightly":
            return cls(package, "nightly", "", value)
        if text.startswith("nightly:"):
            date = text[len("nightly:"):]
            try:
                _dt.date.fromisoformat(date)
            except ValueError:
                raise bad("a nightly date is written 'nightly:YYYY-MM-DD'") from None
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
                raise bad("a nightly date is written 'nightly:YYYY-MM-DD'")
            return cls(package, "nightly", date, value)
        if text.startswith("test:"):
            spec = _parse_specifier(text[len("test:"):])
            if spec is None:
                raise bad("'test:' takes a version or specifier, e.g. 'test:2.15.0'")
            return cls(package, "test", spec, value)
        if text.startswith("wheelhouse:"):
            name = text[len("wheelhouse:"):]
            if not _NAME_RE.match(name):
                raise bad("'wheelhouse:NAME' takes a name of letters, digits, '-' or '_'")
            if name.lower() == "root":
                raise bad("the wheelhouse name 'root' is reserved (DISTCI_WHEELHOUSE_ROOT is the cache root)")
            return cls(package, "wheelhouse", name, value)
        if text.startswith("git:"):
            name, sep, rev = text[len("git:"):].partition("@")
            if not sep or not rev or not _NAME_RE.match(name) or re.search(r"\s", rev):
                raise bad("write a git source as 'git:NAME@REV' (e.g. 'git:torchtitan@main'); "
                          "the URL comes from DISTCI_GIT_<NAME>")
            return cls(package, "git", f"{name}@{rev}", value)
        spec = _parse_specifier(text)
        if spec is None:
            raise bad(f"not a valid source; allowed: {ALLOWED_FORMS}")
        return cls(package, "release", spec, value)

    @property
    def id_fragment(self) -> str:
        """The part of a cell id this source contributes, from the declared value only."""
        prefix = ID_PREFIX.get(self.package, _sanitize(self.package))
        return f"{prefix}_{self._id_body()}"

    def _id_body(self) -> str:
        if self.kind in ("none", "latest", "installed"):
            return self.kind
        if self.kind == "nightly":
            return "nightly" + self.spec.replace("-", "")
        if self.kind == "release":
            return _specifier_fragment(self.spec)
        if self.kind == "test":
            return "test" + _specifier_fragment(self.spec)
        if self.kind == "wheelhouse":
            return "wh_" + _sanitize(self.spec)
        name, _, rev = self.spec.partition("@")
        return f"git_{_sanitize(name)}_{_sanitize(rev)}"

    @property
    def nightly_date(self) -> _dt.date | None:
        if self.kind == "nightly" and self.spec:
            return _dt.date.fromisoformat(self.spec)
        return None

    @property
    def git_name(self) -> str:
        return self.spec.partition("@")[0]

    @property
    def git_rev(self) -> str:
        return self.spec.partition("@")[2]

    @property
    def is_exact(self) -> bool:
        """True when pip can install this source without asking an index what is newest."""
        if self.kind in ("none", "installed") or self.resolved:
            return True
        if self.kind in ("release", "test"):
            return _exact_version(self.spec) is not None
        return False

    def pin(self, resolved: str) -> "Source":
        return replace(self, resolved=resolved)


def _parse_specifier(text: str) -> str | None:
    """A bare version means ``==version``; anything else must be a PEP 440 specifier set."""
    text = text.strip()
    if not text:
        return None
    candidate = text if text[0] in "=!<>~" else f"=={text}"
    try:
        specs = SpecifierSet(candidate)
    except InvalidSpecifier:
        return None
    if not len(specs):
        return None
    return str(specs) if len(specs) > 1 else candidate.replace(" ", "")


def _exact_version(spec: str) -> str | None:
    specs = list(SpecifierSet(spec))
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def _specifier_order(spec: Specifier) -> tuple[Version, str]:
    try:
        version = Version(spec.version.replace(".*", ""))
    except InvalidVersion:
        version = Version("0")
    return version, spec.operator


def _specifier_fragment(spec: str) -> str:
    specs = sorted(SpecifierSet(spec), key=_specifier_order)
    if len(specs) == 1 and specs[0].operator == "==":
        return _sanitize(specs[0].version.replace("*", "x"))
    return "_".join(_OPERATOR_WORDS[s.operator] + _sanitize(s.version.replace("*", "x")) for s in specs)


@dataclass(frozen=True)
class IndexConfig:
    """Package index settings, read from the environment (never from the repository).

    DISTCI_INDEX_URL          main index; empty means pip's own configuration
    DISTCI_EXTRA_INDEX_URLS   space-separated extra indexes
    DISTCI_FIND_LINKS         space-separated find-links locations
    DISTCI_NIGHTLY_INDEX_URL  PyTorch nightly simple index; needed only for nightly sources
    DISTCI_TEST_INDEX_URL     PyTorch test (release candidate) index; needed only for test:
    DISTCI_WHEELHOUSE_<NAME>  directory of wheels for ``wheelhouse:NAME`` sources
    DISTCI_GIT_<NAME>         repository URL or path for ``git:NAME@REV`` sources
    DISTCI_CA_BUNDLE          CA bundle for reading indexes over https (behind a proxy)
    """

    index_url: str = ""
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    nightly_index_url: str = ""
    test_index_url: str = ""
    named: Mapping[str, str] = field(default_factory=dict, hash=False)
    ca_bundle: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "IndexConfig":
        env = os.environ if environ is None else environ
        named = {
            k: v
            for k, v in env.items()
            if (k.startswith("DISTCI_WHEELHOUSE_") and k != "DISTCI_WHEELHOUSE_ROOT")
            or k.startswith("DISTCI_GIT_")
        }
        return cls(
            index_url=env.get("DISTCI_INDEX_URL", "").strip(),
            extra_index_urls=tuple(env.get("DISTCI_EXTRA_INDEX_URLS", "").split()),
            find_links=tuple(env.get("DISTCI_FIND_LINKS", "").split()),
            nightly_index_url=env.get("DISTCI_NIGHTLY_INDEX_URL", "").strip(),
            test_index_url=env.get("DISTCI_TEST_INDEX_URL", "").strip(),
            named=named,
            ca_bundle=env.get("DISTCI_CA_BUNDLE", "").strip(),
        )

    def index_for(self, source: Source, variant: str | None = None) -> str:
        """The index that serves a nightly or test source; ConfigError names the missing variable."""
        if source.kind == "nightly":
            var, url, what = "DISTCI_NIGHTLY_INDEX_URL", self.nightly_index_url, "PyTorch nightly"
        elif source.kind == "test":
            var, url, what = "DISTCI_TEST_INDEX_URL", self.test_index_url, "PyTorch test-channel"
        else:
            raise ValueError(f"{source.kind} sources have no dedicated index")
        if not url:
            raise ConfigError(
                f"{var} is not set: {source.package} = '{source.declared}' needs the {what} "
                f"simple index URL (it may contain {{variant}}, e.g. .../{{variant}})"
            )
        return _format_url(url, variant, var)

    def wheelhouse_dir(self, source: Source) -> Path:
        var = env_var_name("DISTCI_WHEELHOUSE_", source.spec)
        value = self.named.get(var, "")
        if not value:
            raise ConfigError(
                f"{var} is not set: {source.package} = '{source.declared}' needs a directory of wheels"
            )
        path = Path(value).expanduser()
        if not path.is_dir():
            raise ConfigError(f"{var}={value} is not a directory of wheels")
        return path.resolve()

    def git_url(self, source: Source) -> str:
        """The pip VCS URL (``git+...``) of a git source's repository, without the revision."""
        var = env_var_name("DISTCI_GIT_", source.git_name)
        value = self.named.get(var, "")
        if not value:
            raise ConfigError(
                f"{var} is not set: {source.package} = '{source.declared}' needs a repository "
                "URL or local path"
            )
        if value.startswith("git+"):
            return value
        if "://" in value:
            return "git+" + value
        path = Path(value).expanduser()
        if not path.exists():
            raise ConfigError(f"{var}={value} is neither a URL nor an existing path")
        return "git+" + path.resolve().as_uri()


def _format_url(url: str, variant: str | None, var: str) -> str:
    if "{variant}" not in url:
        return url
    if not variant:
        raise ConfigError(f"{var} contains {{variant}} but no cell variant was given")
    return url.replace("{variant}", variant)


def requirement_lines(sources: Iterable[Source]) -> list[str]:
    """pip requirement lines for the sources; nightly and git sources must be resolved first."""
    lines: list[str] = []
    for source in sources:
        if source.kind in ("none", "installed"):
            continue
        if source.kind == "git":
            if not source.resolved:
                raise SourceError(
                    f"{source.package} = '{source.declared}' is not resolved to a commit; "
                    "call distci.sources.resolve_sources first"
                )
            lines.append(f"{source.package} @ {source.resolved}")
        elif source.resolved:
            lines.append(f"{source.package}=={source.resolved}")
        elif source.kind in ("nightly", "latest"):
            raise SourceError(
                f"{source.package} = '{source.declared}' is not resolved to a version; "
                "call distci.sources.resolve_sources first"
            )
        elif source.kind == "wheelhouse":
            lines.append(source.package)
        else:
            lines.append(f"{source.package}{source.spec}")
    return lines


def pip_args(sources: Iterable[Source], config: IndexConfig, *, variant: str | None = None) -> list[str]:
    """Index, find-links and --pre arguments that make pip see every source's origin.

    With no DISTCI_INDEX_URL, pip keeps its own configured index (pip.conf, PIP_* vars);
    nightly/test indexes are added as extra indexes so ordinary dependencies still come
    from the usual place.
    """
    pairs: list[tuple[str, str]] = []
    if config.index_url:
        pairs.append(("--index-url", _format_url(config.index_url, variant, "DISTCI_INDEX_URL")))
    for url in config.extra_index_urls:
        pairs.append(("--extra-index-url", _format_url(url, variant, "DISTCI_EXTRA_INDEX_URLS")))
    for loc in config.find_links:
        pairs.append(("--find-links", _format_url(loc, variant, "DISTCI_FIND_LINKS")))
    pre = False
    for source in sources:
        if source.kind in ("nightly", "test"):
            pairs.append(("--extra-index-url", config.index_for(source, variant)))
            pre = True
        elif source.kind == "wheelhouse":
            pairs.append(("--find-links", str(config.wheelhouse_dir(source))))
    args: list[str] = []
    for pair in dict.fromkeys(pairs):
        args.extend(pair)
    if pre:
        args.append("--pre")
    return args


# --------------------------------------------------------------------------- nightly dates


def nightly_date(version: Version) -> _dt.date | None:
    dev = version.dev
    if dev is None or not 19000101 <= dev <= 29991231:
        return None
    try:
        return _dt.datetime.strptime(str(dev), "%Y%m%d").date()
    except ValueError:
        return None


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
                found += list_index_versions(_format_url(url, variant, "DISTCI_INDEX_URL"), package,
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
    if source.kind in ("release", "test") and _exact_version(source.spec):
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

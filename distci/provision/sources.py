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
    # -> distci.provision.wheelhouse.ensure_wheelhouse(requirements, args, ...)

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from distci.errors import ConfigError, MatrixError, SourceError

KINDS = ("release", "latest", "nightly", "test", "wheelhouse", "git", "installed", "none")

# Short names used in cell ids; any other package uses its own (sanitized) name.
ID_PREFIX = {"torch": "torch", "torchao": "ao", "torchtitan": "titan", "torch_npu": "npu"}
PACKAGE_AXES = tuple(ID_PREFIX)
"""The matrix axes that name a package Source, in cell-id order: the one spelling of that list."""

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
    (distci.provision.envs.installed_env), and the Stack records the version found with source=installed.
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
            return exact_version(self.spec) is not None
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


def exact_version(spec: str) -> str | None:
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
        return format_url(url, variant, var)

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


def format_url(url: str, variant: str | None, var: str) -> str:
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
                    "call distci.provision.resolve.resolve_sources first"
                )
            lines.append(f"{source.package} @ {source.resolved}")
        elif source.resolved:
            lines.append(f"{source.package}=={source.resolved}")
        elif source.kind in ("nightly", "latest"):
            raise SourceError(
                f"{source.package} = '{source.declared}' is not resolved to a version; "
                "call distci.provision.resolve.resolve_sources first"
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
        pairs.append(("--index-url", format_url(config.index_url, variant, "DISTCI_INDEX_URL")))
    for url in config.extra_index_urls:
        pairs.append(("--extra-index-url", format_url(url, variant, "DISTCI_EXTRA_INDEX_URLS")))
    for loc in config.find_links:
        pairs.append(("--find-links", format_url(loc, variant, "DISTCI_FIND_LINKS")))
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



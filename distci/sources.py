"""Where a package of a cell comes from: the Source record (kinds, parsing, its cell-id part),
PACKAGE_AXES, and the nightly date of a version: records the matrix, the known-issues
registry and every stage share. How a Source becomes pip arguments and index listings is
distci.provision's (sources.py, index.py, resolve.py).

A matrix value such as ``"2.13.0"`` or ``"nightly:2026-11-20"`` is parsed once into a
`Source`. The cell id is built from what was *declared*; what a source resolves to
(an exact nightly version, a commit sha) lives in `Source.resolved` and later in the
Stack, never in the id, so tonight's run of a cell compares with last night's.

The nightly date has one parser here (`nightly_date`: a Version's date) and one text
form (`nightly_date_of`: ISO `YYYY-MM-DD`), what run.json, the store and known issues use.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, replace

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from distci.errors import MatrixError

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


def nightly_date(version: Version) -> _dt.date | None:
    """The date of a nightly build (`2.10.0.dev20250901`), else None: the one parser of it."""
    dev = version.dev
    if dev is None or not 19000101 <= dev <= 29991231:
        return None
    try:
        return _dt.datetime.strptime(str(dev), "%Y%m%d").date()
    except ValueError:
        return None


def nightly_date_of(version: str | None) -> str | None:
    """The nightly date of a torch version like `2.10.0.dev20250901+cu130`, else None."""
    try:
        day = nightly_date(Version(version or ""))
    except InvalidVersion:
        return None
    return day.isoformat() if day else None

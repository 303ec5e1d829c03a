"""Which torch build this is, and whether a fix's declared range covers it.

Three kinds of builds reach a cell: releases (`2.7.0`, `2.7.0+cu126`), nightlies
(`2.12.0.dev20260301+cu130`) and source builds (`2.12.0a0+git1a2b3c4`, with
torch.version.git_version). A nightly or source build of X.Y.0 was built after the
X.(Y-1) branch cut and before X.Y.0, so when the release specifier says the same for
X.(Y-1).0 and X.Y.0 the build is decided by it; otherwise it sits on the boundary and
its date or commit decides, or failing both, the fix's detect().
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from distci_fixes.model import Applies

RELEASE = "release"
NIGHTLY = "nightly"
SOURCE = "source"

_GIT_LOCAL = re.compile(r"^git([0-9a-f]{7,40})")


@dataclass(frozen=True)
class TorchBuild:
    """A torch build as its version string and git hash describe it."""

    version: str
    git_version: str = ""

    @property
    def parsed(self) -> Version:
        return Version(self.version)

    @property
    def kind(self) -> str:
        v = self.parsed
        if v.dev is not None and self.nightly_date is not None:
            return NIGHTLY
        if v.is_prerelease or (v.local or "").startswith("git"):
            return SOURCE
        return RELEASE

    @property
    def release(self) -> Version:
        """The release this build is, or leads up to (local label and dev/pre dropped)."""
        return Version(self.parsed.base_version)

    @property
    def nightly_date(self) -> Optional[str]:
        dev = self.parsed.dev
        if dev is None or len(str(dev)) != 8:
            return None
        s = str(dev)
        return f"{s[:4]}-{s[4:6]}-{s[6:]}"

    @property
    def commit(self) -> str:
        """The git hash: torch.version.git_version, else the one in a `+git…` label."""
        if self.git_version and self.git_version != "Unknown":
            return self.git_version
        m = _GIT_LOCAL.match(self.parsed.local or "")
        return m.group(1) if m else ""

    @classmethod
    def current(cls) -> "TorchBuild":
        """The torch of this process; safe while `import torch` is still running."""
        import sys

        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch, "__version__"):
            import torch  # noqa: F811
        version = getattr(torch, "version", None)
        return cls(str(torch.__version__), str(getattr(version, "git_version", "") or ""))


@dataclass(frozen=True)
class Decision:
    """Whether a build is in a fix's range: True, False, or None (detect() decides)."""

    in_range: Optional[bool]
    reason: str


def _previous_release(release: Version) -> Optional[Version]:
    major, minor = release.major, release.minor
    return Version(f"{major}.{minor - 1}.0") if minor > 0 else None


def decide(applies: Applies, build: TorchBuild) -> Decision:
    """Place `build` against `applies` (see the module docstring for the rules)."""
    try:
        kind = build.kind
    except InvalidVersion:
        return Decision(None, f"unparsable torch version {build.version!r}")
    spec = SpecifierSet(applies.releases)
    if kind == RELEASE:
        inside = build.release in spec
        return Decision(inside, f"release {build.release} {'in' if inside else 'not in'} {spec}")

    if kind == SOURCE and build.commit:
        for fixed in applies.fixed_commits:
            if build.commit.startswith(fixed) or fixed.startswith(build.commit):
                return Decision(False, f"source build at fixing commit {fixed}")

    before, after = _previous_release(build.release), build.release
    if before is not None and (before in spec) == (after in spec):
        inside = after in spec
        return Decision(
            inside,
            f"{kind} build between {before} and {after}, both {'in' if inside else 'not in'} {spec}",
        )

    date = build.nightly_date
    if kind == NIGHTLY and date and (applies.nightly_from or applies.nightly_until):
        inside = (applies.nightly_from is None or date >= applies.nightly_from) and (
            applies.nightly_until is None or date < applies.nightly_until
        )
        bounds = f"[{applies.nightly_from or '…'}, {applies.nightly_until or '…'})"
        return Decision(inside, f"nightly {date} {'in' if inside else 'not in'} {bounds}")
    return Decision(None, f"{kind} build {build.version} on the boundary of {spec}: detect() decides")

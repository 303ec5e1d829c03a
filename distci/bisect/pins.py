"""The rest of the stack: what a probe pins around the candidate.

A bisect changes one package and holds everything else where the bad cell had it, so
the only difference between two probes is the candidate. The bad cell's Stack (its
stack.json, distci.stack) lists every installed distribution as ``name==version``;
those pins, less the bisected package and distci's own wheels, build the shared base
environment of the probes.

distci and distci-fixes are not pinned: they are installed apart, from the wheels of
this checkout (distci.provision.selfwheels), so a probe runs today's harness against yesterday's
torch (their versions never change, their code does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from distci.errors import ConfigError
from distci.rundir import STACK_FILE
from distci.stack import Stack

OWN = frozenset({"distci", "distci-fixes"})
# What `python -m pytest -p distci.harness.plugin` needs besides torch, when a stack lacks it.
HARNESS_NEEDS = ("pytest", "packaging")


@dataclass
class Pins:
    """Exact versions of every package of a stack, by canonical name."""

    versions: dict[str, str] = field(default_factory=dict)
    where: str = ""

    @classmethod
    def from_stack(cls, stack: Stack, where: str = "") -> "Pins":
        versions: dict[str, str] = {}
        for line in stack.packages or []:
            try:
                req = Requirement(str(line))
            except InvalidRequirement:
                raise ConfigError(f"stack package {line!r} is not name==version", where=where) from None
            spec = next(iter(req.specifier), None)
            if spec is None or spec.operator != "==" or len(req.specifier) != 1:
                raise ConfigError(f"stack package {line!r} is not pinned with ==", where=where)
            versions[canonicalize_name(req.name)] = spec.version
        return cls(versions, where)

    def version(self, package: str) -> str | None:
        return self.versions.get(canonicalize_name(package))

    def requirements(self, without: str | None = None) -> list[str]:
        """``name==version`` for every pin except `without` and distci's own packages."""
        drop = OWN | ({canonicalize_name(without)} if without else set())
        return [f"{name}=={version}" for name, version in sorted(self.versions.items())
                if name not in drop]

    def harness_requirements(self, without: str | None = None) -> list[str]:
        """The pins plus, unpinned, what the harness needs and the stack lacks."""
        missing = [name for name in HARNESS_NEEDS if canonicalize_name(name) not in self.versions]
        return self.requirements(without) + missing


def load_stack(path: Path | str) -> Stack:
    """A stack.json, or the stack.json of a run directory."""
    path = Path(path)
    if path.is_dir():
        path = path / STACK_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("no such stack file (give a stack.json or a run directory)",
                          where=str(path)) from None
    except ValueError as exc:
        raise ConfigError(f"not a stack ({exc})", where=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("packages"), list):
        raise ConfigError("not a stack: it has no `packages` list (distci.stack writes one)",
                          where=str(path))
    return Stack.from_dict(data)

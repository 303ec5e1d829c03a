"""Whose wheels a wheelhouse holds: the interpreter's identity, or another CPython's.

An image's Python need not be the controller's, so a wheelhouse may be downloaded for a
target interpreter (WheelTarget) and its wheels' dependencies read with that target's
markers (wheel_requires). distci.provision.wheelhouse downloads; this module only describes targets.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from distci.errors import InfraError


def interpreter_tags(python: str = sys.executable) -> dict[str, str]:
    """The target interpreter's identity as it matters for wheels: ``cp311``, ``linux-x86_64``."""
    if Path(python).resolve() == Path(sys.executable).resolve():
        impl = sys.implementation.name
        return {"python": f"{impl}{sys.version_info[0]}{sys.version_info[1]}", "platform": sysconfig.get_platform()}
    code = ("import sys, sysconfig, json; print(json.dumps({'python': sys.implementation.name + "
            "'%d%d' % sys.version_info[:2], 'platform': sysconfig.get_platform()}))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise InfraError(f"cannot run the target interpreter {python}", log=proc.stderr)
    return json.loads(proc.stdout)


# manylinux glibc levels a target accepts, newest first (pip needs each one named).
MANYLINUX_MINORS = tuple(range(39, 16, -1))


@dataclass(frozen=True)
class WheelTarget:
    """A CPython and Linux architecture wheels are downloaded for, other than the controller's.

    An image's Python need not be the controller's: `pip download --only-binary=:all:
    --python-version X.Y --platform ...` fetches exactly the wheels that interpreter
    would install, from any controller Python >= 3.9. Only wheels: an sdist or a git
    source would have to be built by the target interpreter (build the image where one
    runs, or set DISTCI_IMAGE_PYTHON to it).
    """

    python: str   # "3.11"
    machine: str  # "x86_64" | "aarch64"

    @property
    def nodot(self) -> str:
        return self.python.replace(".", "")

    def tags(self) -> dict[str, str]:
        """The identity the wheelhouse key records: the same as interpreter_tags() of that interpreter."""
        return {"python": f"cpython{self.nodot}", "platform": f"linux-{self.machine}"}

    def platforms(self) -> list[str]:
        return [*(f"manylinux_2_{m}_{self.machine}" for m in MANYLINUX_MINORS), f"manylinux2014_{self.machine}",
                f"linux_{self.machine}"]

    def pip_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp",
                "--abi", f"cp{self.nodot}", "--abi", "abi3", "--abi", "none"]
        for platform in self.platforms():
            args += ["--platform", platform]
        return args

    def packaging_tags(self) -> list:
        """The wheel tags this interpreter accepts, best first (for reading an index's file list)."""
        from packaging.tags import compatible_tags, cpython_tags

        version = tuple(int(x) for x in self.python.split("."))
        return [*cpython_tags(version, platforms=self.platforms()),
                *compatible_tags(version, f"cp{self.nodot}", platforms=self.platforms())]

    def marker_env(self) -> dict[str, str]:
        """PEP 508 marker values of the target (for reading its wheels' Requires-Dist)."""
        from packaging.markers import default_environment

        return {**default_environment(), "python_version": self.python, "python_full_version": f"{self.python}.0",
                "platform_machine": self.machine, "sys_platform": "linux", "platform_system": "Linux",
                "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def wheel_requires(path: Path) -> list[Requirement]:
    """A wheel's Requires-Dist, from its METADATA."""
    with zipfile.ZipFile(path) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        text = zf.read(name).decode("utf-8", "replace") if name else ""
    found = []
    for line in text.splitlines():
        if not line.strip():
            break
        if line.startswith("Requires-Dist:"):
            try:
                found.append(Requirement(line.split(":", 1)[1].strip()))
            except InvalidRequirement:
                continue
    return found

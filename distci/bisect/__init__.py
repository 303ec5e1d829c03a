"""Bisect a regression (or a fix) to a version, a nightly date or a commit.

The engine (engine.py) is a pure search over an ordered candidate list with a probe
`candidate -> good | bad | skip`; candidates.py lists candidates (releases, nightlies,
wheelhouse, git commits); probes.py installs a candidate into a cached environment over
the rest of the stack (pins.py: the bad cell's versions) and runs a check (a command, or
one test id through the harness in torchrun mode); state.py makes a bisect resumable;
report.py writes what happened (and the store's record of it); regression.py turns a
regression verdict of the store into a bisect question; command.py is
`python -m distci bisect`. Below the nightly: nightly_map.py (nightly -> main commit),
overlay.py (Python-only commits over a nightly binary), suspects.py. Inside torch.compile:
compiler.py drives torch's compiler bisector from outside the failing processes.
"""

from distci.bisect.engine import (
    BisectRefused,
    BisectResult,
    ProbeOutcome,
    ProbeRecord,
    Progress,
    bisect,
    candidate_key,
)
from distci.bisect.state import BisectError, BisectState, ProbeRun


def add_parser(sub) -> None:
    """Register `distci bisect` (distci.cli calls this for every module that has it)."""
    from distci.bisect.command import add_parser as add

    add(sub)


__all__ = [
    "BisectError",
    "BisectRefused",
    "BisectResult",
    "BisectState",
    "ProbeOutcome",
    "ProbeRecord",
    "ProbeRun",
    "add_parser",
    "Progress",
    "bisect",
    "candidate_key",
]

"""Bisect a regression (or a fix) to a version, a nightly date or a commit.

The engine (engine.py) is a pure search over an ordered candidate list with a probe
`candidate -> good | bad | skip`; candidates.py lists candidates (releases, nightlies,
wheelhouse and the wheelhouse archive, git commits); install.py puts a candidate into a
cached environment over the rest of the stack (a base env from distci.provision.envs, wheels from
the distci.provision.wheelhouse archive, commit wheels), checks.py runs the check through a Runner
(the seam for running probes elsewhere, e.g. a cell's image), probes.py joins the two;
pins.py reads the bad cell's versions; state.py makes a bisect resumable; report.py
writes what happened (and the store's record of it); regression.py turns a regression
verdict of the store into a bisect question; args.py parses the command line once into
BisectArgs (one subcommand per mode), question.py is what every mode shares, and
command.py is `python -m distci bisect MODE`. Below the nightly: below.py (the
stage), nightly_map.py (nightly -> main commit), overlay.py (Python-only commits over a
nightly binary), suspects.py. Between two builds: pydiff.py (delta debugging of their
Python, over hunks.py's hunks and line edits), builds.py (the builds' dependencies and
downloads, planned first), upstream.py (git hashes, compare URL, pull requests),
pydiff_command.py (`python-diff`). Inside torch.compile: compiler.py drives torch's
compiler bisector from outside the failing processes, compiler_command.py is `compiler`. fix_audit.py answers the fix
audit's "obsolete since which change".
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

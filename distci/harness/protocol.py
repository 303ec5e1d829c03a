"""Messages between the pytest process (controller) and its rank workers.

Plain dataclasses sent with multiprocessing.connection (pickle). A TestRequest names the
test by module and qualified name, so a worker imports it the way pytest did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHANNEL_BROKEN_EXIT = 75  # a rank exits with this when its control channel to the controller broke


@dataclass
class TestRequest:
    nodeid: str
    module: str
    qualname: str
    kwargs: dict[str, Any]
    sys_path: list[str]
    seed: int = 1234
    isolate: bool = True
    timeout_s: float = 300.0
    pg_timeout_s: float | None = None  # its process group's timeout (its class's); None: the pool's
    seq: int = 0  # the pool's count of tests: every rank's process for this test meets its peers under it


@dataclass
class Started:
    """A rank template's word that `pid`, a fresh fork, now runs the test (where its stack is read)."""

    rank: int
    pid: int


@dataclass
class ChildExit:
    """A rank's process for one test ended without a report: `code` as Popen.returncode words it
    (negative: the signal). The template that forked it is fine and serves the next test."""

    rank: int
    code: int
    max_rss_kb: int = 0  # its peak resident memory (rusage), for telling an OOM kill


@dataclass
class RankReport:
    """What one rank says about one test (or about its start-up / health check)."""

    rank: int
    outcome: str  # passed | failed | skipped
    kind: str | None = None  # assert | exception
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    duration_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Warm:
    """The first message a rank worker receives: the modules its tests will import (the
    selection's test modules, in run order), which it imports before it forks a test's
    process, and the sys.path they import from. A pool started before collection ended
    (distci.harness.plugin) gets it once the selection is known."""

    modules: list[str] = field(default_factory=list)
    sys_path: list[str] = field(default_factory=list)


@dataclass
class RankForked:
    """The pool's zygote (zygote.py) forked rank `rank`'s process: `pid` is its keeper."""

    rank: int
    pid: int


@dataclass
class RankExited:
    """A rank's keeper ended and the zygote reaped it: `code` as Popen.returncode words it."""

    rank: int
    code: int


@dataclass
class Shutdown:
    pass


@dataclass
class HealthCheck:
    """Is the pool fit for the next test? `collective=False` asks each rank about its own
    process group only (alive, collectives issued); `collective=True` runs one tiny
    all-reduce with a known answer, waited for at most `timeout_s`."""

    collective: bool = True
    timeout_s: float = 30.0

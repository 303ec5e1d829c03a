"""The store's row records: a run, a result, a bisect answer, a fix-audit row, as the store
hands them to the gate, the dashboard and the export; and the test-id helpers they group by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from distci.rundir import RunInfo
from distci.stack import Stack


def is_environment(test_id: str) -> bool:
    """Whether a result stands for the environment, not a test (`<infra>::<cell id>`:
    the record a run leaves when its environment never came up)."""
    return test_id.startswith("<")


FUZZ_TESTS = "suites/fuzz_entry.py::"
"""The fuzzer's configurations (suites.generators.space.ENTRY_TEST, tested to agree): drawn anew every
night, so no run of them says which tests a cell is expected to have (distci.judge.coverage)."""


GENERATOR_TESTS = "suites/generators/"
"""The generators' cases (the ops generator's `ops_entry.py::test_op_case[<case id>]` finds):
drawn anew every night like the configurations, so judged alike."""
FUZZ_PREFIXES = (FUZZ_TESTS, GENERATOR_TESTS)


def is_fuzz(test_id: str) -> bool:
    """Whether a result is one of the fuzzer's drawn configurations or a generator's case."""
    return test_id.startswith(FUZZ_PREFIXES)


@lru_cache(maxsize=65536)
def suite_of(test_id: str) -> str:
    """The suite a test belongs to, from its pytest node id: the dashboard's grid columns.

    `suites/regressions/test_x.py::t` -> `regressions` (a directory of suites/ is a
    suite); `suites/test_tp.py::t` -> `tp` (so is a top-level file, without `test_`);
    `<infra>::cell` -> `<infra>`.
    """
    path = test_id.split("::", 1)[0]
    if is_environment(test_id):
        return path
    parts = [p for p in path.split("/") if p and p != "."]
    if parts and parts[0] == "suites":
        parts = parts[1:]
    if len(parts) > 1:
        return parts[0]
    stem = parts[0].rsplit(".", 1)[0] if parts else test_id
    return stem[5:] if stem.startswith("test_") else stem


@dataclass
class RunRow(RunInfo):
    """A run as the store holds it."""

    stack: Stack = field(default_factory=lambda: Stack.from_dict({}))
    torch_git: str | None = None
    source_path: str = ""  # the run directory's absolute path, resolved at ingest
    content_hash: str = ""
    n_results: int = 0

    @property
    def night(self) -> str:
        """The nightly date, or the day the run started: the column a history sits in."""
        return self.nightly_date or self.started_at[:10]


@dataclass
class ResultRow:
    """A result as the store holds it: the outcome, its verdict and why."""

    run_id: str
    test_id: str
    cell_id: str
    suite: str
    outcome: str
    verdict: str
    compared_run: str | None
    verdict_reason: str
    duration_s: float
    failure_kind: str | None
    error_signature: str | None
    excerpt: str
    repro: str
    known_issue: str | None
    reruns: int
    rerun_outcomes: list[str]
    started_at: str


@dataclass(frozen=True)
class Regression:
    """A result worth filing or bisecting (verdict `regression`, or a fuzz find that failed)
    with the runs it compares: the run it failed in and the green run its verdict was judged
    against (None: it has none, as a fuzz find). Bisect searches between the two runs'
    stacks; CI files it as an issue by its signature."""

    result: ResultRow
    bad_run: RunRow
    good_run: RunRow | None = None

    @property
    def cell_id(self) -> str:
        return self.result.cell_id

    @property
    def run_id(self) -> str:
        return self.result.run_id

    @property
    def test_id(self) -> str:
        return self.result.test_id

    @property
    def ident(self) -> str:
        return f"{self.run_id}::{self.test_id}"

    @property
    def signature(self) -> str:
        """The error signature, or what failed and how when the failure left none."""
        r = self.result
        return r.error_signature or f"{r.failure_kind or r.outcome}: {r.test_id}"

    @property
    def good_stack(self) -> Stack:
        return self.good_run.stack if self.good_run is not None else Stack.from_dict({})

    @property
    def bad_stack(self) -> Stack:
        return self.bad_run.stack


@dataclass
class BisectRow:
    """One bisect result: the first bad point of `axis` between good and bad."""

    test_id: str
    axis: str
    good: str
    bad: str
    culprit: str | None = None
    report_path: str = ""
    cell_id: str = ""
    status: str = ""
    created_at: str = ""


@dataclass
class FixAuditRow:
    """One fix on one version: is the bug there, did the fix apply, what its test says.

    `off`/`on` are the regression test's outcome with the fix disabled/enabled;
    `verdict` is the audit's conclusion (e.g. needed, obsolete, broken, ineffective).
    """

    fix: str
    version: str
    present: str | None = None
    applied: str | None = None
    off: str | None = None
    on: str | None = None
    verdict: str | None = None
    cell_id: str = ""
    source_path: str = ""

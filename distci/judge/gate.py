"""The release gate: may this tier (or this release candidate) ship?

The gate knows what should exist: the cells matrix.toml declares for the tier (or every
cell whose id contains `--candidate`: a release candidate is a `test:<version>` Source of
torch, so its cells have their own ids). It judges coverage, not "the latest run":

- a cell's expected tests are those of its latest *complete* run of the tier (one that
  ended and was not narrowed by `-k` / `--test`: run.json's `selection` is empty; or, for
  a tier run as N shard jobs, the latest ended run of every share 1..N together), plus
  any test a later run added;
- each expected test is judged by its latest result since that run (infra results are
  not results of the test: they never replace one), so a narrowed rerun adds evidence and
  never hides a failure it did not re-run;
- a test with no result on the current stack (that of the latest run that ran a test) is
  missing: the cell is `partial` and the gate names the test.

Each expected cell gets a CellState:

    ok          a complete run within --max-age and a result on the current stack for every expected test
    missing     no run of the cell at all
    stale       the complete run the expected tests come from started longer than --max-age ago
    infra_only  the latest run ran no test (only `infra` records, or nothing but skips)
    in_flight   the latest run has not ended yet
    partial     no complete run of the tier, or expected tests without a result on the current stack
    waived      not ok, but waived by name (`--waive CELL --reason TEXT`)

A test blocks when its verdict is `regression` or `fail` in a release-blocking suite
(declared per tier in matrix.toml). `fixed` never blocks; `infra` and `flaky` never
block but are listed. The answer, and the exit code of `nox -s gate`:

    PASSED      0   every expected cell is ok (or waived) and nothing blocks
    BLOCKED     1   a release-blocking test regressed or fails
    INCOMPLETE  3   nothing blocks, but a cell is missing, stale, infra-only, in flight or
                    partial: a gate never says PASSED about tests that did not run
    (2 is a usage or configuration error, as for every distci command)

BLOCKED wins over INCOMPLETE: a known regression is a definite "no". `evaluate` is the
judgement the dashboard's release view shows; `tally` is how the HUD export counts one
run's results the same way. The `gate` command (printing, the step summary, the exit
file) is distci.publish.gate's: this module only judges.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable, Sequence

from distci.errors import SelectionError
from distci.judge.coverage import DEFAULT_MAX_AGE, CellState, judge_cell
from distci.run.fitting import shorten_test_id
from distci.judge.history import Onset, onset
from distci.judge.store import Store
from distci.judge.rows import BisectRow, ResultRow, RunRow, suite_of
from distci.judge.verdicts import BLOCKING
from distci.rundir import repro_line

WARN = ("infra", "flaky")

STATUSES = ("PASSED", "BLOCKED", "INCOMPLETE")
EXIT_CODES = {"PASSED": 0, "BLOCKED": 1, "INCOMPLETE": 3}
CELL_STATES = ("ok", "missing", "stale", "infra_only", "in_flight", "partial", "waived")
SHOWN_MISSING = 10
STATUS_MEANINGS = {
    "PASSED": "every expected cell ran every expected test and nothing blocks",
    "BLOCKED": "a release-blocking test regressed or fails",
    "INCOMPLETE": "nothing blocks, but an expected cell or test is missing, stale, infra-only or in flight",
}
COMPLETE_STATES = frozenset({"ok", "waived"})


@dataclass
class GateItem:
    """One test the gate reports, with what a person needs to act on it."""

    cell_id: str
    run_id: str
    test_id: str
    suite: str
    verdict: str
    error_signature: str | None
    reason: str
    repro: str

    @classmethod
    def of(cls, r: ResultRow) -> "GateItem":
        return cls(r.cell_id, r.run_id, r.test_id, r.suite, r.verdict, r.error_signature, r.verdict_reason, r.repro)


@dataclass
class GateResult:
    tier: str
    candidate: str | None
    runs: list[RunRow]
    blocking_suites: list[str] | None
    blocking: list[GateItem] = field(default_factory=list)
    warnings: list[GateItem] = field(default_factory=list)
    not_blocking: list[GateItem] = field(default_factory=list)
    fixed: list[GateItem] = field(default_factory=list)
    cells: list[CellState] = field(default_factory=list)
    waivers: dict[str, str] = field(default_factory=dict)
    onsets: dict[tuple[str, str], Onset] = field(default_factory=dict)  # (cell, test) -> since when, what changed
    bisects: dict[tuple[str, str], BisectRow] = field(default_factory=dict)  # (cell, test) -> its latest bisect

    @property
    def incomplete(self) -> list[CellState]:
        return [c for c in self.cells if c.state not in COMPLETE_STATES]

    @property
    def status(self) -> str:
        if self.blocking:
            return "BLOCKED"
        if self.incomplete or not self.cells:
            return "INCOMPLETE"
        return "PASSED"

    @property
    def ok(self) -> bool:
        return self.status == "PASSED"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def _scope(self) -> str:
        what = f"candidate `{self.candidate}`" if self.candidate else f"tier `{self.tier}`"
        if self.blocking_suites is None:
            suites = "all suites"
        else:
            suites = ", ".join(self.blocking_suites) or "none (nothing blocks this tier)"
        counts = ", ".join(
            f"{n} {s}" for s in CELL_STATES if (n := sum(c.state == s for c in self.cells))
        )
        return f"{what}: {len(self.cells)} cells expected ({counts or 'none'}), blocking suites: {suites}"

    def to_text(self, width: int | None = None) -> str:
        """The gate's report. With `width`, each test id stands on its own line shortened to
        fit (file stem, function and parametrization kept); the caller wraps the prose
        (fit_text). Without, ids are whole, as the step summary has them."""
        def tid(test_id: str, indent: int) -> str:
            return shorten_test_id(test_id, width - indent) if width else test_id

        lines = [f"gate {self.status} for {self._scope().replace('`', '')}"]
        lines += [f"  cell {c.to_text()}" for c in self.cells]
        lines += [f"  waived: {cell}: {why}" for cell, why in sorted(self.waivers.items())]
        for c in self.incomplete:
            lines.append(f"  incomplete: {c.cell_id} is {c.state}: {c.reason}")
            lines += [f"      missing: {tid(t, 15)}" for t in c.missing_tests[:SHOWN_MISSING]]
            if len(c.missing_tests) > SHOWN_MISSING:
                lines.append(f"      ... and {len(c.missing_tests) - SHOWN_MISSING} more")
        for title, items in (
            ("blocking", self.blocking),
            ("warning (does not block)", self.warnings),
            ("failing outside release-blocking suites", self.not_blocking),
            ("fixed", self.fixed),
        ):
            for it in items:
                lines.append(f"  {title}: [{it.verdict}] {it.cell_id}")
                lines.append(f"      {tid(it.test_id, 6)}")
                if it.error_signature:
                    lines.append(f"      {it.error_signature}")
                if it.repro and it.verdict in BLOCKING:
                    lines.append(f"      repro: {it.repro}")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        icon = {"PASSED": ":white_check_mark:", "BLOCKED": ":x:", "INCOMPLETE": ":warning:"}[self.status]
        out = [f"## {icon} distci gate {self.status.lower()}", "", self._scope(), ""]
        out += ["| cell | state | last run | torch | git | why |", "|---|---|---|---|---|---|"]
        for c in self.cells:
            last = c.last_run.started_at if c.last_run else ""
            why = c.reason.replace("|", "\\|")
            out.append(f"| `{c.cell_id}` | {c.state} | {last} | {c.torch_version or ''} | {c.torch_git or ''} | {why} |")
        out.append("")
        if self.waivers:
            out += [f"- waived `{cell}`: {why}" for cell, why in sorted(self.waivers.items())] + [""]
        for c in self.incomplete:
            if c.missing_tests:
                out += [f"Missing on the current stack of `{c.cell_id}` ({len(c.missing_tests)}):", ""]
                out += [f"- {md_code(t)}" for t in c.missing_tests[:SHOWN_MISSING]]
                if len(c.missing_tests) > SHOWN_MISSING:
                    out.append(f"- ... and {len(c.missing_tests) - SHOWN_MISSING} more")
                out.append("")

        def table(title: str, items: list[GateItem]) -> None:
            if not items:
                return
            out.extend(
                [f"### {title} ({len(items)})", "", "| verdict | cell | test | error signature |", "|---|---|---|---|"]
            )
            for it in items:
                sig = (it.error_signature or it.reason or "").replace("|", "\\|")
                out.append(f"| {it.verdict} | `{it.cell_id}` | {md_code(it.test_id).replace('|', chr(92) + '|')} | {sig} |")
            out.append("")

        self._blocking_markdown(out)
        table("Warnings (do not block)", self.warnings)
        table("Failing outside release-blocking suites", self.not_blocking)
        table("Fixed", self.fixed)
        return "\n".join(out) + "\n"


    def _blocking_markdown(self, out: list[str]) -> None:
        """Each blocking test with since when (first bad run), what changed from the last good
        run (stack diff, upstream compare links) and the command that reruns it."""
        if not self.blocking:
            return
        out += [f"### Blocking ({len(self.blocking)})", "",
                "| verdict | cell | test | error signature | since | changed from the last good run |",
                "|---|---|---|---|---|---|"]
        for it in self.blocking:
            o = self.onsets.get((it.cell_id, it.test_id))
            since = f"{o.first_bad.night} (`{o.first_bad.run_id}`)" if o and o.first_bad else ""
            changed = "; ".join(f"{k} `{a}` → `{b}`" for k, a, b in o.diff) if o else ""
            if o and o.last_good is None:
                changed = "no passing run before it"
            elif o and not o.diff:
                changed = "nothing in the tracked stack"
            sig = (it.error_signature or it.reason or "").replace("|", "\\|")
            test = md_code(it.test_id).replace("|", "\\|")
            out.append(f"| {it.verdict} | `{it.cell_id}` | {test} | {sig} | {since} | {changed} |")
        out += ["", "What to do:", ""]
        for it in self.blocking:
            o = self.onsets.get((it.cell_id, it.test_id))
            compare = ", ".join(f"[{label}]({url})" for label, url in (o.compare if o else []))
            b = self.bisects.get((it.cell_id, it.test_id))
            found = f"bisect {b.axis} {b.good}..{b.bad}: " + (f"`{b.culprit}`" if b.culprit else b.status or "no answer") \
                if b else ""
            out.append(f"- `{it.test_id}` in `{it.cell_id}`" + "".join(
                f"; {part}" for part in (f"upstream {compare}" if compare else "", found) if part))
            if it.repro:
                out += ["", "  ```sh", f"  {it.repro}", "  ```"]
        out.append("")


def explain_blocking(store: Store, result: GateResult, limit: int = 50) -> GateResult:
    """Fills `result.onsets` (distci.judge.history) and `result.bisects` for its first `limit`
    blocking tests, and gives each the repro line of today's CLI with its run's backend (a
    stored one may be of an older distci)."""
    backends = {r.run_id: r.backend for r in result.runs}
    bisects = store.bisects()
    for it in result.blocking[:limit]:
        found = [b for b in bisects if b.test_id == it.test_id and b.cell_id in ("", it.cell_id)]
        if found:
            result.bisects[(it.cell_id, it.test_id)] = found[-1]
        r = store.result(it.run_id, it.test_id)
        if r is not None:
            result.onsets[(it.cell_id, it.test_id)] = onset(store, r)
        it.repro = repro_line(it.cell_id, it.test_id, backend=backends.get(it.run_id) or None)
    return result


def md_code(text: str) -> str:
    """`text` as a Markdown code span that a backtick inside cannot end (CommonMark: a longer fence)."""
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def evaluate(
    store: Store,
    tier: str,
    *,
    matrix_path: Path,
    now: datetime | None = None,
    max_age: timedelta = DEFAULT_MAX_AGE,
    waivers: dict[str, str] | None = None,
) -> GateResult:
    """The gate's answer for a tier: its cells and blocking suites come from matrix.toml."""
    from distci.matrix import load_matrix

    matrix = load_matrix(matrix_path)
    cells = [c.id for c in matrix.select(tier=tier)]
    suites = list(matrix.tiers[tier].blocking_suites)
    return evaluate_cells(store, tier, cells, blocking_suites=suites, now=now, max_age=max_age, waivers=waivers,
                          covering_tiers=covering_tiers(list(matrix.tiers), tier))


def covering_tiers(declared: Sequence[str], tier: str) -> tuple[str, ...]:
    """The tiers whose complete runs define `tier`'s expected tests: itself and those
    declared after it. matrix.toml declares tiers narrowest first, and a scenario of one
    tier runs in every later tier too (suites/conftest.py), so a nightly run covers pr."""
    return tuple(declared[declared.index(tier):]) if tier in declared else (tier,)


def evaluate_candidate(
    store: Store,
    candidate: str,
    *,
    matrix_path: Path,
    tier: str = "release",
    now: datetime | None = None,
    max_age: timedelta = DEFAULT_MAX_AGE,
    waivers: dict[str, str] | None = None,
) -> GateResult:
    """The gate's answer for the matrix's cells whose id contains `candidate`, with the
    blocking suites of `tier`."""
    from distci.matrix import load_matrix

    matrix = load_matrix(matrix_path)
    if tier not in matrix.tiers:
        raise SelectionError(f"tier {tier!r} is not declared; tiers: {', '.join(matrix.tiers)}", where=str(matrix_path))
    cells = [c.id for c in matrix.cells if candidate in c.id]
    if not cells:
        raise SelectionError(f"--candidate {candidate!r} matches no cell of the matrix", where=str(matrix_path))
    suites = list(matrix.tiers[tier].blocking_suites)
    out = evaluate_cells(store, tier, cells, blocking_suites=suites, now=now, max_age=max_age, waivers=waivers,
                         covering_tiers=covering_tiers(list(matrix.tiers), tier))
    out.candidate = candidate
    return out


def evaluate_cells(
    store: Store,
    tier: str,
    cells: Sequence[str],
    *,
    blocking_suites: Iterable[str] | None,
    now: datetime | None = None,
    max_age: timedelta = DEFAULT_MAX_AGE,
    waivers: dict[str, str] | None = None,
    covering_tiers: Sequence[str] = (),
) -> GateResult:
    """Judges each expected cell by coverage (see the module doc). `covering_tiers`: the
    tiers whose complete runs count for `tier` (default: `tier` only). `blocking_suites=None`
    means every suite blocks. A waiver naming a cell that is not expected is an error (a
    typo must not waive nothing silently)."""
    now = now or datetime.now(timezone.utc)
    waivers = dict(waivers or {})
    for cell in waivers:
        if cell not in cells:
            close = difflib.get_close_matches(cell, cells, n=3, cutoff=0.5)
            hint = f" (did you mean: {', '.join(close)}?)" if close else ""
            raise SelectionError(f"--waive {cell!r} is not a cell the gate expects{hint}")
    suites = sorted(set(blocking_suites)) if blocking_suites is not None else None
    out = GateResult(tier, None, [], suites, waivers=waivers)
    for cell in sorted(set(cells)):
        state, judged = judge_cell(store, cell, tier, now=now, max_age=max_age, covering_tiers=covering_tiers)
        if state.state not in COMPLETE_STATES and cell in waivers:
            state.reason = f"{state.state}: {state.reason}; waived: {waivers[cell]}"
            state.state = "waived"
        out.cells.append(state)
        if state.last_run is not None:
            out.runs.append(state.last_run)
        for r in judged:
            if r.verdict in BLOCKING:
                blocks = suites is None or any(in_suite(r.test_id, s) for s in suites)
                (out.blocking if blocks else out.not_blocking).append(GateItem.of(r))
            elif r.verdict in WARN:
                out.warnings.append(GateItem.of(r))
            elif r.verdict == "fixed":
                out.fixed.append(GateItem.of(r))
    return out


def in_suite(test_id: str, suite: str) -> bool:
    """Whether a test belongs to a suite as matrix.toml names it: a path under the repo
    (`suites`, `suites/regressions`, a file), or a dashboard suite name (`tp`)."""
    path = test_id.split("::", 1)[0]
    prefix = suite.strip().rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or suite_of(test_id) == prefix

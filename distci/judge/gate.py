"""The release gate: may this tier (or this release candidate) ship?

The gate knows what should exist: the cells matrix.toml declares for the tier (or every
cell whose id contains `--candidate`: a release candidate is a `test:<version>` Source of
torch, so its cells have their own ids). Each expected cell gets a CellState from its
latest run in the store:

    ok          a finished run within --max-age in which some test ran
    missing     no run of the cell at all
    stale       the latest run started longer than --max-age ago
    infra_only  the latest run ran no test (only `infra` records, or nothing but skips)
    in_flight   the latest run has not ended yet
    waived      not ok, but waived by name (`--waive CELL --reason TEXT`)

A test blocks when its verdict is `regression` or `fail` in a release-blocking suite
(declared per tier in matrix.toml). `fixed` never blocks; `infra` and `flaky` never
block but are listed. The answer, and the exit code of `nox -s gate`:

    PASSED      0   every expected cell is ok (or waived) and nothing blocks
    BLOCKED     1   a release-blocking test regressed or fails
    INCOMPLETE  3   nothing blocks, but a cell is missing, stale, infra-only or in flight:
                    a gate never says PASSED about tests that did not run
    (2 is a usage or configuration error, as for every distci command)

BLOCKED wins over INCOMPLETE: a known regression is a definite "no".
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from distci.errors import SelectionError
from distci.command import write_exit_file
from distci.judge.history import Onset, onset
from distci.judge.store import BisectRow, ResultRow, RunRow, Store, default_store_path, suite_of
from distci.judge.verdicts import BLOCKING
from distci.rundir import repro_line

WARN = ("infra", "flaky")
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
DEFAULT_MAX_AGE = timedelta(hours=36)

STATUSES = ("PASSED", "BLOCKED", "INCOMPLETE")
EXIT_CODES = {"PASSED": 0, "BLOCKED": 1, "INCOMPLETE": 3}
STATUS_MEANINGS = {
    "PASSED": "every expected cell ran and nothing blocks",
    "BLOCKED": "a release-blocking test regressed or fails",
    "INCOMPLETE": "nothing blocks, but an expected cell is missing, stale, infra-only or in flight",
}
CELL_STATES = ("ok", "missing", "stale", "infra_only", "in_flight", "waived")
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
class CellState:
    """What the store holds for one cell the gate expects (states: see the module doc)."""

    cell_id: str
    state: str
    last_run: RunRow | None = None
    age_s: float | None = None
    torch_version: str | None = None
    torch_git: str | None = None
    reason: str = ""

    def to_text(self) -> str:
        if self.last_run is None:
            return f"{self.cell_id}: {self.state} ({self.reason})"
        age = f"{self.age_s / 3600:.1f} h ago" if self.age_s is not None else "age unknown"
        return (
            f"{self.cell_id}: {self.state}  last run {self.last_run.started_at or '?'} ({age})  "
            f"torch {self.torch_version or '?'}  git {self.torch_git or '?'}  run {self.last_run.run_id}"
            + (f"  ({self.reason})" if self.reason else "")
        )


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

    def to_text(self) -> str:
        lines = [f"gate {self.status} for {self._scope().replace('`', '')}"]
        lines += [f"  cell {c.to_text()}" for c in self.cells]
        lines += [f"  waived: {cell}: {why}" for cell, why in sorted(self.waivers.items())]
        for c in self.incomplete:
            lines.append(f"  incomplete: {c.cell_id} is {c.state}: {c.reason}")
        for title, items in (
            ("blocking", self.blocking),
            ("warning (does not block)", self.warnings),
            ("failing outside release-blocking suites", self.not_blocking),
            ("fixed", self.fixed),
        ):
            for it in items:
                lines.append(f"  {title}: [{it.verdict}] {it.cell_id} :: {it.test_id}")
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

        def table(title: str, items: list[GateItem]) -> None:
            if not items:
                return
            out.extend(
                [f"### {title} ({len(items)})", "", "| verdict | cell | test | error signature |", "|---|---|---|---|"]
            )
            for it in items:
                sig = (it.error_signature or it.reason or "").replace("|", "\\|")
                out.append(f"| {it.verdict} | `{it.cell_id}` | `{it.test_id}` | {sig} |")
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
            out.append(f"| {it.verdict} | `{it.cell_id}` | `{it.test_id}` | {sig} | {since} | {changed} |")
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
    return evaluate_cells(store, tier, cells, blocking_suites=suites, now=now, max_age=max_age, waivers=waivers)


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
    out = evaluate_cells(store, tier, cells, blocking_suites=suites, now=now, max_age=max_age, waivers=waivers)
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
) -> GateResult:
    """Judges the latest run of each expected cell. `blocking_suites=None` means every
    suite blocks. A waiver naming a cell that is not expected is an error (a typo must
    not waive nothing silently)."""
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
        runs = store.runs(cell_id=cell)
        last = runs[-1] if runs else None
        results = store.results(run_id=last.run_id) if last else []
        state = _cell_state(cell, last, results, now, max_age)
        if state.state not in COMPLETE_STATES and cell in waivers:
            state.reason = f"{state.state}: {state.reason}; waived: {waivers[cell]}"
            state.state = "waived"
        out.cells.append(state)
        if last is None:
            continue
        out.runs.append(last)
        for r in results:
            if r.verdict in BLOCKING:
                blocks = suites is None or any(in_suite(r.test_id, s) for s in suites)
                (out.blocking if blocks else out.not_blocking).append(GateItem.of(r))
            elif r.verdict in WARN:
                out.warnings.append(GateItem.of(r))
            elif r.verdict == "fixed":
                out.fixed.append(GateItem.of(r))
    return out


def _parse_time(ts: str) -> datetime | None:
    try:
        dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _cell_state(
    cell: str, run: RunRow | None, results: list[ResultRow], now: datetime, max_age: timedelta
) -> CellState:
    if run is None:
        return CellState(cell, "missing", reason="no run of this cell in the store")
    started = _parse_time(run.started_at)
    age = (now - started).total_seconds() if started else None
    state = CellState(cell, "ok", run, age, run.stack.get("torch"), run.torch_git or run.stack.get("torch_git"))
    ran = [r for r in results if r.verdict not in ("infra", "skip")]
    if age is None or age > max_age.total_seconds():
        state.state = "stale"
        state.reason = f"latest run is older than {format_duration(max_age)}" if age is not None else "no start time"
    elif not run.ended_at:
        state.state, state.reason = "in_flight", "the latest run has not ended"
    elif not ran:
        infra = [r for r in results if r.verdict == "infra"]
        state.state = "infra_only"
        if infra:
            first = infra[0]
            lines = first.excerpt.strip().splitlines()
            state.reason = first.error_signature or (lines[0] if lines else "the environment never came up")
        else:
            state.reason = f"no test ran ({len(results)} skipped)" if results else "the run recorded no result"
    return state


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "": 3600}


def parse_duration(text: str) -> timedelta:
    """`36h`, `90m`, `2d`, `3600s`; a bare number is hours."""
    m = _DURATION_RE.match(text)
    if not m:
        raise SelectionError(f"--max-age {text!r} is not a duration like 36h, 90m or 2d")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def format_duration(d: timedelta) -> str:
    s = d.total_seconds()
    return f"{s / 3600:g}h" if s % 3600 == 0 else f"{s / 60:g}m" if s % 60 == 0 else f"{s:g}s"


def in_suite(test_id: str, suite: str) -> bool:
    """Whether a test belongs to a suite as matrix.toml names it: a path under the repo
    (`suites`, `suites/regressions`, a file), or a dashboard suite name (`tp`)."""
    path = test_id.split("::", 1)[0]
    prefix = suite.strip().rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or suite_of(test_id) == prefix


def blocking_suites_from_matrix(tier: str, matrix_path: Path) -> list[str] | None:
    """`[tiers.<tier>] blocking_suites` of matrix.toml; None (every suite blocks) when
    there is no matrix file. An empty list means nothing blocks (e.g. nightly)."""
    if not Path(matrix_path).exists():
        return None
    from distci.matrix import load_matrix

    matrix = load_matrix(matrix_path)
    if tier not in matrix.tiers:
        raise SelectionError(f"tier {tier!r} is not declared; tiers: {', '.join(matrix.tiers)}", where=str(matrix_path))
    return list(matrix.tiers[tier].blocking_suites)


def write_step_summary(result: GateResult) -> Path | None:
    """Appends the Markdown summary to $GITHUB_STEP_SUMMARY when it is set."""
    target = os.environ.get(SUMMARY_ENV)
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(result.to_markdown())
    return Path(target)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `gate` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "gate",
        help="PASSED (0) / BLOCKED (1) / INCOMPLETE (3): may this tier ship?",
        description="Compare the store with matrix.toml's cells for a tier and list what blocks "
        "or is missing. Exit 0 PASSED, 1 BLOCKED, 3 INCOMPLETE (a cell missing, stale, infra-only "
        "or in flight), 2 usage error.",
    )
    p.add_argument("--tier", default="release", help="tier whose cells are expected (default: release)")
    p.add_argument(
        "--candidate",
        default=None,
        help="judge the matrix's cells whose id contains this (a cell id or a Source, e.g. torch_test)",
    )
    p.add_argument("--max-age", default="36h", help="a cell's latest run older than this is stale (default 36h)")
    p.add_argument("--waive", action="append", default=[], metavar="CELL",
                   help="accept this cell being missing/stale/infra-only (repeatable; needs --reason)")
    p.add_argument("--reason", action="append", default=[], help="why the --waive before it is acceptable")
    p.add_argument(
        "--matrix", default=argparse.SUPPRESS, help="matrix file declaring cells and blocking suites (default matrix.toml)"
    )
    p.add_argument(
        "--store", type=Path, default=None, help="store file (default $DISTCI_STORE or .distci/store.sqlite)"
    )
    p.set_defaults(fn=run)
    return p


def waivers_of(cells: Sequence[str], reasons: Sequence[str]) -> dict[str, str]:
    """`--waive A --reason X --waive B --reason Y` as {A: X, B: Y}; every waiver needs its reason."""
    if len(cells) != len(reasons) or any(not r.strip() for r in reasons):
        raise SelectionError("every --waive CELL needs its own --reason TEXT")
    return dict(zip(cells, reasons))


def run(args: argparse.Namespace) -> int:
    matrix = Path(getattr(args, "matrix", "matrix.toml"))
    store_path = args.store or default_store_path()
    if not Path(store_path).exists():
        raise SelectionError(f"no store at {store_path}; run `nox -s ingest -- PATH...` first")
    if not matrix.exists():
        raise SelectionError("no matrix file: the gate needs it to know which cells should exist", where=str(matrix))
    opts = {"matrix_path": matrix, "max_age": parse_duration(args.max_age), "waivers": waivers_of(args.waive, args.reason)}
    with Store(store_path) as store:
        if args.candidate:
            result = evaluate_candidate(store, args.candidate, tier=args.tier, **opts)
        else:
            result = evaluate(store, args.tier, **opts)
        explain_blocking(store, result)
    print(result.to_text())
    write_step_summary(result)
    write_exit_file("gate", result.exit_code, f"{result.status}: {STATUS_MEANINGS[result.status]}",
                    status=result.status, tier=result.tier, candidate=result.candidate,
                    incomplete=[c.cell_id for c in result.incomplete], blocking=len(result.blocking))
    return result.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.judge.gate` is `python -m distci gate`."""
    from distci.command import run_module

    return run_module(add_parser, argv)


if __name__ == "__main__":
    sys.exit(main())

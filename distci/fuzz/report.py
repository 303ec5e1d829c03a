"""What a fuzz run tells people: the paste-ready row and repro of a find, the run's report
and the coverage of axis values and pairs per stack (markdown, under reports/)."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Callable

from distci.fuzz.records import Find, Outcome, Report
from distci.fuzz.space import Space
from distci.stack import Stack



@dataclass(frozen=True)
class FuzzRun:
    """One fuzz command's inputs and what its stack was, for the reports."""

    cell_id: str
    seed: str
    budget_s: float
    space: Space
    run_dir: str
    stack: Stack | None  # None: no result recorded one
    plant: str = ""


def table_row(space: Space, point: dict[str, Any]) -> str:
    """The point as a line of suites/scenario/table.py's TABLE (its `row(parallel, compile, backend, ...)`).
    Sizes off the table's defaults are no column: they follow as a comment (the id and the
    repro carry them), so the line still pastes."""
    extra = space.non_default(point)
    args = [repr(point["parallel"])]
    if point["compile"] != "none":
        args += [repr(point["compile"]), repr(point["backend"])]
    args += [f"{name}={value!r}" for name, value in extra.items()
             if name not in ("parallel", "compile", "backend") and name not in space.cell.SIZE_DEFAULTS]
    sizes = [f"{name}={value}" for name, value in extra.items() if name in space.cell.SIZE_DEFAULTS]
    note = f"  # sizes {', '.join(sizes)}: no table column (the id and the repro carry them)" if sizes else ""
    return f"row({', '.join(args)}),{note}"


def shrink_state(find: Find) -> str:
    """How far a find was shrunk, in the words the report uses."""
    if find.complete:
        return "shrunk"
    return f"shrunk so far, not minimal ({find.stopped})"


def config_json(space: Space, point: dict[str, Any]) -> str:
    return json.dumps(space.non_default(point), sort_keys=True)


def repro(space: Space, cell_id: str, point: dict[str, Any], plant: str = "") -> str:
    """One line that runs this configuration alone through a normal cell run: its test id
    names it (suites/fuzz_entry.py reads the point back from the scenario id)."""
    test = shlex.quote(f"{space.cell.ENTRY_TEST}::test_fuzz_config[{space.key(point)}]")
    env = f"DISTCI_FUZZ_PLANT={plant} " if plant else ""
    return f"{env}nox -s dist_tests -- --cell {cell_id} --test {test}"


def find_lines(run: FuzzRun, find: Find) -> list[str]:
    s = find.shrunk
    return [
        f"find: {s.signature}",
        f"  found as {find.found.key}, {shrink_state(find)} to {s.key} in {len(find.steps)} step(s), "
        f"{find.seconds:.0f} s",
        *([f"  near miss of {find.near_miss} (its signature names that bug; its tests do not name this configuration)"]
          if find.near_miss else []),
        f"  row:    {table_row(run.space, s.case)}",
        f"  id:     {s.key}",
        f"  repro:  {repro(run.space, run.cell_id, s.case, run.plant)}",
        f"  replay: nox -s fuzz -- --cell {run.cell_id} --replay {shlex.quote(config_json(run.space, s.case))}",
    ]


def stack_line(stack: Stack | None) -> str:
    if stack is None:
        return "unknown stack; python ?; fixes ?"
    shown = ", ".join(f"{k} {v}" for k, v in (("torch", stack.torch), ("torchao", stack.torchao),
                                               ("torchtitan", stack.torchtitan)) if v)
    return f"{shown or 'unknown stack'}; python {stack.python or '?'}; fixes {stack.fixes_mode or '?'}"


def classification(find: Find) -> str:
    """A find's classification line as the run can say it: a registered entry's near miss when
    one explains the signature (never a new bug to file), else new, with the triage it needs."""
    if find.near_miss:
        return (f"near miss of registered {find.near_miss}: its signature, on a case outside the "
                "entry's tests (widen the entry's tests when the cause is the same; not filed as new)")
    return ("new: no registered entry explains it; triage it as a known issue, a new upstream bug "
            "(repro in suites/regressions/, entry, draft under reports/) or a distci bug (fixed)")


def generator_report(title: str, noun: str, cell_id: str, seed: str, budget_s: float, stack: Stack | None,
                     report: Report, started: str, command: str, lines_of: Callable[[Find], list[str]]) -> str:
    """The markdown of a programs or models run (`noun`: what a case is): inputs, every find
    with its lines (`lines_of`: the generator's own, where it diverged and its repro) and its
    classification, every case tried."""
    lines = [f"# {title}: {cell_id}, seed {seed}", "", f"- date: {started}", f"- command: `{command}`",
             f"- stack: {stack_line(stack)}", f"- budget: {budget_s:.0f} s; {noun}s tried: {len(report.tried)} "
             f"({len(report.drawn)} drawn)", "", "## Finds", ""]
    if not report.finds and not report.known and not report.slow:
        lines.append(f"None: every {noun} passed.")
    for n, find in enumerate(report.finds, 1):
        lines += [f"### {n}. `{find.shrunk.signature}`", "", "```", *lines_of(find), "```", "",
                  f"Classification: {classification(find)}", ""]
    lines += [f"- known issue `{o.known_issue}`: `{o.key}` ({o.signature})" for o in report.known]
    lines += [f"- timed out, not shrunk: `{o.key}` ({o.seconds:.0f} s)" for o in report.slow]
    lines += ["", f"## Every {noun}", "", f"| {noun} | outcome | seconds |", "|---|---|---|"]
    lines += [f"| `{o.key}` | {o.outcome}{' (' + o.known_issue + ')' if o.known_issue else ''} | {o.seconds:.1f} |"
              for o in report.tried]
    return "\n".join(lines) + "\n"


def render_report(run: FuzzRun, report: Report, started: str, command: str) -> str:
    """A reports/fuzz-<date>-<stack>.md: inputs, every configuration tried, every find."""
    drawn = set(report.drawn)
    lines = [
        f"# Fuzz run: {run.cell_id}, seed {run.seed}",
        "",
        f"- date: {started}",
        f"- command: `{command}`",
        f"- stack: {stack_line(run.stack)}",
        f"- budget: {run.budget_s:.0f} s; configurations tried: {len(report.tried)} "
        f"({len(report.drawn)} drawn, {len(report.tried) - len(drawn & {o.key for o in report.tried})} shrink candidates)",
        f"- shrinking: {report.shrink_s:.0f} s of the budget over {len(report.finds)} find(s)",
        f"- run directory: `{Path(run.run_dir).name}` (results.jsonl holds every configuration as a Result)",
        "",
        "## Finds",
        "",
    ]
    if not report.finds and not report.known and not report.slow:
        lines.append("None: every configuration passed or was skipped.")
    for n, find in enumerate(report.finds, 1):
        lines += [f"### {n}. `{find.shrunk.signature}`", "", "```", *find_lines(run, find), "```",
                  "", f"Classification: {classification(find)}", ""]
    for o in report.known:
        lines.append(f"- known issue `{o.known_issue}`: `{o.key}` ({o.signature})")
    if report.slow:
        lines += ["", "Timed out (past the test timeout, not shrunk: a smaller configuration is faster whatever "
                  "the bug):", ""]
        lines += [f"- `{o.key}` ({o.seconds:.0f} s)" for o in report.slow]
    if report.repeats:
        lines += ["", "Repeats of a find (same signature, not shrunk again):", ""]
        lines += [f"- `{k}` repeats `{v}`" for k, v in report.repeats.items()]
    lines += ["", "## Every configuration", "", "| # | configuration | drawn / shrink | result | seconds | signature |",
              "| ---: | --- | --- | --- | ---: | --- |"]
    for n, o in enumerate(report.tried, 1):
        how = "drawn" if o.key in drawn else "shrink"
        sig = (o.signature or "").replace("|", "\\|")
        lines.append(f"| {n} | `{o.key}` | {how} | {o.outcome} | {o.seconds:.1f} | {sig} |")
    return "\n".join(lines) + "\n"


def coverage(space: Space, tried: list[Outcome]) -> tuple[Counter, set, int]:
    """(runs per (axis, value), pairs of (axis, value) run together, pairs valid at all)."""
    values: Counter = Counter()
    pairs: set = set()
    for o in tried:
        full = space.complete(o.case)
        for a in space.axes:
            values[(a.name, full[a.name])] += 1
        names = [a.name for a in space.axes]
        pairs |= {((x, full[x]), (y, full[y])) for x, y in combinations(names, 2)}
    possible = sum(len(a.values) * len(b.values) for a, b in combinations(space.axes, 2))
    return values, pairs, possible


MARK = "<!-- fuzz-coverage {} -->"
END = "<!-- /fuzz-coverage -->"


def coverage_section(run: FuzzRun, tried: list[Outcome]) -> str:
    values, pairs, possible = coverage(run.space, tried)
    lines = [MARK.format(run.cell_id), f"## {run.cell_id}", "", f"Stack: {stack_line(run.stack)}; seed {run.seed}; "
             f"{len(tried)} configurations; {len(pairs)} of {possible} value pairs tried (some are invalid by the "
             "space's rules).", "", "| axis | value: configurations |", "| --- | --- |"]
    for a in run.space.axes:
        cells = ", ".join(f"{v}: {values.get((a.name, v), 0)}" for v in a.values)
        lines.append(f"| {a.name} | {cells} |")
    never = [f"{a.name}={v}" for a in run.space.axes for v in a.values if not values.get((a.name, v))]
    lines += ["", f"Never tried: {', '.join(never) if never else 'nothing'}.", END]
    return "\n".join(lines)


def update_coverage(path: Path, run: FuzzRun, tried: list[Outcome]) -> None:
    """Write this cell's section of the coverage page, replacing the cell's previous one."""
    head = "# Fuzz coverage: axis values and pairs tried, per cell and stack\n\nWritten by `nox -s fuzz`.\n"
    text = path.read_text() if path.exists() else head
    section = coverage_section(run, tried)
    start = text.find(MARK.format(run.cell_id))
    if start >= 0:
        end = text.find(END, start)
        text = text[:start] + section + text[end + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)

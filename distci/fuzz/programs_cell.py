"""`distci fuzz --generator programs`: draw training programs on one cell, run them on its rank
pool in batches, shrink what fails, report.

The cell is provisioned and the run started as `distci run` does (distci.run.cellrun);
the batches run in one pytest session of suites/generators/programs_entry.py (distci/run/batches.py), so every program
is an ordinary Result in the one run directory (cell, stack, error signature, known-issue
match) and ingest, verdicts, the gate and the dashboard treat a find like any failure.
A failure whose signature a registered known issue explains, though the entry's test
pattern does not cover programs, is that entry's near miss (Registry.near_misses, read in
distci.fuzz.records.outcome_of): named, shrunk one round, never counted as new.

Exit code: 1 when the run found a failure no known issue explains, 3 when the cell's
environment never came up, else 0.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from distci.rundir import RunDir, now as _now
from distci.stack import Stack

from distci.training_program import ENTRY_TEST, PROGRAMS_ENV, TEST_NAME, Program

from .programs import ProgramFuzzer, first_action
from .records import Find, Outcome, Report

FUZZ_DIR = "fuzz"
DRAW_BATCH = 16
"""Programs drawn per pytest session: each session starts the 2- and 4-rank pools (seconds
idle, a minute at load 20 on 2 cores), so 16 programs a session instead of 6 spend that
start on more programs (docs/benchmarks.md, the generators' throughput). Shrink rounds use
ProgramFuzzer.shrink_batch: first improvement wants its answer sooner."""


def test_id(program: Program) -> str:
    return f"{ENTRY_TEST}::{TEST_NAME}[{program.text}]"


def repro(cell_id: str, program: Program, plant: str = "") -> str:
    env = f"DISTCI_PROGRAMS_PLANT={plant} " if plant else ""
    return f"{env}nox -s dist_tests -- --cell {cell_id} --test {shlex.quote(test_id(program))}"


def find_lines(cell_id: str, find: Find, plant: str = "") -> list[str]:
    s = find.shrunk
    state = "shrunk" if find.complete else f"shrunk so far, not minimal ({find.stopped})"
    return [f"find: {s.signature}",
            *([f"  near miss of {find.near_miss} (its signature names that bug; its tests do not name programs)"]
              if find.near_miss else []),
            f"  found as {find.found.key}, {state} to {s.key} in {len(find.steps)} step(s), {find.seconds:.0f} s",
            f"  where:  {s.first_divergence or '?'}",
            f"  repro:  {repro(cell_id, s.case, plant)}"]


def report_json(cell_id: str, seed: str, budget_s: float, stack: Stack | None, report: Report,
                seconds: float) -> dict:
    def outcome(o: Outcome) -> dict:
        return {"program": o.key, "outcome": o.outcome, "signature": o.signature, "seconds": o.seconds,
                "known_issue": o.known_issue, "near_miss": o.near_miss, "first_action": first_action(o.message)}
    return {"generator": "programs", "cell": cell_id, "seed": seed, "budget_s": budget_s, "wall_s": seconds,
            "stack": stack.to_dict() if stack else {}, "drawn": report.drawn, "tried": [outcome(o) for o in report.tried],
            "finds": [{"found": f.found.key, "shrunk": outcome(f.shrunk), "steps": f.steps, "complete": f.complete,
                       "stopped": f.stopped, "seconds": f.seconds, "near_miss": f.near_miss} for f in report.finds],
            "known": [outcome(o) for o in report.known], "repeats": report.repeats, "shrink_s": report.shrink_s,
            "slow": [o.key for o in report.slow]}


def render(cell_id: str, seed: str, budget_s: float, stack: Stack | None, report: Report, started: str, command: str,
           plant: str) -> str:
    """The run's markdown (`--report`): inputs, every program tried, every find with where it
    diverged and its classification."""
    from distci.fuzz.report import generator_report

    return generator_report("Programs fuzz run", "program", cell_id, seed, budget_s, stack, report, started, command,
                            lambda find: find_lines(cell_id, find, plant))


def fuzz_programs_cell(cell, *, seed: str, budget_s: float, max_programs: int | None = None,
                       batch_size: int = DRAW_BATCH,
                       shrink: bool = True, python: str | None = None, runs_root: Path = Path(".distci/runs"),
                       replay: str | None = None, known_issues: str | None = None, layouts: tuple[str, ...] = (),
                       rounds: tuple[str, ...] | None = None, shrink_limit_s: float | None = None,
                       report_path: Path | None = None, command: str = "",
                       log=print) -> int:
    """Fuzz one cell with training programs; returns the exit code (module docstring)."""
    from distci.errors import FuzzSpecError
    from distci.fuzz.command import CaseBatches
    from distci.known_issues import load_registry
    from distci.run.cellrun import REPO, start_provisioned
    from distci.run.terminal import EXIT_INFRA

    from distci.training_program import LAYOUTS, ProgramError, parse

    bad = [x for x in layouts if x not in LAYOUTS]
    if bad:
        raise FuzzSpecError(f"--layout {', '.join(bad)}: not a programs layout; layouts: {', '.join(LAYOUTS)}")
    try:
        replayed = parse(replay) if replay else None
    except ProgramError as exc:
        raise FuzzSpecError(f"--replay: {exc}") from None
    started_run = start_provisioned(cell, runs_root, python=python, command=command, log=log)
    if started_run is None:
        return EXIT_INFRA
    info, run_dir, env = started_run
    path = Path(known_issues) if known_issues else REPO / "suites" / "known_issues.toml"
    registry = load_registry(path) if path.exists() else None
    extra = [f"--distci-known-issues={path}"] if path.exists() else []
    runner = CaseBatches(cell, Path(env.python), info, run_dir, extra + ["--distci-reruns=0"], registry, log,
                         entry_test=ENTRY_TEST, test_name=TEST_NAME, env_var=PROGRAMS_ENV, noun="program",
                         key=lambda p: p.text, message_chars=4000)
    try:
        started = time.monotonic()
        plant = os.environ.get("DISTCI_PROGRAMS_PLANT", "")
        if replayed is not None:
            report = Report.of_replay(runner([replayed]), log)
            new = report.new
        else:
            log(f"fuzz programs {cell.id}: seed {seed}, budget {budget_s:.0f}s"
                + (f", at most {max_programs} programs" if max_programs else ""))
            fuzzer = ProgramFuzzer(seed, runner, budget_s=budget_s, max_programs=max_programs, batch_size=batch_size,
                                   shrink=shrink, layouts=tuple(layouts) or tuple(LAYOUTS), rounds=rounds, log=log,
                                   shrink_limit_s=shrink_limit_s if shrink_limit_s is not None else 900.0)
            report = fuzzer.run()
            new = report.new
            for find in report.finds:
                for line in find_lines(cell.id, find, plant):
                    log(line)
    finally:
        runner.close()  # the run's pytest session and its pools, also when the run raised
    seconds = time.monotonic() - started
    (run_dir / FUZZ_DIR / "report.json").write_text(
        json.dumps(report_json(cell.id, seed, budget_s, runner.stack, report, seconds), indent=1, default=str))
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(render(cell.id, seed, budget_s, runner.stack, report, _now(), command, plant))
        log(f"report: {report_path}")
    code = 1 if new else 0
    info.ended_at, info.exit_code = _now(), code
    RunDir(run_dir).write_info(info)
    RunDir(run_dir).write_junit(cell.id)
    rate = 3600 * len(report.tried) / seconds if seconds else 0.0
    log(f"fuzz programs {cell.id}: {len(report.tried)} program(s) in {seconds:.0f} s ({rate:.0f}/h), "
        f"{len(new)} new find(s), {len(report.near_misses)} near miss(es), {len(report.known)} known issue(s), "
        f"{len(report.slow)} timed out; run {run_dir}")
    return code


def run_generator(args, cell, seed: str, command: str) -> int:
    """`distci fuzz --generator programs` (distci.fuzz.command's table): list the drawn
    programs, or draw, run and shrink them on `cell`."""
    from distci.fuzz.command import parse_budget

    from distci.errors import FuzzSpecError
    from distci.program_forms import LATER_ROUNDS
    from distci.training_program import LAYOUTS

    from .programs import draw

    layouts = tuple(x for spec in args.layout for x in spec.split(",") if x)
    rounds = None if args.rounds is None else tuple(x for x in args.rounds.split(",") if x)
    names = [stream for stream, _, _ in LATER_ROUNDS]
    if rounds is not None and set(rounds) - set(names):
        raise FuzzSpecError(f"--rounds {args.rounds}: {', '.join(sorted(set(rounds) - set(names)))} is no later "
                            f"round of forms; rounds: {', '.join(names)} (leave it out for all)")
    if args.list:
        for i in range(args.max_configs or 20):
            print(draw(seed, i, layouts or tuple(LAYOUTS), rounds).text)
        return 0
    return fuzz_programs_cell(cell, seed=seed, budget_s=parse_budget(args.budget), max_programs=args.max_configs,
                              batch_size=args.batch or DRAW_BATCH, shrink=not args.no_shrink, python=args.python,
                              runs_root=Path(args.runs_root), replay=args.replay, known_issues=args.known_issues,
                              layouts=layouts, rounds=rounds, command=command, report_path=args.report,
                              shrink_limit_s=parse_budget(args.shrink_limit, "--shrink-limit")
                              if args.shrink_limit else None)

"""The models generator on one cell: provision it as `distci run` does, run the batches of
structures in one pytest session of suites/generators/models_entry.py (distci/run/batches.py)
in one run directory, read the outcomes back off the Results, write the report (distci/fuzz/models.py
holds the engine and says what the exit code means)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from distci.rundir import RunDir, now as _now
from distci.stack import Stack

from .models import ENTRY_TEST, FUZZ_DIR, MODELS_ENV, TEST_NAME, ModelFuzzer, find_lines, key
from .records import Outcome, Report


def fuzz_models_cell(cell, *, seed: str, budget_s: float, max_structures: int | None = None, batch_size: int = 6,
                     shrink: bool = True, python: str | None = None, runs_root: Path = Path(".distci/runs"),
                     known_issues: str | None = None, allowed: dict[str, tuple] | None = None,
                     report_path: Path | None = None, command: str = "", log=print) -> int:
    """Fuzz model structures on one cell; returns the exit code (distci/fuzz/models.py)."""
    from distci.fuzz.command import CaseBatches
    from distci.known_issues import load_registry
    from distci.run.cellrun import REPO, start_provisioned
    from distci.run.terminal import EXIT_INFRA

    started_run = start_provisioned(cell, runs_root, python=python, command=command, log=log)
    if started_run is None:
        return EXIT_INFRA
    info, run_dir, env = started_run
    registry_path = Path(known_issues) if known_issues else REPO / "suites" / "known_issues.toml"
    registry = load_registry(registry_path) if registry_path.exists() else None
    extra = [f"--distci-known-issues={registry_path}"] if registry is not None else []
    runner = CaseBatches(cell, Path(env.python), info, run_dir, extra, registry, log, entry_test=ENTRY_TEST,
                         test_name=TEST_NAME, env_var=MODELS_ENV, noun="structure", key=key)
    started = _now()
    log(f"fuzz models on {cell.id}: seed {seed}, budget {budget_s:.0f}s")
    try:
        report = ModelFuzzer(seed, runner, budget_s, max_structures=max_structures, batch_size=batch_size,
                             shrink=shrink, allowed=allowed, log=log).run()
    finally:
        runner.close()  # the run's pytest session and its pools, also when the run raised
    plant = os.environ.get("DISTCI_MODELS_PLANT", "")
    for find in report.finds:
        for line in find_lines(cell.id, find, plant):
            log(line)
    (run_dir / FUZZ_DIR / "models-report.json").write_text(json.dumps(report_json(cell.id, seed, report), indent=1))
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(render(cell.id, seed, budget_s, runner.stack, report, started, command, plant))
        log(f"report: {report_path}")
    code = 1 if report.new else 0
    info.ended_at, info.exit_code = _now(), code
    RunDir(run_dir).write_info(info)
    RunDir(run_dir).write_junit(cell.id)
    log(f"fuzz models {cell.id}: {len(report.tried)} structure(s), {len(report.new)} new find(s), "
        f"{len(report.near_misses)} near miss(es), {len(report.known)} known issue(s); run {run_dir}")
    return code


def report_json(cell_id: str, seed: str, report: Report) -> dict:
    def outcome(o: Outcome) -> dict:
        return {"id": o.key, "structure": o.case, "outcome": o.outcome, "signature": o.signature,
                "seconds": o.seconds, "known_issue": o.known_issue, "near_miss": o.near_miss}
    return {"cell": cell_id, "seed": seed, "drawn": report.drawn, "tried": [outcome(o) for o in report.tried],
            "finds": [{"found": f.found.key, "shrunk": outcome(f.shrunk), "steps": f.steps, "complete": f.complete,
                       "near_miss": f.near_miss} for f in report.finds],
            "known": [o.key for o in report.known], "near_misses": [f.found.key for f in report.near_misses],
            "slow": [o.key for o in report.slow]}


def render(cell_id: str, seed: str, budget_s: float, stack: Stack | None, report: Report, started: str, command: str,
           plant: str) -> str:
    """The run's markdown: inputs, every structure tried, every find with its classification line."""
    from distci.fuzz.report import generator_report

    return generator_report("Models fuzz run", "structure", cell_id, seed, budget_s, stack, report, started, command,
                            lambda find: find_lines(cell_id, find, plant))


def run_generator(args, cell, seed: str, command: str) -> int:
    """`distci fuzz --generator models` (distci.fuzz.command's table): list the drawn
    structures, or draw, run and shrink them on `cell`."""
    from distci.errors import FuzzSpecError
    from distci.fuzz.command import parse_budget

    from .models import Drawer, parse_space

    try:
        allowed = parse_space(args.space)
    except ValueError as exc:
        raise FuzzSpecError(str(exc)) from None
    if args.list:
        drawer = Drawer(seed, allowed)
        for _ in range(args.max_configs or 20):
            print(key(drawer.draw()))
        return 0
    return fuzz_models_cell(cell, seed=seed, budget_s=parse_budget(args.budget), max_structures=args.max_configs,
                            batch_size=args.batch or 6, shrink=not args.no_shrink, python=args.python,
                            runs_root=Path(args.runs_root), known_issues=args.known_issues, allowed=allowed,
                            report_path=args.report, command=command)

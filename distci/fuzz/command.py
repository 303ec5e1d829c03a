"""`python -m distci fuzz`: explore the scenario space on one cell and shrink what fails.

The cell is provisioned once (as `distci run` does: a venv from the wheelhouse, or
`--python`'s preinstalled stack); the engine (distci/fuzz/engine.py) then draws configurations
from the seed and runs them in batches, every batch of the run in one pytest session of
suites/fuzz_entry.py on the cell's rank pool (distci/run/batches.py: pytest and the pools
start once per run). Every configuration is an ordinary Result
in the one run directory (cell, stack, error signature, known-issue match), so ingest,
verdicts, the dashboard and bisect treat a find like any failure. Each configuration
prints one line; each find prints as a row to paste into suites/scenario/table.py, its id and
a one-line repro. `--report` writes the run's markdown report, `--coverage` the cell's
section of the coverage page.

Exit code: 1 when the run found a failure no known issue explains, 3 when the cell's
environment never came up, else 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

from distci.errors import FuzzSpecError
from distci.rundir import RunDir, now as _now
from distci.stack import Stack

FUZZ_DIR = "fuzz"
BUDGET = re.compile(r"^(\d+(?:\.\d+)?)([smh]?)$")


def parse_budget(text: str, flag: str = "--budget") -> float:
    """'90s', '30m', '1.5h' or plain seconds -> seconds; `flag` names the option in the error."""
    m = BUDGET.match(text.strip())
    if not m:
        raise FuzzSpecError(f"{flag} {text!r}: write seconds, or a number with s, m or h (e.g. 30m)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _value(axis, text: str) -> Any:
    for v in axis.values:
        if str(v).lower() == text.strip().lower():
            return v
    raise FuzzSpecError(f"--space {axis.name}={text}: not a value of {axis.name}; values: "
                        f"{', '.join(map(str, axis.values))}")


def build_space(device_type: str, specs: list[str]):
    """The cell's space, restricted by `AXIS=V1,V2` specs (one value fixes the axis)."""
    from distci.fuzz.space import Space, cell_side

    try:
        space = Space(cell_side(), device_type=device_type)
    except ValueError as exc:
        raise FuzzSpecError(str(exc)) from None
    wanted: dict[str, list] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep or not values:
            raise FuzzSpecError(f"--space {spec!r}: write AXIS=V1,V2; axes: {', '.join(space.names)}")
        try:
            axis = space.axis(name.strip())
        except KeyError:
            raise FuzzSpecError(f"--space {spec!r}: no axis {name!r}; axes: {', '.join(space.names)}") from None
        wanted[axis.name] = [_value(axis, v) for v in values.split(",")]
    try:
        return space.restrict(wanted)
    except ValueError as exc:
        raise FuzzSpecError(str(exc)) from None


def parse_replay(space, text: str) -> dict[str, Any]:
    try:
        point = json.loads(text)
        full = space.complete(point)
    except (ValueError, TypeError, AttributeError) as exc:
        raise FuzzSpecError(f"--replay {text!r}: {exc}") from None
    problems = space.problems(full)
    if problems:
        raise FuzzSpecError(f"--replay {text!r} cannot run here: {'; '.join(problems)}")
    return full


def batch_session(cell, python: Path, info, run_dir: Path, *, entry_test: str, extra_args: list[str],
                  relay: IO[str]):
    """The run's one pytest session of `entry_test` (distci/run/batches.py): every batch of the
    run goes to it, so pytest and the rank pools start once per run, not once per batch;
    pytest's output goes to FUZZ_DIR's relay log (`relay`)."""
    from distci.run.batches import BatchSession

    def write(message: str) -> None:
        relay.write(message + "\n")
        relay.flush()

    return BatchSession(cell, python, info, run_dir, entry_test=entry_test, extra_args=extra_args,
                        directory=run_dir / FUZZ_DIR / "sessions", log=write)


def run_cases(session, run_dir: Path, *, env_var: str, batch: Path, cases: list[str]) -> dict[str, Any]:
    """One batch of drawn cases in the run's session: the case list goes to the cell's pytest
    as a file named by `env_var` (for this batch only); returns the Results it added, by test
    id (a case without one: its session died, see distci/run/batches.py). What every
    generator's batch runner shares."""
    batch.write_text(json.dumps(cases, indent=1))
    before = {r.test_id for r in RunDir(run_dir).results()}
    session.run({env_var: str(batch)})
    return {r.test_id: r for r in RunDir(run_dir).results() if r.test_id not in before}


class CaseBatches:
    """Runs a batch of drawn cases (programs, model structures) in the run's one pytest session
    of the generator's entry test (`run_cases`) and reads each case's Result as its Outcome
    (records.outcome_of: near misses by the registry's one rule). The programs and models
    generators' batch runner; the configurations' BatchRunner also relays pytest's lines.
    `close()` ends the session (the session's pytest also ends with this process)."""

    def __init__(self, cell, python: Path, info, run_dir: Path, extra_args: list[str], registry: Any,
                 log: Callable[[str], Any], *, entry_test: str, test_name: str, env_var: str, noun: str,
                 key: Callable[[Any], str], message_chars: int = 2000) -> None:
        self.run_dir, self.registry, self.log = run_dir, registry, log
        self.entry_test, self.test_name, self.env_var, self.noun = entry_test, test_name, env_var, noun
        self.key, self.message_chars = key, message_chars
        self.batches = 0
        self.stack: Stack | None = None  # the first result's
        (run_dir / FUZZ_DIR).mkdir(exist_ok=True)
        self.relay = open(run_dir / FUZZ_DIR / "pytest-relay.log", "a")
        self.session = batch_session(cell, python, info, run_dir, entry_test=entry_test, extra_args=extra_args,
                                     relay=self.relay)

    def __call__(self, cases: list[Any]) -> list[Any]:
        from distci.fuzz.records import outcome_of

        self.batches += 1
        self.log(f"batch {self.batches}: {len(cases)} {self.noun}(s)")
        keys = [self.key(c) for c in cases]
        by_id = run_cases(self.session, self.run_dir, env_var=self.env_var,
                          batch=self.run_dir / FUZZ_DIR / f"{self.noun}s-{self.batches:03d}.json", cases=keys)
        out = []
        for case, key in zip(cases, keys):
            r = by_id.get(f"{self.entry_test}::{self.test_name}[{key}]")
            self.stack = self.stack or (r.stack if r is not None else None)
            o = outcome_of(case, key, r, self.registry, message_chars=self.message_chars)
            self.log(f"  {o.outcome.upper():7s} {o.seconds:5.1f}s {key}" + (f"\n      {o.signature}" if o.failed else "")
                     + (f" (near miss of {o.near_miss})" if o.near_miss else ""))
            out.append(o)
        return out

    def close(self) -> None:
        self.session.close()
        self.relay.close()


TABLE_PATTERN = re.compile(r'"suites/test_scenarios\.py::test_scenario(\?[^"]*)"')


def fuzz_registry(source: Path, target: Path) -> Path:
    """The known-issues registry with every pattern over the table's test ids also written over
    the fuzzer's: a configuration with a row's scenario id is that scenario, so the same
    known issue explains its failure (and a fuzz find it explains is not new)."""
    from distci.fuzz.space import cell_side

    fuzz_id = f"{cell_side().ENTRY_TEST}::test_fuzz_config"
    text = TABLE_PATTERN.sub(lambda m: f'{m.group(0)}, "{fuzz_id}{m.group(1)}"', source.read_text())
    target.write_text(text)
    return target


class BatchRunner:
    """Runs a batch of points in the run's one pytest session (`batch_session`); returns their
    Outcomes. `close()` ends the session."""

    def __init__(self, cell, python: Path, info, run_dir: Path, extra_args: list[str], log, registry=None) -> None:
        from distci.fuzz.space import cell_side
        from distci.run.terminal import ResultTail

        self.run_dir, self.log, self.registry = run_dir, log, registry
        self.batches = 0
        self.stack: Stack | None = None  # the first result's
        (run_dir / FUZZ_DIR).mkdir(exist_ok=True)
        self.relay = open(run_dir / FUZZ_DIR / "pytest-relay.log", "a")
        self.cell_side = cell_side()
        self.tail = ResultTail(run_dir / "results.jsonl")
        self.tail.new()  # what the run recorded before its first batch
        self.lock = threading.Lock()  # the session's relay thread and this one both drain the tail
        self.session = batch_session(cell, python, info, run_dir, entry_test=self.cell_side.ENTRY_TEST,
                                     extra_args=extra_args, relay=self.relay)
        self.session.log = self._relay_line

    def _relay_line(self, message: str) -> None:
        """pytest's lines go to a file; each configuration that finished gets its one line
        (outcome, seconds, id: the full id, read off its Result, never a shortened one)."""
        from distci.run.terminal import result_line

        prefix = f"{self.cell_side.ENTRY_TEST}::test_fuzz_config["
        with self.lock:
            self.relay.write(message + "\n")
            self.relay.flush()
            for r in self.tail.new():
                if r.test_id.startswith(prefix):
                    self.log(re.sub(r"\](?=\s|$)", "", result_line(r).replace(prefix, ""), count=1))

    def __call__(self, points: list[dict[str, Any]]):
        from distci.fuzz.records import outcome_of

        ENTRY_TEST, key = self.cell_side.ENTRY_TEST, self.cell_side.key
        self.batches += 1
        self.log(f"batch {self.batches}: {len(points)} configuration(s)")
        by_id = run_cases(self.session, self.run_dir, env_var=self.cell_side.CONFIGS_ENV,
                          batch=self.run_dir / FUZZ_DIR / f"batch-{self.batches:03d}.json", cases=points)
        self._relay_line("")  # the batch's last result, recorded after pytest's last line
        out = []
        for p in points:
            r = by_id.get(f"{ENTRY_TEST}::test_fuzz_config[{key(p)}]")
            self.stack = self.stack or (r.stack if r is not None else None)
            o = outcome_of(p, key(p), r, self.registry)
            if o.failed:
                self.log(f"    {o.key}: {o.signature}" + (f" (near miss of {o.near_miss})" if o.near_miss else ""))
            elif o.outcome == "infra":
                self.log(f"INFRA   {o.key}: {o.message}")
            out.append(o)
        return out

    def close(self) -> None:
        self.session.close()
        self._relay_line("")  # what the session's closing recorded
        self.relay.close()


def start_fuzz_run(cell, runs_root: Path, *, python: str | None, command: str, log) -> tuple | None:
    """A fuzz run's run directory on `cell`, its environment provisioned (as `distci run`
    does): (info, run_dir, env), or None when the environment never came up (then the
    run directory records it as infra, and the caller exits EXIT_INFRA). Every generator
    starts its run here (the run stage's start_provisioned)."""
    from distci.run.cellrun import start_provisioned

    return start_provisioned(cell, runs_root, python=python, command=command, log=log)


def finish_fuzz_run(cell, info, run_dir: Path, code: int) -> int:
    """Closes a fuzz run's directory (run.json with its end and exit code, JUnit); returns `code`."""
    info.ended_at, info.exit_code = _now(), code
    RunDir(run_dir).write_info(info)
    RunDir(run_dir).write_junit(cell.id)
    return code


def fuzz_cell(cell, *, seed: str, budget_s: float, space_specs: list[str], max_configs: int | None = None,
              batch_size: int = 6, shrink: bool = True, python: str | None = None,
              runs_root: Path = Path(".distci/runs"), replay: str | None = None, known_issues: str | None = None,
              report_path: Path | None = None, coverage_path: Path | None = None, command: str = "",
              reruns: int | None = None, shrink_limit_s: float | None = None, log=print) -> int:
    """Fuzz one cell; returns the exit code (see the module docstring)."""
    from distci.fuzz.engine import Fuzzer, ShrinkLimits
    from distci.fuzz.records import Report

    from distci.run.terminal import EXIT_INFRA
    from distci.fuzz.report import FuzzRun, find_lines, render_report, update_coverage

    from distci.known_issues import load_registry
    from distci.run.cellrun import REPO

    space = build_space(cell.accelerator, space_specs)
    point = parse_replay(space, replay) if replay else None
    registry = Path(known_issues) if known_issues else REPO / "suites" / "known_issues.toml"
    if known_issues or registry.exists():
        load_registry(registry)  # a mistake in it: one line now, not a cell that cannot start
    started_run = start_fuzz_run(cell, runs_root, python=python, command=command, log=log)
    if started_run is None:
        return EXIT_INFRA
    info, run_dir, env = started_run
    extra, judged = [], None
    if registry.exists():
        (run_dir / FUZZ_DIR).mkdir(exist_ok=True)
        cells_registry = fuzz_registry(registry, run_dir / FUZZ_DIR / "known_issues.toml")
        extra.append(f"--distci-known-issues={cells_registry}")
        judged = load_registry(cells_registry)
    if reruns is not None:  # after the cell's own --distci-reruns: the last one counts
        extra.append(f"--distci-reruns={reruns}")
    runner = BatchRunner(cell, Path(env.python), info, run_dir, extra, log, judged)
    started = _now()
    try:
        if point is not None:
            report = Report.of_replay(runner([point]), log)
            fuzzer = None
        else:
            log(f"fuzz {cell.id}: seed {seed}, budget {budget_s:.0f}s"
                + (f", at most {max_configs} configurations" if max_configs else ""))
            limits = ShrinkLimits() if shrink_limit_s is None else ShrinkLimits(per_find_max_s=shrink_limit_s,
                                                                                per_find_share=1.0)
            fuzzer = Fuzzer(space, seed, runner, budget_s=budget_s, max_configs=max_configs, batch_size=batch_size,
                            shrink=shrink, log=log, limits=limits)
            report = fuzzer.run()
    finally:
        runner.close()
    run = FuzzRun(cell.id, seed, budget_s, space, str(run_dir), runner.stack, os.environ.get(space.cell.PLANT_ENV, ""))
    for find in report.finds:
        for line in find_lines(run, find):
            log(line)
    if fuzzer is None:
        for o in report.tried:
            if o.failed:
                log(f"replayed: {o.key} {o.outcome}: {o.signature}")
    (run_dir / FUZZ_DIR / "report.json").write_text(json.dumps(_report_json(run, report), indent=1, default=str))
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(render_report(run, report, started, command))
        log(f"report: {report_path}")
    if coverage_path:
        update_coverage(Path(coverage_path), run, report.tried)
        log(f"coverage: {coverage_path}")
    code = finish_fuzz_run(cell, info, run_dir, 1 if report.new else 0)
    log(f"fuzz {cell.id}: {len(report.tried)} configuration(s), {len(report.new)} new find(s), "
        f"{len(report.near_misses)} near miss(es), {len(report.known)} known issue(s), {len(report.slow)} timed out; "
        f"run {run_dir}")
    return code


def _report_json(run, report) -> dict:
    def outcome(o):
        return {"id": o.key, "point": o.case, "outcome": o.outcome, "signature": o.signature,
                "seconds": o.seconds, "known_issue": o.known_issue, "near_miss": o.near_miss, "test_id": o.test_id}
    return {"cell": run.cell_id, "seed": run.seed, "budget_s": run.budget_s, "stack": run.stack.to_dict() if run.stack else {},
            "drawn": report.drawn, "tried": [outcome(o) for o in report.tried],
            "finds": [{"found": f.found.key, "shrunk": outcome(f.shrunk), "steps": f.steps,
                       "complete": f.complete, "stopped": f.stopped, "seconds": f.seconds,
                       "near_miss": f.near_miss} for f in report.finds],
            "known": [o.key for o in report.known], "repeats": report.repeats, "shrink_s": report.shrink_s,
            "slow": [o.key for o in report.slow]}


def list_draws(space, seed: str, count: int) -> list[str]:
    """The first `count` configurations a seed draws (what a run draws, outcomes aside)."""
    from distci.fuzz.space import Drawer

    drawer = Drawer(space, seed)
    out = []
    for _ in range(count):
        point = drawer.draw()
        if point is None:
            break
        out.append(space.key(point))
    return out


def public_command(argv: list[str]) -> str:
    """The command as reports quote it: no machine's paths (an absolute path keeps its last part)."""
    out = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] == "--python":
            out.append("PYTHON")
        elif arg.startswith("/"):
            out.append(f".../{Path(arg).name}")
        else:
            out.append(arg)
    return shlex.join(out)


@dataclass(frozen=True)
class Generator:
    """One `--generator`: the module whose `run_generator(args, cell, seed, command) -> exit
    code` runs it (None: this module's configuration fuzzer), imported by name only when
    chosen, and what it draws (the option's help)."""

    module: str | None
    help: str


GENERATORS: dict[str, Generator] = {
    "configs": Generator(None, "points of the scenario space (suites/generators/space.py): the table's columns, drawn and shrunk"),
    "ops": Generator("distci.fuzz.ops_command", "DTensor ops forward and backward on every mesh and placement "
                     "trainers produce, against the full-tensor op"),
    "programs": Generator("distci.fuzz.programs_cell", "training programs: sequences of the calls real training "
                          "loops make, against a single-process run after every step"),
    "models": Generator("distci.fuzz.models_cell", "model structures production models have (MoE loops, ties, "
                        "buffers, parametrizations, FSDP2 units) crossed with the layouts"),
}
"""What `--generator` draws; `configs` is the default."""


def _cmd_fuzz(args: argparse.Namespace) -> int:
    import importlib

    from distci.matrix import load_matrix

    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    matrix = load_matrix(args.matrix)
    cells = matrix.select(cell_ids=[args.cell]) if args.cell else matrix.select(tier="pr")[:1]
    if len(cells) != 1:
        raise FuzzSpecError(f"--cell {args.cell!r} names {len(cells)} cells; fuzz one cell at a time")
    seed = args.seed or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    generator = GENERATORS[args.generator]
    if generator.module is not None:
        module = importlib.import_module(generator.module)
        return module.run_generator(args, cells[0], seed, public_command(["python", "-m", "distci", *sys.argv[1:]]))
    if args.list:
        for line in list_draws(build_space(cells[0].accelerator, args.space), seed, args.max_configs or 20):
            print(line)
        return 0
    command = public_command(["python", "-m", "distci", *sys.argv[1:]])
    return fuzz_cell(cells[0], seed=seed, budget_s=parse_budget(args.budget), space_specs=args.space,
                     max_configs=args.max_configs, batch_size=args.batch or 6, shrink=not args.no_shrink,
                     python=args.python, runs_root=Path(args.runs_root), replay=args.replay,
                     known_issues=args.known_issues, report_path=args.report, coverage_path=args.coverage,
                     command=command, reruns=args.reruns,
                     shrink_limit_s=parse_budget(args.shrink_limit, "--shrink-limit") if args.shrink_limit else None)


def add_parser(sub) -> None:
    p = sub.add_parser("fuzz", help="draw scenario configurations on one cell, run them on its rank pool, "
                       "shrink what fails")
    p.add_argument("--cell", default=None, help="the cell whose stack runs what is drawn (default: the pr tier's "
                   "cell, as `distci run` defaults to)")
    p.add_argument("--generator", choices=list(GENERATORS), default="configs",
                   help="what to draw: " + "; ".join(f"{k}: {g.help}" for k, g in GENERATORS.items()))
    p.add_argument("--ops", default=None, metavar="OP1,OP2", help="ops generator: draw only these ops")
    p.add_argument("--meshes", default=None, metavar="M1,M2", help="ops generator: draw only these meshes (2, 4, 2x2)")
    p.add_argument("--max-cases", type=int, default=None, help="ops generator: stop after this many cases")
    p.add_argument("--layout", action="append", default=[], metavar="L1,L2",
                   help="programs: draw only these layouts (fsdp, tp, fsdp_tp, ddp)")
    p.add_argument("--rounds", default=None, metavar="R1,R2",
                   help="programs: consult only these later rounds of forms (their stream names, "
                        "program_forms.LATER_ROUNDS; default: all): a seed's programs as drawn when only "
                        "they existed (the planted-bug trials pin theirs)")
    p.add_argument("--seed", default=None, help="any text (default: today's UTC date); the same seed draws the same list")
    p.add_argument("--budget", default="30m", help="wall-clock budget: seconds or 90s / 30m / 1h (default 30m)")
    p.add_argument("--max-configs", "--max-programs", type=int, default=None,
                   help="stop after drawing this many configurations (programs)")
    p.add_argument("--space", action="append", default=[], metavar="AXIS=V1,V2",
                   help="keep only these values of an axis (repeatable; one value fixes it)")
    p.add_argument("--batch", type=int, default=None,
                   help="cases per pytest session (default: configurations and models 6, programs 16 drawn and 8 "
                        "per shrink round: a session's pool starts cost more than a program)")
    p.add_argument("--no-shrink", action="store_true", help="report failures as drawn")
    p.add_argument("--shrink-limit", default=None, metavar="DURATION", help="how long one find may shrink "
                   "(default: min(15m, 25%% of the budget)); all shrinking stays within half the budget")
    p.add_argument("--list", action="store_true", help="print the configurations the seed draws and exit")
    p.add_argument("--replay", default=None, metavar="JSON", help="run this one configuration (a find's JSON)")
    p.add_argument("--reruns", type=int, default=None, help="reruns of a failing configuration (default: the "
                   "cell run's; a rerun that passes marks the find flaky)")
    p.add_argument("--python", default=None, help="run on this interpreter's preinstalled stack")
    p.add_argument("--runs-root", default=".distci/runs")
    p.add_argument("--known-issues", default=None, help="registry to match failures against "
                   "(default: suites/known_issues.toml)")
    p.add_argument("--report", type=Path, default=None, help="write the run's markdown report here")
    p.add_argument("--coverage", type=Path, default=None, help="update this cell's section of this coverage page")
    p.set_defaults(fn=_cmd_fuzz)

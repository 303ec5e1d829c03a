"""`python -m distci fuzz --generator ops`: draw DTensor op cases on one cell, shrink what fails.

The cell is provisioned once (as `distci run` does); cases are drawn from the seed
(distci/fuzz/ops.py) and run in sweeps, each one batch of
suites/generators/ops_entry.py::test_op_sweep on the cell's rank pools (2 and 4 ranks),
sized to about `session_s` seconds at the rate measured so far. Every sweep of the run goes
to one pytest session (distci/run/batches.py, as the other generators' batches): pytest,
the stack capture and the rank pools start once per run, not once per sweep; a session that
dies costs its sweep's unanswered cases (the first of each world size a find, the rest
drawn again) and the next sweep starts a new one. A failure with a signature new to the run
is shrunk inside its sweep. Every find (its shrunk case) is then run once more, in the same
session, as its own test, `test_op_case[<case id>]`: an ordinary Result of the run directory
(cell, stack, signature, known-issue match), so ingest, the gate and the dashboard see it
like any failure. A find the registry does not explain for that test but whose signature
names an entry's bug (Registry.near_misses: the registry's one rule) is reported as that
entry's near miss, not as new.

Exit code: 1 when a find no known issue explains (nor names as a near miss), 3 when the
cell's environment never came up, else 0.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from distci.op_case import MESHES, parse_case
from distci.op_inventory import BY_NAME
from distci.stack import Stack

from .ops import draw_cases

ENTRY = "suites/generators/ops_entry.py"
SWEEP = f"{ENTRY}::test_op_sweep"
CASES_ENV = "DISTCI_OPS_CASES"
"""The batch file the sweep reads (suites/generators/ops_entry.py names the same variable)."""


@dataclass
class OpsFind:
    signature: str
    found: str
    shrunk: str
    message: str
    steps: int = 0
    checks: int = 0
    complete: bool = True
    test_id: str = ""
    outcome: str = ""
    known_issue: str | None = None
    near_miss: list[str] = field(default_factory=list)

    @property
    def new(self) -> bool:
        return not self.known_issue and not self.near_miss and self.outcome != "passed"


@dataclass
class OpsReport:
    seed: str
    counts: dict[str, int] = field(default_factory=dict)
    """status -> cases (pass, fail, gap, invalid, lost)."""
    gaps: dict[str, int] = field(default_factory=dict)
    """op -> cases that hit a missing sharding strategy."""
    by_op: dict[str, int] = field(default_factory=dict)
    finds: list[OpsFind] = field(default_factory=list)
    repeats: dict[str, int] = field(default_factory=dict)
    """signature -> further cases that failed with it (not shrunk again)."""
    case_s: float = 0.0
    """Time inside cases (all ranks agreeing), shrinking included."""
    wall_s: float = 0.0
    sweeps: int = 0
    sessions: int = 0
    """pytest sessions the sweeps and the finds' replay ran in (1 unless one died)."""
    drawn: int = 0
    slowest: list = field(default_factory=list)
    """[seconds, case id] of the slowest cases (a case that costs a minute is worth a look:
    at the ranks' speed it is a trainer's step that stalls)."""

    @property
    def cases(self) -> int:
        return sum(self.counts.values())

    def per_hour(self) -> float:
        return self.cases / self.wall_s * 3600 if self.wall_s else 0.0


def plan_size(done: int, seconds: float, session_s: float, first: int = 300, most: int = 6000) -> int:
    """Cases for the next sweep: `session_s` at the rate so far (`first` before any)."""
    if not done or seconds <= 0:
        return first
    return max(20, min(most, int(session_s * done / seconds)))


def read_outcomes(out_dir: Path) -> list[dict[str, Any]]:
    """The sweep's rows, one per case (the first, should a sweep have run twice)."""
    rows, seen = [], set()
    for path in sorted(out_dir.glob("ws*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line cut by a dying rank
                continue
            if row["id"] not in seen:
                seen.add(row["id"])
                rows.append(row)
    return rows


class Sweeps:
    """Draws, runs sweeps, keeps the tally: the loop of one ops fuzz run, runner given."""

    def __init__(self, seed: str, run_sweep: Callable[[Path, list], list[dict]], work: Path, *,
                 ops: list[str] | None = None, meshes: list[str] | None = None, shrink: bool = True,
                 shrink_s: float = 120.0,
                 session_s: float = 300.0, log: Callable[[str], Any] = print,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seed, self.run_sweep, self.work, self.log, self.clock = seed, run_sweep, work, log, clock
        self.specs = [BY_NAME[o] for o in ops] if ops else None
        self.meshes = meshes
        self.shrink, self.shrink_s, self.session_s = shrink, shrink_s, session_s
        self.report = OpsReport(seed)
        self.signatures: dict[str, OpsFind] = {}

    def run(self, budget_s: float, max_cases: int | None = None) -> OpsReport:
        start = self.clock()
        queue: list = []
        while self.clock() - start < budget_s and (max_cases is None or self.report.drawn < max_cases):
            size = plan_size(self.report.cases, self.report.wall_s, self.session_s)
            size = min(size, max_cases - self.report.drawn) if max_cases is not None else size
            fresh = draw_cases(self.seed, self.report.drawn, max(0, size - len(queue)), self.specs, self.meshes)
            self.report.drawn += len(fresh)
            batch, queue = queue + fresh, []
            self.report.sweeps += 1
            folder = self.work / f"sweep-{self.report.sweeps:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            began = self.clock()
            rows = self.run_sweep(folder, batch)
            wall = self.clock() - began
            self.report.wall_s += wall
            queue = self._tally(batch, rows)
            in_cases = sum(r.get("seconds", 0.0) for r in rows)
            self.log(f"sweep {self.report.sweeps}: {len(batch)} case(s), {len(rows)} answered in {wall:.0f}s "
                     f"({in_cases:.0f}s inside the drawn cases; the rest: pytest, pool starts, shrinking, dead "
                     f"slots), {self.report.per_hour():.0f} cases/hour so far, {len(self.report.finds)} find(s)")
        return self.report

    def _tally(self, batch: list, rows: list[dict]) -> list:
        """Counts a sweep's rows; returns the cases to run again (after the one a dead sweep died on)."""
        answered = {r["id"] for r in rows}
        for r in rows:
            self.report.counts[r["status"]] = self.report.counts.get(r["status"], 0) + 1
            op = r["id"].split("~", 1)[0]
            self.report.by_op[op] = self.report.by_op.get(op, 0) + 1
            self.report.case_s += r.get("seconds", 0.0)
            self.report.slowest = sorted(self.report.slowest + [[r.get("seconds", 0.0), r["id"]]], reverse=True)[:5]
            if r["status"] == "gap":
                self.report.gaps[op] = self.report.gaps.get(op, 0) + 1
            if r["status"] in ("fail", "lost"):  # lost: the case a resume slot found its sweep died on
                self._failed(r)
        missing = [c for c in batch if c.id not in answered]
        by_world: dict[int, list] = {}
        for c in missing:
            by_world.setdefault(c.world_size, []).append(c)
        for cases in by_world.values():
            dead = cases[0]  # the sweep of that world size stopped on it: crash, hang or timeout
            self.report.counts["lost"] = self.report.counts.get("lost", 0) + 1
            self._failed({"id": dead.id, "status": "fail", "signature": f"{dead.op}: the sweep died on this case",
                          "message": f"{dead.op}: the sweep died on this case (crash, hang or timeout: see "
                                     f"the run's pytest log)\n  case {dead.id}"})
        return [c for cases in by_world.values() for c in cases[1:]]

    def _failed(self, row: dict) -> None:
        sig = row["signature"]
        if sig in self.signatures:
            self.report.repeats[sig] = self.report.repeats.get(sig, 0) + 1
            return
        shrunk = row.get("shrunk") or {}
        find = OpsFind(sig, row["id"], shrunk.get("id", row["id"]), shrunk.get("message") or row["message"],
                       len(shrunk.get("steps", [])), shrunk.get("checks", 0), shrunk.get("complete", not shrunk))
        self.signatures[sig] = find
        self.report.finds.append(find)
        self.log(f"  find: {sig}\n    drawn  {find.found}\n    shrunk {find.shrunk} ({find.steps} step(s), "
                 f"{find.checks} check(s))")

    def batch_file(self, folder: Path, cases: list) -> Path:
        path = folder / "batch.json"
        path.write_text(json.dumps({
            "cases": [c.to_json() for c in cases], "out": str(folder),
            "known_signatures": sorted(self.signatures),
            "shrink": {"max_checks": 400 if self.shrink else 0, "max_s": self.shrink_s}}))
        return path


def judge_find(find: OpsFind, test_id: str, result: Any, registry: Any) -> None:
    """A find's own Result (its rerun as `test_op_case`; None: none recorded) read into it: the
    known issue the harness matched, else the entries it is a near miss of (Registry.near_misses)."""
    find.test_id, find.outcome = test_id, result.outcome if result is not None else "missing"
    if result is None:
        return
    find.known_issue = result.known_issue
    if registry is not None and not result.known_issue and result.outcome == "failed":
        find.near_miss = registry.near_misses(result.test_id, result.error_signature or "", result.message,
                                              result.stack)


def case_test_id(case_id: str) -> str:
    return f"{ENTRY}::test_op_case[{parse_case(case_id).id}]"


def fuzz_ops(cell, *, seed: str, budget_s: float, python: str | None = None, runs_root: Path = Path(".distci/runs"),
             known_issues: str | None = None, report_path: Path | None = None, command: str = "",
             ops: list[str] | None = None, meshes: list[str] | None = None, max_cases: int | None = None,
             shrink: bool = True,
             shrink_s: float = 120.0, session_s: float = 300.0, log: Callable[[str], Any] = print) -> int:
    """Fuzz one cell's DTensor ops; returns the exit code (see the module docstring)."""
    from distci.known_issues import load_registry
    from distci.rundir import RunDir, now
    from distci.run.cellrun import REPO
    from distci.fuzz.command import FUZZ_DIR, batch_session, finish_fuzz_run, start_fuzz_run
    from distci.run.terminal import EXIT_INFRA

    from .ops_report import render_report

    unknown = [o for o in ops or [] if o not in BY_NAME]
    if unknown:
        from distci.errors import FuzzSpecError

        raise FuzzSpecError(f"--ops {','.join(unknown)}: not in the ops inventory; ops: {', '.join(BY_NAME)}")
    if any(m not in MESHES for m in meshes or []):
        from distci.errors import FuzzSpecError

        raise FuzzSpecError(f"--meshes {','.join(meshes or [])}: meshes are {', '.join(MESHES)}")
    started_run = start_fuzz_run(cell, runs_root, python=python, command=command, log=log)
    if started_run is None:
        return EXIT_INFRA
    info, run_dir, env = started_run
    registry_path = Path(known_issues) if known_issues else REPO / "suites" / "known_issues.toml"
    extra = [f"--distci-known-issues={registry_path}"] if registry_path.exists() else []
    # no reruns (the default, said aloud): a rerun of a dead sweep would rerun the case that killed it
    work = run_dir / FUZZ_DIR / "ops"
    work.mkdir(parents=True, exist_ok=True)
    relay = open(run_dir / FUZZ_DIR / "pytest-relay.log", "a")
    session = batch_session(cell, Path(env.python), info, run_dir, entry_test=SWEEP,
                            extra_args=[*extra, "--distci-reruns=0"], relay=relay)

    def run_sweep(folder: Path, cases: list) -> list[dict]:
        session.run({CASES_ENV: str(sweeps.batch_file(folder, cases))})
        return read_outcomes(folder)

    sweeps = Sweeps(seed, run_sweep, work, ops=ops, meshes=meshes, shrink=shrink, shrink_s=shrink_s,
                    session_s=session_s, log=log)
    started = now()
    log(f"fuzz ops {cell.id}: seed {seed}, budget {budget_s:.0f}s"
        + (f", at most {max_cases} cases" if max_cases else "") + (f", ops {','.join(ops)}" if ops else ""))
    try:
        report = sweeps.run(budget_s, max_cases)
        stack: Stack | None = None  # the first find's
        if report.finds:  # each find once more, as its own test, in the same session: a Result like any failure
            ids = [case_test_id(f.shrunk) for f in report.finds]
            finds = work / "finds.json"
            finds.write_text(json.dumps({"finds": [parse_case(f.shrunk).id for f in report.finds], "out": str(work)}))
            before = {r.test_id for r in RunDir(run_dir).results()}
            session.run({CASES_ENV: str(finds)}, tests=[f"{ENTRY}::test_op_case"])
            results = {r.test_id: r for r in RunDir(run_dir).results() if r.test_id not in before}
            registry = load_registry(registry_path) if registry_path.exists() else None
            for find, test_id in zip(report.finds, ids):
                r = results.get(test_id)
                judge_find(find, test_id, r, registry)
                stack = stack or (r.stack if r is not None else None)
        report.sessions = session.sessions
    finally:
        session.close()
        relay.close()
    for find in report.finds:
        label = (f"known issue {find.known_issue}" if find.known_issue else
                 f"near miss of {', '.join(find.near_miss)}" if find.near_miss else
                 "did not fail again on its own" if find.outcome == "passed" else "NEW")
        log(f"find [{label}]: {find.signature}\n  repro: python -m distci run --cell {cell.id} --test "
            f"'{find.test_id}'")
    (run_dir / FUZZ_DIR / "ops-report.json").write_text(json.dumps(_as_json(report, cell.id, stack), indent=1))
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(render_report(report, cell.id, stack, started, command))
        log(f"report: {report_path}")
    code = finish_fuzz_run(cell, info, run_dir, 1 if any(f.new for f in report.finds) else 0)
    log(f"fuzz ops {cell.id}: {report.cases} case(s) in {report.wall_s:.0f}s ({report.per_hour():.0f}/hour), "
        f"{sum(f.new for f in report.finds)} new find(s), {len(report.finds)} find(s) in all; run {run_dir}")
    return code


def _as_json(report: OpsReport, cell_id: str, stack: Stack | None) -> dict[str, Any]:
    from dataclasses import asdict

    return {"cell": cell_id, "stack": stack.to_dict() if stack else {}, **{k: v for k, v in asdict(report).items() if k != "finds"},
            "per_hour": round(report.per_hour()), "finds": [{**asdict(f), "new": f.new} for f in report.finds]}


def run_generator(args, cell, seed: str, command: str) -> int:
    """The `fuzz --generator ops` entry (distci/fuzz/command.py's GENERATORS): arguments to fuzz_ops."""
    from distci.fuzz.command import parse_budget

    return fuzz_ops(cell, seed=seed, budget_s=parse_budget(args.budget), python=args.python,
                    runs_root=Path(args.runs_root), known_issues=args.known_issues, report_path=args.report,
                    command=command, ops=[o.strip() for o in args.ops.split(",")] if args.ops else None,
                    meshes=[m.strip() for m in args.meshes.split(",")] if args.meshes else None,
                    max_cases=args.max_cases, shrink=not args.no_shrink,
                    shrink_s=parse_budget(args.shrink_limit, "--shrink-limit") if args.shrink_limit else 120.0)

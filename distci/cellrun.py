"""Run one cell: provision its environment, run its suites there, collect the results.

This is the loop every other part of distci consumes. A cell whose environment never
comes up still produces a run directory with one `infra` Result carrying the cell id,
the partial stack (what was declared and what resolved) and the install log, so the
failure is visible, grouped and never mistaken for a regression.

After pytest, the cell's external suites (upstream's own tests, `external` in
matrix.toml) run in the same environment and append to the same results.jsonl, so a
run directory holds one cell's whole story whichever runner produced each Result.
"""

from __future__ import annotations

import datetime
import difflib
import fnmatch
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .envs import ensure_env
from .errors import ConfigError, InfraError, SelectionError, SourceError
from .external.spec import SuiteSpec, load_suites
from .matrix import EXTERNAL_SUITES, Cell
from .results import (JUNIT_FILE, RESULTS_FILE, STACK_FILE, Result, ResultWriter, error_signature, read_results,
                      write_junit)
from .selfwheels import REPO, build_all
from .sources import IndexConfig, pip_args, redact_url, requirement_lines, resolve_sources
from .wheelhouse import ensure_wheelhouse

# What the harness needs inside every cell environment besides the cell's own stack.
HARNESS_REQUIREMENTS = ("pytest", "packaging", "numpy")
RUN_FILE = "run.json"
EXTERNAL_PREFIX = "external/"

Log = Callable[[str], None]


@dataclass
class RunInfo:
    run_id: str
    cell_id: str
    started_at: str
    ended_at: str = ""
    runner: str = ""
    backend: str = "venv"
    image_digest: str | None = None
    image: str | None = None
    tier: str | None = None
    nightly_date: str | None = None
    cell: dict = field(default_factory=dict)
    pytest_exit: int | None = None
    command: str = ""


@dataclass
class CellRun:
    info: RunInfo
    run_dir: Path
    results: list[Result]

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.results)

    @property
    def infra(self) -> bool:
        return any(r.failure_kind == "infra" for r in self.results)

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.outcome in ("failed", "error") and r.failure_kind != "infra"
                and not r.known_issue]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def new_run_id(cell: Cell) -> str:
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}-{cell.id}"


def partial_stack(cell: Cell, **extra) -> dict:
    """The provenance an infra record carries when the environment never came up."""
    return {
        "partial": True,
        "declared": cell.as_dict(),
        "python": sys.version.split()[0],
        "runner": os.environ.get("DISTCI_RUNNER") or socket.gethostname(),
        **extra,
    }


def infra_result(run_id: str, cell: Cell, exc: Exception, log_path: Path | None, *,
                 test_id: str | None = None, stack: dict | None = None) -> Result:
    """An `infra` Result: for the whole cell, or for `test_id` (one external suite) when given.

    `stack` is the captured Stack when the environment did come up; otherwise the partial one.
    """
    log = getattr(exc, "log", "") or ""
    return Result(
        run_id=run_id,
        cell_id=cell.id,
        test_id=test_id or f"<infra>::{cell.id}",
        outcome="error",
        failure_kind="infra",
        error_signature=error_signature(type(exc).__name__, str(exc)),
        message=f"{type(exc).__name__}: {exc}\n{log}"[:20000],
        stack=stack if stack is not None else partial_stack(cell, error=str(exc)),
        repro=f"nox -s dist_tests -- --cell {cell.id}" + (f" --test {shlex.quote(test_id)}" if test_id else ""),
        started_at=_now(),
        log_path=str(log_path) if log_path else "",
    )


def pytest_command(cell: Cell, python: Path, run_dir: Path, run_id: str, *, tests: list[str], keyword: str | None,
                   extra_args: list[str], root: Path = REPO) -> list[str]:
    """The pytest command of a cell run; `root` is where the checkout's suites are (in an image: its workdir).

    The rootdir is pinned to the checkout and every option is passed as `--opt=value`:
    pytest otherwise picks its rootdir from the paths on its command line (option values
    included), and test ids, which key all history, would change with where a clone lives.
    """
    # A test file outside the checkout (a user's own repro) gets no id under a pinned rootdir.
    outside = [t for t in tests if Path(t.split("::")[0]).is_absolute() and not _within(t.split("::")[0], REPO)]
    cmd = [
        str(python), "-m", "pytest", "-p", "distci.harness", "-p", "no:cacheprovider", "-rfEs",
        *([] if outside else [f"--rootdir={root}"]), f"--distci-run-dir={run_dir}", f"--distci-cell={cell.id}", f"--distci-run-id={run_id}",
        f"--distci-world-size={cell.world_size}", f"--distci-device={cell.accelerator}",
        f"--distci-timeout={cell.timeout}",
    ]
    registry = Path("suites") / "known_issues.toml"
    if (REPO / registry).exists():
        cmd += [f"--distci-known-issues={root / registry}"]
    if keyword:
        cmd += ["-k", keyword]
    cmd += extra_args
    cmd += tests or list(cell.suites)
    return cmd


def _within(path: str, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def cell_environment(cell: Cell, tier: str | None) -> dict[str, str]:
    """What a cell's pytest process is told on top of its machine's environment."""
    env = {"DISTCI_FIXES": "all" if cell.fixes == "on" else "none", "DISTCI_CELL": cell.id}
    if tier:
        env["DISTCI_TIER"] = tier
    return env


def start_run(cell: Cell, runs_root: Path, *, tier: str | None, backend: str = "venv",
              log: Log = print) -> tuple[RunInfo, Path]:
    """Create the run directory and its run.json; every backend starts a run this way."""
    run_id = new_run_id(cell)
    run_dir = Path(runs_root).resolve() / run_id
    run_dir.mkdir(parents=True)
    info = RunInfo(run_id=run_id, cell_id=cell.id, started_at=_now(), tier=tier, cell=cell.as_dict(),
                   backend=backend, runner=os.environ.get("DISTCI_RUNNER") or socket.gethostname())
    _write_info(run_dir, info)
    log(f"[{cell.id}] run {run_id}")
    return info, run_dir


def infra_run(cell: Cell, info: RunInfo, run_dir: Path, exc: Exception, log_path: Path | None) -> CellRun:
    """Close a run whose environment never came up: one `infra` Result instead of test outcomes."""
    result = infra_result(info.run_id, cell, exc, log_path)
    ResultWriter(run_dir).write(result)
    write_junit([result], run_dir / JUNIT_FILE, suite_name=cell.id)
    info.ended_at = _now()
    _write_info(run_dir, info)
    return CellRun(info, run_dir, [result])


def finish_run(cell: Cell, info: RunInfo, run_dir: Path, exit_code: int | None) -> CellRun:
    """Collect what pytest recorded; a pytest that died before recording anything is `infra`."""
    info.pytest_exit = exit_code
    info.ended_at = _now()
    results_file = run_dir / "results.jsonl"
    results = list(read_results(results_file)) if results_file.exists() else []
    if not results and exit_code not in (0, 5):
        log_file = run_dir / "pytest.log"
        exc = InfraError(f"pytest exited with {exit_code} and recorded no result",
                         log=log_file.read_text()[-6000:] if log_file.exists() else "")
        result = infra_result(info.run_id, cell, exc, log_file)
        ResultWriter(run_dir).write(result)
        results = [result]
        write_junit(results, run_dir / JUNIT_FILE, suite_name=cell.id)
    _write_info(run_dir, info)
    return CellRun(info, run_dir, results)


def run_cell(
    cell: Cell,
    *,
    runs_root: Path = Path(".distci/runs"),
    tests: list[str] | None = None,
    keyword: str | None = None,
    tier: str | None = None,
    extra_pytest_args: list[str] | None = None,
    external_suites: Path = EXTERNAL_SUITES,
    log: Log = print,
) -> CellRun:
    externals = external_plan(cell, tests or [], external_suites)  # a bad selection fails before any run
    info, run_dir = start_run(cell, runs_root, tier=tier, log=log)
    try:
        env = provision(cell, run_dir, log=log)
    except (InfraError, SourceError, ConfigError) as exc:
        log(f"[{cell.id}] infra: {exc}")
        return infra_run(cell, info, run_dir, exc, run_dir / "provision.log")
    return run_in_env(cell, Path(env.python), info, run_dir, tests=tests, keyword=keyword, tier=tier,
                      extra_pytest_args=extra_pytest_args, external_suites=external_suites, externals=externals,
                      log=log)


def run_in_env(
    cell: Cell,
    python: Path,
    info: RunInfo,
    run_dir: Path,
    *,
    tests: list[str] | None = None,
    keyword: str | None = None,
    tier: str | None = None,
    extra_pytest_args: list[str] | None = None,
    external_suites: Path = EXTERNAL_SUITES,
    externals: list[str] | None = None,
    log: Log = print,
) -> CellRun:
    """Run a started cell's suites with `python` (its environment's): pytest, then its external suites.

    `tests` may mix pytest node ids and external test ids (``external/<suite>/...``, globs
    allowed); given only one kind, only that runner runs. `externals` is the plan made by
    `external_plan` (made here when not given).
    """
    native, external = split_tests(tests or [])
    if externals is None:
        externals = external_plan(cell, tests or [], external_suites)
    if native or not external:
        cmd = pytest_command(cell, python, run_dir, info.run_id, tests=native, keyword=keyword,
                             extra_args=extra_pytest_args or [])
        info.command = shlex.join(cmd)
        child_env = {**os.environ, **cell_environment(cell, tier)}
        child_env.pop("PYTHONPATH", None)
        log(f"[{cell.id}] $ {info.command}")
        with open(run_dir / "pytest.log", "w") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1)
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                log(f"[{cell.id}] {line.rstrip()}")
            code = proc.wait()
        run = finish_run(cell, info, run_dir, code)
        if not externals:
            return run
    run_external_suites(cell, python, info, run_dir, externals, select=external, keyword=keyword,
                        suites_path=external_suites, log=log)
    info.ended_at = _now()
    _write_info(run_dir, info)
    results_file = run_dir / RESULTS_FILE
    return CellRun(info, run_dir, list(read_results(results_file)) if results_file.exists() else [])


def split_tests(tests: list[str]) -> tuple[list[str], list[str]]:
    """(pytest node ids, external test ids): the two runners of a cell take their own."""
    external = [t for t in tests if t.startswith(EXTERNAL_PREFIX)]
    return [t for t in tests if t not in external], external


def external_plan(cell: Cell, tests: list[str], suites_path: Path = EXTERNAL_SUITES) -> list[str]:
    """The external suites a run of `cell` runs: all of the cell's when no test is selected,
    else those the selected ``external/<suite>/...`` ids name (none for pytest ids only).

    An explicit external id may name any declared suite (a repro, a bisect probe), not
    only the cell's; a name declared nowhere is a SelectionError.
    """
    if not tests:
        return list(cell.external)
    _, selection = split_tests(tests)
    if not selection:
        return []
    declared = [s.name for s in load_suites(suites_path)]
    chosen: list[str] = []
    for pattern in selection:
        name = pattern[len(EXTERNAL_PREFIX):].split("/", 1)[0].split("::", 1)[0]
        matched = [n for n in declared if fnmatch.fnmatchcase(n, name)]
        if not matched:
            close = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SelectionError(f"--test {pattern}: no external suite '{name}'{hint}; declared: "
                                 f"{', '.join(declared)}", where=str(suites_path))
        chosen += [n for n in matched if n not in chosen]
    return chosen


def _external_select(selection: list[str], names: list[str]) -> list[str]:
    """The runner's patterns: a bare ``external/<suite>`` (an infra repro) selects the whole suite."""
    return [f"{p}/*" if p in {EXTERNAL_PREFIX + n for n in names} else p for p in selection]


def run_external_suites(cell: Cell, python: Path, info: RunInfo, run_dir: Path, names: list[str], *,
                        select: list[str], keyword: str | None, suites_path: Path = EXTERNAL_SUITES,
                        log: Log = print) -> list[Result]:
    """Run the named external suites in the cell's environment; their Results join the run's.

    The runner appends to the run's results.jsonl and rewrites junit.xml from all of it,
    so pytest's records stay. distci-fixes is installed in the cell environment, so the
    fixes load in every launch by their entry point as in the cell's pytest run; no
    extra fix package is laid over it. Whatever stops the suites from running at all
    becomes one `infra` Result per suite, never a lost run.
    """
    from .external.runner import ExternalRun, run_external  # the harness's launch machinery: load on use

    try:
        declared = {s.name: s for s in load_suites(suites_path)}
        missing = [n for n in names if n not in declared]
        if missing:
            raise ConfigError(f"external suite {', '.join(missing)} is not declared", where=str(suites_path))
        suites: list[SuiteSpec] = [declared[n] for n in names]
        registry = REPO / "suites" / "known_issues.toml"
        run = ExternalRun(run_dir=run_dir, run_id=info.run_id, cell_id=cell.id, device_type=cell.accelerator,
                          python=str(python), fixes=cell.fixes, select=_external_select(select, names),
                          keyword=keyword, known_issues=registry if registry.exists() else None,
                          unset_env=("PYTHONPATH",))
        log(f"[{cell.id}] external suites: {', '.join(names)}")
        return run_external(suites, run, world_size=cell.world_size, log=lambda m: log(f"[{cell.id}] {m}"))
    except (InfraError, SourceError, ConfigError) as exc:
        log(f"[{cell.id}] infra: external {', '.join(names)}: {exc}")
        writer = ResultWriter(run_dir)
        stack = _read_stack(run_dir)
        results = [infra_result(info.run_id, cell, exc, None, test_id=f"{EXTERNAL_PREFIX}{n}", stack=stack)
                   for n in names]
        for result in results:
            writer.write(result)
        write_junit(read_results(writer.path), run_dir / JUNIT_FILE, suite_name=cell.id)
        return results


def stack_inputs(cell: Cell, python: str = sys.executable) -> tuple[list, list[str], list[str]]:
    """A cell's resolved sources, its requirement lines and pip arguments: what keys its wheelhouse."""
    config = IndexConfig.from_env()
    sources = resolve_sources(cell.sources, config, variant=cell.variant, python=python)
    reqs = requirement_lines(sources) + list(cell.requirements) + list(HARNESS_REQUIREMENTS)
    return sources, reqs, pip_args(sources, config, variant=cell.variant)


def provision(cell: Cell, run_dir: Path, *, log: Log = print):
    """Wheelhouse (download once) + venv (install offline) + distci's own wheels."""
    sources, reqs, args = stack_inputs(cell)
    started = time.monotonic()
    wheelhouse = ensure_wheelhouse(reqs, args, log=lambda m: log(f"[{cell.id}] {m}"))
    own = build_all(Path(".distci") / "selfwheels", log=lambda m: log(f"[{cell.id}] {m}"))
    env = ensure_env(cell, wheelhouse, extra_wheels=own, log=lambda m: log(f"[{cell.id}] {m}"))
    log(f"[{cell.id}] environment ready in {time.monotonic() - started:.1f}s: {env.path}")
    (run_dir / "provision.json").write_text(json.dumps({
        "wheelhouse": str(wheelhouse.path), "wheelhouse_key": wheelhouse.key, "env": str(env.path),
        "sources": {s.package: {"declared": s.declared, "resolved": getattr(s, "resolved", None)} for s in sources},
        "requirements": reqs, "pip_args": [redact_url(a) if "://" in a else a for a in args]}, indent=1))
    return env


def _read_stack(run_dir: Path) -> dict | None:
    """The Stack the run's pytest captured (stack.json), if it got that far."""
    try:
        return json.loads((run_dir / STACK_FILE).read_text())
    except (OSError, ValueError):
        return None


def _write_info(run_dir: Path, info: RunInfo) -> None:
    tmp = run_dir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(info), indent=1, sort_keys=True))
    tmp.replace(run_dir / RUN_FILE)

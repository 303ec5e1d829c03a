"""A cell run's external suites: which upstream suites a selection names, and running them
after pytest into the same run directory (distci.external does the work).
"""

from __future__ import annotations

import difflib
import fnmatch
from pathlib import Path
from typing import Callable

from distci.cells import Cell
from distci.errors import ConfigError, InfraError, SelectionError, SourceError
from distci.external.spec import CHECKOUT_SUITES, SuiteSpec, load_suites
from distci.provision.selfwheels import REPO
from distci.results import Result
from distci.run.infra import infra_result
from distci.run.fitting import cell_tag
from distci.rundir import RunDir, RunInfo

Log = Callable[[str], None]
EXTERNAL_PREFIX = "external/"


def split_tests(tests: list[str]) -> tuple[list[str], list[str]]:
    """(pytest node ids, external test ids): the two runners of a cell take their own."""
    external = [t for t in tests if t.startswith(EXTERNAL_PREFIX)]
    return [t for t in tests if t not in external], external


def external_plan(cell: Cell, tests: list[str], suites_path: Path = CHECKOUT_SUITES) -> list[str]:
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
                        select: list[str], keyword: str | None, suites_path: Path = CHECKOUT_SUITES,
                        log: Log = print) -> list[Result]:
    """Run the named external suites in the cell's environment; their Results join the run's.

    The runner appends to the run's results.jsonl and rewrites junit.xml from all of it,
    so pytest's records stay. distci-fixes is installed in the cell environment, so the
    fixes load in every launch by their entry point as in the cell's pytest run; no
    extra fix package is laid over it. Whatever stops the suites from running at all
    becomes one `infra` Result per suite, never a lost run.
    """
    from distci.external.runner import ExternalRun, run_external  # the harness's launch machinery: load on use

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
        log(f"{cell_tag(cell.id)}external suites: {', '.join(names)}")
        return run_external(suites, run, world_size=cell.world_size, log=lambda m: log(f"{cell_tag(cell.id)}{m}"))
    except (InfraError, SourceError, ConfigError) as exc:
        log(f"{cell_tag(cell.id)}infra: external {', '.join(names)}: {exc}")
        rundir = RunDir(run_dir)
        stack = rundir.read_stack()
        results = [infra_result(info.run_id, cell, exc, None, test_id=f"{EXTERNAL_PREFIX}{n}", stack=stack)
                   for n in names]
        if err := rundir.append_closing(results, cell.id):  # a full disk: the summary still says infra
            log(f"[{cell.id}] {err}")
        return results

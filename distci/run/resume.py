"""Resuming a cell run that stopped part-way (`distci run --resume RUN_DIR`).

A nightly cell takes half an hour or more; a runner that is taken back, a session that
ends or a Ctrl-C stops it with part of the tier done. Every finished test's Result is
already on disk, so the rest is what is left to run: the same selection (tier, `-k`,
`--test`, `--shard`) minus the tests that have a result in the runs named. A test whose
result is `infra` (the one in flight when the run stopped, a pool that did not start)
has no answer yet and runs again. The resumed run is a run of its own, narrowed (its
selection says which runs it resumes); `distci report` over all of them keeps each
test's latest result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from distci.errors import ConfigError
from distci.rundir import RunContents, RunDirError, read_run

RESUME_PREFIX = "--resume "
DONE_FILE = "resume-done.txt"


def split_resume(selection: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the run's own selection, the ids of the runs it resumes) from run.json's selection."""
    own, resumed = [], []
    for part in selection:
        (resumed if part.startswith(RESUME_PREFIX) else own).append(part)
    return own, [part[len(RESUME_PREFIX):] for part in resumed]


def has_answer(result) -> bool:
    """Whether a Result answers its test: anything but an infra failure or an error
    (the harness's words for "the test did not get to say"), or a timeout the runner's load
    caused (saturated, the ranks still computing) that was not run again with a longer budget."""
    if result.failure_kind == "infra" or result.outcome == "error":
        return False
    load = getattr(result, "load", None) or {}
    slowed = result.failure_kind in ("timeout", "hang") and load.get("saturated") and load.get("progressing")
    return not (slowed and "retried_with_s" not in load)


def read_resumed(run_dirs: Iterable[str | Path], cell_id: str) -> list[RunContents]:
    """The runs to resume, each checked to be a run of `cell_id` (a run of another cell
    answers nothing about this one: an error naming both, not a silent skip)."""
    runs = []
    for d in run_dirs:
        if not Path(d).is_dir():
            raise RunDirError("no such run directory (give a run's directory under the runs root)", Path(d))
        run = read_run(Path(d))
        if run.info.cell_id != cell_id:
            raise RunDirError(f"is a run of cell {run.info.cell_id}, not of {cell_id}; "
                              f"--resume takes runs of the cell it runs", Path(d))
        runs.append(run)
    return runs


def check_same_stack(runs: Sequence[RunContents], sources: Sequence, installed: str | None) -> None:
    """Refuse to resume runs of another stack: a cell id does not pin one (an `installed`
    cell is whatever the interpreter has; `--python` can name another), and answers of
    torch 2.10 say nothing about 2.12. Checked before anything is provisioned, against the
    interpreter's installed versions (`installed`) or a release's specifier; a source that
    resolves only at run time (nightly, latest, git) is not checked here."""
    for source in sources:
        seen = {public(run.stack.get(source.package)) for run in runs} - {None}
        if len(seen) > 1:
            raise ConfigError(f"--resume: the runs named ran {source.package} {' and '.join(sorted(seen))}; "
                              f"resume the runs of one stack")
        if not seen:
            continue
        (theirs,) = seen
        if installed is not None:
            from distci.provision.envs import probe_installed  # not at import: the gate imports this module

            here = public(probe_installed(installed, [source.package]).versions.get(source.package))
            if here is not None and here != theirs:
                raise ConfigError(f"--resume: the runs named ran {source.package} {theirs}; {installed} has {here}: "
                                  f"their answers are not this stack's")
        elif source.kind in ("release", "test") and source.spec and Version(theirs) not in SpecifierSet(source.spec):
            raise ConfigError(f"--resume: the runs named ran {source.package} {theirs}, outside this cell's "
                              f"{source.package} {source.spec}")


def public(version: str | None) -> str | None:
    """A version without its local part (2.10.0+cu128 -> 2.10.0): the wheel's build, not the release."""
    try:
        return Version(version).public if version else None
    except InvalidVersion:
        return version


def done_tests(runs: Iterable[RunContents]) -> set[str]:
    """Test ids with an answer in any of `runs`: the ones a resumed run leaves out."""
    return {r.test_id for run in runs for r in run.results if has_answer(r)}


def write_done(run_dir: Path, done: set[str]) -> Path:
    """The done list beside the resumed run's results (the harness deselects from it)."""
    path = Path(run_dir) / DONE_FILE
    path.write_text("".join(f"{t}\n" for t in sorted(done)))
    return path


def latest_results(runs: Iterable[RunContents]) -> tuple[list, int]:
    """Each test's result from the latest run that answers it (else its latest result of
    any kind), and how many results that leaves out: one page of a resumed cell counts
    every test once."""
    ordered = sorted(runs, key=lambda run: run.info.started_at)
    chosen: dict[str, object] = {}
    total = 0
    for run in ordered:
        for r in run.results:
            total += 1
            held = chosen.get(r.test_id)
            if held is None or has_answer(r) or not has_answer(held):
                chosen[r.test_id] = r
    return list(chosen.values()), total - len(chosen)

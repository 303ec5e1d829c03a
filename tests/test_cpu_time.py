"""tests/cpu_time.py and tests/workers.py, run for real on a small suite of their own: under
pytest-xdist the figures are still each test's process tree, a line per file comes as the file
ends, each tier is totalled, and the heaviest file is handed out first."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO
from workers import SHARED, scope_of

pytestmark = pytest.mark.slow  # pytest runs with their own workers

CONFTEST = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import pytest
    sys.path.insert(0, {tests!r})
    from cpu_time import CpuTime

    def pytest_addoption(parser):
        parser.addoption("--cpu-report", type=Path, default=None)

    def pytest_configure(config):
        config.pluginmanager.register(CpuTime(config, config.getoption("--cpu-report")), "cpu-time")

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(config, log):
        from workers import make_scheduler
        return make_scheduler(config, log, json.loads((Path(__file__).parent / "weights.json").read_text()))
""")

BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass"

FILES = {
    "test_light.py": """
        def test_one(): pass
        def test_two(): pass
    """,
    "test_heavy.py": f"""
        import subprocess, sys, pytest
        @pytest.mark.slow
        def test_a_child_burns_cpu():
            subprocess.run([sys.executable, "-c", {BURN.format(s=0.6)!r}], check=True)
        @pytest.mark.docker
        def test_no_daemon():
            pytest.skip("no daemon here")
        def test_fails():
            assert False
    """,
}


def _suite(tmp_path: Path, weights: dict[str, float]) -> Path:
    root = tmp_path / "suite"
    root.mkdir()
    (root / "conftest.py").write_text(CONFTEST.format(tests=str(REPO / "tests")))
    (root / "weights.json").write_text(json.dumps(weights))
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: s\n    docker: d\n    long: l\n")
    for name, body in FILES.items():
        (root / name).write_text(textwrap.dedent(body))
    return root


def _run(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = root / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--cpu-report={report}", *args],
                          cwd=root, capture_output=True, text=True, timeout=300)
    return proc, json.loads(report.read_text())


@pytest.mark.parametrize("workers", ["2", "0"])
def test_each_tier_and_each_tests_tree_are_counted_on_workers_and_in_one_process(tmp_path, workers):
    root = _suite(tmp_path, {"test_heavy.py": 10.0})
    proc, report = _run(root, "-n", workers, "--dist", "loadfile")
    assert proc.returncode == 1, proc.stdout[-3000:]
    tiers = {name: {k: n for k, n in t["outcomes"].items() if n} for name, t in report["tiers"].items()}
    assert tiers == {"quick": {"passed": 2, "failed": 1}, "slow": {"passed": 1}, "docker": {"skipped": 1}}
    costs = {t["nodeid"]: t for t in report["tests"]}
    burner = costs["test_heavy.py::test_a_child_burns_cpu"]
    assert burner["cpu_s"] >= 0.5 and burner["tier"] == "slow", burner  # the child's CPU, in the worker's tree
    assert report["total_cpu_s"] >= sum(t["cpu_s"] for t in report["tests"]), report["total_cpu_s"]  # workers included
    assert report["workers"] == int(workers)
    per_file = [line for line in proc.stdout.splitlines() if "_light.py: " in line or "_heavy.py: " in line]
    if workers == "0":
        assert per_file == [], "a serial run has pytest's own line per file"
    else:  # each file's line as it ends: its worker, its outcomes, its CPU
        assert sorted(line.split("] ", 1)[1].split(";")[0] for line in per_file) == [
            "test_heavy.py: 1 passed, 1 failed, 1 skipped", "test_light.py: 2 passed"], proc.stdout[-3000:]
        assert all(line.startswith("[gw") for line in per_file)


@pytest.mark.parametrize("heaviest", ["test_heavy.py", "test_light.py"])
def test_the_heaviest_file_is_handed_out_first(tmp_path, heaviest):
    root = _suite(tmp_path, {heaviest: 50.0})
    _, report = _run(root, "-n", "1", "--dist", "loadfile")
    assert report["tests"][0]["nodeid"].startswith(heaviest), [t["nodeid"] for t in report["tests"]]


def test_files_that_share_a_daemon_share_a_worker():
    assert {scope_of(f"{path}::test_x") for path in SHARED} == set(SHARED.values())
    assert scope_of("tests/test_cellrun.py::test_x[a::b]") == "tests/test_cellrun.py"
    assert all((REPO / path).exists() for path in SHARED), "a file named in SHARED was renamed or removed"


BURN_THEN_WAIT = BURN.format(s=0.8) + "\nprint('burned', flush=True)\ntime.sleep(600)"
SHARED_CHILD = f"""
    import subprocess, sys, pytest

    @pytest.fixture(scope="module")
    def child():
        proc = subprocess.Popen([sys.executable, "-c", {BURN_THEN_WAIT!r}], stdout=subprocess.PIPE, text=True)
        yield proc
        proc.kill()
        proc.wait()

    @pytest.mark.slow
    def test_it_burns_while_a_slow_test_runs(child):
        assert child.stdout.readline().strip() == "burned"

    def test_the_last_test_reaps_it(child):
        pass
"""


def test_a_module_fixtures_child_is_charged_once_though_a_quick_test_reaps_it(tmp_path):
    """A module fixture's process (the ops tests' shared session) burns while a slow test runs,
    which charges it by walking the tree; the last test, quick, reaps it at the module's
    teardown: it must be charged what the child used during it, not the child's whole life."""
    root = tmp_path / "suite"
    root.mkdir()
    (root / "conftest.py").write_text(CONFTEST.format(tests=str(REPO / "tests")))
    (root / "weights.json").write_text("{}")
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: s\n    docker: d\n    long: l\n")
    (root / "test_shared_child.py").write_text(textwrap.dedent(SHARED_CHILD))
    proc, report = _run(root, "-n", "0")
    assert proc.returncode == 0, proc.stdout[-3000:]
    costs = {t["nodeid"].split("::")[1]: t["cpu_s"] for t in report["tests"]}
    assert costs["test_it_burns_while_a_slow_test_runs"] >= 0.6, costs
    assert costs["test_the_last_test_reaps_it"] < 0.4, costs  # its whole life again would be >= 0.8

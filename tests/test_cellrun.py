"""The core loop end to end: provision a real cell env, run a suite, record results."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

DEFAULT_CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"


def distci(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distci", *args], cwd=cwd, capture_output=True, text=True, timeout=1500
    )


def test_default_cell_runs_and_records_provenance(tmp_path):
    proc = distci(
        "run",
        "--cell",
        DEFAULT_CELL,
        "--runs-root",
        str(tmp_path),
        "--test",
        "tests/harness_cases/test_trivial.py::test_trivial[3]",
        "--test",
        "tests/harness_cases/test_basic.py::test_rank_assert",
    )
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "distci results" in proc.stdout and DEFAULT_CELL in proc.stdout
    (run_dir,) = tmp_path.iterdir()
    records = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert {r["test_id"].split("::")[-1]: r["outcome"] for r in records} == {
        "test_trivial[3]": "passed",
        "test_rank_assert": "failed",
    }
    for r in records:
        assert r["cell_id"] == DEFAULT_CELL
        assert r["stack"]["torch"].startswith("2.13.0")
        assert len(r["stack"]["torch_git"]) == 40
        assert r["stack"]["torchao"] == "0.18.0"
        assert r["stack"]["fixes_mode"] == "all"
    failed = next(r for r in records if r["outcome"] == "failed")
    assert failed["failure_kind"] == "assert"
    assert (
        failed["repro"]
        == f"nox -s dist_tests -- --cell {DEFAULT_CELL} --test tests/harness_cases/test_basic.py::test_rank_assert"
    )
    assert "repro:" in proc.stdout
    junit = ET.parse(run_dir / "junit.xml").getroot()
    assert junit.find("testsuite").get("failures") == "1"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["cell_id"] == DEFAULT_CELL and info["pytest_exit"] == 1 and info["ended_at"]


def test_unresolvable_cell_is_infra_not_failure(tmp_path):
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        'schema = 1\n[accelerators.cpu]\nbackend = "gloo"\nrunner = ["ubuntu-latest"]\n'
        'archs = ["x86_64"]\nvariants = ["cpu"]\n[tiers.pr]\n[[matrix]]\naccelerator = "cpu"\ntorch = "0.0.1"\ntorchao = "0.18.0"\ntiers = ["pr"]\n'
    )
    cell = DEFAULT_CELL.replace("torch_2.13.0", "torch_0.0.1")
    proc = distci("--matrix", str(matrix), "run", "--cell", cell, "--runs-root", str(tmp_path / "runs"))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    (record,) = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert record["cell_id"] == cell
    assert record["outcome"] == "error" and record["failure_kind"] == "infra"
    assert record["stack"]["partial"] is True and record["stack"]["declared"]["torch"] == "0.0.1"
    assert "torch==0.0.1" in record["message"]
    # The one-line message names pip's cause, and the log it points at exists.
    assert "torch==0.0.1" in record["message"].splitlines()[0] and "ERROR:" in record["message"].splitlines()[0]
    assert Path(record["log_path"]).is_file() and "torch==0.0.1" in Path(record["log_path"]).read_text()


INSTALLED_MATRIX = (
    'schema = 1\n[accelerators.cpu]\nbackend = "gloo"\nrunner = ["ubuntu-latest"]\n'
    'archs = ["x86_64"]\nvariants = ["cpu"]\n[tiers.pr]\n[tiers.nightly]\n[[matrix]]\naccelerator = "cpu"\n'
    'torch = "installed"\ntorchao = "installed"\nfixes = "off"\ntiers = []\n'
)
INSTALLED_CELL = "cpu-cpu-torch_installed-ao_installed-ws2-fix_off"
TRIVIAL = [f"tests/harness_cases/test_trivial.py::test_trivial[{i}]" for i in (1, 2, 3)]
NIGHTLY_TEST = ("suites/regressions/test_pytorch174727_embedding_backward_cache.py::"
                "test_a_second_sharded_embedding_gets_its_own_gradient_shape[control]")


def installed_argv(matrix: Path, runs: Path, *tests: str) -> list[str]:
    """`distci run` of the installed cell on this interpreter, as a printed repro reads."""
    return ["--matrix", str(matrix), "run", "--cell", INSTALLED_CELL, "--python", sys.executable,
            "--runs-root", str(runs), *(a for t in tests for a in ("--test", t))]


@pytest.fixture(scope="module")
def installed_run(tmp_path_factory) -> dict:
    """One cell run on this interpreter's installed stack, of test_trivial[3] and a nightly-tier
    test named with --test: what the installed-stack test and the printed-repro test read, and
    the stopped run the resume test continues (a cell run each was ~8-10 CPU-s of controller,
    selection check, pytest and rank pool)."""
    root = tmp_path_factory.mktemp("installed")
    matrix = root / "matrix.toml"
    matrix.write_text(INSTALLED_MATRIX)
    proc = distci(*installed_argv(matrix, root / "runs", TRIVIAL[2], NIGHTLY_TEST))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (run_dir,) = (root / "runs").iterdir()
    records = {r["test_id"]: r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}
    return {"proc": proc, "matrix": matrix, "runs": root / "runs", "run_dir": run_dir, "records": records}


def test_installed_stack_runs_through_distci_run(installed_run):
    """`--python` runs a cell on that interpreter's preinstalled stack: no wheelhouse, the
    stack's sources marked source=installed (here: the test session's own torch)."""
    assert "wheelhouse" not in installed_run["proc"].stdout
    record = installed_run["records"][TRIVIAL[2]]
    assert record["outcome"] == "passed" and record["stack"]["fixes_mode"] == "none"
    import torch

    sources = record["stack"]["sources"]
    assert sources["torch"] == {"declared": "installed", "kind": "installed", "resolved": torch.__version__,
                                "source": "installed", "python": sys.executable}
    assert record["stack"]["torch"] == torch.__version__
    assert json.loads((installed_run["run_dir"] / "run.json").read_text())["backend"] == "installed"


def test_a_printed_repro_runs_its_nightly_test(installed_run):
    """Every failure prints `--cell C --test ID` (rundir.repro_line: no tier). Pasted for a
    nightly test, it must run that test: a named test runs whatever its tier (the module's
    run names one beside an untiered test), while an explicit `--tier pr` still narrows to
    the pr tier (and says it selected nothing)."""
    assert sorted(installed_run["records"]) == sorted([TRIVIAL[2], NIGHTLY_TEST])
    assert installed_run["records"][NIGHTLY_TEST]["outcome"] == "passed"
    assert json.loads((installed_run["run_dir"] / "run.json").read_text())["tier"] == ""  # no tier filter

    repro = installed_argv(installed_run["matrix"], installed_run["runs"].with_name("narrowed"), NIGHTLY_TEST)
    narrowed = distci(*repro, "--tier", "pr")
    assert narrowed.returncode == 2, narrowed.stdout[-3000:] + narrowed.stderr[-2000:]
    assert "no test selected by --test" in narrowed.stderr


def test_a_resumed_run_runs_only_what_the_stopped_run_left(tmp_path, installed_run):
    """`--resume` continues a run: the same selection, minus the tests the earlier run
    answered. The resumed run says which run it continues, and one report over both counts
    every test once. The stopped run is `installed_run`'s (test_trivial[3] and the nightly
    test answered)."""
    stopped = installed_run["run_dir"]
    argv = installed_argv(installed_run["matrix"], tmp_path / "runs", *TRIVIAL)
    resumed = distci(*argv, "--resume", str(stopped))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    ran = [json.loads(x)["test_id"] for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(ran) == TRIVIAL[:2]
    assert f"--resume {stopped.name}" in json.loads((run_dir / "run.json").read_text())["selection"]
    report = distci("report", str(stopped), str(run_dir), "--title", "t", "--command", "c",
                    "--out", str(tmp_path / "page.md"))
    assert report.returncode == 0, report.stderr
    assert "4 passed;" in (tmp_path / "page.md").read_text()
    # all answered: the same resume again has nothing left to run, which is no error
    again = distci(*argv, "--resume", str(stopped), "--resume", str(run_dir))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert "nothing left to run" in again.stdout


def test_cell_whose_accelerator_is_absent_is_one_infra_result_before_any_download(tmp_path):
    """A CUDA cell on a machine without a GPU: one infra record in seconds, nothing resolved."""
    from distci.run.cellrun import missing_accelerator

    if missing_accelerator("cuda") is None:
        pytest.skip("this machine has a GPU")
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        'schema = 1\n[accelerators.cuda]\nbackend = "nccl"\nrunner = ["gpu"]\narchs = ["x86_64"]\n'
        'variants = ["cu130"]\n[tiers.pr]\n[[matrix]]\naccelerator = "cuda"\ntorch = "0.0.1"\n'
        'torchao = "none"\ntiers = ["pr"]\n'
    )
    started = time.monotonic()
    proc = distci("--matrix", str(matrix), "run", "--tier", "pr", "--runs-root", str(tmp_path / "runs"))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert time.monotonic() - started < 30
    (run_dir,) = (tmp_path / "runs").iterdir()
    (record,) = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert record["failure_kind"] == "infra" and record["test_id"] == "<infra>::" + record["cell_id"]
    assert "cell needs cuda; this runner has none" in record["message"]
    assert not (run_dir / "provision.json").exists()  # torch==0.0.1 was never even resolved
    assert json.loads((run_dir / "run.json").read_text())["ended_at"]


def test_accelerator_detection_reads_device_nodes(tmp_path):
    from distci.run.cellrun import missing_accelerator

    assert missing_accelerator("cpu", dev=tmp_path) is None
    assert missing_accelerator("npu", dev=tmp_path) == "cell needs npu; this runner has none"
    (tmp_path / "davinci0").touch()
    assert missing_accelerator("npu", dev=tmp_path) is None


def test_matrix_json_is_an_actions_include_list():
    proc = distci("matrix", "--json", "--tier", "pr")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [e["cell"] for e in data["include"]] == [DEFAULT_CELL]


def test_bad_matrix_gives_one_line_error(tmp_path):
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((REPO / "matrix.toml").read_text().replace("torchao =", "torchoa =", 1))
    proc = distci("--matrix", str(matrix), "matrix")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "torchoa" in lines[0] and "torchao" in lines[0], proc.stderr


# ----------------------------------------------------------------------------- external suites in a cell run

# A tiny upstream (made by tests/test_external.py's helpers): a pytest file read through
# JUnit, a torchao-style script whose cases need CUDA, and a suite with no sources at all.
EXTERNAL_SUITES = """
schema = 1

[[suite]]
name = "tinyup"
adapter = "torchao"
package = "tinyup"
keep = ["dist"]
timeout = 120

[[suite.case]]
kind = "pytest"
script = "dist/test_junit_style.py"

[[suite.case]]
script = "dist/test_collectives.py"
nproc = 2
requires_accelerator = "cuda"

[[suite]]
name = "nosource"
adapter = "torchao"
package = "torch"
git = "NOWHERE_FOR_DISTCI_TESTS"
keep = ["test"]
"""

EXTERNAL_MATRIX = """
schema = 1
[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64"]
variants = ["cpu"]
[[matrix]]
accelerator = "cpu"
torch = "2.13.0"
torchao = "0.18.0"
suites = ["tests/harness_cases/test_trivial.py::test_trivial[3]"]
external = ["tinyup", "nosource"]
"""


@pytest.fixture
def external_cell(tmp_path, monkeypatch):
    """A cell declaring two external suites, its suites file, and the tiny upstream's sources."""
    from test_external import PYTEST_FILE, SCRIPT, _write

    from distci.external.spec import suite_names
    from distci.matrix import load_matrix

    upstream = tmp_path / "tinyup-src"
    _write(upstream, {"dist/test_junit_style.py": PYTEST_FILE, "dist/test_collectives.py": SCRIPT})
    suites = tmp_path / "external.toml"
    suites.write_text(EXTERNAL_SUITES)
    (tmp_path / "matrix.toml").write_text(EXTERNAL_MATRIX)
    (cell,) = load_matrix(tmp_path / "matrix.toml", external_names=lambda: suite_names(suites)).cells
    monkeypatch.setenv("DISTCI_EXTERNAL_TINYUP", str(upstream))
    for var in ("DISTCI_GIT_NOWHERE_FOR_DISTCI_TESTS", "DISTCI_EXTERNAL_NOSOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DISTCI_EXTERNAL_ROOT", str(tmp_path / "external-cache"))
    return cell, suites


def test_cell_run_records_pytest_and_external_results_together(tmp_path, external_cell):
    """The cell's python (here this one) runs pytest, then the external suites, into one run."""
    from distci.run.cellrun import run_in_env, start_run

    cell, suites = external_cell
    info, run_dir = start_run(cell, tmp_path / "runs", tier="nightly", log=lambda m: None)
    run = run_in_env(cell, Path(sys.executable), info, run_dir, tier="nightly", external_suites=suites,
                     log=lambda m: None)

    records = {r["test_id"]: r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}
    outcomes = {t: (r["outcome"], r["failure_kind"]) for t, r in records.items()}
    junit_style = "external/tinyup/dist/test_junit_style.py::"
    assert outcomes == {
        "tests/harness_cases/test_trivial.py::test_trivial[3]": ("passed", None),
        junit_style + "test_pass": ("passed", None),
        junit_style + "test_fail": ("failed", "assert"),
        junit_style + "test_skip": ("skipped", None),
        junit_style + "TestGroup::test_error": ("failed", "exception"),
        "external/tinyup/dist/test_collectives.py::_test_allreduce_mean": ("skipped", None),
        "external/tinyup/dist/test_collectives.py::_test_rank1_segfault": ("skipped", None),
        "external/tinyup/dist/test_collectives.py::_test_double": ("skipped", None),
        "external/nosource": ("error", "infra"),
    }, {t: r["message"][:300] for t, r in records.items()}
    assert {r["cell_id"] for r in records.values()} == {cell.id}
    assert {r["run_id"] for r in records.values()} == {info.run_id}
    assert records["external/tinyup/dist/test_collectives.py::_test_double"]["message"] == "needs cuda; the cell is cpu"
    assert "no source for the nosource tests" in records["external/nosource"]["message"]
    assert records[junit_style + "test_fail"]["repro"] == (
        f"nox -s dist_tests -- --cell {cell.id} --test {junit_style}test_fail")

    assert sorted(r.test_id for r in run.results) == sorted(records)
    assert run.infra and {r.test_id for r in run.failed} == {junit_style + "test_fail",
                                                             junit_style + "TestGroup::test_error"}
    suite = ET.parse(run_dir / "junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("9", "2", "1")
    info_file = json.loads((run_dir / "run.json").read_text())
    assert info_file["pytest_exit"] == 0 and info_file["ended_at"] and info_file["cell"]["external"] == [
        "tinyup", "nosource"]


def test_external_selection_and_suites_that_cannot_start(tmp_path, external_cell):
    """`--test external/...` picks suites; a suites file gone at run time is `infra`, pytest's results stay."""
    from distci.run.cellrun import start_run
    from distci.run.externals import external_plan, run_external_suites
    from distci.errors import SelectionError
    from distci.results import Result
    from distci.rundir import RunDir

    cell, suites = external_cell
    assert external_plan(cell, [], suites) == ["tinyup", "nosource"]
    assert external_plan(cell, ["suites/test_tp_mlp.py"], suites) == []
    assert external_plan(cell, ["external/nosource", "external/tiny*/dist/x.py::f"], suites) == ["nosource", "tinyup"]
    with pytest.raises(SelectionError, match=r"no external suite 'tinyupp' \(did you mean 'tinyup'\?\)"):
        external_plan(cell, ["external/tinyupp/dist/x.py::f"], suites)

    info, run_dir = start_run(cell, tmp_path / "runs", tier=None, log=lambda m: None)
    RunDir(run_dir).append(Result(run_id=info.run_id, cell_id=cell.id, test_id="suites/test_a.py::test_a",
                                       outcome="passed", stack={"torch": "2.13.0"}))
    added = run_external_suites(cell, Path(sys.executable), info, run_dir, ["tinyup"], select=[], keyword=None,
                                suites_path=tmp_path / "gone.toml", log=lambda m: None)
    assert [(r.test_id, r.outcome, r.failure_kind) for r in added] == [("external/tinyup", "error", "infra")]
    assert added[0].repro == f"nox -s dist_tests -- --cell {cell.id} --test external/tinyup"
    assert "ConfigError" in added[0].message and "gone.toml" in added[0].message
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["test_id"] for x in lines] == ["suites/test_a.py::test_a", "external/tinyup"]
    assert ET.parse(run_dir / "junit.xml").getroot().find("testsuite").get("tests") == "2"

"""External suites on CPU: a tiny "upstream" (made here) run through the adapters end to end.

The upstream is a git repository tagged v1.0.0 with a package `tinyup` (installed here
by its metadata, as a cell would have it installed), torchao-style distributed scripts
run with torchrun on gloo (one function passes, one fails an assertion, one crashes a
rank, one needs 4 ranks), a pytest file read
through JUnit, and a torchtitan-style integration runner. A third-party fix package, built here, registers
a fix through the `distci.fixes` entry point; the same upstream test passes with fixes
on and fails with them off, which is how a team validates its patch against upstream.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distci.errors import ConfigError
from distci.external import readers
from distci.external.runner import ExternalRun, run_external
from distci.external.spec import load_suites
from distci.rundir import parse_results

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make the tiny upstream repository")

SCRIPT = '''
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def setup_distributed():
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    torch.manual_seed(1)
    return mesh


def _test_allreduce_sum(mesh):
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), 3.0)), t


def _test_allreduce_mean(mesh):
    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert t[0].item() == 1.5, f"mean over ranks is {t[0].item()} on rank {dist.get_rank()}, expected 1.5"


def _test_rank1_segfault(mesh):
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()


def _test_sleep(mesh):
    print(f"sleeping: rank {dist.get_rank()}", flush=True)  # the stop test waits for both lines
    time.sleep(600)


def _test_double(mesh):
    from tinyup import ops

    got = torch.tensor([float(ops.double(3))])
    dist.all_reduce(got)
    assert got.item() == 12.0, f"double(3) is {ops.double(3)}"


if __name__ == "__main__":
    mesh = setup_distributed()
    tests = [_test_allreduce_mean, _test_rank1_segfault, _test_double]
    for test in tests:
        test(mesh)
'''

PYTEST_FILE = '''
import pytest


def test_pass():
    assert 1 + 1 == 2


def test_fail():
    assert [1, 2] == [1, 3], "lists differ at 0x7f00aa"


@pytest.mark.skip(reason="needs 8 GPUs")
def test_skip():
    pass


class TestGroup:
    def test_error(self):
        raise RuntimeError("boom")
'''

# A torchtitan-shaped upstream: OverrideDefinitions, a group list, the runner, run_train.sh.
TT_INIT = '''
from dataclasses import dataclass
from typing import Sequence


@dataclass
class OverrideDefinitions:
    override_args: Sequence[Sequence[str]] = tuple(tuple(" "))
    test_descr: str = "default"
    test_name: str = "default"
    ngpu: int = 4
    disabled: bool = False
'''
TT_FEATURES = '''
from tests.integration_tests import OverrideDefinitions


def build_features_test_list():
    return [
        OverrideDefinitions([["--steps 3"]], "small run", "small", ngpu=2),
        OverrideDefinitions([["--steps 3"]], "needs four", "four_gpus", ngpu=4),
        OverrideDefinitions([["--steps 3"]], "off for now", "broken_upstream", ngpu=2, disabled=True),
    ]
'''
TT_RUN_TESTS = '''
import argparse
import os
import subprocess

from tests.integration_tests.features import build_features_test_list


def run_single_test(flavor, full_path, output_dir):
    for args in flavor.override_args:
        cmd = f"CONFIG_FILE={full_path} NGPU={flavor.ngpu} ./run_train.sh " + " ".join(args)
        print(f"===== Integration test, flavor : {flavor.test_descr}, command : {cmd}", flush=True)
        if subprocess.run([cmd], shell=True).returncode != 0:
            raise Exception(f"Integration test failed, flavor : {flavor.test_descr}, command : {cmd}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output_dir")
    p.add_argument("--test_suite", default="features")
    p.add_argument("--test_name", default="all")
    p.add_argument("--config_path", default="./cfg.toml")
    p.add_argument("--ngpu", type=int, default=8)
    a = p.parse_args()
    for flavor in build_features_test_list():
        if flavor.test_name == a.test_name and not flavor.disabled and flavor.ngpu <= a.ngpu:
            run_single_test(flavor, a.config_path, a.output_dir)


if __name__ == "__main__":
    main()
'''
TT_RUN_TRAIN = '''#!/bin/sh
set -e
torchrun --nproc_per_node=${NGPU} --tee 3 -m tinytrain "$@"
'''
TT_TRAIN = '''
import os
import sys

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 10
for step in range(1, steps + 1):
    if os.environ["RANK"] == "0":
        print(f"step: {step}  loss: {8.0 - step * 0.5:7.4f}  grad_norm: 1.0", flush=True)
'''

FIX_PACKAGE = '''
from distci_fixes import Applies, Fix


def _detect(ops):
    return ops.double(3) != 6


def _apply(ops):
    ops.double = lambda x: 2 * x


FIX = Fix(
    id="tinyup_double",
    title="tinyup.ops.double squares instead of doubling",
    upstream=(),
    applies=Applies(releases=">=1.0"),
    target="tinyup.ops",
    detect=_detect,
    apply=_apply,
    test="external/tinyup/dist/test_collectives.py::_test_double",
)
'''

SUITES = '''
schema = 1

[[suite]]
name = "tinyup"
adapter = "torchao"
package = "tinyup"
git = "TINYUP"
ref = "v{version}"
keep = ["dist"]
timeout = 120

[[suite.case]]
script = "dist/test_collectives.py"
nproc = 2

[[suite.case]]
script = "dist/test_collectives.py"
nproc = 4
variant = "ws4"
functions = ["_test_allreduce_sum"]

[[suite.case]]
kind = "pytest"
script = "dist/test_junit_style.py"

[[suite]]
name = "tinytitan"
adapter = "torchtitan"
package = "tinyup"
git = "TINYUP"
ref = "v{version}"
keep = ["run_train.sh", "tinytrain.py", "tests", "cfg.toml", "losses.txt"]
timeout = 120
upstream = ["features"]

[[suite]]
name = "tinysleep"
adapter = "torchao"
package = "tinyup"
git = "TINYUP"
ref = "v{version}"
keep = ["dist"]
timeout = 300

[[suite.case]]
script = "dist/test_collectives.py"
nproc = 2
variant = "sleep"
functions = ["_test_sleep"]
'''


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """The tiny upstream repository (tag v1.0.0), its installed package, and a fix package."""
    base = tmp_path_factory.mktemp("external")
    repo = base / "tinyup-repo"
    _write(repo, {
        "tinyup/__init__.py": "",
        "tinyup/ops.py": "def double(x):\n    return x * x\n",
        "dist/test_collectives.py": SCRIPT,
        "dist/test_junit_style.py": PYTEST_FILE,
        "tests/__init__.py": "",
        "tests/integration_tests/__init__.py": TT_INIT,
        "tests/integration_tests/features.py": TT_FEATURES,
        "tests/integration_tests/run_tests.py": TT_RUN_TESTS,
        "run_train.sh": TT_RUN_TRAIN,
        "tinytrain.py": TT_TRAIN,
        "cfg.toml": "",
        "losses.txt": "1 7.5\n2 7.0\n3 6.5\n",
    })
    (repo / "run_train.sh").chmod(0o755)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "tinyup 1.0.0")
    _git(repo, "tag", "v1.0.0")
    # The package as a cell has it installed: the module plus its metadata.
    site = base / "site"
    shutil.copytree(repo / "tinyup", site / "tinyup")
    (site / "tinyup-1.0.0.dist-info").mkdir()
    (site / "tinyup-1.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyup\nVersion: 1.0.0\n")
    team = base / "team-fixes"
    _write(team, {
        "pyproject.toml": textwrap.dedent('''
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "team-fixes"
            version = "0.1.0"
            [project.entry-points."distci.fixes"]
            tinyup_double = "team_fixes:FIX"
            [tool.setuptools]
            packages = ["team_fixes"]
            '''),
        "team_fixes/__init__.py": FIX_PACKAGE,
    })
    suites = base / "external.toml"
    suites.write_text(textwrap.dedent(SUITES))
    return {"base": base, "repo": repo, "site": site, "team": team, "suites": suites}


def _run(upstream, monkeypatch, name: str, *, fixes: str, select=(), suites=None):
    monkeypatch.setenv("DISTCI_GIT_TINYUP", str(upstream["repo"]))
    monkeypatch.setenv("PYTHONPATH", str(upstream["site"]))
    monkeypatch.delenv("DISTCI_EXTERNAL_TINYUP", raising=False)
    run_dir = upstream["base"] / "runs" / name
    run = ExternalRun(run_dir=run_dir, run_id=name, cell_id="cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_" + fixes,
                      device_type="cpu", python=sys.executable, fixes=fixes,
                      fix_packages=[REPO / "fixes", upstream["team"]], select=select,
                      cache_root=upstream["base"] / "cache")
    chosen = [s for s in load_suites(upstream["suites"])
              if (s.name in suites if suites is not None else s.name != "tinysleep")]
    run_external(chosen, run, world_size=2, log=lambda m: None)
    return {r.test_id: r for r in list(parse_results(run_dir))}, run_dir


def _fixes_ready() -> str:
    pkg = REPO / "fixes" / "distci_fixes"
    for needed in ("__init__.py", "_autoload.py", "engine.py"):
        if not (pkg / needed).exists():
            return f"fixes/distci_fixes/{needed} is not written yet"
    return ""


@pytest.mark.slow
def test_upstream_suite_becomes_results(upstream, monkeypatch):
    if _fixes_ready():
        pytest.skip(_fixes_ready())
    results, run_dir = _run(upstream, monkeypatch, "on", fixes="on")
    ids = "external/tinyup/dist/test_collectives.py::"
    cell = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"

    ok = results[ids + "_test_double"]  # passes because the team's fix is on (see the next test)
    assert ok.outcome == "passed" and ok.failure_kind is None, ok.message
    assert ok.repro == f"nox -s dist_tests -- --cell {cell} --test {ids}_test_double"
    assert ok.stack.torch and ok.stack.extra["external"]["tinyup"]["ref"] == "v1.0.0"
    assert len(ok.stack.extra["external"]["tinyup"]["commit"]) == 40

    wrong = results[ids + "_test_allreduce_mean"]
    assert (wrong.outcome, wrong.failure_kind) == ("failed", "assert")
    assert wrong.error_signature == "AssertionError: mean over ranks is N on rank N, expected N"
    assert {r.rank for r in wrong.ranks} == {0, 1}

    crash = results[ids + "_test_rank1_segfault"]
    assert (crash.outcome, crash.failure_kind) == ("failed", "crash")
    assert crash.error_signature == "RankCrash: rank N killed by SIGSEGV"

    assert ids + "_test_allreduce_sum" not in results  # not in the script's `tests` list
    ws4 = results[ids + "_test_allreduce_sum[ws4]"]
    assert (ws4.outcome, ws4.message) == ("skipped", "needs 4 processes; the cell has 2")

    junit = "external/tinyup/dist/test_junit_style.py::"
    assert results[junit + "test_pass"].outcome == "passed"
    fail = results[junit + "test_fail"]
    assert (fail.outcome, fail.failure_kind, fail.error_signature) == (
        "failed", "assert", "AssertionError: lists differ at 0x?")
    assert results[junit + "test_skip"].outcome == "skipped"
    assert results[junit + "test_skip"].message == "needs 8 GPUs"
    error = results[junit + "TestGroup::test_error"]
    assert (error.failure_kind, error.error_signature) == ("exception", "RuntimeError: boom")

    titan = "external/tinytitan/integration/features::"
    assert results[titan + "small"].outcome == "passed", results[titan + "small"].message
    assert results[titan + "four_gpus"].message == "needs 4 processes; the cell has 2"
    assert results[titan + "broken_upstream"].message.startswith("disabled upstream")

    assert all(r.cell_id == cell and r.run_id == "on" for r in results.values())
    junit_xml = (run_dir / "junit.xml").read_text()
    assert "_test_rank1_segfault" in junit_xml and 'name="failure_kind" value="crash"' in junit_xml
    assert json.loads((run_dir / "stack.json").read_text())["fixes_mode"] == "all"


@pytest.mark.slow
def test_team_fix_is_what_makes_upstream_pass(upstream, monkeypatch):
    """With fixes off, the upstream test the team's fix targets fails as upstream wrote it."""
    if _fixes_ready():
        pytest.skip(_fixes_ready())
    test_id = "external/tinyup/dist/test_collectives.py::_test_double"
    results, _ = _run(upstream, monkeypatch, "off", fixes="off", select=[test_id], suites=["tinyup"])
    assert list(results) == [test_id]
    off = results[test_id]
    assert (off.outcome, off.failure_kind) == ("failed", "assert")
    assert off.error_signature == "AssertionError: double(N) is N"
    assert off.stack.fixes_mode == "none"


def test_loss_check_against_upstream_file():
    expected = {1: 8.13756, 2: 7.84095}
    log = "\x1b[31m[rank0]:step:  1  loss:  8.13756  grad_norm: 1.0\n[rank0]:step:  2  loss:  7.84100\n"
    actual = readers.read_losses(log)
    assert actual == {1: 8.13756, 2: 7.841}
    assert readers.check_losses(actual, expected) == (
        "LossMismatch", "loss at step 2 is 7.841, upstream expects 7.84095 (rtol 0.0)")
    assert readers.check_losses(actual, expected, rtol=1e-3) is None
    assert readers.check_losses({}, None)[0] == "LossMissing"
    assert readers.check_losses({1: float("nan")}, None)[0] == "LossNotFinite"


def test_torchao_skip_convention():
    """torchao disables a test on some torch versions by printing `skipping <name> ...` and returning."""
    from distci.external.adapters.torchao import _skip_line, main_list

    log = "W1130 noise\nskipping _test_dtensor_fp8_autograd for torch >= 2.11.0.dev\n"
    assert _skip_line(log, "_test_dtensor_fp8_autograd") == "skipping _test_dtensor_fp8_autograd for torch >= 2.11.0.dev"
    assert _skip_line(log, "_test_scaled_mm") is None
    assert main_list(SCRIPT) == ["_test_allreduce_mean", "_test_rank1_segfault", "_test_double"]


def test_root_cause_is_read_from_the_failing_rank():
    log = textwrap.dedent("""
        [rank1]:Traceback (most recent call last):
        [rank1]:  File "/x/torchtitan/train.py", line 12, in <module>
        [rank1]:    main()
        [rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
        Traceback (most recent call last):
          File "/x/run.py", line 3, in <module>
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        Root Cause (first observed failure):
        [0]:
          rank      : 1 (local_rank: 1)
          exitcode  : 1 (pid: 77)
        Traceback (most recent call last):
          File "/x/tests/integration_tests/run_tests.py", line 70, in run_single_test
        Exception: Integration test failed, flavor : 2D eager, command : ./run_train.sh
        """)
    combined = readers.command_outcome(1, False, log, 3.0, [])
    assert (combined.outcome, combined.failure_kind) == ("failed", "exception")
    assert combined.signature == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate N GiB"


def test_upstream_ref_follows_what_the_cell_installed():
    from distci.errors import SourceError
    from distci.external.fetch import upstream_ref

    ao = next(s for s in load_suites(REPO / "suites" / "external.toml") if s.name == "torchao")
    assert upstream_ref(ao, {"version": "0.17.0+cu130"}).ref == "v0.17.0"
    assert upstream_ref(ao, {"version": "0.18.0+git1a2b3c4"}).ref == "1a2b3c4"
    assert upstream_ref(ao, {"version": "0.18.0", "commit": "f" * 40}).ref == "f" * 40
    with pytest.raises(SourceError, match="nightly or source build"):
        upstream_ref(ao, {"version": "0.19.0.dev20261120+cu130"})
    assert upstream_ref(ao, {"version": "0.19.0.dev20261120"}, override="abc123").ref == "abc123"


def test_suite_file_mistakes_name_the_suite(tmp_path):
    bad = tmp_path / "external.toml"
    bad.write_text('schema = 1\n[[suite]]\nname = "x"\nadapter = "torchao"\npackage = "torchao"\n'
                   '[[suite.case]]\nscirpt = "a.py"\n')
    with pytest.raises(ConfigError, match=r"\(x\) case #1: unknown key 'scirpt' \(did you mean 'script'\?\)"):
        load_suites(bad)
    bad.write_text('schema = 1\n[[suite]]\nname = "y"\nadapter = "torchtitan"\npackage = "torchtitan"\n'
                   '[[suite.case]]\nscript = "t.py"\n')
    with pytest.raises(ConfigError, match=r"\(y\) case #1: the torchtitan adapter runs cases of kind train"):
        load_suites(bad)
    assert [s.name for s in load_suites(REPO / "suites" / "external.toml")] == ["torchtitan", "torchao"]


@pytest.mark.slow
def test_a_stopped_run_records_the_test_it_was_in(upstream, tmp_path):
    """SIGTERM (a job timeout) mid-test: the test gets an `Interrupted` infra Result, the
    JUnit file is written, the CLI exits 143 and none of the test's processes survive."""
    import signal as sig
    import time
    import uuid

    from conftest import processes_with_env

    token = uuid.uuid4().hex
    env = dict(os.environ, DISTCI_GIT_TINYUP=str(upstream["repo"]), PYTHONPATH=os.pathsep.join(
        [str(upstream["site"]), str(REPO)]), DISTCI_TEST_TOKEN=token)
    env.pop("DISTCI_EXTERNAL_TINYUP", None)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "distci.external", "--suites", str(upstream["suites"]), "run", "--suite", "tinysleep",
         "--device", "cpu", "--fixes", "off", "--run-dir", str(run_dir), "--run-id", "stopped", "--cell-id", "c"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    logs = run_dir / "external" / "logs"

    def sleeping() -> int:
        return sum(p.read_text(errors="replace").count("sleeping: rank ") for p in logs.glob("*_test_sleep*.log"))

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and sleeping() < 2:  # both ranks inside the test
        time.sleep(0.2)
    assert sleeping() == 2, f"the ranks never reached the test's sleep:\n{proc.stdout.read() if proc.poll() is not None else ''}"
    proc.send_signal(sig.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-3000:]
    (stopped,) = list(parse_results(run_dir))
    assert stopped.test_id == "external/tinysleep/dist/test_collectives.py::_test_sleep[sleep]"
    assert (stopped.outcome, stopped.failure_kind) == ("error", "infra"), stopped.message
    assert "stopped (SIGTERM)" in stopped.message and stopped.error_signature == "Interrupted: stopped by SIGTERM"
    assert "_test_sleep" in (run_dir / "junit.xml").read_text()
    deadline = time.monotonic() + 2  # as long as it ever had: gone at once is sooner
    while time.monotonic() < deadline and processes_with_env(token):
        time.sleep(0.1)
    assert processes_with_env(token) == []

"""torch's compiler bisector, driven from outside the failing process.

The repro is the one torch's own test_compiler_bisector.py uses (test_bad_decomp): the
decomposition table inductor hands to AOTAutograd maps `aten.exponential` to a
function returning NaN. Eager is right, every compiled backend from
aot_eager_decomp_partition on is wrong. The bisector, one fresh process per step, must
name that backend, the `decomposition` subsystem, the first application and the op.
It needs no C++ compiler: the failing backend never reaches inductor's codegen.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from distci import cli
from distci.bisect.compiler import compiler_bisect
from distci.bisect.state import BisectError

REPRO = """\
import sys

import torch
import torch._inductor.compile_fx as compile_fx

original = compile_fx.select_decomp_table


def bad_exponential(self, rate=1, generator=None):
    return torch.rand_like(self) * float("nan")


def patched():
    table = dict(original())
    table[torch.ops.aten.exponential.default] = bad_exponential
    return table


compile_fx.select_decomp_table = patched


def f(x):
    return (x + 3).exponential_() * 10.5


out = torch.compile(f)(torch.randn(4, 8))
sys.exit(1 if out.isnan().any() else 0)
"""


@pytest.mark.slow
def test_compiler_bisector_names_backend_subsystem_and_op(tmp_path, monkeypatch, capsys):
    (tmp_path / "repro.py").write_text(REPRO)
    monkeypatch.chdir(tmp_path)
    # starting at aot_eager skips one step (eager) and still crosses a backend boundary
    argv = ["bisect", "--compiler", "--command", "python repro.py", "--compiler-backend", "aot_eager",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--timeout", "300"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "with torch.compile as an identity the command exits 0" in out
    assert "[bisector] run 1: backend=aot_eager subsystem=- -> pass" in out
    assert "[bisector] run 2: backend=aot_eager_decomp_partition subsystem=- -> fail" in out
    report = json.loads(Path(re.search(r"^report: (.+)$", out, re.MULTILINE).group(1)).read_text())
    assert (report["backend"], report["subsystem"], report["bisect_number"]) == (
        "aot_eager_decomp_partition", "decomposition", 1)
    assert "aten.exponential" in report["debug_info"]
    assert report["torch"].startswith("2.") and report["runs"] >= 5


# A fullgraph model whose failure is inductor's: a joint-graph pass is broken (it raises,
# as a pass bug does at compile time). Eager, aot_eager and the decompositions are fine;
# the bisector must name inductor, its `joint_graph_passes` subsystem and the pass.
# fullgraph=True: the pre-check must not depend on TORCH_COMPILE_DISABLE, under which
# torch refuses a fullgraph compile that compiled nothing. One linear layer: inductor
# calls the extern addmm, so the passing runs need no C++ compile (CI time).
PASS_REPRO = """\
import sys

import torch
import torch._inductor.config as inductor_config


def broken_pass(graph):
    raise RuntimeError("broken joint-graph pass")


inductor_config.joint_custom_pre_pass = broken_pass
torch.manual_seed(0)
linear = torch.nn.Linear(8, 8)


@torch.compile(fullgraph=True)
def f(x):
    return linear(x)


x = torch.randn(4, 8)
sys.exit(0 if torch.allclose(f(x), linear(x)) else 1)
"""


@pytest.mark.slow
def test_a_fullgraph_model_with_a_broken_pass_is_inductors(tmp_path, monkeypatch, capsys):
    (tmp_path / "repro.py").write_text(PASS_REPRO)
    monkeypatch.chdir(tmp_path)
    argv = ["bisect", "--compiler", "--command", "python repro.py", "--compiler-backend", "inductor",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--timeout", "300"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "with torch.compile as an identity the command exits 0" in out
    report = json.loads(Path(re.search(r"^report: (.+)$", out, re.MULTILINE).group(1)).read_text())
    assert (report["backend"], report["subsystem"]) == ("inductor", "joint_graph_passes")
    assert report["debug_info"] == "joint_custom_pre_pass"


def test_compiler_bisect_refuses_a_failure_that_is_not_the_compilers(tmp_path):
    with pytest.raises(BisectError, match=r"replaced by an identity \(exit 3\) and with the eager backend"):
        compiler_bisect("exit 3", python=sys.executable, cwd=tmp_path, log=lambda line: None)


PASS_TEST = PASS_REPRO.replace("import sys\n\n", "").split("\nx = torch.randn")[0] + '''

def test_linear_compiles():
    x = torch.randn(4, 8)
    assert torch.allclose(f(x), linear(x))
'''


@pytest.mark.slow
def test_a_test_id_is_bisected_in_the_pr_cells_stack_env(tmp_path, monkeypatch, capsys):
    """`nox -s bisect -- TEST_ID --compiler` from the controller venv (no torch there):
    with no --in-env the failing env is the pr cell's stack env, as its runs build it."""
    from distci.provision.selfwheels import REPO

    (tmp_path / "test_broken_pass.py").write_text(PASS_TEST)
    monkeypatch.chdir(tmp_path)
    # the checkout's caches: the same wheelhouse and env the pr tier's run uses
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(REPO / ".distci" / "wheelhouse"))
    monkeypatch.setenv("DISTCI_ENV_ROOT", str(REPO / ".distci" / "envs"))
    argv = ["bisect", "test_broken_pass.py::test_linear_compiles", "--compiler", "--compiler-backend", "inductor",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--timeout", "300"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"compiler bisect in the stack env of cell cpu-\S+ \(--cell CELL or --in-env VENV", out), out
    report = json.loads(Path(re.search(r"^report: (.+)$", out, re.MULTILINE).group(1)).read_text())
    assert (report["backend"], report["subsystem"]) == ("inductor", "joint_graph_passes"), report
    assert report["python"].startswith(str(REPO / ".distci" / "envs")), report["python"]

"""torch's compiler bisector, driven from outside the failing process.

The repro is the one torch's own test_compiler_bisector.py uses (test_bad_decomp): the
decomposition table inductor hands to AOTAutograd maps `aten.exponential` to a
function returning NaN. Eager is right, every compiled backend from
aot_eager_decomp_partition on is wrong. The bisector, one fresh process per step, must
name that backend, the `decomposition` subsystem, the application and the op. A `python
SCRIPT` command's steps are forks of one step template (distci.bisect.stepfork; what a
fork sees is proven against a new process in tests/test_bisect_stepfork.py), its
confirmation runs new processes.
It needs no C++ compiler: the repro compiles with aot_eager_decomp_partition, the
backend that shows the failure, so its run as it is never reaches inductor's codegen
(with the default backend that run alone compiled five C++ kernels, 14 of the test's
CPU-s); every step's backend is the bisector's whatever the repro names.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from distci import cli
from distci.bisect.compiler import compiler_bisect, drive
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


out = torch.compile(f, backend="aot_eager_decomp_partition")(torch.randn(4, 8))
sys.exit(1 if out.isnan().any() else 0)
"""


# These tests check the mode against real torch: each search step of a script a fork of the
# step template (under a CPU-s), each confirmation run and each step of a test id a new
# interpreter (~5 CPU-s, nearly all imports). The confirmation in real processes (the finding's backend fails
# again, the backend before it passes, the subsystem disabled by environment passes) is proven
# once, by the first test, with one fresh run per side; the other two name what they are about
# without it (2 and 1 runs fewer). The default count (CONFIRM_RUNS, chosen by
# distci.bisect.simulate) is held by
# test_the_compiler_mode_defaults_name_no_wrong_backend_at_a_lie_rate_of_one_in_five below.
ONE_CONFIRM = ("--confirm", "1")
NO_CONFIRM = ("--no-confirm",)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """One working directory for the three bisects: the probes' distci wheels (built under
    the working directory's .distci/, ~3 CPU-s) and the --cache holding them are made once."""
    return tmp_path_factory.mktemp("compiler-bisect")


def bisect_argv(workdir: Path, tmp_path: Path, *args: str) -> list[str]:
    return ["bisect", *args, "--cache", str(workdir / "cache"), "--out", str(tmp_path / "out"), "--timeout", "300"]


@pytest.mark.slow
def test_compiler_bisector_names_backend_subsystem_and_op(workdir, tmp_path, monkeypatch, capsys):
    (workdir / "repro.py").write_text(REPRO)
    monkeypatch.chdir(workdir)
    # starting at aot_eager skips one step (eager) and still crosses a backend boundary
    argv = bisect_argv(workdir, tmp_path, "--compiler", "--command", "python repro.py",
                       "--compiler-backend", "aot_eager", *ONE_CONFIRM)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "with torch.compile as an identity the command exits 0" in out
    assert "[bisector] run 1: backend=aot_eager subsystem=- -> pass" in out
    assert "[bisector] run 2: backend=aot_eager_decomp_partition subsystem=- -> fail" in out
    # each side confirmed by a fresh run, the subsystem disabled through the environment
    for confirm in ("backend=aot_eager_decomp_partition subsystem=- -> fail",
                    "backend=aot_eager subsystem=- -> pass",
                    "backend=aot_eager_decomp_partition subsystem=decomposition disabled -> pass"):
        assert re.search(rf"^\[bisector\] run \d+: confirm: {re.escape(confirm)}", out, re.MULTILINE), out
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
def test_a_fullgraph_model_with_a_broken_pass_is_inductors(workdir, tmp_path, monkeypatch, capsys):
    (workdir / "broken_pass.py").write_text(PASS_REPRO)
    monkeypatch.chdir(workdir)
    argv = bisect_argv(workdir, tmp_path, "--compiler", "--command", "python broken_pass.py",
                       "--compiler-backend", "inductor", *NO_CONFIRM)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "with torch.compile as an identity the command exits 0" in out
    report = json.loads(Path(re.search(r"^report: (.+)$", out, re.MULTILINE).group(1)).read_text())
    assert (report["backend"], report["subsystem"]) == ("inductor", "joint_graph_passes")
    assert report["debug_info"] == "joint_custom_pre_pass"


def test_compiler_bisect_refuses_a_failure_that_is_not_the_compilers(tmp_path):
    with pytest.raises(BisectError, match=r"replaced by an identity \(exit 3\) and with the eager backend"):
        compiler_bisect("exit 3", python=sys.executable, cwd=tmp_path, log=lambda line: None)


TRACED_TEST = """\
import torch


@torch.compile(fullgraph=True, backend="aot_eager")  # no inductor: the run as it is builds no C++ kernel
def double(x):
    # a path only traced code takes (code gated on is_compiling): wrong as soon as Dynamo traces it
    return x + 2 if torch.compiler.is_compiling() else x * 2


def test_double():
    x = torch.randn(4, 8)
    assert torch.allclose(double(x), x * 2)
"""


@pytest.mark.slow
def test_a_test_id_is_bisected_in_the_pr_cells_stack_env(workdir, tmp_path, monkeypatch, capsys):
    """`nox -s bisect -- TEST_ID --compiler` from the controller venv (no torch there):
    with no --in-env the failing env is the pr cell's stack env, as its runs build it.

    What the bisector names is proven by the two tests above; this one proves where a test id
    runs. Its test fails once Dynamo traces it, so from `--compiler-backend eager` the search is
    its first step, unconfirmed (3 runs of the test in all, each a pytest and torchrun: the
    command as it is, the identity pre-check, eager; a broken inductor pass took 10)."""
    from distci.provision.selfwheels import REPO

    (workdir / "test_traced.py").write_text(TRACED_TEST)
    monkeypatch.chdir(workdir)
    # the checkout's caches: the same wheelhouse and env the pr tier's run uses
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(REPO / ".distci" / "wheelhouse"))
    monkeypatch.setenv("DISTCI_ENV_ROOT", str(REPO / ".distci" / "envs"))
    argv = bisect_argv(workdir, tmp_path, "test_traced.py::test_double", "--compiler",
                       "--compiler-backend", "eager", *NO_CONFIRM)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"compiler bisect in the stack env of cell cpu-\S+ \(--cell CELL or --in-env VENV", out), out
    assert "with torch.compile as an identity the command exits 0" in out
    report = json.loads(Path(re.search(r"^report: (.+)$", out, re.MULTILINE).group(1)).read_text())
    assert (report["backend"], report["subsystem"]) == ("eager", None), report
    assert report["culprit"] == "backend eager", report
    assert report["test"] == "test_traced.py::test_double" and "--distci-mode=torchrun" in report["command"], report
    assert report["python"].startswith(str(REPO / ".distci" / "envs")), report["python"]


# -- drive() against a stand-in for torch's bisector (backends only; no torch needed) ------

BACKENDS = ["eager", "aot_eager", "aot_eager_decomp_partition", "aot_eager_decomp_partition_crossref", "inductor"]


class BackendsOnly:
    """torch's CompilerBisector as far as drive() calls it, backends only: do_bisect tries
    the backends in order and names the first whose check fails (torch does the same
    before it looks at subsystems)."""

    backend: str | None = None
    bisection_enabled = False

    @classmethod
    def get_backend(cls):
        return cls.backend

    @classmethod
    def get_subsystem(cls):
        return None

    @classmethod
    def get_run_state(cls, backend, subsystem):
        return None

    @classmethod
    def do_bisect(cls, fn):
        for name in BACKENDS:
            cls.backend = name
            if not fn():
                return SimpleNamespace(backend=name, subsystem=None, bisect_number=None, debug_info=None)
        return None


CB = SimpleNamespace(CompilerBisector=BackendsOnly, BACKENDS={name: [] for name in BACKENDS})
ORIGINAL = "exit 1\nTraceback (most recent call last):\nAssertionError: loss 1.25 != 1.5\n"
OTHER = "exit 1\nTraceback (most recent call last):\ntorch._dynamo.exc.Unsupported: graph break in 3 places\n"


def test_a_backend_is_named_only_where_the_original_failure_is():
    # aot_eager fails otherwise (a crash the user's backend never meets); the original
    # failure starts at aot_eager_decomp_partition
    def run(env):
        at = BACKENDS.index(env["TORCH_BISECT_BACKEND"])
        return (0, "exit 0\n") if at == 0 else (1, OTHER) if at == 1 else (1, ORIGINAL.replace("1.25", "9.75"))

    finding = drive(CB, run, {}, original=ORIGINAL, log=lambda line: None)
    assert (finding.status, finding.backend) == ("found", "aot_eager_decomp_partition")
    other = [s for s in finding.steps if s["verdict"] == "fails otherwise"]
    assert other and all("Unsupported" in s["tail"] for s in other)  # each step's failure kept
    assert finding.original.endswith("AssertionError: loss 1.25 != 1.5\n")
    # without the original's text, the other failure would have been blamed
    assert drive(CB, lambda env: run(env)[0], {}, log=lambda line: None).backend == "aot_eager"


def test_a_failing_test_is_the_same_failure_however_long_pytest_took():
    # an assertion in a test id names no error line: pytest's totals line is the signature, and
    # past a minute (a loaded runner's original run) pytest adds "(0:01:03)" to it
    def pytest_tail(seconds: float, warnings: int) -> str:
        clock = f" (0:{int(seconds) // 60:02d}:{int(seconds) % 60:02d})" if seconds >= 60 else ""
        return (f"exit 1\nE       assert False\nFAILED test_traced.py::test_double - assert False\n"
                f"1 failed, {warnings} warning{'s' * (warnings != 1)} in {seconds:.2f}s{clock}\n")

    def run(env):
        return (0, "exit 0\n") if env["TORCH_BISECT_BACKEND"] == "eager" else (1, pytest_tail(12.5, 2))

    finding = drive(CB, run, {}, original=pytest_tail(63.2, 1), log=lambda line: None)
    assert (finding.status, finding.backend) == ("found", "aot_eager"), finding.steps
    assert drive(CB, lambda env: (1, pytest_tail(9.0, 0).replace("1 failed", "1 passed, 1 error")), {},
                 original=pytest_tail(63.2, 1), log=lambda line: None).backend is None  # another outcome


def test_no_backend_is_named_when_no_step_fails_like_the_original():
    finding = drive(CB, lambda env: (1, OTHER), {}, original=ORIGINAL, log=lambda line: None)
    assert finding.backend is None and "no compile backend reproduces the failure" in finding.describe()


def test_the_compiler_mode_defaults_name_no_wrong_backend_at_a_lie_rate_of_one_in_five():
    wrong, right = [], 0
    for seed in range(400):
        rng = random.Random(seed)
        culprit = BACKENDS[1 + seed % 4]

        def run(env) -> int:
            fails = BACKENDS.index(env["TORCH_BISECT_BACKEND"]) >= BACKENDS.index(culprit)
            return int(fails != (rng.random() < 0.2))

        finding = drive(CB, run, {}, log=lambda line: None)  # defaults: repeats 1, CONFIRM_RUNS fresh
        if finding.status == "found" and finding.backend is not None:
            right += finding.backend == culprit
            if finding.backend != culprit:
                wrong.append(seed)
    assert wrong == [] and right > 0

"""One honesty contract for every bisect mode, against a planted check that lies.

The check gives the wrong answer 20% of the time (seeded). Over 20 seeds, with the
contract at its documented defaults (--repeats 1, --confirm: CONFIRM_RUNS fresh runs), and
with --repeats 3, no mode may name a wrong culprit with exit 0: it
names the right one or says it could not (flaky / unconfirmed / refused, non-zero). Each
mode's test also runs the same liar without the contract (repeats 1, no confirm) and
shows that it does fool the search there, so the contract is what the test measures.

Modes: the engine's candidate lists (versions, nightlies, commits, below-nightly main
commits: one engine, which every one of those modes calls with the --repeats and --confirm
it was given), python-diff (overlays of two fake builds, the check answered through the
Runner seam), and the compiler (torch's own CompilerBisector driven by
distci.bisect.compiler.drive). That the CLI hands the options down is tested where each
mode's CLI is (test_bisect_pydiff_cli.py: a flaky check exits 1 with its report).
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from distci.bisect import BisectRefused, bisect
from distci.bisect.checks import CommandCheck, RunOutput
from distci.bisect.install import EnvCache
from distci.bisect.pydiff import PyDiffStop, python_diff

SEEDS = range(20)
LIE = 0.2


class Liar:
    """The truth, except that each answer is flipped with probability LIE (seeded)."""

    def __init__(self, seed: int, truth) -> None:
        self.rng = random.Random(seed)
        self.truth = truth
        self.calls = 0

    def __call__(self, candidate) -> str:
        self.calls += 1
        bad = self.truth(candidate)
        if self.rng.random() < LIE:
            bad = not bad
        return "bad" if bad else "good"


SHAPES = {
    "versions": [f"2.{minor}.{patch}" for minor in range(5, 15) for patch in range(3)],
    "nightlies": [f"2026-{month:02d}-{day:02d}" for month in (10, 11) for day in range(1, 29)],
    "commits": [f"{i:040x}" for i in range(1, 41)],
    "below-nightly": [f"{i * 7919:040x}" for i in range(1, 24)],
}


def _engine_run(candidates, culprit, seed, *, repeats, confirm):
    """(named culprit or None, exit code as the CLI gives it)."""
    position = {c: i for i, c in enumerate(candidates)}
    probe = Liar(seed, lambda c: position[c] >= position[culprit])
    try:
        result = bisect(candidates, probe, repeats=repeats, confirm=confirm)
    except BisectRefused:
        return None, 2
    if result.kind == "boundary":
        return result.first_bad, 0
    return None, 1


@pytest.mark.parametrize("repeats", [1, 3])
@pytest.mark.parametrize("mode", sorted(SHAPES))
def test_the_engine_modes_never_name_a_wrong_candidate_with_exit_0(mode, repeats):
    candidates = SHAPES[mode]
    culprit = candidates[len(candidates) * 2 // 3]
    wrong = [seed for seed in SEEDS
             if (found := _engine_run(candidates, culprit, seed, repeats=repeats, confirm=True))[1] == 0
             and found[0] != culprit]
    assert wrong == []
    fooled = [seed for seed in SEEDS
              if (found := _engine_run(candidates, culprit, seed, repeats=1, confirm=False))[1] == 0
              and found[0] != culprit]
    assert fooled, "without the contract the liar must fool some seeds, or this test measures nothing"


# -- python-diff ------------------------------------------------------------------------

# the two-build fixture of tests/test_bisect_pydiff.py (one definition of the fake torch)
from test_bisect_pydiff import OPS, build as _build  # noqa: E402


class PlantedRunner:
    """The check `torch.ops.scale(3) == 6`, read off the overlay's file instead of run
    (the Runner seam: where a check runs), with LIE of its answers flipped."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def run(self, command, *, venv, env, cwd, timeout) -> RunOutput:
        ops = next((venv / "lib").glob("python*/site-packages")) / "torch" / "ops.py"
        bad = "x + x + (x == 3)" in ops.read_text()
        if self.rng.random() < LIE:
            bad = not bad
        return RunOutput(1, "AssertionError: scale(3) != 6") if bad else RunOutput(0, "ok")


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("builds")
    init = "from torch import ops, util\n"
    good = _build(root / "good", {
        "torch/__init__.py": init, "torch/ops.py": OPS.format(scale="2 * x", name="a", pi="3.14"),
        "torch/util.py": "U = 1\n", "torch/extra.py": "E = 1\n"})
    bad = _build(root / "bad", {
        "torch/__init__.py": init + "from torch import extra\n",
        "torch/ops.py": OPS.format(scale="x + x + (x == 3)", name="b", pi="math.pi"),
        "torch/util.py": "U = 2\n", "torch/extra.py": "E = 1\nE2 = 2\n"})
    return good, bad, EnvCache(root / "cache")


def _pydiff_run(two_builds, seed, *, repeats, confirm):
    good, bad, cache = two_builds
    check = CommandCheck("planted", runner=PlantedRunner(seed))
    try:
        result = python_diff(check, cache, good, bad, log=lambda line: None, repeats=repeats,
                             confirm=confirm, keep_overlays=True)
    except PyDiffStop as stop:
        return stop.result, 2 if stop.result.kind == "refused" else 1
    return result, 0


@pytest.mark.slow
def test_python_diff_never_names_a_wrong_change_with_exit_0(two_builds):
    culprit = "+    return x + x + (x == 3)"
    for seed, repeats in [(seed, repeats) for seed in SEEDS for repeats in (1, 3)]:
        result, code = _pydiff_run(two_builds, seed, repeats=repeats, confirm=True)
        if code == 0:
            assert result.files == ["torch/ops.py"], seed
            assert len(result.lines) == 1 and culprit in result.lines[0].unified(), seed
    fooled = []
    for seed in SEEDS:
        result, code = _pydiff_run(two_builds, seed, repeats=1, confirm=False)
        named = "".join(h.unified() for h in result.lines)
        if code == 0 and (result.files != ["torch/ops.py"] or culprit not in named or len(result.lines) != 1):
            fooled.append(seed)
    assert fooled, "without the contract the liar must fool some seeds"


# -- the compiler -----------------------------------------------------------------------


def _compiler_run(seed, *, repeats, confirm, culprit="aot_eager_decomp_partition"):
    torch = pytest.importorskip("torch")  # the tests session installs torch; a bare controller has none
    from torch._inductor import compiler_bisector as cb

    from distci.bisect.compiler import drive

    order = list(cb.BACKENDS)
    rng = random.Random(seed)

    def run(env) -> int:  # the planted command: broken from `culprit` on, lying LIE of the time
        backend = env.get("TORCH_BISECT_BACKEND") or order[0]
        fails = order.index(backend) >= order.index(culprit)
        if rng.random() < LIE:
            fails = not fails
        return 1 if fails else 0

    del torch
    return drive(cb, run, {}, repeats=repeats, confirm=confirm, log=lambda line: None)


@pytest.mark.slow
def test_the_compiler_mode_never_names_a_wrong_backend_with_exit_0():
    for seed, repeats in [(seed, repeats) for seed in SEEDS for repeats in (1, 3)]:
        finding = _compiler_run(seed, repeats=repeats, confirm=True)
        if finding.status == "found" and finding.backend is not None:
            assert finding.backend == "aot_eager_decomp_partition", (seed, finding)
    fooled = [seed for seed in SEEDS
              if (f := _compiler_run(seed, repeats=1, confirm=False)).status == "found"
              and f.backend != "aot_eager_decomp_partition"]
    assert fooled, "without the contract the liar must fool some seeds"

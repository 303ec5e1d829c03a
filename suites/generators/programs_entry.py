"""Runs training programs the programs generator drew (distci/training_program.py) as tests on the rank pool.

Not collected with `suites/` (the file name is not test_*.py): `python -m distci fuzz
--generator programs` names it, with the programs in $DISTCI_FUZZ_PROGRAMS (a JSON file:
a list of program texts) or $DISTCI_FUZZ_PROGRAM (one text); a test id names its program,
so a rerun or a bisect probe of a find needs nothing else:

    python -m distci run --cell CELL \\
        --test 'suites/generators/programs_entry.py::test_program[fsdp-ws2-w8-l1-sgd:fwd_bwd,step]'

The failure's first line is the signature the shrinker keeps: the first action where the
parallel run left the reference and its most telling problem, no number in it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from distci.training_program import AMP, CHECKPOINTED, PROGRAM_ENV, PROGRAMS_ENV, TEST_NAME, parse

from ..probes import capabilities
from ..runner.checkpoint import shared_dir
from . import program_hooks as hooks
from . import program_checkpointing as checkpointing
from . import program_optimizers as optimizers
from .program_plants import planted
from .program_judge import lead
from .programs import run_program

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")
TIMEOUT_S = 240


def texts(args: list[str] | None = None) -> list[str]:
    if os.environ.get(PROGRAMS_ENV):
        return list(json.loads(Path(os.environ[PROGRAMS_ENV]).read_text()))
    if os.environ.get(PROGRAM_ENV):
        return [os.environ[PROGRAM_ENV]]
    marker = f"::{TEST_NAME}["
    return [a.split(marker, 1)[1].rsplit("]", 1)[0] for a in args or [] if marker in a]


def params(args: list[str] | None = None) -> list:
    out = []
    for text in texts(args):
        program = parse(text)
        marks = [pytest.mark.world_size(program.world_size), pytest.mark.dist_timeout(TIMEOUT_S)]
        out.append(pytest.param(program, id=program.text, marks=marks))
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ == TEST_NAME:
        metafunc.parametrize("program", params(list(metafunc.config.args)))


def test_program(dist, program) -> None:
    if ("save=full" in program.actions or "load=file" in program.actions) and capabilities.full_state_dict_broadcast():
        pytest.skip(capabilities.full_state_dict_broadcast())
    if optimizers.missing(program.optim, dist.device_type):
        pytest.skip(optimizers.missing(program.optim, dist.device_type))
    if program.layout in AMP and capabilities.dtensor_loss_scaling(dist.device_type):
        pytest.skip(capabilities.dtensor_loss_scaling(dist.device_type))
    if hooks.missing(program.actions):
        pytest.skip(hooks.missing(program.actions))
    if program.layout in CHECKPOINTED and checkpointing.missing(CHECKPOINTED[program.layout][1]):
        pytest.skip(checkpointing.missing(CHECKPOINTED[program.layout][1]))
    with shared_dir() as where:
        found = run_program(program, dist, planted(), where)
    if found is not None:
        first = NUMBER.sub("N", lead(found.problems))
        raise AssertionError(f"at action {found.action}: {first} ({len(found.problems)} problem(s))\n"
                             f"  first divergence at action {found.index} ({found.action}) of {program.text} "
                             f"on {dist.world_size} {dist.device_type} ranks\n  " + "\n  ".join(found.problems[:100]))

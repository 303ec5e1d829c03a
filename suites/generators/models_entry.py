"""Runs model structures the models generator drew as ordinary tests on the rank pool.

Not collected with `suites/` (no test_*.py name): `distci fuzz --generator models` names
it, with the structures in $DISTCI_FUZZ_MODELS (a JSON file: a list of keys) or
$DISTCI_FUZZ_MODEL (one key), e.g.

    DISTCI_FUZZ_MODEL=ddp-moe4-steps2 python -m distci run --cell CELL --test suites/generators/models_entry.py
    python -m distci run --cell CELL --test 'suites/generators/models_entry.py::test_model_structure[ddp-moe4-steps2]'

(a test id alone names its structure). A failure's first line is its signature: where the
parallel run first leaves the reference (localize.py), else the checks' lead problem; the
rest lists every problem.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from .model_space import RANKS, key, parse

MODELS_ENV = "DISTCI_FUZZ_MODELS"
MODEL_ENV = "DISTCI_FUZZ_MODEL"
TEST_NAME = "test_model_structure"
SIGNED_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def structure_keys(args: list[str] | None = None) -> list[str]:
    """The structures to run: from the environment, else from test ids on the command line."""
    if os.environ.get(MODELS_ENV):
        keys = json.loads(Path(os.environ[MODELS_ENV]).read_text())
    elif os.environ.get(MODEL_ENV):
        keys = [os.environ[MODEL_ENV]]
    else:
        keys = [a.split(f"::{TEST_NAME}[", 1)[1].rsplit("]", 1)[0] for a in args or [] if f"::{TEST_NAME}[" in a]
    return [key(parse(k)) for k in keys]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ == TEST_NAME:
        keys = structure_keys(list(metafunc.config.args))
        ranks = {k: RANKS.get(parse(k)["parallel"]) for k in keys}
        metafunc.parametrize("structure", [pytest.param(k, id=k, marks=[pytest.mark.world_size(ranks[k])] if ranks[k]
                                                        else []) for k in keys])


def lead(problems: list[str]) -> str:
    """The checks' problem that names the bug best: a gradient's, else the first."""
    grads = [p for p in problems if ": gradient" in p or "no gradient" in p or "has a gradient" in p]
    return re.sub(r"(?<=[.])[0-9]+(?=[.])", "N", (grads or problems)[0])


def test_model_structure(dist, structure: str) -> None:
    from .model_plants import plant
    from .model_meshes import lacks, mesh_of
    from .model_training import judge

    if dist.group is None:
        dist.init()
    missing = lacks(parse(structure)["mesh"])
    if missing:
        pytest.skip(missing)
    judged = judge(parse(structure), dist.rank, dist.world_size, mesh_of(parse(structure), dist), dist.device, plant)
    if judged.problems:
        first = judged.divergence.signature if judged.divergence else SIGNED_NUMBER.sub("N", lead(judged.problems))
        where = f"\n  {judged.divergence}" if judged.divergence else "\n  (no traced tensor left its rounding bound)"
        raise AssertionError(f"{first} ({len(judged.problems)} problem(s))\n  {structure} on {dist.world_size} "
                             f"{dist.device_type} ranks{where}\n  " + "\n  ".join(judged.problems[:100]))

"""Runs configurations the fuzzer drew (points of suites/generators/space.py) as ordinary tests on the rank pool.

Not collected with `suites/` (the file name is not test_*.py): `python -m distci fuzz`
names it, with the configurations in $DISTCI_FUZZ_CONFIGS (a JSON file: a list of points)
or $DISTCI_FUZZ_CONFIG (inline JSON: one point, axes at their defaults left out), e.g.

    DISTCI_FUZZ_CONFIG='{"parallel": "fsdp", "ac": "full"}' \\
        python -m distci run --cell CELL --test suites/fuzz_entry.py
    python -m distci run --cell CELL --test 'suites/fuzz_entry.py::test_fuzz_config[fsdp-eager-ac_full]'

(a test id alone names its configuration, so a rerun or a bisect probe of a find needs
nothing else).
Each one is judged exactly as a table row (suites/test_scenarios.py): the same reference,
checks and tolerances. The failure's first line leads with its most specific problem (a
gradient names its parameter) so the Result's error signature tells bugs apart: the
fuzzer shrinks while that signature persists.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from .generators.config_plants import planted
from .generators.space import CONFIG_ENV, CONFIGS_ENV, complete, point_from_id, scenario
from .test_scenarios import marks_of, scenario_problems



SIGNED_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def configs(args: list[str] | None = None) -> list[dict]:
    """The points to run: from the environment, else from test ids on the command line
    (`suites/fuzz_entry.py::test_fuzz_config[<scenario id>]`: the id names the point)."""
    if os.environ.get(CONFIGS_ENV):
        raw = json.loads(Path(os.environ[CONFIGS_ENV]).read_text())
    elif os.environ.get(CONFIG_ENV):
        raw = json.loads(os.environ[CONFIG_ENV])
    else:
        ids = [a.split("::test_fuzz_config[", 1)[1].rsplit("]", 1)[0] for a in args or []
               if "::test_fuzz_config[" in a]
        return [point_from_id(i) for i in ids]
    points = raw if isinstance(raw, list) else [raw]
    return [complete(p) for p in points]


def params(args: list[str] | None = None) -> list:
    out = []
    for point in configs(args):
        s = scenario(point, tier="pr")  # named explicitly: selected whatever tier the run is
        out.append(pytest.param(s, id=s.id, marks=marks_of(s)))
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ == "test_fuzz_config":
        metafunc.parametrize("scenario", params(list(metafunc.config.args)))


def lead(problems: list[str]) -> str:
    """The problem that names the bug best: the first gradient problem, else the first graph
    or routing problem, else the first (a loss off is what every numeric bug shows)."""
    grads = [p for p in problems if ": gradient" in p or "no gradient" in p or "has a gradient" in p]
    others = [p for p in problems if not p.startswith("step ") or "loss" not in p]
    return (grads or others or problems)[0]


UNEXERCISED = ("routing: every expert got tokens in every microbatch", "never got a token: their gradients")
"""checks.check_routing's problems: the reference's data did not exercise what a MoE row is
written to exercise (an empty expert somewhere, every expert somewhere). They judge the
test, not the system: a table row is written so they hold; a drawn point (fewer steps,
other sizes) may route otherwise, and is then not judged rather than failed."""


def judged(problems: list[str]) -> tuple[list[str], list[str]]:
    """(problems of the run, problems of the test's own data)."""
    own = [p for p in problems if any(u in p for u in UNEXERCISED)]
    return [p for p in problems if p not in own], own


def test_fuzz_config(dist, scenario) -> None:
    problems, unexercised = judged(scenario_problems(dist, scenario, planted(scenario)))
    if unexercised and not problems:
        pytest.skip(f"not judged: {unexercised[0]} (the drawn configuration routes otherwise than a table row)")
    if problems:
        # the first line is the signature: nothing in it may name the configuration, and a
        # number's sign is no part of the bug (an SQNR of -3 dB and one of 3 dB fail alike)
        first = SIGNED_NUMBER.sub("N", lead(problems))
        raise AssertionError(f"{first} ({len(problems)} problem(s))\n  {scenario.id} on "
                             f"{dist.world_size} {dist.device_type} ranks\n  " + "\n  ".join(problems[:100]))

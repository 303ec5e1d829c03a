"""Moved: the fuzzer's engine is distci/fuzz/engine.py (in the wheel), its generic space
distci/fuzz/space.py; the cell side's axes and contract stay in suites/generators/space.py.

A thin re-export for imports written before the move; remove once nothing imports it
(tests/test_architecture.py lists it among the arrows that must go).
"""

from distci.fuzz.engine import FAILED, Find, Fuzzer, Outcome, Report, ShrinkLimits  # noqa: F401
from .generators.space import CONFIG_ENV, CONFIGS_ENV, ENTRY_TEST  # noqa: F401

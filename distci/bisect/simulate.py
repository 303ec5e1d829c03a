"""The engine's own simulation: how often a bisect names a wrong change with exit 0 when
the check lies.

A seeded oracle answers the truth (old state before the culprit, new state from it on)
and flips each answer with probability p. Over many seeds, every candidate shape the
modes search (releases, nightly dates, a commit range, the main commits below a nightly,
the differing files of python-diff, the compile backends), culprits anywhere in the list
and both directions (regression, --find-fix), each run of the engine ends as the CLI
would end it: a boundary (exit 0), a range, flaky, came-and-went or refused (non-zero).
A *wrong answer* is a boundary whose first-new candidate is not the culprit: what a user
would act on.

This is how CONFIRM_RUNS was chosen (docs/bisect.md gives the table): the smallest
number of fresh confirmation runs per side for which no seed at p <= 0.2 gives a wrong
answer, with the default `--repeats 1`. `python -m distci.bisect.simulate` prints the
table again; tests/test_bisect_sure.py keeps the default honest.

Pure: no process, no file, no torch; a few seconds for thousands of bisects.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from distci.bisect.engine import CONFIRM_RUNS, FLANKS, BisectRefused, bisect

SHAPES: dict[str, list[str]] = {
    "versions": [f"2.{minor}.{patch}" for minor in range(5, 16) for patch in range(3)],
    "nightly dates": [f"2026-{month:02d}-{day:02d}" for month in (9, 10, 11) for day in range(1, 29)],
    "commits": [f"{i * 2654435761 % 16**40:040x}" for i in range(1, 242)],  # torchao v0.17..v0.18: 241
    "below-nightly commits": [f"{i * 7919:040x}" for i in range(1, 41)],
    "python-diff files": [f"torch/{name}.py" for name in "abcdefghijklmnop"],
    "compiler backends": ["eager", "aot_eager", "aot_eager_decomp_partition",
                          "aot_eager_decomp_partition_crossref", "inductor"],
}
"""Candidate lists shaped like each mode's: the engine sees only their length and order."""

EXIT = {"boundary": 0, "range": 3, "came-and-went": 4, "flaky": 1, "refused": 2}
"""How the CLI ends each kind of answer (distci.bisect.command.EXIT_CODES)."""


class Liar:
    """The truth about `culprit` along `candidates`, each answer flipped with probability p."""

    def __init__(self, candidates: Sequence[str], culprit: int, p: float, seed: int,
                 find_fix: bool = False) -> None:
        self.position = {c: i for i, c in enumerate(candidates)}
        self.culprit, self.p, self.find_fix = culprit, p, find_fix
        self.rng = random.Random(seed)
        self.calls = 0

    def __call__(self, candidate: str) -> str:
        self.calls += 1
        new = self.position[candidate] >= self.culprit
        if self.rng.random() < self.p:
            new = not new
        bad = new != self.find_fix  # a fix: the new state is good
        return "bad" if bad else "good"


@dataclass
class Tally:
    """How the bisects of one (shape, p, rule) ended."""

    shape: str
    p: float
    repeats: int
    confirm: int
    runs: int = 0
    ends: Counter = field(default_factory=Counter)
    wrong: list[int] = field(default_factory=list)
    """Seeds whose answer was a wrong boundary with exit 0."""
    probe_runs: int = 0

    @property
    def right(self) -> int:
        return self.ends["right"]

    def row(self) -> str:
        others = ", ".join(f"{k} {v}" for k, v in sorted(self.ends.items()) if k != "right")
        return (f"{self.shape:<22} p={self.p:<4} repeats={self.repeats} confirm={self.confirm}: "
                f"{self.runs} bisects, {len(self.wrong)} wrong with exit 0, {self.right} right "
                f"({others}); {self.probe_runs / max(self.runs, 1):.1f} check runs each")


def run_one(candidates: Sequence[str], culprit: int, p: float, seed: int, *, repeats: int = 1,
            confirm: int = CONFIRM_RUNS, flanks: int = FLANKS, find_fix: bool = False) -> tuple[str, int]:
    """(how it ended: right / wrong / range / flaky / came-and-went / refused, check runs)."""
    liar = Liar(candidates, culprit, p, seed, find_fix)
    try:
        result = bisect(candidates, liar, find_fix=find_fix, repeats=repeats, confirm=confirm,
                        flanks=flanks)
    except BisectRefused:
        return "refused", liar.calls
    if result.kind != "boundary":
        return result.kind, liar.calls
    return ("right" if result.first_new == candidates[culprit] else "wrong"), liar.calls


def simulate(shape: str, p: float, seeds: int, *, repeats: int = 1, confirm: int = CONFIRM_RUNS,
             flanks: int = FLANKS, first_seed: int = 0) -> Tally:
    """`seeds` bisects of `shape` at lie rate p, the culprit and the direction drawn per seed."""
    candidates = SHAPES[shape]
    tally = Tally(shape, p, repeats, confirm)
    for seed in range(first_seed, first_seed + seeds):
        draw = random.Random(f"{shape}/{seed}")
        culprit = draw.randrange(1, len(candidates))
        end, calls = run_one(candidates, culprit, p, seed, repeats=repeats, confirm=confirm,
                             flanks=flanks, find_fix=draw.random() < 0.5)
        tally.runs += 1
        tally.probe_runs += calls
        tally.ends[end] += 1
        if end == "wrong":
            tally.wrong.append(seed)
    return tally


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table docs/bisect.md gives: every shape, lie rates, confirmation runs."""
    parser = argparse.ArgumentParser(prog="python -m distci.bisect.simulate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2000, help="bisects per row (default 2000)")
    parser.add_argument("--p", type=float, action="append", help="lie rates (default 0.05 0.1 0.2 0.3)")
    parser.add_argument("--confirm", type=int, action="append",
                        help=f"confirmation runs per side to compare (default 1 2 {CONFIRM_RUNS})")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    for confirm in args.confirm or sorted({1, 2, CONFIRM_RUNS}):
        for p in args.p or (0.05, 0.1, 0.2, 0.3):
            for shape in SHAPES:
                print(simulate(shape, p, args.seeds, repeats=args.repeats, confirm=confirm).row(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`distci fuzz --generator models`: draw model structures (suites/generators/model_space.py),
run each on one cell's rank pool against its single-process reference, shrink what fails
to the smallest structure that still fails the same way, report.

The engine is pure (draw, shrink: `ModelFuzzer` over a `run_batch(structures) -> outcomes`
function); `fuzz_models_cell` provisions the cell as `distci run` does and runs each batch
as one pytest session of suites/generators/models_entry.py, so every structure is an
ordinary Result in the one run directory (cell, stack, error signature, known-issue
match) and ingest, verdicts, the gate and the dashboard treat a find like any failure.

Draws are seeded (random.Random over a string seed: the same list on every platform);
each feature sits at its default with probability 1/2, else takes another value, and a
meaningless draw (model_space.RULES) moves features back to their defaults until it is
not. Shrinking is greedy over the one-step simplifications (a feature back to its default,
a number to any smaller value, smallest first), keeping a candidate only while the SAME
error signature persists: the shrunk structure holds no feature the failure does not need.

A failure the registry explains (its entry's tests name models_entry) is a known issue; one
whose signature an entry explains though its tests do not name this test is that entry's
near miss (Registry.near_misses, read in distci.fuzz.records.outcome_of): reported under the
entry's id, not shrunk beyond one round, never counted as new. Exit code: 1 when a find no entry explains remains, 3 when
the cell's environment never came up, else 0.
"""

from __future__ import annotations

import functools
import json
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .records import Find, Outcome, Report

MODEL_SPACE = "suites.generators.model_space"
"""The cell side's one declaration of the structure space (features, rules, ids)."""
ENTRY_TEST = "suites/generators/models_entry.py"
TEST_NAME = "test_model_structure"
MODELS_ENV = "DISTCI_FUZZ_MODELS"
FUZZ_DIR = "fuzz"


@functools.lru_cache(maxsize=None)
def model_space() -> Any:
    """The structure space the cell side declares (suites/generators/model_space.py), loaded by
    name from the checkout as distci.fuzz.space.cell_side loads suites/generators/space.py."""
    from distci.fuzz.space import cell_side

    return cell_side(module=MODEL_SPACE)


def key(structure: dict[str, Any]) -> str:
    """A structure's id (the cell side's `key`): its test id's parameter."""
    return model_space().key(structure)


class Drawer:
    """Seeded draws of valid structures, never the same one twice; `allowed` keeps only some
    values of a feature (`--space parallel=ddp,tp`); the parallelism is always drawn.

    Two streams: the first draws every feature's first values (Feature.first) exactly as it
    did before any later value existed; then draw `n`'s later stream
    (random.Random(f"...:{seed}:{n}:later")) may move a feature from its origin to a later
    value that keeps it meaningful (the TP plans, attention, fsdp_tp), each with
    probability 1/2 (always, when `allowed` leaves the origin out). A seed's earlier draws keep their first-stream values,
    and a draw no later value touched keeps its id."""

    def __init__(self, seed: str, allowed: dict[str, tuple] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(f"distci-fuzz-models:{seed}")
        self.allowed = allowed or {}
        self.drawn: set[str] = set()
        self.count = 0

    def _first_values(self, f) -> tuple:
        values = self.allowed.get(f.name, f.values)
        first = tuple(v for v in values if v not in f.later)
        return first or tuple(dict.fromkeys(f.origin_of(v) for v in values))

    def _value(self, f) -> Any:
        values = self._first_values(f)
        if f.name != "parallel" and f.default in values and self.rng.random() < 0.5:
            return f.default
        return self.rng.choice(values)

    def draw(self, tries: int = 200) -> dict[str, Any] | None:
        for _ in range(tries):
            space = model_space()
            s = {f.name: self._value(f) if f.first != (f.default,) else f.default for f in space.FEATURES}
            moved = [f.name for f in space.FEATURES[1:] if s[f.name] != f.default and f.default in
                     self.allowed.get(f.name, f.values)]
            self.rng.shuffle(moved)
            while not space.valid(s) and moved:
                name = moved.pop()
                s[name] = _default(name)
            if space.valid(s) and key(s) not in self.drawn:
                self.drawn.add(key(s))
                later = self._later(s)
                if later is not None:
                    return space.complete(later)
        return None

    def _later(self, first: dict[str, Any]) -> dict[str, Any] | None:
        """The later stream's moves on a valid first draw; moves that make it meaningless go
        back (the last first); None when `allowed` forces a move no valid structure takes."""
        space = model_space()
        rng = random.Random(f"distci-fuzz-models:{self.seed}:{self.count}:later")
        self.count += 1
        s, moves = dict(first), []
        for f in space.FEATURES:
            if not f.later:
                continue
            allowed = self.allowed.get(f.name, f.values)
            forced = s[f.name] not in allowed
            candidates = [v for v in f.later if v in allowed and s[f.name] == f.origin_of(v)
                          and (forced or space.valid({**s, f.name: v}))]
            stays = rng.random() < 0.5 and not forced  # one number per feature, whatever it decides
            if stays or not candidates:
                continue
            s[f.name] = rng.choice(candidates)
            moves.append((f, forced))
        for f, forced in reversed(moves):
            if space.valid(s):
                break
            if not forced:
                s[f.name] = f.origin_of(s[f.name])
        return s if space.valid(s) else None


def _default(name: str) -> Any:
    return next(f.default for f in model_space().FEATURES if f.name == name)


def smaller(structure: dict[str, Any]) -> list[dict[str, Any]]:
    """The one-step simplifications of `structure`, simplest first, each valid; the
    parallelism never moves (it is part of what a find is)."""
    space = model_space()
    full = space.complete(structure)
    out, seen = [], {key(full)}
    for f in space.FEATURES[1:]:
        if full[f.name] == f.default:
            continue
        targets = [f.default]
        if f.name in space.SIZES:
            targets += [v for v in f.values if f.default < v < full[f.name]]
        for value in targets:
            candidate = {**full, f.name: value}
            if not space.valid(candidate):  # e.g. experts 0 takes top_k, the shared expert, the bias
                candidate = {**candidate, **{g: _default(g) for g in ("top_k", "shared_expert", "balance")}}
            if space.valid(candidate) and key(candidate) not in seen:
                seen.add(key(candidate))
                out.append(candidate)
    return out


RunBatch = Callable[[list[dict[str, Any]]], list[Outcome]]


@dataclass
class ModelFuzzer:
    """Draw, run in batches, shrink each find while its signature persists."""

    seed: str
    run_batch: RunBatch
    budget_s: float
    max_structures: int | None = None
    batch_size: int = 6
    shrink: bool = True
    allowed: dict[str, tuple] | None = None
    log: Callable[[str], Any] = print
    clock: Callable[[], float] = time.monotonic
    cache: dict[str, Outcome] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.drawer = Drawer(self.seed, self.allowed)
        self.report = Report()
        self.started = self.clock()

    def left_s(self) -> float:
        return self.budget_s - (self.clock() - self.started)

    def run(self) -> Report:
        while self.left_s() > 0:
            room = None if self.max_structures is None else self.max_structures - len(self.report.drawn)
            if room is not None and room <= 0:
                break
            batch = []
            for _ in range(self.batch_size if room is None else min(room, self.batch_size)):
                s = self.drawer.draw()
                if s is None:
                    break
                batch.append(s)
                self.report.drawn.append(key(s))
            if not batch:
                break
            for outcome in self._run(batch):
                if outcome.failed:
                    self._found(outcome)
        return self.report

    def _run(self, structures: list[dict[str, Any]]) -> list[Outcome]:
        todo = [s for s in structures if key(s) not in self.cache]
        if todo:
            for o in self.run_batch(todo):
                o = o if o.key else replace(o, key=key(o.case))
                self.cache[o.key] = o
                self.report.tried.append(o)
        return [self.cache[key(s)] for s in structures if key(s) in self.cache]

    def _found(self, outcome: Outcome) -> None:
        find = self.report.take(outcome, self.log)
        if find is None:
            return
        if self.shrink:
            self._shrink(find, rounds=1 if outcome.near_miss else 50)

    def _shrink(self, find: Find, rounds: int) -> None:
        current = find.found
        for _ in range(rounds):
            candidates = smaller(current.case)
            keeper = None
            for i in range(0, len(candidates), self.batch_size):
                if self.left_s() <= 0:
                    find.complete = False
                    break
                keeper = next((o for o in self._run(candidates[i:i + self.batch_size])
                               if o.failed and o.signature == find.found.signature), None)
                if keeper is not None:
                    break
            if keeper is None:
                break
            current = keeper
            find.steps.append(keeper.key)
            self.log(f"  shrunk to {keeper.key}")
        else:
            find.complete = False
        find.shrunk = current


def find_lines(cell_id: str, find: Find, plant: str = "") -> list[str]:
    """A find as printed and reported: its structure, what it needs, a repro."""
    env = f"DISTCI_MODELS_PLANT={plant} " if plant else ""
    test = f"{ENTRY_TEST}::{TEST_NAME}[{find.shrunk.key}]"
    lines = [f"find: {find.shrunk.signature}", f"  structure: {find.shrunk.key} (drawn as {find.found.key})",
             f"  needs:     {json.dumps(model_space().non_default(find.shrunk.case))}",
             f"  where:     {find.shrunk.first_divergence or 'no traced tensor left its rounding bound'}",
             f"  repro:     {env}python -m distci run --cell {cell_id} --test '{test}'"]
    if find.near_miss:
        lines += [f"  near miss: {find.near_miss}", "  (a near miss: one shrink round only)"]
    elif not find.complete:
        lines.append("  (shrunk so far: the budget ran out before every simplification was tried)")
    return lines


def parse_space(specs: list[str]) -> dict[str, tuple]:
    """`FEATURE=V1,V2` specs -> allowed values (ValueError naming the bad feature or value)."""
    FEATURE = model_space().FEATURE
    out: dict[str, tuple] = {}
    for spec in specs:
        name, _, text = spec.partition("=")
        f = FEATURE.get(name.strip())
        if f is None or not text:
            raise ValueError(f"--space {spec!r}: write FEATURE=V1,V2; features: {', '.join(FEATURE)}")
        by_text = {str(v).lower(): v for v in f.values}
        wrong = [v for v in text.split(",") if v.strip().lower() not in by_text]
        if wrong:
            raise ValueError(f"--space {spec!r}: {', '.join(wrong)} not among {', '.join(map(str, f.values))}")
        out[f.name] = tuple(by_text[v.strip().lower()] for v in text.split(","))
    return out

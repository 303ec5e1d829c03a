"""The programs generator's engine: draw training programs, run them in batches, shrink what fails.

A program (vocabulary in distci/training_program.py) is a layout, a world size, a model size, an
optimizer and a sequence of inventoried actions; its text is its test id, e.g.

    fsdp-ws2-w8-l2-adamw:fwd_bwd,step,save=dcp,fwd_bwd,step,load,fwd_bwd,step

so a find replays from its text alone, and a seed replays a night: program `i` of seed
`S` is drawn from random.Random(f"{S}/{i}") (a string seed: the same on every platform
and Python, independent of PYTHONHASHSEED and of what earlier programs did).

Why an own engine and not Hypothesis's RuleBasedStateMachine (which draws and shrinks
rule sequences well): its rules run synchronously in the process that draws them, one
example at a time, while a program here runs on a rank pool in another interpreter (the
cell's stack), and batching candidates into one pytest session is what makes drawing
and shrinking affordable (a pool start costs more than a program). Its shrink order and
database also change between its releases, and replay from a seed must hold across
them. What we need is small: preconditions as data (training_program.INVENTORY), a seeded
draw, and a greedy shrinker: drop chunks of actions (halves down to one action),
actions back to their plainest form, then the smallest model, world size, optimizer and
layout that still fail with the SAME error signature. Every candidate is checked against
the preconditions before it runs, so a shrunk program is still a program a loop makes.

Pure: it never starts a process (`run_batch(programs) -> outcomes` is given by the
caller; distci.fuzz.programs_cell runs a batch on a cell's rank pool; tests give fakes).
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection

from distci.program_forms import LATER_ROUNDS, forms, is_form
from distci.training_program import (AMP, CHECKPOINTED, INVENTORY, LAYERS, LAYOUTS, OPTIMIZERS, WIDTHS, Program, State, action,
                                      drawn_args, split, token, valid)
from .records import Find, Outcome, Report

MIN_ACTIONS, MAX_ACTIONS = 4, 14

def draw(seed: str, index: int, layouts: tuple[str, ...] = tuple(LAYOUTS),
         rounds: Collection[str] | None = None) -> Program:
    """Program `index` of `seed`: layout, size and optimizer, then actions drawn by weight
    among those enabled where the program stands (a no-sync run is closed by a synced backward).
    Each drawn value then takes one of its forms (program_forms.FORMS) from a second stream,
    so the main stream, and with it every program drawn before a form was added, stays put;
    a value the forms stream left plain may take a later form from a third stream (LATER_FORMS),
    so the forms stream stays put too, and one that stream left plain a round-2 form from a
    fourth (LATER_FORMS_2), so the third stays put, and so on (LATER_ROUNDS). `rounds`: consult
    only the later rounds of these stream names (None: all), the seed's programs as drawn when
    only they existed. A `load=LAYOUT` (round `later_reshard`) moves the program to LAYOUT:
    the actions after it are drawn where the new layout allows them."""
    rng = random.Random(f"{seed}/{index}")
    first = random.Random(f"{seed}/{index}/forms").choice
    laters = [(table, p, random.Random(f"{seed}/{index}/{stream}")) for stream, table, p in LATER_ROUNDS
              if rounds is None or stream in rounds]

    def pick(what: str, values: list[str], allowed: Collection[str]) -> str:
        """A form from the forms stream; then, where it left the plain value, maybe a later
        form (one of `allowed`) from each round's stream in turn while they leave it plain
        (program_forms.LATER_ROUNDS)."""
        got = first(values)
        if got != values[0]:
            return got
        for table, p, later in laters:
            more = [x for x in table.get((what, got), ()) if x in allowed]
            if more and later.random() < p:
                return later.choice(more)
        return got
    bases = sorted(x for x in layouts if not is_form("layout", x)) or sorted(layouts)
    layout = rng.choice(bases)
    ws = rng.choice(LAYOUTS[layout])
    head = dict(world_size=ws, width=rng.choice(WIDTHS), layers=rng.choice(LAYERS))
    optim = rng.choice([x for x in OPTIMIZERS if not is_form("optim", x)])
    fits = [x for x in forms("layout", layout) if x in layouts]
    runs_here = [x for x in layouts if ws in LAYOUTS[x]]  # hsdp: 4 ranks only
    head["layout"] = layout = pick("layout", fits, runs_here) if fits else layout
    head["optim"] = pick("optim", list(forms("optim", optim)), OPTIMIZERS)
    length = rng.randint(MIN_ACTIONS, MAX_ACTIONS)
    state, actions = State(layout=layout, world_size=ws), []
    while len(actions) < length or state.unsynced:
        layout = state.layout  # a load=LAYOUT moves the program (program_forms.LATER_FORMS_RESHARD)
        choices = [(a, arg) for a in INVENTORY for arg in drawn_args(a) if a.enabled(state, layout, arg)]
        if len(actions) >= length:  # close the accumulation
            choices = [(a, arg) for a, arg in choices if a.name == "fwd_bwd" and arg == "sync"]
        weights = [a.weight / len(drawn_args(a)) for a, _ in choices]
        a, arg = rng.choices(choices, weights)[0]
        arg = pick(a.name, [x for x in forms(a.name, arg) if a.enabled(state, layout, x)],
                   [x for x in a.args if a.enabled(state, layout, x)])
        actions.append(token(a.name, arg))
        state = a.effect(state, arg)
    return Program(actions=tuple(actions), **head)


@dataclass(frozen=True)
class Edit:
    """One simplification: actions dropped, actions put in their plainest form, model fields set."""

    drop: frozenset = frozenset()
    plain: frozenset = frozenset()
    model: tuple = ()
    """(field, value) pairs of Program's layout, world_size, width, layers, optim."""

    def __add__(self, other: "Edit") -> "Edit":
        fields = dict(self.model)
        fields.update((k, v) for k, v in other.model if k not in fields)
        return Edit(self.drop | other.drop, self.plain | other.plain, tuple(fields.items()))

    def apply(self, program: Program) -> Program:
        actions = tuple(split(tok)[0] if i in self.plain else tok
                        for i, tok in enumerate(program.actions) if i not in self.drop)
        return replace(program, actions=actions, **dict(self.model))


def edits(program: Program) -> list[Edit]:
    """The one-step simplifications of `program`, shortest first: chunks of actions dropped
    (halves down to single actions), then the model (layers, width), world size, optimizer
    and layout toward the plainest, then each action's plainest form."""
    out: list[Edit] = []
    n = len(program.actions)
    size = max(n // 2, 1)
    while True:
        out += [Edit(drop=frozenset(range(start, min(start + size, n)))) for start in range(0, n, size)]
        if size == 1:
            break
        size //= 2
    if program.layers > LAYERS[0]:
        out += [Edit(model=(("layers", LAYERS[0]),)), Edit(model=(("layers", program.layers - 1),))]
    if program.width > WIDTHS[0]:
        out.append(Edit(model=(("width", WIDTHS[0]),)))
    if program.world_size > min(LAYOUTS[program.layout]):
        out.append(Edit(model=(("world_size", min(LAYOUTS[program.layout])),)))
    if program.optim != OPTIMIZERS[0]:
        out.append(Edit(model=(("optim", OPTIMIZERS[0]),)))
    plainer = {"fsdp_tp": ("tp", "fsdp", "ddp"), "fsdp_mp": ("fsdp",), "fsdp_offload": ("fsdp",),
               "hsdp": ("fsdp",), "fsdp_f8": ("fsdp",), "tp_f8": ("tp",), "fsdp_tp_amp": ("fsdp_tp", "tp_amp", "fsdp_amp"),
               "hsdp_amp": ("hsdp", "fsdp_amp"), "fsdp_tp_ac": ("fsdp_tp", "tp_ac", "fsdp_ac")}.get(
                   program.layout, (AMP[program.layout],) if program.layout in AMP else
                   (CHECKPOINTED[program.layout][0],) if program.layout in CHECKPOINTED else ())
    for layout in plainer:
        out.append(Edit(model=(("layout", layout), ("world_size", min(LAYOUTS[layout])))))
    out += [Edit(plain=frozenset({i})) for i, tok in enumerate(program.actions)
            if split(tok)[1] != action(split(tok)[0]).args[0]]
    return out


def simplifications(program: Program) -> list[tuple[Edit, Program]]:
    """`edits(program)` applied, keeping those that are still programs (and new)."""
    out, seen = [], {program.text}
    for edit in edits(program):
        p = edit.apply(program)
        if p.text not in seen and valid(p):
            seen.add(p.text)
            out.append((edit, p))
    return out


def smaller(program: Program) -> list[Program]:
    return [p for _, p in simplifications(program)]


RunBatch = Callable[[list[Program]], list[Outcome]]


@dataclass
class ProgramFuzzer:
    seed: str
    run_batch: RunBatch
    budget_s: float = 1800.0
    max_programs: int | None = None
    batch_size: int = 8
    shrink_batch: int = 8
    """Candidates per session while shrinking (at most batch_size): a round stops at its first keeper."""
    shrink: bool = True
    layouts: tuple[str, ...] = tuple(LAYOUTS)
    rounds: tuple[str, ...] | None = None
    """Later rounds of forms consulted, by stream name (`draw`'s `rounds`; None: all)."""
    shrink_limit_s: float = 900.0
    log: Callable[[str], Any] = print
    clock: Callable[[], float] = time.monotonic
    cache: dict[str, Outcome] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.report = Report()
        self.started = self.clock()

    def left_s(self) -> float:
        return self.budget_s - (self.clock() - self.started)

    def run(self) -> Report:
        """Draw and run batches until the budget (time or programs) is spent."""
        index = 0
        while self.left_s() > 0:
            size = self.batch_size
            if self.max_programs is not None:
                size = min(size, self.max_programs - index)
            if size <= 0:
                break
            batch = [draw(self.seed, index + i, self.layouts, self.rounds) for i in range(size)]
            index += size
            self.report.drawn += [p.text for p in batch]
            for outcome in self._run(batch):
                if outcome.failed:
                    self._found(outcome)
        return self.report

    def _run(self, programs: list[Program]) -> list[Outcome]:
        todo = [p for p in programs if p.text not in self.cache]
        if todo:
            for outcome in self.run_batch(todo):
                outcome = outcome if outcome.key else replace(outcome, key=outcome.case.text)
                self.cache[outcome.key] = outcome
                self.report.tried.append(outcome)
        missing = [p.text for p in programs if p.text not in self.cache]
        if missing:
            raise RuntimeError(f"the batch runner returned no outcome for {', '.join(missing)}")
        return [self.cache[p.text] for p in programs]

    def _found(self, outcome: Outcome) -> None:
        find = self.report.take(outcome, self.log)
        if find is None:
            return
        if self.shrink:
            started = self.clock()
            try:
                self._shrink(find)
            finally:
                find.seconds = self.clock() - started
                self.report.shrink_s += find.seconds

    def _shrink(self, find: Find) -> None:
        """Greedy first improvement: each round runs the current program's simplifications in
        batches and moves to the first that fails with the same signature; when a batch holds
        several keepers, their edits combined (if still a program) lead the next round, so a
        program with k removable parts shrinks in about log2(k) + 2 batches, not k."""
        signature, current = find.found.signature, find.found
        limit = min(self.shrink_limit_s, 0.5 * self.budget_s)
        start = self.clock()
        combo: Program | None = None
        rounds = 0
        self.log(f"  shrinking {current.key} ({signature})")
        while True:
            if find.near_miss and rounds >= 1:
                find.complete, find.stopped = False, f"a near miss of {find.near_miss}: one round only"
                break
            rounds += 1
            candidates = simplifications(current.case)
            programs = [p for _, p in candidates]
            if combo is not None and valid(combo) and combo.text not in self.cache:
                programs = [combo] + [p for p in programs if p.text != combo.text]
            keepers: list[Outcome] = []
            step = min(self.batch_size, self.shrink_batch)
            for i in range(0, len(programs), step):
                if self.clock() - start > limit or self.left_s() <= 0:
                    find.complete, find.stopped = False, "its shrink limit or the budget ran out"
                    break
                keepers = [o for o in self._run(programs[i:i + step])
                           if o.failed and o.signature == signature]
                if keepers:
                    break
            if not keepers:
                break
            keeper = keepers[0]
            by_text = {p.text: e for e, p in candidates}
            kept = [by_text[o.key] for o in keepers if o.key in by_text]
            combo = sum(kept[1:], kept[0]).apply(current.case) if len(kept) > 1 else None
            find.steps.append(keeper.key)
            self.log(f"  shrunk to {keeper.key}")
            current = keeper
        find.shrunk = current


def first_action(message: str) -> str | None:
    """The action where the parallel run first left the reference, as the entry writes it."""
    m = re.search(r"at action (\d+) \(([^)]*)\)", message)
    return f"{m.group(1)} ({m.group(2)})" if m else None

"""How often a free draw of the programs generator reaches each form (issue 40: which forms a
night meets, and which need a run of their own).

Usage (from the checkout root):
    python tools/program_draw_shares.py [--seed S] [--programs N] [--layout A,B,...]

Draws N programs of seed S exactly as `distci fuzz --generator programs` does (distci.fuzz.programs.draw)
and prints, for the forms table and each later round in program_forms.LATER_ROUNDS' order, the share
of programs holding each form (a layout or optimizer form: the program's; an action form: at least
one action). A round is consulted only where every earlier round left the plain value, so a form of
a value earlier rounds take often is rare in a free draw: the nightly's programs step reaches it
about share x programs-a-night times, and a form under ~1 % needs a step restricted to it
(`--layout`), as .github/workflows/nightly.yml's rare-forms step is. Drawing is pure Python
(~4,000 programs a CPU-second since 2026-12-07), nothing runs.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import distci.program_forms as pf  # noqa: E402 - after the checkout is on the path
from distci.fuzz.programs import draw  # noqa: E402
from distci.training_program import LAYOUTS  # noqa: E402


def shares(seed: str, n: int, layouts: tuple[str, ...]) -> list[tuple[str, dict[str, float]]]:
    """[(round, {form: share of programs})] for the forms table and each later round."""
    programs = [draw(seed, i, layouts) for i in range(n)]
    rounds = [("forms", pf.FORMS)] + [(name, table) for name, table, _ in pf.LATER_ROUNDS]
    out = []
    for name, table in rounds:
        got: dict[str, float] = collections.Counter()
        for (what, _), forms in table.items():
            for form in forms:
                if what in ("layout", "optim"):
                    hits = sum(getattr(p, what) == form for p in programs)
                else:
                    hits = sum(f"{what}={form}" in p.actions for p in programs)
                got[f"{what}={form}"] = hits / n
        out.append((name, dict(sorted(got.items(), key=lambda kv: -kv[1]))))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", default="shares")
    p.add_argument("--programs", type=int, default=20000)
    p.add_argument("--layout", default=",".join(LAYOUTS), help="comma-separated layouts, as the fuzz command takes")
    args = p.parse_args(argv)
    layouts = tuple(x for x in args.layout.split(",") if x)
    unknown = [x for x in layouts if x not in LAYOUTS]
    if unknown:
        p.error(f"--layout: unknown {', '.join(unknown)}; layouts: {', '.join(LAYOUTS)}")
    for name, got in shares(args.seed, args.programs, layouts):
        print(f"{name}: " + ", ".join(f"{form} {share:.2%}" for form, share in got.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

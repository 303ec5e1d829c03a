"""WCAG contrast of the dashboard's stylesheet, computed from the CSS itself.

`python -m distci.dashboard.contrast [style.css]` lists every text colour pair the
stylesheet can produce and exits 1 when one is below AA (4.5:1). A pair is:

- a rule's `color` on its own `background` (badges, chips, squares, tags), or
- a rule's `color` without a background, on every surface it can sit on: the page,
  the cards and every other background a rule paints without setting a text colour
  (the header's rules are checked on the header's background instead).

Status squares must also differ by more than hue: `pass` against `fail` and
`regression` backgrounds need 3:1 (WCAG 1.4.11, non-text contrast), so the history
reads in greyscale too (each square carries a glyph as well).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

AA = 4.5
NON_TEXT = 3.0
DEFAULT_CSS = Path(__file__).parent / "assets" / "style.css"
HEADER = ".top"
NAMED = {"white": "#ffffff", "black": "#000000"}
# Rules that paint shapes with no text in them (dots, legend lines): never a text surface.
DECORATION = re.compile(r"^\.(dot|s-[\w-]+|legend \.line|tier[\w-]*|break[\w. -]*|story)$")
# Backgrounds that must differ in luminance, not only in hue.
DISTINCT = (("v-pass", "v-fail"), ("v-pass", "v-regression"))


@dataclass(frozen=True)
class Rule:
    selectors: tuple[str, ...]
    decls: dict[str, str]


@dataclass(frozen=True)
class Pair:
    where: str
    fg: str
    bg: str
    ratio: float
    need: float

    @property
    def ok(self) -> bool:
        return self.ratio >= self.need

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        return f"{mark} {self.ratio:5.2f}:1 (need {self.need:g})  {self.fg} on {self.bg}  {self.where}"


def parse(css: str) -> list[Rule]:
    """Flat rules (those inside @media included); comments dropped."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules = []
    for m in re.finditer(r"([^{}@]+)\{([^{}]*)\}", css):
        selectors = tuple(s.strip() for s in m.group(1).split(",") if s.strip())
        decls = {}
        for d in m.group(2).split(";"):
            if ":" in d:
                k, v = d.split(":", 1)
                decls[k.strip()] = v.strip()
        rules.append(Rule(selectors, decls))
    return rules


def variables(rules: Sequence[Rule]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in rules:
        if ":root" in r.selectors:
            out.update({k: v for k, v in r.decls.items() if k.startswith("--")})
    return out


def colours(value: str, env: dict[str, str]) -> list[str]:
    """The solid colours a value names (every stop of a gradient); [] for none/transparent."""
    for _ in range(5):
        value = re.sub(r"var\((--[\w-]+)\)", lambda m: env.get(m.group(1), ""), value)
    found = [_hex(h) for h in re.findall(r"#[0-9a-fA-F]{3,8}\b", value)]
    for r, g, b in re.findall(r"rgba?\((\d+)\s*,\s*(\d+)\s*,\s*(\d+)", value):
        found.append(f"#{int(r):02x}{int(g):02x}{int(b):02x}")
    found += [NAMED[w] for w in re.findall(r"\b(white|black)\b", value)]
    return found


def _hex(h: str) -> str:
    h = h.lstrip("#").lower()
    if len(h) in (3, 4):
        h = "".join(c * 2 for c in h[:3])
    return "#" + h[:6]


def luminance(hex_colour: str) -> float:
    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def ratio(a: str, b: str) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def _background(rule: Rule, env: dict[str, str]) -> list[str]:
    return colours(rule.decls.get("background-color") or rule.decls.get("background") or "", env)


def _is_header(rule: Rule) -> bool:
    return all(s.startswith(HEADER) for s in rule.selectors)


def check(css: str) -> list[Pair]:
    rules = parse(css)
    env = variables(rules)
    header_bg = next((c for r in rules if r.selectors == (HEADER,) for c in _background(r, env)), None)
    surfaces = sorted({c for r in rules if "color" not in r.decls and not _is_header(r)
                       and r.selectors != (":root",) and not all(DECORATION.match(s) for s in r.selectors)
                       for c in _background(r, env)})
    pairs = []
    for rule in rules:
        if "color" not in rule.decls:
            continue
        where = ", ".join(rule.selectors)
        for fg in colours(rule.decls["color"], env):
            own = _background(rule, env)
            if own:
                backs = own + (surfaces if rule.selectors == ("body",) else [])
            elif _is_header(rule) and header_bg:
                backs = [header_bg]
            else:
                backs = surfaces
            pairs += [Pair(where, fg, bg, ratio(fg, bg), AA) for bg in backs]
    by_class = {s.lstrip("."): _background(r, env) for r in rules for s in r.selectors if s.startswith(".v-")}
    for a, b in DISTINCT:
        for ca in by_class.get(a, []):
            for cb in by_class.get(b, []):
                pairs.append(Pair(f"status squares .{a} vs .{b}", ca, cb, ratio(ca, cb), NON_TEXT))
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else DEFAULT_CSS
    pairs = check(path.read_text(encoding="utf-8"))
    seen = set()
    for p in sorted(pairs, key=lambda p: (p.ok, p.ratio)):
        key = (p.where, p.fg, p.bg)
        if key not in seen:
            seen.add(key)
            print(p.line())
    failed = [p for p in pairs if not p.ok]
    print(f"{len(seen)} colour pairs, {len({(p.where, p.fg, p.bg) for p in failed})} below the required contrast")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

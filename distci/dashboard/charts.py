"""Inline SVG charts, drawn server-side so the page needs no script and no CDN."""

from __future__ import annotations

from html import escape
from typing import Sequence

# Bar fills (no text sits on them); the page's text colours live in assets/style.css.
VERDICT_COLORS = {
    "regression": "#cf222e",
    "fail": "#82071e",
    "flaky": "#d4a72c",
    "infra": "#8250df",
    "xfail": "#54aeff",
    "fixed": "#1b7c83",
    "pass": "#2da44e",
    "skip": "#d0d7de",
}
STACK_ORDER = ("pass", "fixed", "xfail", "skip", "infra", "flaky", "fail", "regression")
# A glyph per verdict, so a square says what it is without its colour.
GLYPHS = {
    "regression": "R",
    "fail": "F",
    "flaky": "~",
    "infra": "I",
    "xfail": "K",
    "fixed": "+",
    "pass": "✓",
    "skip": "–",
    "none": "·",
}
FONT = "font-family=\"system-ui, -apple-system, 'Segoe UI', sans-serif\""


def glyph(verdict: str | None) -> str:
    return GLYPHS.get(verdict or "none", "?")


def _x_positions(n: int, left: float, right: float) -> list[float]:
    if n == 1:
        return [(left + right) / 2]
    step = (right - left) / (n - 1)
    return [left + i * step for i in range(n)]


def stacked_bars(
    x_labels: Sequence[str], counts: Sequence[dict[str, int]], *, width: int = 760, height: int = 230, title: str = ""
) -> str:
    """Results per night stacked by verdict (the worst on top)."""
    left, right, top, bottom = 44.0, width - 16.0, 14.0, height - 30.0
    peak = max((sum(c.values()) for c in counts), default=0) or 1
    n = max(len(x_labels), 1)
    slot = (right - left) / n
    bar = min(42.0, slot * 0.62)
    out = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {width} {height}" '
        f'width="100%" preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg" {FONT} font-size="11">'
    ]
    if title:
        out.append(f"<title>{escape(title)}</title>")
    for frac in (0, 0.5, 1):
        yy = bottom - (bottom - top) * frac
        out.append(f'<line x1="{left}" x2="{right}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#d8dee4"/>')
        out.append(
            f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end" fill="#57606a">{round(peak * frac)}</text>'
        )
    every = max(1, n // 10)
    for i, (label, c) in enumerate(zip(x_labels, counts)):
        x = left + slot * i + (slot - bar) / 2
        yy = bottom
        for verdict in STACK_ORDER:
            k = c.get(verdict, 0)
            if not k:
                continue
            h = (bottom - top) * k / peak
            yy -= h
            out.append(
                f'<rect x="{x:.1f}" y="{yy:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{VERDICT_COLORS[verdict]}">'
                f"<title>{escape(label)}: {k} {verdict}</title></rect>"
            )
        if i % every == 0 or i == n - 1:
            cx = x + bar / 2
            out.append(
                f'<text x="{cx:.1f}" y="{bottom + 18}" text-anchor="middle" fill="#57606a">{escape(label)}</text>'
            )
    out.append("</svg>")
    return "".join(out)


def sparkline(values: Sequence[float | None], *, width: int = 88, height: int = 22) -> str:
    """A tiny 0-100 trend for a grid row; the last point is drawn solid."""
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    out = [
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    if pts:
        xs = _x_positions(len(values), 3, width - 3)

        def y(v: float) -> float:
            return height - 3 - (height - 6) * v / 100.0

        d = " ".join(f"{'M' if j == 0 else 'L'}{xs[i]:.1f},{y(v):.1f}" for j, (i, v) in enumerate(pts))
        last_i, last_v = pts[-1]
        color = VERDICT_COLORS["pass"] if last_v >= 99.999 else VERDICT_COLORS["regression"]
        out.append(f'<path d="{d}" fill="none" stroke="#8c959f" stroke-width="1.5"/>')
        out.append(f'<circle cx="{xs[last_i]:.1f}" cy="{y(last_v):.1f}" r="2.6" fill="{color}"/>')
    out.append("</svg>")
    return "".join(out)

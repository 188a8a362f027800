"""The deviation plot: per request, how far the device's logprob is from the reference's.

One SVG (written by hand: no plotting package needed) with a panel per request:
x is the generated position, y the absolute logprob deviation in nats on a log
scale, a dashed line the tolerance. Disagreements (the device's argmax is not
the reference's token, given the reference's history) are red squares,
positions where the reference itself is a near-tie are orange rings; the first
divergence of the free run is a grey vertical line. Attached to token and
logprob failures.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

from harness.checks.forcing import ForcedComparison
from harness.checks.logprobs import LogprobComparison

PANEL_W, PANEL_H, LEFT, TOP, GAP = 640, 110, 60, 28, 34
FLOOR = 1e-7  # deviations below this are drawn at it (log scale)


@dataclass
class PlotSeries:
    """One request's points: (position, deviation), and which positions to mark."""

    request_id: str
    points: list[tuple[int, float]] = field(default_factory=list)
    disagreements: set[int] = field(default_factory=set)
    near_ties: set[int] = field(default_factory=set)
    free_divergence: int | None = None


def series_of_forced(forced: ForcedComparison,
                     free_divergence: dict[str, int | None] | None = None) -> list[PlotSeries]:
    """Every request of a teacher-forced comparison as a series."""
    out = []
    for r in forced.requests:
        s = PlotSeries(r.request_id)
        if r.deviations is not None:
            s.points = [(d.position, d.value) for d in r.deviations.deviations]
        s.disagreements = {p.position for p in r.positions if not p.agrees}
        s.near_ties = {p.position for p in r.positions if p.ref_near_tie}
        s.free_divergence = (free_divergence or {}).get(r.request_id)
        out.append(s)
    return out


def series_of_free_run(cmp_: LogprobComparison,
                       free_divergence: dict[str, int | None] | None = None) -> list[PlotSeries]:
    """A free run's compared positions (where no forced run exists)."""
    return [PlotSeries(r.request_id, [(d.position, d.value) for d in r.deviations],
                       free_divergence=(free_divergence or {}).get(r.request_id))
            for r in cmp_.requests]


def _y(value: float, lo: float, hi: float) -> float:
    v = min(max(value if math.isfinite(value) else hi, lo), hi)
    frac = (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    return TOP + PANEL_H * (1 - frac)


def deviation_svg(series: list[PlotSeries], title: str, tol: float) -> str:
    """The plot as SVG text (see the module docstring)."""
    finite = [v for s in series for _, v in s.points if math.isfinite(v) and v > 0]
    lo = min([FLOOR, *finite]) if finite else FLOOR
    lo = max(lo, FLOOR)
    hi = max([tol * 10, *finite, 1.0]) if finite else max(tol * 10, 1.0)
    width = LEFT + PANEL_W + 20
    height = len(series) * (PANEL_H + TOP + GAP) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
           f' font-family="sans-serif" font-size="11">',
           f'<text x="4" y="16" font-size="13">{html.escape(title)}: |device - reference|'
           f' logprob (nats, log scale); tolerance {tol:g}; red square: disagreement, orange'
           f' ring: reference near-tie</text>']
    for i, s in enumerate(series):
        oy = 30 + i * (PANEL_H + TOP + GAP)
        n = max([p for p, _ in s.points] + [0]) + 1

        def x(pos: int, n: int = n) -> float:
            return LEFT + (pos + 0.5) * PANEL_W / n

        def y(v: float, oy: float = oy) -> float:
            return oy + _y(v, lo, hi) - TOP

        out.append(f'<g><text x="4" y="{oy - 6}">request {html.escape(s.request_id)}'
                   f' ({len(s.disagreements)} disagreements)</text>')
        out.append(f'<rect x="{LEFT}" y="{oy}" width="{PANEL_W}" height="{PANEL_H}"'
                   ' fill="none" stroke="#999"/>')
        for decade in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1):
            yy = y(10.0 ** decade)
            out.append(f'<text x="{LEFT - 4}" y="{yy + 4:.1f}" text-anchor="end">1e{decade}</text>')
        ty = y(tol)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + PANEL_W}" y1="{ty:.1f}" y2="{ty:.1f}"'
                   ' stroke="#c00" stroke-dasharray="4 3"/>')
        if s.free_divergence is not None:
            fx = x(s.free_divergence)
            out.append(f'<line x1="{fx:.1f}" x2="{fx:.1f}" y1="{oy}" y2="{oy + PANEL_H}"'
                       ' stroke="#888"/>')
        path = " ".join(f"{'M' if j == 0 else 'L'}{x(p):.1f},{y(v):.1f}"
                        for j, (p, v) in enumerate(s.points))
        if path:
            out.append(f'<path d="{path}" fill="none" stroke="#1f5fa8"/>')
        for p, v in s.points:
            colour = "#c00" if not v <= tol else "#1f5fa8"
            out.append(f'<circle cx="{x(p):.1f}" cy="{y(v):.1f}" r="2.2" fill="{colour}">'
                       f'<title>position {p}: {v:.3g}</title></circle>')
        for p in sorted(s.near_ties):
            out.append(f'<circle cx="{x(p):.1f}" cy="{oy + PANEL_H - 8}" r="5" fill="none"'
                       ' stroke="#e08000" stroke-width="2"/>')
        for p in sorted(s.disagreements):
            out.append(f'<rect x="{x(p) - 4:.1f}" y="{oy + 4}" width="8" height="8"'
                       ' fill="#c00"/>')
        out.append(f'<text x="{LEFT}" y="{oy + PANEL_H + 13}">0</text>'
                   f'<text x="{LEFT + PANEL_W}" y="{oy + PANEL_H + 13}" text-anchor="end">'
                   f'position {n - 1}</text></g>')
    out.append("</svg>")
    return "\n".join(out)

"""The calibrated thresholds a run used: each metric's measured noise with its band and limit.

A reduced-precision trace (fp16, bf16) is judged by the measured noise of its model in that
precision against fp32 (``harness.calibration``). The session records every calibration it
used (``SessionStats.calibrations``, one record per model and precision: the thresholds, the
sorted values measured per metric, their units, the calibrated near-tie tolerance); this
module shows them:

* ``calibration_svg``: one SVG (written by hand, like ``deviation_plot``) with a panel per
  metric: a histogram of the measured values on a log10 x axis (values <= 0 drawn at the
  axis floor), the band (the measured p99) and the limit (margin x the largest measured) as
  vertical lines, and optionally a run's own values as ticks under the axis;
* ``calibration_markdown``: the ``## Calibrated thresholds`` section of summary.md;
* ``calibration_terminal_lines``: one line per calibration for the terminal summary.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.calibration.metrics import METRICS, UNITS
from harness.calibration.thresholds import ALPHA, BAND_RATE, LIMIT_MARGIN
from harness.report.markdown import md_cell
from harness.session.stats import stats_values

PANEL_W, PANEL_H, LEFT, TOP, GAP = 640, 110, 60, 30, 40
BINS = 40
FIGURES_DIR = "calibration"  # beside summary.md: one SVG per calibration
# The terminal line's metrics: (metric, name shown).
TERMINAL_METRICS = (("chosen_logprob", "logprob"), ("kl_topk", "KL"))


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _g(x: Any) -> str:
    """A number with 4 significant digits ('?' when it is not one)."""
    v = _num(x)
    return "?" if math.isnan(v) else f"{v:.4g}"


def metric_names(record: Mapping[str, Any]) -> list[str]:
    """The record's metrics, the calibration's order first, then any other by name."""
    metrics = record.get("metrics") or {}
    known = [m for m in METRICS if m in metrics]
    return known + sorted(m for m in metrics if m not in known)


def unit_of(record: Mapping[str, Any], metric: str) -> str:
    return str((record.get("units") or {}).get(metric) or UNITS.get(metric, ""))


def record_key(record: Mapping[str, Any]) -> tuple[str, str]:
    return str(record.get("model_hash", "")), str(record.get("precision", ""))


# ------------------------------------------------------------------ the figure


def _axis(values: list[float], marks: list[float]) -> tuple[float, float]:
    """Decade bounds (lo, hi) of a log10 axis holding every positive value and mark."""
    positive = [v for v in [*values, *marks] if math.isfinite(v) and v > 0]
    if not positive:
        return 1e-9, 1.0
    lo = 10.0 ** math.floor(math.log10(min(positive)))
    hi = 10.0 ** math.ceil(math.log10(max(positive)))
    if hi <= lo:
        hi = lo * 10.0
    return lo, hi


def calibration_svg(record: Mapping[str, Any],
                    values: Mapping[str, list[float]] | None = None) -> str:
    """The record's measured noise as SVG text (see the module docstring); ``values``: a run's
    own values per metric, drawn as ticks under each panel's axis."""
    model, precision = str(record.get("model", "?")), str(record.get("precision", "?"))
    metrics = metric_names(record)
    distributions = record.get("distributions") or {}
    n = record.get("positions", "?")
    width = LEFT + PANEL_W + 20
    height = 44 + len(metrics) * (PANEL_H + TOP + GAP)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
           f' font-family="sans-serif" font-size="11">',
           f'<text x="4" y="16" font-size="13">{html.escape(f"{model} {precision}")}: measured'
           f' noise, n={html.escape(str(n))}</text>',
           f'<text x="4" y="32">positions per bin, log scale; orange dashed: band (p99), red:'
           f' limit{"; ticks under the axis: this run (red: over the limit)" if values else ""}'
           '</text>']
    for i, metric in enumerate(metrics):
        t = (record.get("metrics") or {}).get(metric) or {}
        unit = unit_of(record, metric)
        sample = [_num(v) for v in distributions.get(metric) or []]
        sample = [v for v in sample if not math.isnan(v)]
        run = [v for v in (_num(v) for v in (values or {}).get(metric) or []) if not math.isnan(v)]
        band, limit = _num(t.get("band")), _num(t.get("limit"))
        lo, hi = _axis(sample + run, [band, limit])
        span = math.log10(hi) - math.log10(lo)
        oy = 44 + TOP + i * (PANEL_H + TOP + GAP)

        def x(v: float, lo: float = lo, hi: float = hi, span: float = span) -> float:
            v = hi if math.isinf(v) and v > 0 else min(max(v, lo), hi)
            return LEFT + PANEL_W * (math.log10(v) - math.log10(lo)) / span

        counts = [0] * BINS
        for v in sample:
            pos = (x(v) - LEFT) / PANEL_W
            counts[min(BINS - 1, max(0, int(pos * BINS)))] += 1
        at_floor = sum(1 for v in sample if v <= 0)
        top = max(counts) or 1
        head = (f"{metric} ({unit}): n={t.get('n', len(sample))}, p50 {_g(t.get('p50'))},"
                f" p99 {_g(t.get('p99'))}, max {_g(t.get('max'))}")
        if at_floor:
            head += f"; {at_floor} values <= 0 drawn at {lo:.0e}"
        out.append(f'<g><text x="4" y="{oy - 16}">{html.escape(head)}</text>')
        out.append(f'<rect x="{LEFT}" y="{oy}" width="{PANEL_W}" height="{PANEL_H}"'
                   ' fill="none" stroke="#999"/>')
        out.append(f'<text x="{LEFT - 4}" y="{oy + 10}" text-anchor="end">{top}</text>'
                   f'<text x="{LEFT - 4}" y="{oy + PANEL_H}" text-anchor="end">0</text>')
        bw = PANEL_W / BINS
        for b, c in enumerate(counts):
            if c:
                h = PANEL_H * c / top
                out.append(f'<rect x="{LEFT + b * bw:.1f}" y="{oy + PANEL_H - h:.1f}"'
                           f' width="{bw - 1:.1f}" height="{h:.1f}" fill="#1f5fa8">'
                           f'<title>{c} positions</title></rect>')
        first, last = round(math.log10(lo)), round(math.log10(hi))
        for decade in range(first, last + 1, max(1, math.ceil((last - first) / 12))):
            xx = x(10.0 ** decade)
            out.append(f'<text x="{xx:.1f}" y="{oy + PANEL_H + 13}" text-anchor="middle">'
                       f'1e{decade}</text>')
        for v, colour, dash, label, dy in ((band, "#e08000", ' stroke-dasharray="4 3"',
                                            "band", 10), (limit, "#c00", "", "limit", 22)):
            if not (math.isfinite(v) and v > 0):
                continue
            xx = x(v)
            anchor = "end" if xx > LEFT + PANEL_W - 120 else "start"
            tx = xx - 3 if anchor == "end" else xx + 3
            out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{oy}" y2="{oy + PANEL_H}"'
                       f' stroke="{colour}" stroke-width="1.5"{dash}/>')
            out.append(f'<text x="{tx:.1f}" y="{oy + dy}" text-anchor="{anchor}"'
                       f' fill="{colour}">{label} {v:.4g} {html.escape(unit)}</text>')
        if run:
            out.append(f'<text x="{LEFT - 4}" y="{oy + PANEL_H + 26}" text-anchor="end">run</text>')
        for v in run:
            xx = x(v if v > 0 else lo)
            colour = "#c00" if math.isfinite(limit) and not v <= limit else "#000"
            out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{oy + PANEL_H + 18}"'
                       f' y2="{oy + PANEL_H + 28}" stroke="{colour}"/>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def figure_name(record: Mapping[str, Any]) -> str:
    """``<model>-<precision>.svg``, with anything but letters, digits, '.', '_' and '-'
    replaced (a model label is not always a file name)."""
    stem = f"{record.get('model', 'model')}-{record.get('precision', 'precision')}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem) + ".svg"


def figure_names(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """Each record's SVG file name (by ``record_key``); a name two records would share (two
    checkpoints under one label) gets the model hash's first characters."""
    records = list(records)
    names = [figure_name(r) for r in records]
    out = {}
    for r, name in zip(records, names, strict=True):
        if names.count(name) > 1:
            name = f"{name[:-4]}-{str(r.get('model_hash', ''))[:8]}.svg"
        out[record_key(r)] = name
    return out


def write_calibration_svgs(records: list[dict[str, Any]], folder: Path) -> dict[tuple[str, str],
                                                                                  Path]:
    """One SVG per record into ``folder`` (the SVGs of an earlier summary there removed);
    returns the files written by ``record_key``. Best effort: a figure that cannot be written
    is left out (the summary does not link it)."""
    folder = Path(folder)
    written: dict[tuple[str, str], Path] = {}
    names = figure_names(records)
    keep = set(names.values())
    try:
        for old in folder.glob("*.svg") if folder.is_dir() else []:
            if old.name not in keep:
                old.unlink(missing_ok=True)
    except OSError:
        pass
    if not records:
        return written
    for r in records:
        path = folder / names[record_key(r)]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(calibration_svg(r), encoding="utf-8")
        except (OSError, ValueError, TypeError, AttributeError):
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
            continue
        written[record_key(r)] = path
    return written


# ------------------------------------------------------------------ the records


def unique_calibrations(records: Iterable[Any]) -> list[dict[str, Any]]:
    """The records, one per (model hash, precision) (the first of each; workers that used the
    same calibration each recorded it), by model then precision. Anything that is not a
    record (a dict with a precision) is left out."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        if isinstance(r, dict) and r.get("precision") and isinstance(r.get("metrics"), dict):
            seen.setdefault(record_key(r), r)
    return sorted(seen.values(), key=lambda r: (str(r.get("model", "")),
                                                str(r.get("precision", "")),
                                                str(r.get("model_hash", ""))))


def calibrations_from_stats(stats_dir: Path) -> list[dict[str, Any]]:
    """The calibrations of the pytest workers' stats files (``calibrations``), deduplicated."""

    records: list[Any] = []
    for value in stats_values(Path(stats_dir), "calibrations"):
        if isinstance(value, list):
            records += value
    return unique_calibrations(records)


# ------------------------------------------------------------------ text



def _percent(x: Any) -> str:
    v = _num(x)
    return "?" if math.isnan(v) else f"{100 * v:.3g} %"


def _stack(record: Mapping[str, Any]) -> str:
    stack = record.get("stack") or {}
    if not isinstance(stack, dict):
        return ""
    return ", ".join(f"{k} {v}" for k, v in stack.items())


def calibration_markdown(records: list[dict[str, Any]],
                         links: Mapping[tuple[str, str], str] | None = None) -> list[str]:
    """The ``## Calibrated thresholds`` section of summary.md (no lines without records);
    ``links``: a figure's path relative to summary.md per ``record_key``."""
    if not records:
        return []
    first = records[0]
    rate = _num(first.get("rate", BAND_RATE))
    alpha = _num(first.get("alpha", ALPHA))
    margin = _num(first.get("margin", LIMIT_MARGIN))
    lines = ["## Calibrated thresholds", "",
             f"Reduced-precision targets are judged by the noise measured for their model and"
             f" precision against fp32 on the CPU. Band = the measured p99: a request or run"
             f" fails with more positions over it than {100 * rate:g} % per position gives with"
             f" probability {alpha:g}; limit = {margin:g} x the largest measured"
             f" ({margin * margin:g} x for the KL metrics, second order in the error), no"
             f" position may exceed it; near-tie tolerance = twice the largest probability movement"
             f" measured, at least the default (`--near-tie-tol`).", ""]
    for r in records:
        model, precision = str(r.get("model", "?")), str(r.get("precision", "?"))
        lines += [f"### {model} {precision}", ""]
        line = (f"{r.get('positions', '?')} positions measured, greedy flips"
                f" {_percent(r.get('flip_rate'))}, near-tie tolerance {_g(r.get('near_tie_tol'))}")
        if _stack(r):
            line += f"; reference stack: {_stack(r)}"
        link = (links or {}).get(record_key(r))
        if link:
            line += f"; [distributions]({link})"
        lines += [line, "",
                  "| metric | unit | n | p50 | p99 | max | band | limit |",
                  "|---|---|---|---|---|---|---|---|"]
        for metric in metric_names(r):
            t = r["metrics"].get(metric) or {}
            lines.append(f"| {md_cell(metric)} | {md_cell(unit_of(r, metric))} | {t.get('n', '?')}"
                         f" | {_g(t.get('p50'))} | {_g(t.get('p99'))} | {_g(t.get('max'))}"
                         f" | {_g(t.get('band'))} | {_g(t.get('limit'))} |")
        lines.append("")
    return lines


def calibration_terminal_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per record: the logprob and KL limit and band, the near-tie tolerance."""
    out = []
    for r in records:
        parts = []
        for metric, name in TERMINAL_METRICS:
            t = (r.get("metrics") or {}).get(metric)
            if t:
                parts.append(f"{name} limit {_g(t.get('limit'))} band {_g(t.get('band'))}")
        parts.append(f"near-tie tol {_g(r.get('near_tie_tol'))}")
        out.append(f"calibrated {r.get('model', '?')} {r.get('precision', '?')}"
                   f" ({r.get('positions', '?')} positions): {', '.join(parts)}")
    return out


# ------------------------------------------------------------------ per test


def record_of(calibration: Any, used: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The session's record (``PrecisionDesk.used`` values) of ``calibration`` (a
    ``Thresholds``): the one with its model hash and precision; None when there is none."""
    key = (str(getattr(calibration, "model_hash", "")), str(getattr(calibration, "precision", "")))
    return next((dict(r) for r in used if record_key(r) == key), None)


def rules_text(label: str, rules: Any, record: Mapping[str, Any] | None = None) -> str:
    """What a trace labelled ``label`` was judged by (a ``harness.session.precision.Rules``):
    its precision, where the thresholds came from and the three policies."""
    precision = str(getattr(rules, "precision", "?"))
    th = getattr(rules, "calibration", None)
    if th is None:
        source = ("flat fp32 tolerances, no calibration" if precision == "fp32" else
                  f"flat tolerances, no calibration of {precision}")
    else:
        model = (record or {}).get("model") or "model"
        source = (f"calibrated on {model} (model hash {str(th.model_hash)[:12]}),"
                  f" {th.positions} positions measured against fp32,"
                  f" greedy flips {_percent(th.flip_rate)}")
        stack = ", ".join(f"{k} {v}" for k, v in (th.stack or {}).items())
        if stack:
            source += f", reference stack {stack}"
    return "\n".join([
        f"{label} ({precision}): {source}",
        f"  near-tie: {rules.near_tie.describe()}",
        f"  logprob: {rules.logprob.describe()}",
        f"  distribution: {rules.distribution.describe()}",
    ])

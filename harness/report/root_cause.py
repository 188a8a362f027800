"""Failures by root cause: the test that first left an engine dirty, then the tests it affected.

A reused engine found dirty before a test (``harness.engine.hygiene``) is replaced, or,
where it cannot be, inherited. Either way the test it was found before is labelled with
the test that left it so (``root_cause``), how it was handled (``engine_hygiene``:
``replaced`` or ``inherited``) and the first problem (``engine_dirt``). The run summary
groups by that label, so one bug reads as one failure with its consequences; the session
statistics give the restart counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.report.markdown import md_cell
from harness.report.results import labels_of, message_of

ROOT_CAUSE = "root_cause"
HANDLING = "engine_hygiene"
DIRT = "engine_dirt"
START_UP = "start-up"


def labels_for(events: Iterable[Any]) -> list[tuple[str, str]]:
    """The report labels of a test for the dirty engines found before it (``Dirty`` events)."""
    out: list[tuple[str, str]] = []
    for e in events:
        out.append((ROOT_CAUSE, e.left_by or f"{START_UP} of {e.config}"))
        out.append((HANDLING, "replaced" if e.replaced else "inherited"))
        # Shown in the test's header in Allure, and a filter there.
        out.append(("tag", "dirty engine replaced" if e.replaced else "inherited a dirty engine"))
        if e.problems:
            out.append((DIRT, f"{e.config}: {e.problems[0]}"))
    return out


@dataclass
class Affected:
    name: str
    status: str
    handling: str  # replaced / inherited
    message: str = ""


@dataclass
class RootCause:
    """One test that left an engine dirty, and the tests that found it so."""

    culprit: str
    status: str = "not in these results"
    message: str = ""
    dirt: str = ""
    affected: list[Affected] = field(default_factory=list)


def _name(t: dict[str, Any]) -> str:
    return (labels_of(t).get("nodeid") or [str(t.get("name") or t.get("fullName"))])[0]


def _first_line(text: str, chars: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= chars else line[: chars - 3] + "..."


def group_by_root_cause(tests: list[dict[str, Any]]) -> list[RootCause]:
    """Root causes in the order their culprits appear, each with the tests it affected."""
    by_name = {_name(t): t for t in tests}
    groups: dict[str, RootCause] = {}
    for t in tests:
        labels = labels_of(t)
        causes = labels.get(ROOT_CAUSE) or []
        handling = labels.get(HANDLING) or []
        dirt = labels.get(DIRT) or []
        for i, culprit in enumerate(causes):
            g = groups.get(culprit)
            if g is None:
                g = groups[culprit] = RootCause(culprit)
                own = by_name.get(culprit)
                if own is not None:
                    g.status = str(own.get("status") or "unknown")
                    g.message = _first_line(message_of(own))
            if not g.dirt and i < len(dirt):
                g.dirt = dirt[i]
            g.affected.append(Affected(
                _name(t), str(t.get("status") or "unknown"),
                handling[i] if i < len(handling) else "?", _first_line(message_of(t))))
    order = {_name(t): n for n, t in enumerate(tests)}
    return sorted(groups.values(), key=lambda g: order.get(g.culprit, len(order)))



def hygiene_totals(stats: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Restarts, probes and handovers summed over the workers' ``hygiene`` statistics."""
    totals = {"restarts": 0, "probes": 0, "checks": 0}
    for h in stats:
        for k in totals:
            totals[k] += int((h or {}).get(k, 0) or 0)
    return totals


def hygiene_lines(stats: Iterable[dict[str, Any]]) -> list[str]:
    """The terminal summary's lines: the restart count, then each dirty engine found."""
    stats = list(stats)
    t = hygiene_totals(stats)
    lines = [f"engine hygiene: {t['restarts']} restart(s) of dirty engines, {t['checks']}"
             f" handover(s) checked, {t['probes']} probe call(s)"]
    for h in stats:
        for e in (h or {}).get("events", []):
            problems = e.get("problems") or []
            how = problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
            done = "replaced" if e.get("replaced") else f"inherited ({e.get('note', '')})"
            lines.append(f"  {e.get('config')} left dirty by {e.get('left_by') or START_UP}: {how};"
                         f" {done} for {e.get('test')}")
    return lines


def root_cause_markdown(tests: list[dict[str, Any]], stats: list[dict[str, Any]]) -> str:
    """The summary's section: restart counts, then each root cause with the tests affected."""
    groups = group_by_root_cause(tests)
    if not stats and not groups:
        return ""
    t = hygiene_totals(stats)
    lines = ["## Failures by root cause", "",
             f"Engine restarts (dirty engines replaced): {t['restarts']}; handovers checked:"
             f" {t['checks']}; probe calls: {t['probes']}.", ""]
    if not groups:
        lines += ["No test left an engine dirty for the next.", ""]
        return "\n".join(lines)
    for g in groups:
        own = f"{g.status}" + (f": {md_cell(g.message)}" if g.message else "")
        lines.append(f"- `{md_cell(g.culprit)}` ({own}) left {md_cell(g.dirt) or 'an engine dirty'}")
        for a in g.affected:
            if a.handling == "replaced":
                what = f"ran on a fresh engine: {a.status}"
            else:
                what = f"inherited the engine: {a.status}"
            msg = f" ({md_cell(a.message)})" if a.message and a.status not in ("passed",) else ""
            lines.append(f"  - then `{md_cell(a.name)}` {what}{msg}")
    lines.append("")
    return "\n".join(lines)

"""Triage where people look: the labels and description a triaged failure carries in its Allure
result, the "Triage" section of summary.md, and the terminal summary's lines.

A triage (``harness.core.triage.TriageResult``) is written twice: into the failed test's
Allure result (labels, a table attachment) by the report plugin, and into the worker's
statistics file (``triage``) by the session. summary.md reads the labels, so a merge of shard
results (``hil report SOURCE...``) keeps each failure's verdict with its test; the terminal
summary, which has no Allure results to read, reads the statistics files.

A known failure's triage reused from its record (``harness.triage.record``) is shown as reused
everywhere, with the date the record was made.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness.core.triage import TriageResult
from harness.report.markdown import md_cell
from harness.report.results import labels_of

# Allure labels of a triaged failure. ``triage`` holds the verdict's key (one word of
# harness.core.triage.KEYS); a tag ``triage: KEY`` makes it a filter in the Allure UI.
TRIAGE = "triage"
VERDICT = "triage_verdict"
CHECK = "triage_check"
RUNS = "triage_runs"
SECONDS = "triage_seconds"
# When the triage was made, for one reused from a record ("2026-12-07 03:12:45 UTC"); NOT_REUSED
# for one made in the run (every triage carries the label, so a test's labels stay aligned).
REUSED = "triage_reused"
NOT_REUSED = "no"
TAG_PREFIX = "triage: "
ATTACHMENT = "triage"  # the runs as a Markdown table (TriageResult.table())
JSON_ATTACHMENT = "triage (JSON)"  # TriageResult.to_dict(), for tools


def labels_for(result: TriageResult) -> list[tuple[str, str]]:
    """The Allure labels of a test whose failure was triaged into ``result``."""
    return [(TRIAGE, result.key), ("tag", TAG_PREFIX + result.key), (VERDICT, result.verdict),
            (CHECK, result.check), (RUNS, str(result.runs_made)),
            (SECONDS, f"{result.seconds:.1f}"), (REUSED, result.reused_from or NOT_REUSED)]


def description_with_triage(doc: str | None, results: Iterable[TriageResult]) -> str:
    """The test's description (its docstring) followed by each triage's verdict: the Allure
    test page shows the description above the steps, where a reader starts."""
    parts = [inspect.cleandoc(doc)] if doc and doc.strip() else []
    for r in results:
        parts.append(f"**triage of {r.check}: {r.verdict}** ({r.cost()};"
                     f" the runs are in the attachment \"{ATTACHMENT}\")")
    return "\n\n".join(parts)


@dataclass(frozen=True)
class TriageRow:
    """One triaged failure, as the summaries list it."""

    test: str
    check: str
    key: str
    verdict: str
    runs: int
    seconds: float
    reused_from: str = ""  # reused from a record made then; "" when triaged in the run

    def verdict_said(self) -> str:
        """The verdict, and when it was triaged if it was reused from a record."""
        return self.verdict + (f" (reused: triaged {self.reused_from})" if self.reused_from
                               else "")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _nth(labels: dict[str, list[str]], name: str, i: int) -> str:
    """The ``i``-th value of label ``name`` (a test triaged twice has two of each)."""
    values = labels.get(name) or []
    return values[i] if i < len(values) else ""


def rows_from_results(tests: Iterable[dict[str, Any]]) -> list[TriageRow]:
    """The triaged failures of Allure results (their ``triage`` labels), in results order."""
    rows = []
    for t in tests:
        labels = labels_of(t)
        keys = labels.get(TRIAGE) or []
        name = (labels.get("nodeid") or [str(t.get("name") or t.get("fullName"))])[0]
        for i, key in enumerate(keys):
            check = _nth(labels, CHECK, i) or (labels.get("check") or ["?"])[0]
            reused = _nth(labels, REUSED, i)
            rows.append(TriageRow(name, check, key, _nth(labels, VERDICT, i),
                                  _int(_nth(labels, RUNS, i)), _float(_nth(labels, SECONDS, i)),
                                  "" if reused == NOT_REUSED else reused))
    return rows


def rows_from_stats(entries: Iterable[Any]) -> tuple[list[TriageRow], list[str]]:
    """The triaged failures of the workers' statistics (``TriageResult`` dicts), and one line
    per entry that is not one (left out)."""
    rows, bad = [], []
    for e in entries:
        try:
            r = TriageResult.from_dict(e)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            bad.append(f"a triage entry of the statistics is not one ({exc!r}); left out")
            continue
        rows.append(TriageRow(r.nodeid, r.check, r.key, r.verdict, r.runs_made, r.seconds,
                              r.reused_from))
    return rows, bad


def _reused(rows: list[TriageRow]) -> str:
    n = sum(1 for r in rows if r.reused_from)
    return (f"; {n} of them known failure(s) whose recorded triage was reused, not re-run"
            if n else "")


def triage_markdown(rows: list[TriageRow]) -> list[str]:
    """summary.md's "Triage" section (no lines when nothing was triaged)."""
    if not rows:
        return []
    total = sum(r.seconds for r in rows)
    lines = ["## Triage", "",
             f"{len(rows)} failure(s) re-run under varied conditions, {total:.1f} s in all"
             f"{_reused(rows)} (the runs of each: its attachment \"triage\" in the report).", "",
             "| test | check | verdict | runs | s |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{md_cell(r.test)}` | {md_cell(r.check)} | {md_cell(r.verdict_said())} |"
                     f" {r.runs} | {r.seconds:.1f} |")
    return [*lines, ""]


def terminal_lines(rows: list[TriageRow]) -> list[str]:
    """The terminal summary's triage block: a line per triaged test, then the total."""
    if not rows:
        return []
    lines = [f"triage: {r.test}: {r.verdict_said()} ({r.runs} runs, {r.seconds:.1f} s)"
             for r in rows]
    total = sum(r.seconds for r in rows)
    return [*lines, f"triage: {len(rows)} failure(s) triaged in {total:.1f} s{_reused(rows)}"]

"""The run summary in markdown: counts per status and per failure category, the
failing tests with their category, target, model and first message line, the verdict of
each triaged failure (read from the results' labels, so merged shards keep it), and the
calibrated thresholds reduced-precision targets were judged by (from the session stats)."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.checks.agreement import agreement_lines
from harness.checks.exposure import exposure_lines
from harness.report.calibration_report import (
    FIGURES_DIR,
    calibration_markdown,
    calibrations_from_stats,
    figure_names,
    write_calibration_svgs,
)
from harness.report.categories import SKIPPED, UNCLASSIFIED_FAILURE, category_names, classify
from harness.report.markdown import md_cell
from harness.report.results import ResultsFolder, labels_of, load_results, message_of, params_of
from harness.report.root_cause import root_cause_markdown
from harness.report.run_config import read_properties
from harness.report.stack_lacks_section import lacks_markdown
from harness.report.triage_report import TriageRow, rows_from_results, triage_markdown
from harness.session.stats import stats_values

MESSAGE_CHARS = 160


@dataclass
class FailedTest:
    name: str
    status: str
    category: str
    target: str
    model: str
    device: str
    message: str


@dataclass
class RunSummary:
    statuses: Counter[str] = field(default_factory=Counter)
    categories: Counter[str] = field(default_factory=Counter)
    skipped_by_category: Counter[str] = field(default_factory=Counter)
    failed: list[FailedTest] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # Per model: near-tie exposure and top-1 probabilities of the reference (harness.checks.exposure).
    exposure: list[str] = field(default_factory=list)
    # Teacher-forced agreement per target and model (harness.checks.agreement): table lines.
    agreement: list[str] = field(default_factory=list)
    # Failures re-run under varied conditions (harness.triage), from the results' labels.
    triage: list[TriageRow] = field(default_factory=list)
    # The calibrations reduced-precision traces were judged by (harness.report.calibration_report),
    # and each one's figure relative to summary.md (by model hash and precision) where written.
    calibrations: list[dict[str, Any]] = field(default_factory=list)
    calibration_links: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


def _first_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."


def summarize(tests: list[dict[str, Any]], problems: list[str] | None = None) -> RunSummary:
    """Count the results of one run (one entry per test result)."""
    s = RunSummary(problems=list(problems or []))
    # Merged shards must be disjoint: the same test (history id) twice means they overlapped.
    seen = Counter(str(t.get("historyId")) for t in tests if t.get("historyId"))
    twice = sorted(
        (labels_of(t).get("nodeid") or [str(t.get("name"))])[0]
        for t in tests if seen.get(str(t.get("historyId")), 0) > 1
    )
    if twice:
        names = sorted(set(twice))
        s.problems.append(
            f"{len(names)} test(s) ran more than once in these results (overlapping --shard"
            f" values, or two runs into one folder): {', '.join(names[:10])}"
            + (" ..." if len(names) > 10 else "")
        )
    for t in tests:
        status = str(t.get("status") or "unknown")
        s.statuses[status] += 1
        message = message_of(t)
        category = classify(status, message, check=(labels_of(t).get("check") or [None])[0])
        if status == SKIPPED:
            if category:
                s.skipped_by_category[category] += 1
            continue
        if status not in ("failed", "broken"):
            continue
        category = category or UNCLASSIFIED_FAILURE
        s.categories[category] += 1
        params, labels = params_of(t), labels_of(t)
        s.failed.append(FailedTest(
            name=(labels.get("nodeid") or [str(t.get("name") or t.get("fullName"))])[0],
            status=status,
            category=category,
            target=params.get("target_variant") or (labels.get("suite") or ["?"])[0],
            model=params.get("model", "?"),
            device=params.get("device", "?"),
            message=_first_line(message),
        ))
    s.failed.sort(key=lambda f: (category_order(f.category), f.name))
    s.triage = rows_from_results(tests)
    return s


def category_order(name: str) -> int:
    names = category_names()
    return names.index(name) if name in names else len(names)



def summary_markdown(s: RunSummary, title: str = "vllm-hil run") -> str:
    order = ("passed", "failed", "broken", "skipped", "unknown")
    counts = ", ".join(f"{s.statuses[k]} {k}" for k in order if s.statuses.get(k))
    lines = [f"# {title}", "", f"**{s.total} tests**: {counts or 'none'}", ""]
    if s.categories:
        lines += ["| failure category | tests |", "|---|---|"]
        for name in sorted(s.categories, key=category_order):
            lines.append(f"| {name} | {s.categories[name]} |")
        lines.append("")
    if s.skipped_by_category:
        skipped = ", ".join(f"{n} {c}" for c, n in s.skipped_by_category.items())
        lines += [f"Skipped: {skipped}.", ""]
    if s.failed:
        lines += ["## Failing tests", "", "| category | test | target | model | device | message |",
                  "|---|---|---|---|---|---|"]
        for f in s.failed:
            lines.append(
                f"| {md_cell(f.category)} | `{md_cell(f.name)}` | {md_cell(f.target)} | {md_cell(f.model)}"
                f" | {md_cell(f.device)} | {md_cell(f.message)} |"
            )
        lines.append("")
    elif s.total:
        lines += ["No failing tests.", ""]
    lines += triage_markdown(s.triage)
    if s.exposure:
        lines += ["## Near-tie exposure", ""] + [f"- {md_cell(e)}" for e in s.exposure] + [""]
    if s.agreement:
        lines += ["## Teacher-forced agreement", "", *agreement_markdown(s.agreement)]
    lines += calibration_markdown(s.calibrations, s.calibration_links)
    if s.problems:
        lines += ["## Results problems", ""] + [f"- {md_cell(p)}" for p in s.problems] + [""]
    return "\n".join(lines)


def is_table_row(line: str) -> bool:
    return line.lstrip().startswith("|")


def agreement_markdown(lines: list[str]) -> list[str]:
    """The agreement table, then its other lines (targets not forced) as a list after a blank
    line: a line that follows a table without one would be read as a row of it. A table of a
    header alone (no target was forced) is left out."""
    table = [line for line in lines if is_table_row(line)]
    others = [line for line in lines if line.strip() and not is_table_row(line)]
    out = table + [""] if len(table) > 2 else []
    if others:
        out += [f"- {md_cell(line)}" for line in others] + [""]
    return out


def summary_text(tests: list[dict[str, Any]], problems: list[str], stats_dir: Path,
                 title: str = "vllm-hil run", figures: Path | None = None,
                 lacks: bool = True) -> str:
    """The summary of ``tests`` with the statistics of ``stats_dir`` (exposure, agreement,
    calibrated thresholds, engine hygiene). ``figures``: the folder beside the summary holding
    the calibration figures (``write_calibration_svgs``); those found there are linked.
    ``lacks``: with what the stacks of the results (their ``stack`` parameter) do not have."""
    s = summarize(tests, problems)
    s.exposure = exposure_from_stats(stats_dir)
    s.agreement = agreement_from_stats(stats_dir)
    s.calibrations = calibrations_from_stats(stats_dir)
    if figures is not None:
        s.calibration_links = {key: f"{Path(figures).name}/{name}"
                               for key, name in figure_names(s.calibrations).items()
                               if (Path(figures) / name).is_file()}
    text = summary_markdown(s, title)
    stacks = [params_of(t).get("stack") for t in tests] if lacks else []
    for section in (lacks_markdown(name for name in stacks if name),
                    root_cause_markdown(tests, stats_values(stats_dir, "hygiene")),
                    warnings_markdown(stats_dir)):
        if section:
            text = text.rstrip("\n") + "\n\n" + section
    return text


def warnings_markdown(stats_dir: Path) -> str:
    """The summary's "Warnings" section: what the run warned of its own files and its
    quarantine (an ignored engine-order record, an entry that matches no test), each once
    (every xdist worker judges the same collection); empty when nothing was."""
    lines: list[str] = []
    for value in stats_values(stats_dir, "warnings"):
        if isinstance(value, list):
            lines += [str(v) for v in value if str(v) not in lines]
    if not lines:
        return ""
    return "## Warnings\n\n" + "".join(f"- {md_cell(line)}\n" for line in lines)


def write_summary(results_dir: Path, out: Path, folder: ResultsFolder | None = None) -> str:
    """Summarize ``results_dir`` into the markdown file ``out``; returns the text.

    The near-tie exposure comes from the session stats beside it (``../stats``), if any; the
    figure of each calibrated threshold is written beside ``out`` (``calibration/``).
    """
    folder = folder or load_results(results_dir)
    stats_dir = Path(results_dir).parent / "stats"
    figures = Path(out).parent / FIGURES_DIR
    write_calibration_svgs(calibrations_from_stats(stats_dir), figures)
    text = with_faults_line(summary_text(folder.tests, folder.problems, stats_dir, figures=figures),
                            results_dir)
    write_text_safely(out, text)
    return text


def with_faults_line(text: str, results_dir: Path) -> str:
    """``text`` with the line "faults injected: ..." after its counts when the run installed
    faults (its Allure environment's ``run.faults``): a failure a fault caused must not read
    as the stack's own bug."""
    faults = read_properties(Path(results_dir) / "environment.properties").get("run.faults", "")
    if not faults or faults == "none":
        return text
    lines = text.split("\n")
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("**")), len(lines))
    return "\n".join([*lines[:at], "", f"faults injected: {md_cell(faults)}", *lines[at:]])


def write_text_safely(out: Path, text: str) -> None:
    """Write ``out`` whole or not at all: a full disk or a killed run never leaves a truncated
    summary in place of the previous one (OSError is raised, the previous file kept)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def agreement_from_stats(stats_dir: Path) -> list[str]:
    """The teacher-forced agreement table from the pytest workers' stats files."""
    stats = []
    for f in sorted(stats_dir.glob("*.json")) if stats_dir.is_dir() else []:
        try:
            stats.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    stats = [s for s in stats if isinstance(s, dict)]
    return agreement_lines([s.get("agreement") or {} for s in stats],
                           [s.get("exposure") or {} for s in stats if s.get("exposure")])


def exposure_from_stats(stats_dir: Path) -> list[str]:
    """Exposure lines from the pytest workers' stats files (none if there are none)."""
    tallies = []
    for f in sorted(stats_dir.glob("*.json")) if stats_dir.is_dir() else []:
        try:
            tallies.append(json.loads(f.read_text()).get("exposure") or {})
        except (OSError, ValueError, AttributeError):
            continue
    return exposure_lines(tallies)

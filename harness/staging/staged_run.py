"""The end of a `hil run`: publish a completed run, keep an interrupted one, discard a
refused one (harness.staging.run_folder holds the folder mechanics).

A run is *completed* when every stack's pytest run ended with exit 0 (all passed) or 1 (some
failed) and at least one test result was recorded: its outputs replace the previous ones. A
run that recorded results but was stopped (a signal, pytest exit 2 after tests ran, or any
other exit) keeps them in ``REPORTS/interrupted-<stamp>/`` (``incomplete-<stamp>`` when no
interrupt stopped it), with its summary's first line and the ``run.interrupted`` environment
property saying so. A run that recorded no result (arguments refused, no test selected,
collection errors, --collect-only) publishes nothing. In every case but the first the
previous results stay as they were.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.lab.shard_plan import DURATIONS_FILE, DurationsError, load_durations
from harness.plugin.option_needs import on_command_line
from harness.report.run_config import INTERRUPTED_KEY, format_properties, read_properties
from harness.report.stack_summary import interrupted_line, write_run_summary
from harness.report.summary import write_text_safely
from harness.staging.interrupt import signal_name
from harness.staging.run_folder import (
    INCOMPLETE_PREFIX,
    INTERRUPTED_PREFIX,
    discard,
    keep_partial,
    partial_folder,
    publish,
    result_count,
)

COMPLETED_CODES = (0, 1)  # pytest: all passed, some failed
REFUSAL_WHY = {
    4: "pytest refused the arguments (exit 4)",
    5: "no test was selected (pytest exit 5: check -m, -k, --target and the node ids)",
    2: "pytest stopped before any test ran (exit 2: collection errors or an interrupt)",
    3: "pytest failed inside (exit 3: internal error) before any test ran",
}


@dataclass
class StagedRun:
    """One `hil run`: its folders and each stack's pytest exit code, in run order."""

    reports: Path
    staging: Path
    stacks: Sequence[str]
    codes: list[int] = field(default_factory=list)
    signal: int | None = None
    published: bool = False

    @property
    def results(self) -> Path:
        return self.staging / "allure-results"

    def first_failure(self) -> int:
        return next((c for c in self.codes if c), 0)

    def completed(self) -> bool:
        return (self.signal is None and len(self.codes) == len(self.stacks)
                and all(c in COMPLETED_CODES for c in self.codes)
                and result_count(self.results) > 0)


def kept_line(reports: Path) -> str:
    return (f"the previous results in {reports} (allure-results/, junit*.xml, summary.md, stats/,"
            " devices/) are kept: nothing of this run was published")


def mark_interrupted(results: Path, summary: Path, why: str) -> None:
    """The environment property and the summary's first line of a run that did not finish."""
    props_file = results / "environment.properties"
    props = read_properties(props_file) if props_file.is_file() else {}
    props[INTERRUPTED_KEY] = why
    results.mkdir(parents=True, exist_ok=True)
    write_text_safely(props_file, format_properties(props))
    text = summary.read_text(encoding="utf-8") if summary.is_file() else ""
    write_text_safely(summary, interrupted_line(why) + text)


def finish(run: StagedRun) -> tuple[int, list[str]]:
    """Publish, keep or discard ``run``; returns (exit code, lines for the user). The summary
    text of a published run is the first line."""
    n = result_count(run.results)
    if run.completed():
        text = write_run_summary(run.staging, run.results, run.stacks,
                                 published=run.reports / "allure-results")
        publish(run.staging, run.reports)
        run.published = True
        return run.first_failure(), [text, f"hil run: {n} test result(s); reports in"
                                     f" {run.reports} (junit*.xml, allure-results/,"
                                     " engine-logs/, stacks/: each stack's summary part)"]
    code = 128 + run.signal if run.signal else run.first_failure()
    if n == 0:
        discard(run.staging)
        if run.signal:
            why = f"interrupted by {signal_name(run.signal)} before any test result was recorded"
        elif run.first_failure() in REFUSAL_WHY:
            why = REFUSAL_WHY[run.first_failure()]
        else:
            why = f"no test result was recorded (pytest exit {run.first_failure()}; --collect-only?)"
        return code, [f"hil run: {why}; {kept_line(run.reports)}"]
    stopped = run.signal is not None or 2 in run.codes
    target = partial_folder(run.reports, INTERRUPTED_PREFIX if stopped else INCOMPLETE_PREFIX)
    exits = ", ".join(f"{s}: exit {c}" for s, c in zip(run.stacks, run.codes, strict=False))
    why = (f"stopped by {signal_name(run.signal)}" if run.signal else
           f"the run did not complete (pytest {exits})") + f" after {n} test result(s)"
    write_run_summary(run.staging, run.results, run.stacks[:max(1, len(run.codes))],
                      published=target / "allure-results")
    mark_interrupted(run.results, run.staging / "summary.md", why)
    run.staging.rename(target)
    return code, [f"hil run: {why}; the partial results are kept in {target} (summary.md marked"
                  f" INTERRUPTED); make their report with `hil report --reports-dir {target}`;"
                  f" {kept_line(run.reports)}"]


def after_os_error(run: StagedRun | None, reports: Path) -> str:
    """What became of a run whose outputs could not be written."""
    if run is None or not run.staging.exists():
        return f"the previous results in {reports} are kept"
    if result_count(run.results):
        try:
            kept = keep_partial(run.staging, reports, INCOMPLETE_PREFIX)
        except OSError:
            kept = run.staging
        return (f"this run's results are kept in {kept}; the previous results in {reports}"
                " are kept")
    discard(run.staging)
    return f"the previous results in {reports} are kept"


def durations_args(reports: Path, args: argparse.Namespace, extra: list[str]) -> list[str]:
    """pytest plans shards by REPORTS_DIR/durations.json by default; the run's reports dir is
    its staging folder, so the published one is named (unless one is given, or it is
    unreadable: then, as pytest does with its default, a warning and the plan goes by count)."""
    given = (getattr(args, "shard_durations", "") or os.environ.get("HIL_SHARD_DURATIONS")
             or any(a.startswith("--shard-durations") for a in extra))
    default = reports / DURATIONS_FILE
    if given or not default.is_file():
        return []
    try:
        load_durations(default)
    except DurationsError as e:
        print(f"hil run: warning: {e}; ignored: shards are planned by test count",
              file=sys.stderr)
        return []
    return [f"--shard-durations={default}"]


def sharded(args: argparse.Namespace, extra: list[str]) -> bool:
    """Whether the run's pytest is given a shard (``hil nightly --shard``, a ``--shard``
    among the pytest arguments, or HIL_SHARD, pytest's variable for it)."""
    return bool(getattr(args, "shard", "") or on_command_line("--shard", extra)
                or os.environ.get("HIL_SHARD", "").strip())

"""`hil report SOURCE...`: the shards of a lab nightly -> one results folder, one report.

The merged results go to REPORTS_DIR/merged-results, the report to the usual report folder
(so the previous report's history carries the trend on), and the summary gets the merge's
problems and where each test ran. A complete merge (every shard once) also writes
REPORTS_DIR/durations.json, which the next nightly's shards balance by.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.lab.shard_plan import DURATIONS_FILE, write_durations
from harness.report.generate import generate_report
from harness.report.merge import MergeError, durations_of, merge_results, where_markdown
from harness.report.results import load_results
from harness.report.run_config import read_properties
from harness.report.summary import summarize, summary_markdown


def merge_command(sources: list[str], reports_dir: Path, report_dir: Path, summary_path: Path,
                  history: bool = True) -> int:
    """0 when the report was made from complete shards; 1 when shards are missing or
    doubled, or generation failed; 2 when a source cannot be read or the tool is missing."""
    merged_dir = Path(reports_dir) / "merged-results"
    try:
        merged = merge_results(sources, merged_dir)
    except MergeError as e:
        print(f"hil report: {e}", file=sys.stderr)
        return 2
    for src in merged.sources:
        print(f"hil report: {src.name}: {src.tests} tests from {src.given}")
    outcome = generate_report(merged_dir, report_dir, summary_path, history=history)
    folder = load_results(merged_dir)
    text = summary_markdown(summarize(folder.tests, merged.problems + folder.problems),
                            title=f"vllm-hil run, {len(merged.sources)} shard(s) merged")
    summary_path.write_text(text + "\n" + where_markdown(folder.tests))
    for problem in merged.problems:
        print(f"hil report: merge: {problem}", file=sys.stderr)
    if merged.complete and folder.tests:
        path = write_durations(Path(reports_dir) / DURATIONS_FILE, durations_of(folder.tests),
                               source=f"merge of {len(merged.sources)} shard(s)")
        print(f"hil report: test durations for the next split in {path}")
    print(f"hil report: merged results in {merged_dir}; summary in {summary_path}")
    print(outcome.describe(), file=sys.stdout if outcome.generated else sys.stderr, flush=True)
    if not outcome.generated:
        return 2 if outcome.tool_missing else 1
    return 0 if merged.complete else 1


def keep_durations(results_dir: Path, reports_dir: Path) -> Path | None:
    """After `hil report` of one unsharded run: its test durations, for a later split.
    A single shard's results are never used (other hosts would plan from other data)."""
    props = read_properties(Path(results_dir) / "environment.properties")
    folder = load_results(Path(results_dir))
    if not props or props.get("run.shard") or not folder.tests:
        return None
    return write_durations(Path(reports_dir) / DURATIONS_FILE, durations_of(folder.tests),
                           source=f"unsharded run on {props.get('host', '?')}")

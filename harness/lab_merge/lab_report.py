"""`hil report SOURCE...`: the shards of a lab nightly -> one results folder, one report.

The merged results go to REPORTS_DIR/merged-results, the report to the usual report folder
(so the previous report's history carries the trend on), and the summary gets the merge's
problems and where each test ran. A complete merge (every shard once) also writes
REPORTS_DIR/durations.json, which the next nightly's shards balance by: the durations it
measured are updated there, the others kept.

Every source is opened and checked before anything is written: a source that cannot be read,
two sources that are copies of one another, or an output that would replace a source refuse
the merge, and merged-results, the report and the summary stay as they were.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.lab.shard_plan import DURATIONS_FILE, update_durations
from harness.lab_merge.merge import (
    MergeError,
    durations_of,
    find_results,
    merge_results,
    where_markdown,
)
from harness.report.generate import generate_report
from harness.report.results import load_results
from harness.report.run_config import INTERRUPTED_KEY, read_properties
from harness.report.summary import summarize, summary_markdown, write_text_safely


def merge_command(sources: list[str], reports_dir: Path, report_dir: Path, summary_path: Path,
                  history: bool = True) -> int:
    """0 when the report was made from complete shards; 1 when shards are missing or
    doubled, or generation failed; 2 when a source cannot be read or the tool is missing."""
    merged_dir = Path(reports_dir) / "merged-results"
    problem = sources_problem(sources, merged_dir)
    if problem:
        print(f"hil report: {problem}", file=sys.stderr)
        return 2
    try:
        merged = merge_results(sources, merged_dir)
    except MergeError as e:
        said = str(e).rstrip(".")
        print(f"hil report: {said}" + ("." if said.endswith("Nothing was changed")
                                        else ". Nothing was changed"), file=sys.stderr)
        return 2
    for src in merged.sources:
        print(f"hil report: {src.name}: {src.tests} tests from {src.given}")
    outcome = generate_report(merged_dir, report_dir, summary_path, history=history)
    folder = load_results(merged_dir)
    text = summary_markdown(summarize(folder.tests, merged.problems + folder.problems),
                            title=f"vllm-hil run, {len(merged.sources)} shard(s) merged")
    write_text_safely(summary_path, text + "\n" + where_markdown(folder.tests))
    for problem in merged.problems:
        print(f"hil report: merge: {problem}", file=sys.stderr)
    if merged.complete and folder.tests:
        path = update_durations(Path(reports_dir) / DURATIONS_FILE, durations_of(folder.tests),
                                source=f"merge of {len(merged.sources)} shard(s)")
        print(f"hil report: test durations for the next split in {path}")
    print(f"hil report: merged results in {merged_dir}; summary in {summary_path}")
    print(outcome.describe(), file=sys.stdout if outcome.generated else sys.stderr, flush=True)
    if not outcome.generated:
        return 2 if outcome.tool_missing else 1
    return 0 if merged.complete else 1


def keep_durations(results_dir: Path, reports_dir: Path) -> Path | None:
    """After `hil report` of one unsharded run: its test durations, for a later split.
    A single shard's results and an interrupted run's are never used (other hosts would plan
    from other data); the tests this run did not measure keep their durations."""
    props = read_properties(Path(results_dir) / "environment.properties")
    folder = load_results(Path(results_dir))
    measured = durations_of(folder.tests)
    if not props or props.get("run.shard") or props.get(INTERRUPTED_KEY) or not measured:
        return None
    return update_durations(Path(reports_dir) / DURATIONS_FILE, measured,
                            source=f"unsharded run on {props.get('host', '?')}")


def source_inputs(sources: list[str]) -> list[tuple[str, Path]]:
    """(what, path) of each source as the merge reads it: a folder's results folder, an
    archive itself (for the output checks of `hil report`)."""
    out = []
    for given in sources:
        path = Path(given)
        if path.is_dir():
            out.append((f"the source {given}", find_results(path) or path))
        elif path.exists():
            out.append((f"the source {given}", path))
    return out


def sources_problem(sources: list[str], merged_dir: Path) -> str | None:
    """A source that the merge would replace (merged-results, or a folder inside it)."""
    merged = merged_dir.resolve()
    for what, path in source_inputs(sources):
        p = path.resolve()
        if p.is_relative_to(merged) or merged.is_relative_to(p):
            return (f"{what.removeprefix('the source ')}: it is or holds {merged_dir}, which the"
                    " merge replaces; copy it elsewhere first. Nothing was changed")
    return None

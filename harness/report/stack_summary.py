"""One summary for ``hil run --stacks A,B``: the per-stack summary parts under one matrix.

Every stack's pytest run empties ``REPORTS_DIR/stats`` before it starts, so after the last
stack only that stack's statistics (agreement, exposure, engine hygiene, cards) are left.
``hil run`` therefore keeps, after each stack's run, a part in ``REPORTS_DIR/stacks/<stack>/``:

    stats/        the stack's statistics files, as its run left them
    summary.md    the stack's own summary: its results (the ``stack`` parameter of the
                  Allure results), its exposure and agreement, root causes and cards
    part.json     {"stack", "exit_code", "junit"}

and ``REPORTS_DIR/stacks/run.json`` (the stacks in run order, the results folder and how many
results it held). The merged ``summary.md`` is: the totals, the stack x suite x target matrix
and the skipped tests by reason (from each stack's junit file, ``harness.report.stack_matrix``),
what each stack does not have (its stack file: not collected, ``stack_lacks_section``), then
each part under its stack's heading. ``hil report`` of the same results folder remakes the
merged summary from the parts.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.core.paths import REPO_ROOT
from harness.engine.device_ledger import append_device_summary
from harness.report.calibration_report import (
    FIGURES_DIR,
    calibrations_from_stats,
    write_calibration_svgs,
)
from harness.report.results import ResultsFolder, load_results, params_of
from harness.report.run_config import INTERRUPTED_KEY, read_properties
from harness.report.stack_lacks_section import lacks_markdown
from harness.report.stack_matrix import (
    Case,
    group_skips,
    matrix_markdown,
    matrix_rows,
    read_junit,
    skips_markdown,
    totals_line,
)
from harness.report.summary import (
    is_table_row,
    summary_text,
    with_faults_line,
    write_summary,
    write_text_safely,
)
from harness.stacks.spec import DEFAULT_STACK, StackError, load_stack
from harness.targets import all_variants

PARTS_DIR = "stacks"
RUN_FILE = "run.json"
PART_FILE = "part.json"
SUITES_DIR = REPO_ROOT / "suites"


def junit_name(stack: str) -> str:
    """The junit file of a stack's run: junit.xml for the default stack."""
    return "junit.xml" if stack == DEFAULT_STACK else f"junit-{stack}.xml"


def suite_names(folder: Path = SUITES_DIR) -> list[str]:
    """The suites (``suites/test_NAME.py`` -> NAME), by name."""
    return sorted(p.stem.removeprefix("test_") for p in Path(folder).glob("test_*.py"))


def declared_reasons(stacks: Iterable[str]) -> dict[str, list[str]]:
    """Per stack, the reasons its stack file gives for the targets and suites it does not
    support (none for a stack that cannot be read)."""
    out: dict[str, list[str]] = {}
    for name in stacks:
        try:
            stack = load_stack(name)
        except StackError:
            out[name] = []
            continue
        out[name] = [*stack.unsupported.values(), *stack.unsupported_suites.values()]
    return out


# ------------------------------------------------------------ pure text helpers


def separate_tables(lines: Sequence[str]) -> list[str]:
    """``lines`` with a blank line wherever a table row is followed by a line that is not one,
    so that line is not read as a row of the table."""
    out: list[str] = []
    for line in lines:
        if out and is_table_row(out[-1]) and line.strip() and not is_table_row(line):
            out.append("")
        out.append(line)
    return out


def demote_headings(lines: Sequence[str]) -> list[str]:
    """Every markdown heading one level down (``## X`` -> ``### X``)."""
    return ["#" + line if line.startswith("#") else line for line in lines]


def part_section(stack: str, part: str | None, exit_code: int | None) -> str:
    """A stack's part under its heading: the part's own title replaced, its headings one
    level down, its tables kept apart from the lines after them."""
    code = "" if exit_code is None else f" (pytest exit code {exit_code})"
    lines = [f"## Stack `{stack}`{code}", ""]
    if part is None:
        return "\n".join(lines + ["No summary part: this stack's run wrote none.", ""])
    body = part.strip("\n").splitlines()
    if body and body[0].startswith("# "):
        body = body[1:]
    while body and not body[0].strip():
        body = body[1:]
    lines += separate_tables(demote_headings(body))
    return "\n".join(lines).rstrip("\n") + "\n"


def compose_merged(stacks: Sequence[str], cases: Sequence[Case], matrix: str, skips: str,
                   sections: Sequence[str], problems: Sequence[str] = (), lacks: str = "") -> str:
    """The merged summary: title, totals, matrix, what each stack lacks, skips, each stack's
    section, problems."""
    lines = [f"# vllm-hil run: {len(stacks)} stacks ({', '.join(stacks)})", "",
             totals_line(cases), "", matrix.rstrip("\n"), ""]
    for text in (lacks, skips):
        if text:
            lines += [text.rstrip("\n"), ""]
    for section in sections:
        lines += [section.rstrip("\n"), ""]
    if problems:
        lines += ["## Results problems", ""]
        lines += [f"- {p.replace('|', '/').replace(chr(10), ' ')}" for p in problems] + [""]
    return "\n".join(lines)


# ------------------------------------------------------------------ the parts


def parts_dir(reports: Path) -> Path:
    return Path(reports) / PARTS_DIR


def tests_of_stack(tests: Iterable[dict[str, Any]], stack: str) -> list[dict[str, Any]]:
    """The results of one stack (the ``stack`` parameter; none means the default stack)."""
    return [t for t in tests if (params_of(t).get("stack") or DEFAULT_STACK) == stack]


def save_stack_part(reports: Path, allure_dir: Path, stack: str, exit_code: int,
                    ran: bool = True) -> Path:
    """After one stack's run: keep its statistics and write its summary part; returns the
    part's folder. ``ran`` False (pytest refused the arguments): REPORTS_DIR/stats are still
    the previous stack's, and the part gets none."""
    reports = Path(reports)
    part = parts_dir(reports) / stack
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    if ran and (reports / "stats").is_dir():
        shutil.copytree(reports / "stats", part / "stats")
    tests = tests_of_stack(load_results(Path(allure_dir)).tests, stack)
    figures = part / FIGURES_DIR
    write_calibration_svgs(calibrations_from_stats(part / "stats"), figures)
    # What the stack lacks is the merged summary's, once per stack, not each part's.
    (part / "summary.md").write_text(summary_text(tests, [], part / "stats",
                                                  title=f"stack {stack}", figures=figures,
                                                  lacks=False))
    append_device_summary(part / "stats", part / "summary.md")
    (part / PART_FILE).write_text(json.dumps(
        {"stack": stack, "exit_code": exit_code, "junit": junit_name(stack)}))
    return part


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def known_targets(tests: Iterable[dict[str, Any]] = ()) -> list[str]:
    """The target labels a test id may carry: the registry's variants in their order, then
    any other ``target_variant`` of the results (a variant this process does not know)."""
    known = list(all_variants())
    seen = {params_of(t).get("target_variant") for t in tests}
    return known + sorted(t for t in seen if t and t not in known)


def merged_summary(reports: Path, stacks: Sequence[str], problems: Sequence[str] = (),
                   tests: Iterable[dict[str, Any]] = ()) -> str:
    """The merged summary of the parts and junit files of ``stacks`` in ``reports``; ``tests``
    (the Allure results) name targets the registry does not know."""
    reports = Path(reports)
    cases: list[Case] = []
    missing: list[str] = []
    sections = []
    for stack in stacks:
        folder = parts_dir(reports) / stack
        meta = _read_json(folder / PART_FILE)
        found, why = read_junit(reports / (meta.get("junit") or junit_name(stack)), stack)
        cases += found
        missing += [why] if why else []
        summary = folder / "summary.md"
        text = summary.read_text() if summary.is_file() else None
        sections.append(part_section(stack, text, meta.get("exit_code")))
    declared = declared_reasons(stacks)
    suites = list(dict.fromkeys([*suite_names(), *sorted({c.suite for c in cases})]))
    rows = matrix_rows(cases, stacks, suites, known_targets(tests), declared)
    return compose_merged(stacks, cases, matrix_markdown(rows, suites, missing),
                          skips_markdown(group_skips(cases, declared)), sections, problems,
                          lacks_markdown(stacks))


def write_run_summary(reports: Path, allure_dir: Path, stacks: Sequence[str],
                      published: Path | None = None) -> str:
    """`hil run`'s summary.md: one stack's summary as it always was (with its cards); for
    several stacks the merged summary of their parts. Returns the text written. ``published``:
    where ``allure_dir`` will be once the run is published (``hil run`` writes into a staging
    folder), recorded in run.json so `hil report` of it finds the parts."""
    reports = Path(reports)
    out = reports / "summary.md"
    if len(stacks) < 2:
        (parts_dir(reports) / RUN_FILE).unlink(missing_ok=True)
        text = write_summary(Path(allure_dir), out)
        cards = append_device_summary(reports / "stats", out)
        return text + ("\n" + cards if cards else "")
    folder = load_results(Path(allure_dir))
    parts_dir(reports).mkdir(parents=True, exist_ok=True)
    (parts_dir(reports) / RUN_FILE).write_text(json.dumps({
        "stacks": list(stacks), "results": str(Path(published or allure_dir).resolve()),
        "tests": len(folder.tests)}))
    text = merged_summary(reports, stacks, folder.problems, folder.tests)
    write_text_safely(out, text)
    return text


def run_stacks(results_dir: Path, folder: ResultsFolder) -> list[str] | None:
    """The stacks of the `hil run --stacks` whose parts describe ``results_dir`` as it is
    now (same folder, same number of results, no other stack in it); None otherwise."""
    run = _read_json(parts_dir(Path(results_dir).parent) / RUN_FILE)
    stacks = run.get("stacks")
    if not isinstance(stacks, list) or len(stacks) < 2:
        return None
    if run.get("results") != str(Path(results_dir).resolve()) or run.get("tests") != len(
            folder.tests):
        return None
    seen = {params_of(t).get("stack") or DEFAULT_STACK for t in folder.tests}
    return [str(s) for s in stacks] if seen <= set(stacks) else None


def interrupted_line(why: str) -> str:
    """The first line of the summary of a run that did not finish."""
    return f"**INTERRUPTED**: {why}; these are partial results.\n\n"


def write_report_summary(results_dir: Path, out: Path, folder: ResultsFolder | None = None) -> str:
    """`hil report`'s summary.md: the merged summary again when the results are those of a
    `hil run --stacks` with parts, else the summary of the results folder; first, the mark of
    a run that was interrupted (its ``run.interrupted`` environment property)."""
    folder = folder or load_results(results_dir)
    why = read_properties(Path(results_dir) / "environment.properties").get(INTERRUPTED_KEY)
    stacks = run_stacks(results_dir, folder)
    if stacks is None:
        stats_dir = Path(results_dir).parent / "stats"
        figures = Path(out).parent / FIGURES_DIR
        write_calibration_svgs(calibrations_from_stats(stats_dir), figures)
        text = with_faults_line(summary_text(folder.tests, folder.problems, stats_dir,
                                             figures=figures), results_dir)
    else:
        text = merged_summary(Path(results_dir).parent, stacks, folder.problems, folder.tests)
    text = (interrupted_line(why) if why else "") + text
    write_text_safely(out, text)
    return text

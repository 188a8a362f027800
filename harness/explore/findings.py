"""What ``hil explore`` writes: ``DIR/explore/findings.md`` (every finding: its geometry, its
workload, the failed check's text, its replays on fresh engines (confirmed, or flaky), the
checks that held on it, and the search's figures; "no finding" when there is none)
and one pytest regression test per finding, ``DIR/explore/test_finding_<key>.py``, which replays
the example through the harness plugin and fails while the defect is there. findings.md gives
the exact command that runs it.
"""

from __future__ import annotations

import pprint
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.paths import REPO_ROOT
from harness.explore.confirm import CONFIRM_REPLAYS
from harness.explore.example import Example

if TYPE_CHECKING:  # the search needs hypothesis, which only `hil explore` itself does
    from harness.explore.confirm import Finding
    from harness.explore.search import SearchResult, Tally

FINDINGS_FILE = "findings.md"
FOLDER = "explore"  # REPORTS_DIR/explore/
REPLAY_FOLDER = "replay"  # a regression test's own reports folder, inside FOLDER
# The plugin's modules, loaded by name: a test file outside the checkout has no conftest.py to
# load them (the entry points are blocked, so nothing registers twice).
CHECKOUT_PLUGINS = ("-p", "no:vllm_hil", "-p", "no:vllm_hil_allure",
                    "-p", "harness.plugin.hooks", "-p", "harness.plugin.fixtures",
                    "-p", "harness.plugin.allure_report")
MAX_LISTED_REASONS = 8


@dataclass
class RunInfo:
    """How the search was run: what findings.md and the regression commands say."""

    seed: int
    budget: float
    shrink_budget: float
    model: str
    stack: str
    faults: tuple[str, ...] = ()
    cache_dir: Path | None = None  # None: the default (.hil-cache where the command runs)
    explore_dir: Path = Path(FOLDER)
    confirm: int = CONFIRM_REPLAYS  # replays of a finding on fresh engines (--confirm)
    python: str = field(default_factory=lambda: sys.executable)
    checkout: Path = REPO_ROOT


def test_name(finding: Finding) -> str:
    return f"test_finding_{finding.key}"


def regression_command(test: Path, finding: Finding, info: RunInfo) -> str:
    """The shell command that runs the regression test ``test`` of ``finding``: in this
    checkout with its own plugin modules (an installed harness: ``-p vllm_hil``), on the
    finding's target, model and stack, with its faults, outputs in the replay folder."""
    identity = finding.identity
    checkout = (info.checkout / "pyproject.toml").is_file() and (info.checkout / "harness").is_dir()
    args = [info.python, "-m", "pytest"]
    args += ["-c", "pyproject.toml", *CHECKOUT_PLUGINS] if checkout else ["-p", "vllm_hil"]
    args += [str(test.resolve()), "--target", identity.target, "--model", identity.model,
             "--stack", identity.stack]
    for fault in identity.faults:
        args += ["--inject-fault", fault]
    if info.cache_dir is not None:
        args += ["--hil-cache-dir", str(Path(info.cache_dir).resolve())]
    args.append(f"--hil-reports-dir={(info.explore_dir / REPLAY_FOLDER).resolve()}")
    command = shlex.join(args)
    return f"cd {shlex.quote(str(info.checkout))} && {command}" if checkout else command


def regression_test(finding: Finding, command: str) -> str:
    """The source of the regression test of ``finding``."""
    recorded = {**finding.identity.to_dict(), "check": finding.check}
    text = "\n".join([
        f"A regression test written by hil explore: finding {finding.key}.",
        "",
        f"[check {finding.check}] {finding.verdict.why}",
        "",
        *([finding.confirmation.summary(), ""] if finding.confirmation else []),
        _identity_line(finding),
        *_indented(finding.example.describe()),
        "",
        "It fails while the defect is there. Run it with:",
        "",
        *_indented(command),
    ])
    # A docstring holds any text: its backslashes doubled, no triple quote ending it early.
    doc = '"""' + text.replace("\\", "\\\\").replace('"""', "'''") + '\n"""'
    return "\n".join([
        doc,
        "",
        "import pytest",
        "",
        "from harness.explore.replay import replay_example",
        "",
        f"EXAMPLE = {pprint.pformat(finding.example.to_dict(), width=96, sort_dicts=True)}",
        f"RECORDED = {pprint.pformat(recorded, width=96, sort_dicts=True)}",
        "",
        "",
        f"@pytest.mark.hil_targets({finding.identity.target!r})",
        f"def {test_name(finding)}(hil, model, target_variant):",
        "    replay_example(hil, model, target_variant, EXAMPLE, RECORDED)",
        "",
    ])


def _indented(text: str) -> list[str]:
    return ["    " + line for line in text.splitlines()]


def _identity_line(finding: Finding) -> str:
    i = finding.identity
    faults = f", faults injected: {', '.join(i.faults)}" if i.faults else ""
    return f"Target {i.target}, model {i.model}, stack {i.stack}{faults}."


def workload_table(example: Example) -> list[str]:
    lines = ["| request | prompt tokens | shared with its family | max_tokens | arrives at step"
             " | aborted before step |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(example.requests):
        shared = f"{r.shared} (family {r.family})" if r.shared else "-"
        abort = "-" if r.abort_step is None else str(r.abort_step)
        lines.append(f"| r{i} | {r.prompt_len} | {shared} | {r.max_tokens} | {r.arrival}"
                     f" | {abort} |")
    return lines


def geometry_table(example: Example) -> list[str]:
    """The geometry as a table of fixtures/geometries.toml (lab geometries take it as is)."""
    lines = [f"[{example.geometry.name}]", 'description = "found by hil explore"']
    for key, value in example.values.items():
        shown = str(value).lower() if isinstance(value, bool) else (
            f'"{value}"' if isinstance(value, str) else str(value))
        lines.append(f"{key} = {shown}")
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def tally_lines(tally: Tally, result: SearchResult) -> list[str]:
    lines = [
        f"- stopped: {result.stopped}, after {result.seconds:.0f} s",
        f"- geometries explored: {tally.geometries}; refused before or at engine start:"
        f" {sum(tally.geometries_refused.values())}",
        f"- examples run: {tally.examples} ({tally.passed} passed, {tally.failed} failed);"
        f" one example costs {_seconds(tally.seconds_per_example)} on average (engine run,"
        " reference and checks; engine starts included)",
        f"- engines started: {result.engine_starts} ({result.engine_start_seconds:.0f} s)",
        "- where the time went: " + (", ".join(
            f"{k} {v:.0f} s" for k, v in sorted(result.timers.items()) if v >= 0.5) or "-"),
        f"- examples refused (not run): {sum(tally.rejected.values())}",
    ]
    if tally.flaky:
        lines.append(f"- shrunk examples that did not fail again when replayed: {tally.flaky}")
    for summary, n in tally.known.most_common():
        lines.append(f"- known failures met (not findings): {summary}: {n} example(s)")
    for title, counter in (("geometry refused", tally.geometries_refused),
                           ("example refused", tally.rejected)):
        for reason, n in counter.most_common(MAX_LISTED_REASONS):
            lines.append(f"  - {title} ({n}x): {reason}")
    return lines


def title(findings: Sequence[Finding]) -> str:
    """findings.md's first line: how many findings, the flaky ones apart (a flaky finding is
    no defect until it reproduces)."""
    flaky = sum(f.flaky for f in findings)
    defects = len(findings) - flaky
    parts = []
    if defects or not flaky:
        parts.append(f"{defects or 'no'} finding{'' if defects == 1 else 's'}")
    if flaky:
        parts.append(f"{flaky} flaky finding{'' if flaky == 1 else 's'} (not confirmed)")
    return "# hil explore: " + ", ".join(parts)


def held_checks(finding: Finding) -> str:
    """The checks that held on the finding's example, in one line ("none")."""
    return ", ".join(v.check + (f" ({v.why})" if v.why else "") for v in finding.held) or "none"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def confirmation_lines(finding: Finding) -> list[str]:
    """The replays of a finding on fresh engines, as findings.md shows them."""
    c = finding.confirmation
    if c is None:
        return []
    summary = c.summary()
    lines = ["", summary[0].upper() + summary[1:] + "."]
    if c.replays:
        lines += ["", "| replay | outcome | s | verdict |", "|---|---|---|---|"]
        lines += [f"| {i} | {r.outcome} | {r.seconds:.1f} | {_cell(r.line)} |"
                  for i, r in enumerate(c.replays, 1)]
    return lines


def console_lines(finding: Finding) -> list[str]:
    """What ``hil explore`` prints of a finding: the failure, when and how it was found and
    shrunk, what its replays said (each replay's line when it is flaky), the checks that held."""
    c = finding.confirmation
    name = f"{'flaky finding' if finding.flaky else 'finding'} {finding.key}"
    lines = [f"{name}: [check {finding.check}] {finding.verdict.why}",
             (f"found after {finding.found_after:.1f} s, shrunk in {finding.shrink_seconds:.1f}"
              f" s: {finding.example.describe()}").replace("\n", "; ")]
    if c is not None:
        lines.append(c.summary())
        if finding.flaky:
            lines += c.lines()
    lines.append(f"checks that held on its example: {held_checks(finding)}")
    return lines


def finding_section(finding: Finding, test: Path, command: str) -> list[str]:
    v = finding.verdict
    others = [o for o in finding.outcome.failures if o is not v]
    lines = [
        f"## {'Flaky finding' if finding.flaky else 'Finding'} {finding.key}:"
        f" [check {finding.check}]",
        "",
        _identity_line(finding),
        f"Found after {finding.found_after:.1f} s of search"
        f" ({_count(finding.examples_before, 'example')} run); shrunk in"
        f" {finding.shrink_seconds:.1f} s ({_count(finding.shrink_runs, 'run')})"
        + ("" if finding.reproduced else
                    "; the shrunk example did not fail again when hypothesis replayed it"),
        *confirmation_lines(finding),
        "",
        f"Geometry: {finding.example.geometry.describe().split(': ', 1)[1]}",
        "",
        "```toml", *geometry_table(finding.example), "```",
        "",
        "Workload:",
        "",
        *workload_table(finding.example),
        "",
        "The failed check:",
        "",
        "```text", v.message(), "```",
    ]
    if others:
        lines += ["", "Other checks that failed in the same run:", ""]
        lines += [f"- [check {o.check}] {o.why}" for o in others]
    lines += ["", f"Checks that held on this example: {held_checks(finding)}."]
    if finding.outcome.known:
        lines += ["", "Known failures of the stack met in the same run (quarantine.toml): "
                  + "; ".join(k.reason for k in finding.outcome.known) + "."]
    lines += [
        "",
        f"Regression test: `{test.name}` (beside this file). It fails while the defect is"
        " there" + (" (flaky: it may pass)" if finding.flaky else "") + ":",
        "",
        "```bash", command, "```",
    ]
    if finding.original != finding.example:
        lines += ["", "The first failing example, before shrinking:", "", "```text",
                  finding.original.describe(), "```"]
    return lines


def write_findings(info: RunInfo, results: Sequence[tuple[str, SearchResult]],
                   into: Path | None = None) -> list[Path]:
    """Write findings.md and each finding's regression test into ``into`` (the staging
    folder they are published from; default ``info.explore_dir``); returns the regression
    tests as published, in ``info.explore_dir``, which is where the text cites them."""
    out = into or info.explore_dir
    out.mkdir(parents=True, exist_ok=True)
    findings = [f for _, r in results for f in r.findings]
    faults = f"; faults injected: {', '.join(info.faults)}" if info.faults else ""
    lines = [
        title(findings),
        "",
        f"Model {info.model}, stack {info.stack}, seed {info.seed}, budget {info.budget:g} s"
        f" (shrinking {info.shrink_budget:g} s more){faults}.",
        "",
    ]
    tests: list[Path] = []
    for finding in findings:
        test = info.explore_dir / f"{test_name(finding)}.py"
        command = regression_command(test, finding, info)
        (out / test.name).write_text(regression_test(finding, command), encoding="utf-8")
        tests.append(test)
        lines += [*finding_section(finding, test, command), ""]
    lines += ["## The search", ""]
    for target, result in results:
        lines += [f"### {target}", "", *tally_lines(result.tally, result), ""]
    (out / FINDINGS_FILE).write_text("\n".join(lines), encoding="utf-8")
    return tests

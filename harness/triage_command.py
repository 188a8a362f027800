"""``hil triage NODEID [PYTEST ARGS...]``: triage one test of a previous run again.

    hil triage NODEID [--budget SECONDS] [--reports-dir DIR] [PYTEST ARGS...]

Runs that one test in a child pytest, as ``hil run`` runs the suites, with triage on for it
(``--triage-max 1``, a budget of ``--budget`` seconds), into a folder of its own
(REPORTS_DIR/triage/<time>-<test>/: allure-results, junit.xml, stats, engine logs), so the
published run's results stay as they are. The run takes what the previous run recorded: the
test's stack (its ``stack`` parameter in REPORTS_DIR/allure-results) and the options of its
pytest command (``run.args`` in environment.properties: models, targets, injected faults,
inventory, tolerances...), without its selection, outputs, shard and triage options; PYTEST
ARGS come after them, so they add to or override them.

Prints each triage's table (``TriageResult.table()``) from the run's statistics files.
Exit 0 when a triage was made; 1 when none was (the test passed, was skipped, failed in a way
that is not triaged, or the run stopped); 2 on bad input (no such test, arguments pytest
refused).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from harness.core.paths import REPO_ROOT
from harness.core.triage import TriageResult
from harness.plugin.options import BY_NAME, add_cli_option, cli_type
from harness.report.results import labels_of, load_results, params_of
from harness.report.run_config import read_properties
from harness.staging.interrupt import ChildRunner, pytest_command, signal_name

BUDGET = 1800.0  # seconds of triage for the one test (--budget)
FOLDER = "triage"  # REPORTS_DIR/triage/<time>-<test>/
USAGE_ERROR, NO_TESTS = 4, 5  # pytest's exit codes for refused arguments, nothing collected

# Options of the previous run's command that are not carried over, with the value they take:
# its selection, its outputs, its sharding and its own triage limits (set here).
DROPPED_VALUE = frozenset({
    "--alluredir", "--junitxml", "--junit-xml", "--hil-reports-dir", "--stack", "--shard",
    "--shard-durations", "-m", "-k", "-n", "--numprocesses", "--dist", "--maxfail",
    "--triage-max", "--triage-budget", "--deselect", "--ignore", "--ignore-glob",
})
DROPPED_FLAGS = frozenset({
    "--no-triage", "--clean-alluredir", "--hil-clean-results", "--hil-plan", "-x", "--exitfirst",
    "--lf", "--last-failed", "--ff", "--failed-first", "--sw", "--stepwise", "--co",
    "--collect-only", "--strict-quarantine",
})
# pytest's own options that take a value, kept with it.
PYTEST_VALUE = frozenset({"-p", "-c", "-o", "--override-ini", "-W", "--pythonwarnings",
                          "--rootdir", "--confcutdir", "--timeout", "--basetemp", "--log-level",
                          "--log-cli-level", "--tb"})


def _takes_value(name: str) -> bool | None:
    """Whether option ``name`` takes a value: True, False, or None when it is not known."""
    if name in DROPPED_VALUE or name in PYTEST_VALUE:
        return True
    if name in DROPPED_FLAGS:
        return False
    opt = BY_NAME.get(name)
    if opt is not None:
        return opt.action != "store_true"
    return None


def _is_test_path(token: str) -> bool:
    return "::" in token or token.endswith(".py") or Path(token).exists()


def carried_args(recorded: list[str]) -> list[str]:
    """The options of a previous run's pytest arguments that a re-run of one of its tests
    keeps: every option but the DROPPED ones, with its value; test paths left out (the node id
    is the selection). An option this harness and pytest do not declare is kept with the next
    argument when that is no option and no test path."""
    out: list[str] = []
    i = 0
    while i < len(recorded):
        token = recorded[i]
        i += 1
        if not token.startswith("-") or token == "-":
            continue  # a test path, or a stray word of an expression split on spaces
        name, eq, _ = token.partition("=")
        short_joined = not eq and len(name) > 2 and name[1] != "-" and name[:2] in DROPPED_VALUE
        if name in DROPPED_VALUE or short_joined:
            if not eq and not short_joined and i < len(recorded):
                i += 1  # its value
            continue
        if name in DROPPED_FLAGS:
            continue
        out.append(token)
        takes = _takes_value(name)
        nxt = recorded[i] if i < len(recorded) else None
        if eq or nxt is None:
            continue
        if takes or (takes is None and not nxt.startswith("-") and not _is_test_path(nxt)):
            out.append(nxt)
            i += 1
    return out


@dataclass
class Previous:
    """What the previous run recorded of the test: its stack and the run's options."""

    stack: str = ""
    args: list[str] | None = None
    notes: list[str] | None = None


def previous_run(results: Path, nodeid: str) -> Previous:
    """The stack the test ran on in ``results`` (a failed run of it first; the first of
    several with a note) and the options of that run's pytest command."""
    prev = Previous(notes=[])
    if not results.is_dir():
        prev.notes.append(f"no previous results in {results}: the run takes only the arguments"
                          " given")
        return prev
    mine = [t for t in load_results(results).tests if nodeid in (labels_of(t).get("nodeid") or [])]
    mine.sort(key=lambda t: t.get("status") not in ("failed", "broken"))
    stacks = list(dict.fromkeys(params_of(t).get("stack") or "default" for t in mine))
    if stacks:
        prev.stack = stacks[0]
        if len(stacks) > 1:
            prev.notes.append(f"the test ran on stacks {', '.join(stacks)}; triaging it on"
                              f" {stacks[0]} (give --stack to choose)")
    else:
        prev.notes.append(f"{nodeid} is not in the previous results ({results}): the run takes"
                          " the recorded options and the arguments given")
    recorded = read_properties(results / "environment.properties").get("run.args", "")
    prev.args = carried_args(recorded.split()) if recorded else []
    return prev


def _slug(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", nodeid.rsplit("/", 1)[-1]).strip("-")[:80]


def run_folder(reports: Path, nodeid: str) -> Path:
    """A new folder of the re-run's own under REPORTS_DIR/triage/."""
    base = Path(reports) / FOLDER / f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(nodeid)}"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    folder.mkdir(parents=True)
    return folder


def triage_command(nodeid: str, folder: Path, budget: float, carried: list[str], stack: str,
                   extra: list[str]) -> list[str]:
    """The child pytest's command line (run in the checkout, as ``hil run`` runs it)."""
    given_stack = any(a == "--stack" or a.startswith("--stack=") for a in extra)
    return pytest_command(nodeid, f"--alluredir={folder / 'allure-results'}",
                          f"--junitxml={folder / 'junit.xml'}", f"--hil-reports-dir={folder}",
                          *([f"--stack={stack}"] if stack and not given_stack else []),
                          *carried, "--triage-max=1", f"--triage-budget={budget:g}", *extra)


def triage_results(folder: Path, nodeid: str) -> list[TriageResult]:
    """The triages of the run's statistics files; those of ``nodeid`` when any matches."""
    found: list[TriageResult] = []
    stats = Path(folder) / "stats"
    for f in sorted(stats.glob("*.json")) if stats.is_dir() else []:
        try:
            entries = json.loads(f.read_text(encoding="utf-8")).get("triage") or []
            found += [TriageResult.from_dict(e) for e in entries]
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            continue
    mine = [r for r in found if r.nodeid == nodeid or r.nodeid.endswith(nodeid)]
    return mine or found


def test_outcome(junit: Path) -> tuple[str, str]:
    """(passed | failed | skipped | none, the message) of the run's test from its junit xml."""
    try:
        cases = list(ET.parse(junit).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        return "none", ""
    for tag, outcome in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
        for tc in cases:
            el = tc.find(tag)
            if el is not None:
                return outcome, el.get("message") or (el.text or "")
    return ("passed", "") if cases else ("none", "")


def not_triaged(nodeid: str, message: str) -> str:
    """Why a failed test has no triage: the session's own ``triage:`` paragraph when its
    message has one, else what was triaged and what it failed with."""
    lines = [ln.strip() for ln in message.strip().splitlines()]
    said = next((ln for ln in lines if ln.startswith("triage:")), "")
    if said:
        why = said.removeprefix("triage:").strip().removeprefix("not triaged:").strip()
        return f"{nodeid} failed and was not triaged: {why}"
    first = lines[0] if lines else "no message"
    return (f"{nodeid} failed and was not triaged: only a failed token-equality or KV-ledger"
            f" verdict is; it failed with: {first[:200]}")


def cmd_triage(args: argparse.Namespace, extra: list[str]) -> int:
    nodeid = str(args.nodeid)
    if "::" not in nodeid:
        hint = next((a for a in extra if "::" in a), "")
        print(f"hil triage: {nodeid!r} is not a test's node id (path::name[parameters], as"
              " summary.md lists the failing tests)"
              + (f"; give it first: hil triage {hint} ..." if hint else ""), file=sys.stderr)
        return 2
    reports = Path(args.reports_dir)
    prev = previous_run(reports / "allure-results", nodeid)
    for note in prev.notes or []:
        print(f"hil triage: {note}", file=sys.stderr)
    try:
        folder = run_folder(reports, nodeid)
    except OSError as e:
        print(f"hil triage: cannot make the run's folder: {e}", file=sys.stderr)
        return 2
    cmd = triage_command(nodeid, folder, float(args.budget), prev.args or [], prev.stack, extra)
    print("hil triage: pytest", " ".join(cmd[3:]), flush=True)
    with ChildRunner() as runner:
        outcome = runner.run(cmd, REPO_ROOT)
    return report_outcome(nodeid, folder, outcome.code, signal_name(outcome.signal))


def report_outcome(nodeid: str, folder: Path, code: int, stopped_by: str = "") -> int:
    """Print the triage tables of the run in ``folder`` (or why there are none); the exit
    code of ``hil triage``."""
    if code in (USAGE_ERROR, NO_TESTS):
        what = "no test was collected" if code == NO_TESTS else "pytest refused it"
        print(f"hil triage: {nodeid}: {what} (pytest exit {code}; its message is above): no"
              " such test in this checkout's suites, or arguments it does not take. Give a node"
              " id as summary.md lists it, with the options of the run it failed in",
              file=sys.stderr)
        return 2
    results = triage_results(folder, nodeid)
    for r in results:
        print()
        print(r.table())
    if results:
        print(f"\nhil triage: the run's results are in {folder}")
        return 0
    status, message = test_outcome(folder / "junit.xml")
    if stopped_by:
        print(f"hil triage: stopped by {stopped_by}: nothing triaged; this run's partial"
              f" output is in {folder}; the earlier results are as they were", file=sys.stderr)
    elif status == "passed":
        print(f"{nodeid} passed: nothing to triage")
    elif status == "skipped":
        print(f"{nodeid} was skipped: nothing to triage ({message.strip()[:200]})")
    elif status == "failed":
        print(not_triaged(nodeid, message))
    else:
        print(f"hil triage: {nodeid}: the run ended (pytest exit {code}) without a result for"
              f" the test; see its output above and {folder}", file=sys.stderr)
    return 1


def add_triage_parser(sub: argparse._SubParsersAction, root: Path) -> None:
    """The ``hil triage`` sub-command."""
    t = sub.add_parser("triage", help="triage one test of a previous run again (extra args go"
                       " to pytest)")
    t.add_argument("nodeid", metavar="NODEID",
                   help="the test's node id, as summary.md lists it (give it first)")
    t.add_argument("--budget", type=cli_type("seconds", "--budget"), default=BUDGET,
                   help=f"seconds of triage for the test (default {BUDGET:g})")
    add_cli_option(t, "--hil-reports-dir", "--reports-dir", default=str(root / "reports"))
    t.set_defaults(func=cmd_triage)

"""`hil selftest`: can this host's harness still catch faults on the stack it has today?

Each fault of ``harness.in_engine.faults`` is injected into the installed stack, on each target of
this host it applies to (the CPU paths always; a Spyre card or Neuron device when the
inventory has one), and the smallest suite selection that proves it runs in a child
pytest. Each kind declares its own cases, with the targets they run on (its
``selftest_module``, asked through the kind registry). A case is *caught* when that selection
fails with the fault's failure category (``harness.report.categories``); the table says which
test caught it and with what message. Results go into the allure-results folder as the suite
``selftest`` (one result per fault and target, keyed by host, so merged shards keep one per
host). Exit 1 when any fault family applicable here goes uncaught; exit 2 when ``--fault`` names
one with no case here (a selection of nothing would otherwise report every family caught).
Each child runs as ``hil run``'s does (``harness.staging.interrupt.ChildRunner``): SIGINT,
SIGTERM and SIGHUP stop it and its engines, and a ``hil selftest`` killed outright takes its
child with it; a stopped selftest writes its table marked interrupted and no Allure results
(the cases it did not run would read as caught nowhere), and exits 128 + the signal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.in_engine.faults import FAULTS
from harness.lab.inventory import InventoryError, discover_inventory, load_inventory
from harness.plugin.options import add_cli_option
from harness.report.categories import classify
from harness.stacks.spec import StackError, load_stack, stack_python
from harness.staging.interrupt import ChildRunner, pytest_command, signal_name
from harness.staging.staged_report import StagedReport
from harness.targets import kinds_on, selftest_modules
from harness.targets.selftest_case import Case

# The kinds declare their cases, each with the kind whose target it runs on, in the module
# their ``selftest_module`` names (harness/targets/<kind>/selftest_cases.py):
#   CASES              run on every host: the CPU paths;
#   DEVICE_CASES       run where the host has a device of the kind (the device required);
#   DEVICE_ONLY_FAULTS faults with no case off the device (their check is the device's own),
#   DEVICE_ONLY_WHY    and what proves them instead.


def cpu_cases() -> tuple[Case, ...]:
    """The cases every host runs (the CPU paths), from every kind, in kind order."""
    return tuple(c for m in selftest_modules().values() for c in getattr(m, "CASES", ()))


def device_cases(kind: str) -> tuple[Case, ...]:
    """The cases the kind ``kind`` runs where the host has one of its devices."""
    module = selftest_modules().get(kind)
    return tuple(getattr(module, "DEVICE_CASES", ())) if module is not None else ()


def device_only_faults() -> dict[str, str]:
    """Every kind's faults that have no case off its device -> what proves them instead."""
    return {f: getattr(m, "DEVICE_ONLY_WHY", "needs the device")
            for m in selftest_modules().values() for f in getattr(m, "DEVICE_ONLY_FAULTS", ())}


@dataclass
class Outcome:
    """What one case's child pytest showed."""

    case: Case
    verdict: str  # caught, wrong category, uncaught, not run, not applicable
    test: str = ""
    category: str = ""
    message: str = ""
    seconds: float = 0.0
    output: str = ""
    start_ms: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return self.verdict == "caught"


def cases_for(kinds: list[str], only: list[str] | None = None) -> list[Case]:
    """The cases of this host's device kinds (the CPU paths always), optionally only the
    families in ``only``."""
    cases = list(cpu_cases())
    for kind in kinds:
        cases += device_cases(kind)
    if only:
        unknown = sorted(set(only) - set(FAULTS))
        if unknown:
            raise ValueError(f"--fault: unknown fault(s) {', '.join(unknown)}; known:"
                             f" {', '.join(FAULTS)}")
        here = {c.family for c in cases}
        idle = [f for f in dict.fromkeys(only) if f not in here]
        if idle:
            # A filter that selects nothing would report "every fault family caught".
            elsewhere = device_only_faults()
            by_why: dict[str, list[str]] = {}
            for f in idle:
                if f in elsewhere:
                    by_why.setdefault(elsewhere[f], []).append(f)
            why = "".join(f"; {', '.join(fs)} {w}" for w, fs in by_why.items())
            raise ValueError(f"--fault {', '.join(idle)}: no selftest case on this host"
                             f" (device kinds: {', '.join(kinds) or 'none, the CPU paths'}){why};"
                             f" faults with a case here: {', '.join(sorted(here))}")
        cases = [c for c in cases if c.family in only]
    return cases


def judge(case: Case, returncode: int, junit: Path) -> tuple[str, str, str, str]:
    """(verdict, test, category, first message line) from a child run's junit xml."""
    cases = []
    if junit.is_file():
        try:
            cases = list(ET.parse(junit).getroot().iter("testcase"))
        except ET.ParseError:
            cases = []
    if not cases:
        return "not run", "", "", f"the selection ran no test (pytest exit {returncode})"
    skipped = [tc for tc in cases if tc.find("skipped") is not None]
    if len(skipped) == len(cases):
        # A skip proves nothing: the case is misplaced on this host's stack, not uncaught.
        why = skipped[0].find("skipped").get("message", "") or "no reason given"
        return "not run", "", "", f"the selection was skipped: {why}"[:300]
    for tc in cases:
        for tag in ("failure", "error"):
            el = tc.find(tag)
            if el is None:
                continue
            message = el.get("message") or (el.text or "")
            category = classify("failed", message.splitlines()[0] if message else "") or "?"
            line = (message.strip().splitlines() or [""])[0][:200]
            name = f"{tc.get('classname', '')}::{tc.get('name', '')}"
            verdict = "caught" if category == case.expect else "wrong category"
            return verdict, name, category, line
    return "uncaught", "", "", f"{len(cases)} test(s) passed with the fault injected"


def run_case(case: Case, workdir: Path, root: Path, lease_dir: str = "",
             timeout: float = 600.0, runner: ChildRunner | None = None) -> Outcome:
    """Run one case in a child pytest under ``workdir`` (by ``runner``: a signal it received
    stops the child; by a runner of its own when none is given)."""
    if case.stack != "default":
        try:
            load_stack(case.stack)
            installed = stack_python(case.stack) is not None
        except StackError:
            installed = False
        if not installed:
            return Outcome(case, "not applicable",
                           message=f"stack {case.stack} is not installed on this host"
                           f" (./setup.sh --stack {case.stack})")
    workdir.mkdir(parents=True, exist_ok=True)
    junit = workdir / "junit.xml"
    junit.unlink(missing_ok=True)
    cmd = pytest_command(
        "-p", "no:cacheprovider", "-q", f"--junitxml={junit}",
        f"--hil-reports-dir={workdir / 'reports'}", case.suite, "-k", case.select, "--model",
        "tiny-llama", "--target", case.target, "--stack", case.stack, "--inject-fault",
        case.fault, "--quarantine", os.devnull,
        "--no-triage",  # a selftest asks whether a check fails, not what the failure needs
        *case.extra)
    if lease_dir:
        cmd.append(f"--lease-dir={lease_dir}")
    start_ms, t0 = int(time.time() * 1000), time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if runner is None:
            with ChildRunner() as own:
                child = own.run(cmd, root, stdout=out, stderr=err, timeout=timeout)
        else:
            child = runner.run(cmd, root, stdout=out, stderr=err, timeout=timeout)
        output = "".join(_read_text(f) for f in (out, err))
    rc = child.code
    if child.timed_out:
        output, rc = f"{output}\nselftest: killed after {timeout:.0f} s", -1
    seconds = time.monotonic() - t0
    verdict, test, category, message = judge(case, rc, junit)
    return Outcome(case, verdict, test, category, message, seconds, output, start_ms)


def _read_text(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def table(outcomes: list[Outcome]) -> str:
    """The markdown table `hil selftest` prints and records."""
    lines = ["| fault | target | verdict | caught by | category | seconds |",
             "|---|---|---|---|---|---|"]
    for o in outcomes:
        by = o.test.split("::")[-1] if o.test else o.message
        lines.append(f"| {o.case.fault} | {o.case.target}{'' if o.case.stack == 'default' else ' @ ' + o.case.stack}"
                     f" | {o.verdict} | {by.replace('|', '/')} | {o.category or '-'}"
                     f" | {o.seconds:.0f} |")
    return "\n".join(lines)


def uncaught_families(outcomes: list[Outcome]) -> list[str]:
    """Families with a case that ran here and was not caught."""
    return sorted({o.case.family for o in outcomes
                   if o.verdict not in ("caught", "not applicable")})


def write_allure(outcomes: list[Outcome], results: Path, host: str | None = None) -> list[Path]:
    """One Allure result per case in the suite ``selftest`` (history keyed by host)."""
    host = host or socket.gethostname()
    results.mkdir(parents=True, exist_ok=True)
    status_of = {"caught": "passed", "not applicable": "skipped", "not run": "broken"}
    written = []
    for o in outcomes:
        c = o.case
        uid = str(uuid.uuid4())
        full = f"selftest.{c.family}.{c.target}.{c.stack}"
        message = (f"caught by {o.test}: {o.message}" if o.caught else
                   f"{c.fault} on {c.target} {o.verdict}: expected a {c.expect!r} failure;"
                   f" {o.message or o.category}")
        attachments = []
        if o.output:
            source = f"{uuid.uuid4()}-attachment.txt"
            (results / source).write_text(o.output[-20000:])
            attachments.append({"name": "child pytest output (tail)", "source": source,
                                "type": "text/plain"})
        data = {
            "uuid": uid, "historyId": hashlib.md5(f"{full}|{host}".encode()).hexdigest(),
            "name": f"{c.fault} on {c.target}", "fullName": full,
            "status": status_of.get(o.verdict, "failed"),
            "statusDetails": {"message": message},
            "start": o.start_ms, "stop": o.start_ms + int(o.seconds * 1000),
            "labels": [{"name": "parentSuite", "value": "vllm-hil"},
                       {"name": "suite", "value": "selftest"},
                       {"name": "subSuite", "value": c.target},
                       {"name": "feature", "value": "selftest"},
                       {"name": "story", "value": c.family},
                       {"name": "host", "value": host},
                       {"name": "nodeid", "value": f"selftest::{c.fault}[{c.target}@{host}]"}],
            "parameters": [{"name": "fault", "value": c.fault}, {"name": "target", "value": c.target},
                           {"name": "stack", "value": c.stack}, {"name": "host", "value": host},
                           {"name": "caught by", "value": o.test or "-"},
                           {"name": "category", "value": o.category or "-"}],
            "attachments": attachments,
        }
        path = results / f"{uid}-result.json"
        path.write_text(json.dumps(data, indent=1))
        written.append(path)
    return written


def host_kinds(inventory: str) -> list[str]:
    """The kinds with a device on this host that one of their device-bound variants runs on
    (the nightly's rule: a card, not a CPU-mode stand-in listed as one)."""
    inv = load_inventory(Path(inventory)) if inventory else discover_inventory()
    return sorted({k.name for d in inv.devices for k in kinds_on(d.kind)
                   if any(k.needs_device(v) and k.serves(d, v.backend, v.mode)
                          for v in k.variants)})


def selftest_command(args: argparse.Namespace, extra: list[str]) -> int:
    root = Path(args.root)
    reports = Path(args.reports_dir)
    try:
        cases = cases_for(host_kinds(args.inventory), args.fault or None)
    except (InventoryError, ValueError) as e:
        print(f"hil selftest: {e}", file=sys.stderr)
        return 2
    print(f"hil selftest: {len(cases)} case(s) on {socket.gethostname()}", flush=True)
    t0 = time.monotonic()
    outcomes = []
    with ChildRunner() as runner:
        for i, case in enumerate(cases):
            o = run_case(case, reports / "selftest" / f"{i:02d}-{case.family}-{case.target}",
                         root, args.lease_dir, runner=runner)
            if runner.signal is not None:
                break  # the case the signal stopped proves nothing either way
            print(f"hil selftest: {case.fault} on {case.target}: {o.verdict}"
                  f" ({o.category or o.message}) in {o.seconds:.0f} s", flush=True)
            outcomes.append(o)
    if runner.signal is not None:
        return _interrupted(runner.signal, outcomes, len(cases), reports)
    text = table(outcomes)
    total = time.monotonic() - t0
    missed = uncaught_families(outcomes)
    verdict = (f"every fault family caught ({total:.0f} s)" if not missed else
               f"NOT CAUGHT: {', '.join(missed)} ({total:.0f} s)")
    print(text + "\n\nhil selftest: " + verdict, flush=True)
    with StagedReport(reports / "selftest", "selftest", "selftest.md") as out:
        (out.staging / "selftest.md").write_text(f"# hil selftest\n\n{text}\n\n{verdict}\n")
        out.complete()
    results = Path(args.results or reports / "allure-results")
    write_allure(outcomes, results)
    print(f"hil selftest: results in {results} (suite selftest), table in"
          f" {reports / 'selftest' / 'selftest.md'}")
    return 1 if missed else 0


def _interrupted(signum: int, outcomes: list[Outcome], planned: int, reports: Path) -> int:
    """A selftest stopped by a signal: the cases that ran, in selftest.md marked interrupted;
    no Allure results; 128 + the signal."""
    why = (f"stopped by {signal_name(signum)} after {len(outcomes)} of {planned} case(s):"
           " nothing is said of the faults not run")
    text = table(outcomes)
    print(f"{text}\n", file=sys.stderr, flush=True)
    try:
        # Kept apart (marked INTERRUPTED): the earlier complete table stays in place.
        with StagedReport(reports / "selftest", "selftest", "selftest.md") as out:
            (out.staging / "selftest.md").write_text(f"**INTERRUPTED**: {why}\n\n"
                                                     f"# hil selftest\n\n{text}\n")
            out.incomplete("the table of the cases that ran, marked INTERRUPTED", stopped=True)
        print(f"hil selftest: {why}; {out.line}; no Allure results were written",
              file=sys.stderr)
    except OSError as e:
        print(f"hil selftest: {why}; cannot write its table: {e}", file=sys.stderr)
    return 128 + signum


def add_selftest_parser(sub: argparse._SubParsersAction, root: Path) -> None:
    """The ``hil selftest`` sub-command."""
    s = sub.add_parser("selftest", help="inject each harness fault on this host: is it caught?")
    add_cli_option(s, "--hil-reports-dir", "--reports-dir", default=str(root / "reports"))
    s.add_argument("--results", default="", help="allure results folder to add the suite"
                   " selftest to (default REPORTS_DIR/allure-results)")
    add_cli_option(s, "--inventory", help="the host's inventory (default: discovery; env"
                   " HIL_INVENTORY)")
    add_cli_option(s, "--lease-dir", default="", help="device lease folder (default: pytest's;"
                   " env HIL_LEASE_DIR)")
    s.add_argument("--fault", action="append", default=[], metavar="NAME",
                   help="only this fault family (repeatable)")
    s.add_argument("--root", default=str(root), help=argparse.SUPPRESS)
    s.set_defaults(func=selftest_command)

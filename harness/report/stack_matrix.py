"""What each stack's junit file says, as the merged summary shows it: a stack x suite x target
matrix of outcomes, and the skipped tests grouped by why they skipped.

``hil run --stacks A,B`` writes one junit file per stack (``junit.xml`` for the default stack,
``junit-<stack>.xml`` for the others). Each test case names its suite (its module,
``suites.test_capacity``) and its target (a segment of its parameter id,
``test_x[tiny-llama-spyre-eager-cb-2]``). A skip is filed in one of three groups:

- **stack without the feature**: the stack declares the target or the suite unsupported
  (``[targets.unsupported]``, ``[suites.unsupported]`` or ``[targets] supported`` of
  ``stacks/<stack>.toml``): the skip message is the one the session writes for such a test
  (``... does not run on stack S: REASON``), or carries a declared reason;
- **device missing**: the target's device or card is not on this machine, as the Categories
  tab files it (``harness.report.categories``);
- **other**: any other reason (a model the target cannot run, a plan-only pass, ...).

Everything here but ``read_junit`` is a pure function of its arguments.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.report.categories import SKIPPED, classify
from harness.report.markdown import md_cell

STACK_GROUP = "stack without the feature"
DEVICE_GROUP = "device missing"
OTHER_GROUP = "other"
SKIP_GROUPS = (DEVICE_GROUP, STACK_GROUP, OTHER_GROUP)
# The messages of the skips a stack decides by its stack file (HilSession.stack_problem):
# [suites.unsupported], [targets.unsupported], [targets] supported.
STACK_SKIP = re.compile(r"^(?:suite )?\S+ does not run on stack \S+: |"
                        r"^\S+ is not among the targets of stack ")
# The geometry whose tests keep the suite's own column (harness.geometry.catalog.DEFAULT_GEOMETRY).
SMALL_GEOMETRY = "small"
NOTHING = "—"  # a matrix cell where nothing was collected
NO_TARGET = "(no target)"
REASON_CHARS = 300
# Outcome words of a test case, in the order a cell lists them.
OUTCOMES = ("failed", "error", "passed", "skipped", "xfailed")


@dataclass(frozen=True)
class Case:
    """One junit test case of one stack's run."""

    stack: str
    suite: str  # the suite file's name without test_: capacity, token_equality, ...
    name: str  # the test's name with its parameter id
    outcome: str  # one of OUTCOMES
    message: str = ""  # the skip reason or the failure's message, first line


@dataclass(frozen=True)
class SkipReason:
    """One distinct skip reason: its group, how many tests it skipped, on which stacks."""

    group: str
    reason: str
    count: int
    stacks: tuple[str, ...]


def suite_of(classname: str) -> str:
    """``suites.test_capacity`` -> ``capacity`` (the module, without its test_ prefix)."""
    module = classname.rsplit(".", 1)[-1]
    return module.removeprefix("test_")


def target_of(name: str, targets: Sequence[str]) -> str:
    """The target whose label is a whole ``-``-separated run of the test's parameter id (the
    longest such label); NO_TARGET for a test without parameters or without a known target."""
    if "[" not in name:
        return NO_TARGET
    param_id = "-" + name.split("[", 1)[1].rstrip("]") + "-"
    hits = [t for t in targets if f"-{t}-" in param_id]
    return max(hits, key=len) if hits else NO_TARGET


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    line = lines[0].strip() if lines else ""
    return line.removeprefix("Skipped: ")


def _outcome(case: ET.Element) -> tuple[str, str]:
    """The outcome of one <testcase> and its message: a failure outranks an error (a teardown
    error after a failure), either outranks a skip."""
    for tag, outcome in (("failure", "failed"), ("error", "error")):
        el = case.find(tag)
        if el is not None:
            return outcome, _first_line(el.get("message") or el.text)
    el = case.find("skipped")
    if el is not None:
        outcome = "xfailed" if el.get("type") == "pytest.xfail" else "skipped"
        return outcome, _first_line(el.get("message") or el.text)
    return "passed", ""


def _property(case: ET.Element, name: str) -> str | None:
    """A ``<property>`` of a test case (pytest writes its user properties there)."""
    for prop in case.iter("property"):
        if prop.get("name") == name:
            return prop.get("value")
    return None


def parse_junit(text: str, stack: str) -> list[Case]:
    """The test cases of one junit document (pytest's --junitxml)."""
    root = ET.fromstring(text)
    cases = []
    for tc in root.iter("testcase"):
        outcome, message = _outcome(tc)
        suite = suite_of(tc.get("classname") or "")
        geometry = _property(tc, "geometry")
        if geometry and geometry != SMALL_GEOMETRY:  # a column per geometry beyond the suites' own
            suite = f"{suite} @ {geometry}"
        cases.append(Case(stack=stack, suite=suite, name=tc.get("name") or "", outcome=outcome,
                          message=message))
    return cases


def read_junit(path: Path, stack: str) -> tuple[list[Case], str | None]:
    """The cases of ``path``, or none and why (no file: the run wrote none; not XML)."""
    if not Path(path).is_file():
        return [], f"{path.name}: no such file (the {stack} run wrote no junit file)"
    try:
        return parse_junit(Path(path).read_text(encoding="utf-8"), stack), None
    except (OSError, UnicodeDecodeError, ET.ParseError) as e:
        return [], f"{path.name}: unreadable ({e})"


# ---------------------------------------------------------------------- skips


def skip_group(message: str, declared: Iterable[str]) -> str:
    """The group of a skip by its message: the stack's declared reasons first (a stack that
    declares a target unsupported skips it before looking for its device), then device
    missing as the Categories tab files it, else other."""
    if STACK_SKIP.search(message) or any(r and r in message for r in declared):
        return STACK_GROUP
    if classify(SKIPPED, message) == DEVICE_GROUP:
        return DEVICE_GROUP
    return OTHER_GROUP


def _reason_text(message: str) -> str:
    text = message or "(no reason given)"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def group_skips(cases: Iterable[Case], declared: Mapping[str, Iterable[str]]
                ) -> dict[str, list[SkipReason]]:
    """Skipped cases per group (every group present, in SKIP_GROUPS order): each distinct
    reason with its count and the stacks it skipped on, most tests first. ``declared`` maps
    a stack to the reasons its stack file gives for what it does not support."""
    counts: Counter[tuple[str, str]] = Counter()
    stacks: dict[tuple[str, str], list[str]] = {}
    for c in cases:
        if c.outcome != "skipped":
            continue
        key = (skip_group(c.message, declared.get(c.stack, ())), _reason_text(c.message))
        counts[key] += 1
        seen = stacks.setdefault(key, [])
        if c.stack not in seen:
            seen.append(c.stack)
    out: dict[str, list[SkipReason]] = {g: [] for g in SKIP_GROUPS}
    for (group, reason), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][1])):
        out[group].append(SkipReason(group, reason, n, tuple(stacks[(group, reason)])))
    return out



def skips_markdown(groups: Mapping[str, list[SkipReason]]) -> str:
    """The summary's section: per group its total, then reason | tests | stacks."""
    total = sum(r.count for reasons in groups.values() for r in reasons)
    if not total:
        return ""
    lines = ["## Skipped tests by reason", ""]
    for group in SKIP_GROUPS:
        reasons = groups.get(group) or []
        if not reasons:
            continue
        lines += [f"### {group}: {sum(r.count for r in reasons)} test(s)", "",
                  "| reason | tests | stacks |", "|---|---|---|"]
        lines += [f"| {md_cell(r.reason)} | {r.count} | {', '.join(r.stacks)} |" for r in reasons]
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------- matrix


def cell_text(cases: Sequence[Case], declared: Iterable[str] = ()) -> str:
    """One matrix cell: NOTHING when no case; ``skipped: <group>`` when every case skipped;
    else the count per outcome (``3 passed, 1 failed``), a skip count with its group(s)."""
    if not cases:
        return NOTHING
    declared = tuple(declared)
    groups = list(dict.fromkeys(skip_group(c.message, declared)
                                for c in cases if c.outcome == "skipped"))
    by = Counter(c.outcome for c in cases)
    if by["skipped"] == len(cases):
        return "skipped: " + ", ".join(groups)
    parts = []
    for outcome in OUTCOMES:
        if by[outcome]:
            text = f"{by[outcome]} {outcome}"
            parts.append(text + (f": {', '.join(groups)}" if outcome == "skipped" else ""))
    return ", ".join(parts)


def matrix_rows(cases: Iterable[Case], stacks: Sequence[str], suites: Sequence[str],
                targets: Sequence[str], declared: Mapping[str, Iterable[str]] | None = None
                ) -> list[list[str]]:
    """One row per (stack, target) that has a case: stack, target, then one cell per suite.
    Stacks in the order given, targets in the order of ``targets`` (unknown ones after, by
    name), suites as given (a suite no stack collected still has its column)."""
    declared = declared or {}
    cells: dict[tuple[str, str, str], list[Case]] = {}
    for c in cases:
        cells.setdefault((c.stack, target_of(c.name, targets), c.suite), []).append(c)
    order = {t: i for i, t in enumerate(targets)}
    rows = []
    for stack in stacks:
        present = {t for (s, t, _) in cells if s == stack}
        for target in sorted(present, key=lambda t: (order.get(t, len(order)), t)):
            rows.append([stack, target] + [
                cell_text(cells.get((stack, target, suite), []), declared.get(stack, ()))
                for suite in suites])
    return rows


def matrix_markdown(rows: Sequence[Sequence[str]], suites: Sequence[str],
                    missing: Sequence[str] = ()) -> str:
    """The summary's matrix section; ``missing`` names junit files that could not be read."""
    lines = ["## Stacks, suites and targets", "",
             "| stack | target | " + " | ".join(suites) + " |",
             "|---|---|" + "---|" * len(suites)]
    lines += ["| " + " | ".join(md_cell(x) for x in row) + " |" for row in rows]
    if not rows:
        lines += ["", "No test case in any stack's junit file."]
    lines += [""] + [f"- {md_cell(m)}" for m in missing] + ([""] if missing else [])
    return "\n".join(lines)


def totals_line(cases: Sequence[Case]) -> str:
    """``**N tests**: 3 failed, 12 passed, 4 skipped`` over every stack."""
    by = Counter(c.outcome for c in cases)
    counts = ", ".join(f"{by[k]} {k}" for k in OUTCOMES if by[k])
    return f"**{len(cases)} tests**: {counts or 'none'}"
